//! The doctor's judgement: facts in, findings out, each with what to do about it. No I/O.

use nodemedic_api::names::labels::{ROLE_CONTROL_PLANE, ROLE_MASTER, ROLE_WORKER};
use nodemedic_healthcheck::decide::TemplateRef;
use nodemedic_healthcheck::decide::selection::{SeedStyleLabel, seed_style_label};
use nodemedic_self_remediation::protocol::manager::{Means, cannot_fence};
use serde::Serialize;

use super::facts::{
    AccountAccess, AgentAdmission, FENCE_AGENTS_TEMPLATE, Facts, FenceTemplate, HealthCheck, POISON_PILL_TEMPLATE,
    SELF_REMEDIATION_TEMPLATE, Subject, TemplateLookup, Verdict,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Severity {
    /// nodemedic cannot do its job somewhere until this is fixed.
    Blocking,
    Warning,
    Ok,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Finding {
    pub severity: Severity,
    pub check: &'static str,
    pub subject: String,
    pub message: String,
    /// Empty for an Ok finding.
    pub fix: String,
}

fn finding(
    severity: Severity,
    check: &'static str,
    subject: impl Into<String>,
    message: String,
    fix: String,
) -> Finding {
    Finding {
        severity,
        check,
        subject: subject.into(),
        message,
        fix,
    }
}

fn ok(check: &'static str, subject: impl Into<String>, message: String) -> Finding {
    finding(Severity::Ok, check, subject, message, String::new())
}

pub(super) fn findings(f: &Facts) -> Vec<Finding> {
    let mut out = vec![version(f)];
    out.extend(controller(f));
    out.extend(agent_admission(f));
    out.extend(agents(f));
    out.extend(f.checks.iter().flat_map(|c| health_check(f, c)));
    out.extend(f.fence_templates.iter().flat_map(|t| fence_template(f, t)));
    out.extend(f.access.iter().map(|a| access(f, a)));
    out
}

/// The out-of-service taint: GA in 1.28 (NodeOutOfServiceVolumeDetach), beta and on by default
/// from 1.26, absent before.
fn version(f: &Facts) -> Finding {
    const CHECK: &str = "kubernetes";
    let Some(v) = &f.version else {
        return finding(
            Severity::Warning,
            CHECK,
            "API server",
            "the API server's version could not be read".into(),
            "check that `kubectl version` answers; nodemedic needs Kubernetes 1.28 or later for the out-of-service taint"
                .into(),
        );
    };
    let asking = f.out_of_service_templates.join(", ");
    let subject = format!("Kubernetes {}", v.text);
    match (v.major, v.minor) {
        (1, 28..) | (2.., _) => ok(
            CHECK,
            subject,
            "the out-of-service taint is supported (GA since 1.28)".into(),
        ),
        (1, 26..) if asking.is_empty() => ok(
            CHECK,
            subject,
            "no template asks for the out-of-service taint; Automatic uses ResourceDeletion below 1.28".into(),
        ),
        (1, 26..) => finding(
            Severity::Warning,
            CHECK,
            subject,
            format!("the out-of-service taint is beta before 1.28, and {asking} use it"),
            "keep the NodeOutOfServiceVolumeDetach feature gate on (the default) in kube-controller-manager, or upgrade to Kubernetes 1.28 or later".into(),
        ),
        _ if asking.is_empty() => finding(
            Severity::Warning,
            CHECK,
            subject,
            "the out-of-service taint does not exist before Kubernetes 1.26; remediation falls back to ResourceDeletion".into(),
            "upgrade to Kubernetes 1.28 or later".into(),
        ),
        _ => finding(
            Severity::Blocking,
            CHECK,
            subject,
            format!("the out-of-service taint does not exist before Kubernetes 1.26, and {asking} use it"),
            format!("set remediationStrategy: ResourceDeletion (or Automatic) in {asking}, or upgrade to Kubernetes 1.28 or later"),
        ),
    }
}

fn controller(f: &Facts) -> Vec<Finding> {
    const CHECK: &str = "controller";
    let ns = &f.namespace;
    let subject = format!("namespace {ns}");
    let elsewhere = f.elsewhere.iter().cloned().collect::<Vec<_>>().join(", ");
    let elsewhere_fix = (!elsewhere.is_empty())
        .then(|| format!("nodemedic seems to run in {elsewhere}: run `nodemedic doctor --namespace <that namespace>`"));
    if !f.namespaces.contains(ns) {
        return vec![finding(
            Severity::Blocking,
            CHECK,
            subject,
            format!("namespace {ns} does not exist: nodemedic is not installed there"),
            elsewhere_fix.unwrap_or_else(|| {
                "install nodemedic: kubectl apply --server-side -f deploy/crds/ && kubectl apply -f deploy/nodemedic.yaml (or helm install nodemedic charts/nodemedic -n workload-availability --create-namespace)".into()
            }),
        )];
    }
    vec![match &f.controller {
        None => finding(
            Severity::Warning,
            CHECK,
            subject,
            format!("no controller holds the lease nodemedic-controller in {ns}"),
            elsewhere_fix.unwrap_or_else(|| {
                format!("start the controller (kubectl -n {ns} get deployment nodemedic-controller); a controller run with --leader-elect=false has no lease")
            }),
        ),
        Some(lease) => match lease.stale_for {
            Some(seconds) => finding(
                Severity::Warning,
                CHECK,
                subject,
                format!(
                    "the controller lease (last held by {}) has not been renewed for {seconds} s: no controller is running",
                    lease.holder
                ),
                format!("check the controller's pods: kubectl -n {ns} get pods -l app.kubernetes.io/component=controller"),
            ),
            None => ok(CHECK, subject, format!("the controller runs (leader {})", lease.holder)),
        },
    }]
}

/// Whether the namespace lets the agents' DaemonSet create its pods at all.
fn agent_admission(f: &Facts) -> Option<Finding> {
    const CHECK: &str = "pod-security";
    let subject = format!("namespace {}", f.namespace);
    let ns = &f.namespace;
    match &f.agent_admission {
        AgentAdmission::NotTried => None,
        AgentAdmission::Admitted => Some(ok(
            CHECK,
            subject,
            "admits the self-remediation agents' privileged pods (a server-side dry run of one)".into(),
        )),
        AgentAdmission::Refused(why) => Some(finding(
            Severity::Blocking,
            CHECK,
            subject,
            format!("refuses the self-remediation agents' pods, so no node has its agent: {why}"),
            format!(
                "let the namespace run privileged pods: kubectl label namespace {ns} pod-security.kubernetes.io/enforce=privileged --overwrite (the chart's podSecurity.labelNamespace=true has the controller do it when no level is set); on OpenShift, let the agents use the privileged SCC: oc adm policy add-scc-to-user privileged -z nodemedic-agent -n {ns} (the chart's ClusterRole nodemedic-agent grants it)"
            ),
        )),
        AgentAdmission::Unknown(why) => Some(finding(
            Severity::Warning,
            CHECK,
            subject,
            format!("could not check whether it admits the agents' pods: {why}"),
            format!(
                "run the doctor as someone who may create pods in {ns} (it only dry-runs one), or check the agent DaemonSet's events: kubectl -n {ns} describe daemonset nodemedic-agent"
            ),
        )),
    }
}

/// Each node's agent and fencing means, judged as the self-remediation manager will judge them.
fn agents(f: &Facts) -> Vec<Finding> {
    const CHECK: &str = "agents";
    let settings = f.self_remediation;
    f.nodes
        .iter()
        .map(|node| {
            let remediating: Vec<&str> = f
                .checks
                .iter()
                .filter(|c| c.selects(node) && (c.uses(SELF_REMEDIATION_TEMPLATE) || c.uses(POISON_PILL_TEMPLATE)))
                .map(|c| c.name.as_str())
                .collect();
            let subject = format!("node {}", node.name);
            let own = f.registrations.iter().find(|r| r.node == node.name);
            let Some(why) = cannot_fence(
                &node.name,
                &f.registrations,
                settings.software_reboot_enabled,
                settings.min_peers,
            ) else {
                let means = own.map_or(Means::None, |r| r.means);
                return ok(CHECK, subject, format!("agent registered, fencing by {}", means.as_str()));
            };
            let fix = match own {
                None => format!(
                    "run the nodemedic agent on {}: the controller's DaemonSet places one per node (kubectl -n {} get daemonset; check its tolerations and nodeSelector in the SelfNodeRemediationConfig), or remediate the node with fence agents instead",
                    node.name, f.namespace
                ),
                Some(r) if r.disarmed => format!("start the agent on {} again", node.name),
                Some(r) if matches!(r.means, Means::None | Means::SoftwareReboot) => format!(
                    "give {} a watchdog device (a hardware one, or the softdog module: its agent loads it when the kernel has it), or set isSoftwareRebootEnabled: true in the SelfNodeRemediationConfig{}",
                    node.name,
                    f.fencing_notes
                        .get(&node.name)
                        .map(|note| format!(" (the agent says: {note})"))
                        .unwrap_or_default()
                ),
                Some(_) => "run agents on more nodes, or lower minPeersForRemediation in the SelfNodeRemediationConfig".into(),
            };
            if remediating.is_empty() {
                finding(
                    Severity::Warning,
                    CHECK,
                    subject,
                    format!("{why} (no health check remediates it with self remediation)"),
                    fix,
                )
            } else {
                finding(
                    Severity::Blocking,
                    CHECK,
                    subject,
                    format!("{why}, yet {} remediate it with self remediation", remediating.join(", ")),
                    fix,
                )
            }
        })
        .collect()
}

fn health_check(f: &Facts, c: &HealthCheck) -> Vec<Finding> {
    let subject = format!("NodeHealthCheck {}", c.name);
    if let Err(why) = &c.spec {
        return vec![finding(
            Severity::Blocking,
            "health-check",
            subject,
            format!("the health check is refused: {why}"),
            format!("kubectl edit nodehealthcheck {}: {why}", c.name),
        )];
    }
    let selected: Vec<&str> = f
        .nodes
        .iter()
        .filter(|n| c.selects(n))
        .map(|n| n.name.as_str())
        .collect();
    let seed_style = seed_style_label(&c.selector_keys, f.nodes.iter().map(|n| &n.labels));
    let mut out = vec![if let Some(SeedStyleLabel::Master { .. }) = seed_style {
        finding(
            Severity::Warning,
            "openshift",
            subject.clone(),
            format!(
                "the selector uses {ROLE_MASTER} (OpenShift's label), which no node has: it selects {} nodes",
                selected.len()
            ),
            format!(
                "select {ROLE_CONTROL_PLANE} instead of {ROLE_MASTER}: kubectl edit nodehealthcheck {}",
                c.name
            ),
        )
    } else if seed_style == Some(SeedStyleLabel::Worker) && selected.is_empty() {
        finding(
            Severity::Warning,
            "openshift",
            subject.clone(),
            format!("the selector uses {ROLE_WORKER} (set by OpenShift, not by kubeadm), which no node has"),
            format!(
                "label the workers (kubectl label node <node> {ROLE_WORKER}=), or select the nodes without {ROLE_CONTROL_PLANE} (operator DoesNotExist): kubectl edit nodehealthcheck {}",
                c.name
            ),
        )
    } else if selected.is_empty() {
        finding(
            Severity::Warning,
            "health-check",
            subject.clone(),
            "the selector matches no node: the health check watches nothing".into(),
            format!(
                "change its selector to labels your nodes have (kubectl get nodes --show-labels): kubectl edit nodehealthcheck {}",
                c.name
            ),
        )
    } else {
        ok(
            "health-check",
            subject.clone(),
            format!("selects {}", selected.join(", ")),
        )
    }];
    out.extend(c.templates().into_iter().map(|t| template(f, &subject, t)));
    out
}

fn template(f: &Facts, subject: &str, t: &TemplateRef) -> Finding {
    const CHECK: &str = "template";
    let ns = &f.namespace;
    let lookup = f.templates.get(t).copied().unwrap_or(TemplateLookup::NotFound);
    let blocking = |check, message, fix| finding(Severity::Blocking, check, subject, message, fix);
    match (lookup, t.namespace.as_deref()) {
        (TemplateLookup::Found, _) => ok(CHECK, subject, format!("template {t} exists")),
        (TemplateLookup::KindNotServed, _) => blocking(
            CHECK,
            format!(
                "template {t}: the cluster serves no kind {} (its CRD is not installed)",
                t.kind
            ),
            format!(
                "install the remediator that provides {}, or use a {SELF_REMEDIATION_TEMPLATE} or {FENCE_AGENTS_TEMPLATE} in {ns}",
                t.kind
            ),
        ),
        (TemplateLookup::NotFound, None) => blocking(
            CHECK,
            format!("template {t}: the reference names no namespace"),
            format!("add namespace: {ns} (or the template's namespace) to the template reference"),
        ),
        (TemplateLookup::NotFound, Some(missing)) if !f.namespaces.contains(missing) => {
            let openshift = missing.starts_with("openshift-");
            blocking(
                if openshift { "openshift" } else { CHECK },
                if openshift {
                    format!("template {t}: namespace {missing} is OpenShift's and does not exist here")
                } else {
                    format!("template {t}: namespace {missing} does not exist")
                },
                format!("set the template reference's namespace to {ns}, where nodemedic runs and keeps its templates"),
            )
        }
        (TemplateLookup::NotFound, Some(in_ns)) => blocking(
            CHECK,
            format!("template {t} does not exist"),
            format!(
                "create it, or reference one that exists: kubectl -n {in_ns} get {}",
                t.kind.to_lowercase()
            ),
        ),
    }
}

fn fence_template(f: &Facts, t: &FenceTemplate) -> Vec<Finding> {
    const CHECK: &str = "fence-agents";
    let subject = format!("{FENCE_AGENTS_TEMPLATE} {}/{}", t.namespace, t.name);
    let users: Vec<&str> = f
        .checks
        .iter()
        .filter(|c| c.references(FENCE_AGENTS_TEMPLATE, &t.namespace, &t.name))
        .map(|c| c.name.as_str())
        .collect();
    let edit = format!(
        "kubectl -n {} edit fenceagentsremediationtemplate {}",
        t.namespace, t.name
    );
    let mut out = vec![match &t.parameters {
        Verdict::Passed => ok(CHECK, subject.clone(), "the fence agent accepts its parameters".into()),
        Verdict::Failed(why) => finding(
            if users.is_empty() {
                Severity::Warning
            } else {
                Severity::Blocking
            },
            CHECK,
            subject.clone(),
            if users.is_empty() {
                format!("the fence agent rejects its parameters: {why}")
            } else {
                format!(
                    "the fence agent rejects its parameters (used by {}): {why}",
                    users.join(", ")
                )
            },
            format!("correct the parameters ({why}): {edit}"),
        ),
        Verdict::NotYet => finding(
            Severity::Warning,
            CHECK,
            subject.clone(),
            "the fence-agents controller has not checked its parameters".into(),
            format!(
                "run the controller with the fence-agents operator (not --disable=fence-agents) and look again: kubectl -n {} get deployment nodemedic-controller",
                f.namespace
            ),
        ),
    }];
    if let Verdict::Failed(why) = &t.credentials {
        out.push(finding(
            Severity::Warning,
            CHECK,
            subject,
            format!("the credentials check (--action=status) failed: {why}"),
            format!("check the BMC addresses and the credentials Secret the template names: {edit}"),
        ));
    }
    out
}

fn access(f: &Facts, a: &AccountAccess) -> Finding {
    const CHECK: &str = "rbac";
    const SHOWN: usize = 6;
    let subject = format!("ServiceAccount {}/{}", f.namespace, a.account);
    let mut denied: Vec<String> = a.denied.iter().take(SHOWN).map(|p| p.to_string()).collect();
    if a.denied.len() > SHOWN {
        denied.push(format!("and {} more", a.denied.len() - SHOWN));
    }
    let denied = denied.join(", ");
    let regrant = format!(
        "apply the chart's RBAC again (kubectl apply -f deploy/nodemedic.yaml, or helm upgrade): ClusterRole {} bound to {}/{}",
        a.role, f.namespace, a.account
    );
    let as_admin = "run the doctor as someone who may create SubjectAccessReviews (a cluster administrator) to check the account itself";
    match (a.subject, a.denied.is_empty()) {
        (Subject::Account, true) => ok(
            CHECK,
            subject,
            format!("may do all {} things the chart grants it", a.checked),
        ),
        (Subject::Account, false) => finding(
            Severity::Blocking,
            CHECK,
            subject,
            format!("may not: {denied}"),
            regrant,
        ),
        (Subject::Caller, true) => finding(
            Severity::Warning,
            CHECK,
            subject,
            "not checked: you may not create SubjectAccessReviews; you yourself may do everything it needs".into(),
            as_admin.into(),
        ),
        (Subject::Caller, false) => finding(
            Severity::Warning,
            CHECK,
            subject,
            format!(
                "not checked (you may not create SubjectAccessReviews); checked as you instead, you may not: {denied}"
            ),
            as_admin.into(),
        ),
    }
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod tests;
