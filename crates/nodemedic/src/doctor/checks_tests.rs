use std::{collections::BTreeMap, time::Duration};

use nodemedic_api::healthcheck::NodeHealthCheck;
use nodemedic_self_remediation::protocol::manager::Registration;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::doctor::{
    facts::{AgentAdmission, ControllerLease, NodeFacts, SelfRemediationSettings, Version},
    rbac::Permission,
};

const NS: &str = "workload-availability";
const SNR_API: &str = "self-node-remediation.medik8s.io/v1alpha1";
const FAR_API: &str = "fence-agents-remediation.medik8s.io/v1alpha1";

fn node(name: &str, roles: &[&str]) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        labels: roles.iter().map(|r| ((*r).to_owned(), String::new())).collect(),
    }
}

fn agent(node: &str, means: Means) -> Registration {
    Registration {
        node: node.into(),
        means,
        watchdog: Duration::from_secs(5),
        licence: Duration::from_secs(3),
        accepts: Default::default(),
        acknowledged: 1,
        disarmed: false,
    }
}

fn check(name: &str, key: &str, kind: &str, namespace: &str, template: &str) -> HealthCheck {
    let api = if kind == FENCE_AGENTS_TEMPLATE {
        FAR_API
    } else {
        SNR_API
    };
    let nhc: NodeHealthCheck = serde_json::from_value(json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchExpressions": [{"key": key, "operator": "Exists"}]},
            "remediationTemplate": {"apiVersion": api, "kind": kind, "namespace": namespace, "name": template}
        }
    }))
    .expect("a NodeHealthCheck");
    HealthCheck::from_object(&nhc)
}

fn far(name: &str, parameters: Verdict) -> FenceTemplate {
    FenceTemplate {
        namespace: NS.into(),
        name: name.into(),
        parameters,
        credentials: Verdict::Passed,
    }
}

/// Three control-plane nodes, each with an agent, one SNR health check over them with its
/// template, one valid FAR template, the chart's RBAC in place.
fn healthy() -> Facts {
    let names = ["node-1", "node-2", "node-3"];
    let mut f = Facts {
        namespace: NS.into(),
        version: Version::parse("1", "36", "v1.36.3"),
        nodes: names.iter().map(|n| node(n, &[ROLE_CONTROL_PLANE])).collect(),
        namespaces: [NS.to_owned(), "default".to_owned()].into(),
        registrations: names.iter().map(|n| agent(n, Means::HardwareWatchdog)).collect(),
        self_remediation: SelfRemediationSettings::default(),
        controller: Some(ControllerLease {
            holder: "controller-0".into(),
            stale_for: None,
        }),
        checks: vec![check(
            "cp",
            ROLE_CONTROL_PLANE,
            SELF_REMEDIATION_TEMPLATE,
            NS,
            "automatic",
        )],
        fence_templates: vec![far("bmc", Verdict::Passed)],
        access: ["nodemedic-controller", "nodemedic-agent"]
            .iter()
            .map(|a| AccountAccess {
                account: (*a).into(),
                role: (*a).into(),
                subject: Subject::Account,
                checked: 40,
                denied: Vec::new(),
            })
            .collect(),
        ..Default::default()
    };
    found_templates(&mut f);
    f
}

fn found_templates(f: &mut Facts) {
    f.templates = f
        .checks
        .iter()
        .flat_map(|c| c.templates())
        .map(|t| (t.clone(), TemplateLookup::Found))
        .collect();
}

fn blocking(findings: &[Finding]) -> Vec<&Finding> {
    findings.iter().filter(|f| f.severity == Severity::Blocking).collect()
}

fn about<'a>(findings: &'a [Finding], check: &str, subject: &str) -> Vec<&'a Finding> {
    findings
        .iter()
        .filter(|f| f.check == check && f.subject.contains(subject))
        .collect()
}

#[test]
fn a_namespace_that_refuses_the_agents_blocks_with_the_label_and_the_scc_as_fixes() {
    let refused = "pods \"nodemedic-doctor-x\" is forbidden: violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true), privileged (container \"agent\" must not set securityContext.privileged=true)";
    let mut f = healthy();
    f.agent_admission = AgentAdmission::from_dry_run(Err((403, refused.into())));
    let found = findings(&f);
    let finding = about(&found, "pod-security", NS)[0];
    assert_eq!(finding.severity, Severity::Blocking);
    assert!(finding.message.contains("violates PodSecurity"), "{finding:?}");
    assert!(
        finding.fix.contains(&format!(
            "kubectl label namespace {NS} pod-security.kubernetes.io/enforce=privileged"
        )) && finding
            .fix
            .contains("oc adm policy add-scc-to-user privileged -z nodemedic-agent"),
        "{finding:?}"
    );

    f.agent_admission = AgentAdmission::from_dry_run(Ok(()));
    assert_eq!(about(&findings(&f), "pod-security", NS)[0].severity, Severity::Ok);
    // Not allowed to create pods there: the doctor cannot tell, and says so.
    f.agent_admission = AgentAdmission::from_dry_run(Err((
        403,
        "pods is forbidden: User \"u\" cannot create resource \"pods\"".into(),
    )));
    assert_eq!(about(&findings(&f), "pod-security", NS)[0].severity, Severity::Warning);
    f.agent_admission = AgentAdmission::NotTried;
    assert!(about(&findings(&f), "pod-security", NS).is_empty());
}

#[test]
fn a_healthy_cluster_has_nothing_to_fix() {
    let findings = findings(&healthy());
    assert!(findings.iter().all(|f| f.severity == Severity::Ok), "{findings:#?}");
    assert_eq!(about(&findings, "agents", "node-").len(), 3);
    assert!(
        about(&findings, "health-check", "cp")[0]
            .message
            .contains("node-1, node-2, node-3")
    );
}

#[test]
fn a_node_without_an_agent_blocks_only_where_self_remediation_is_used() {
    let mut f = healthy();
    f.registrations.retain(|r| r.node != "node-3");
    let found = findings(&f);
    let node3 = about(&found, "agents", "node-3");
    assert_eq!(node3[0].severity, Severity::Blocking, "{node3:?}");
    assert!(node3[0].message.contains("no registered nodemedic agent"));
    assert!(node3[0].fix.contains("DaemonSet"));

    f.checks = vec![check("cp", ROLE_CONTROL_PLANE, FENCE_AGENTS_TEMPLATE, NS, "bmc")];
    found_templates(&mut f);
    let found = findings(&f);
    assert_eq!(about(&found, "agents", "node-3")[0].severity, Severity::Warning);
    assert!(blocking(&found).is_empty(), "{found:#?}");
}

#[test]
fn an_agent_without_fencing_means_says_how_to_get_one() {
    let mut f = healthy();
    f.registrations[0].means = Means::None;
    let found = findings(&f);
    let node1 = about(&found, "agents", "node-1");
    assert_eq!(node1[0].severity, Severity::Blocking);
    assert!(node1[0].fix.contains("softdog"), "{node1:?}");
    // What the agent found is passed on: why neither a device nor softdog could be had.
    f.fencing_notes.insert(
        "node-1".into(),
        "no softdog device, and it could not be loaded: modprobe: FATAL: Module softdog not found".into(),
    );
    let found = findings(&f);
    let node1 = about(&found, "agents", "node-1");
    assert!(node1[0].fix.contains("Module softdog not found"), "{node1:?}");
}

/// The healthy cluster with only the seed health check `file`, its templates looked up as `lookup`.
fn with_seed(file: &str, lookup: TemplateLookup) -> Facts {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/seed-manifests")
        .join(file);
    let seed: NodeHealthCheck =
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("the seed manifest")).expect("parses");
    let mut f = healthy();
    f.checks = vec![HealthCheck::from_object(&seed)];
    f.templates = f
        .checks
        .iter()
        .flat_map(|c| c.templates())
        .map(|t| (t.clone(), lookup))
        .collect();
    f
}

#[test]
fn the_seed_health_check_on_plain_kubernetes_names_the_plain_equivalents() {
    let found = findings(&with_seed("002-nhc-snr-3node.yaml", TemplateLookup::NotFound));
    let seed_style = about(&found, "openshift", "nhc-snr-3node");
    assert_eq!(seed_style.len(), 2, "{found:#?}");
    assert!(seed_style[0].message.contains("selects 0 nodes"));
    assert!(seed_style[0].fix.contains(ROLE_CONTROL_PLANE));
    assert_eq!(seed_style[1].severity, Severity::Blocking);
    assert!(seed_style[1].message.contains("openshift-workload-availability"));
    assert!(seed_style[1].fix.contains(NS));
}

#[test]
fn the_seed_worker_check_on_kubeadm_nodes_says_what_to_select_and_to_install() {
    let found = findings(&with_seed("001-nhc-worker-default.yaml", TemplateLookup::KindNotServed));
    let worker = about(&found, "openshift", "nhc-worker-default");
    assert_eq!(worker.len(), 1, "{found:#?}");
    assert!(worker[0].fix.contains("DoesNotExist"), "{worker:?}");
    let template = about(&found, "template", "nhc-worker-default");
    assert_eq!(template[0].severity, Severity::Blocking);
    assert!(
        template[0].message.contains("PoisonPillRemediationTemplate"),
        "{template:?}"
    );
    assert!(template[0].fix.contains(SELF_REMEDIATION_TEMPLATE));
}

#[test]
fn templates_missing_or_unserved_block() {
    let mut f = healthy();
    f.checks
        .push(check("w", ROLE_CONTROL_PLANE, SELF_REMEDIATION_TEMPLATE, NS, "gone"));
    f.checks
        .push(check("m3", ROLE_CONTROL_PLANE, "Metal3RemediationTemplate", NS, "m"));
    found_templates(&mut f);
    for (t, lookup) in f.templates.iter_mut() {
        if t.name == "gone" {
            *lookup = TemplateLookup::NotFound;
        } else if t.name == "m" {
            *lookup = TemplateLookup::KindNotServed;
        }
    }
    let found = findings(&f);
    assert!(
        about(&found, "template", "NodeHealthCheck w")[0]
            .fix
            .contains("kubectl -n workload-availability get")
    );
    assert!(
        about(&found, "template", "NodeHealthCheck m3")[0]
            .message
            .contains("CRD")
    );
    assert_eq!(blocking(&found).len(), 2, "{found:#?}");
}

#[test]
fn a_rejected_fence_agents_template_blocks_when_a_health_check_uses_it() {
    let mut f = healthy();
    let why = "fence_redfish has no option --hostname; did you mean --ip?";
    f.fence_templates = vec![far("bmc", Verdict::Failed(why.into()))];
    assert_eq!(
        about(&findings(&f), "fence-agents", "bmc")[0].severity,
        Severity::Warning
    );
    f.checks
        .push(check("far", ROLE_CONTROL_PLANE, FENCE_AGENTS_TEMPLATE, NS, "bmc"));
    found_templates(&mut f);
    let found = findings(&f);
    let bmc = about(&found, "fence-agents", "bmc");
    assert_eq!(bmc[0].severity, Severity::Blocking);
    assert!(
        bmc[0].message.contains(why) && bmc[0].fix.contains("--hostname"),
        "{bmc:?}"
    );
}

#[test]
fn the_out_of_service_taint_depends_on_the_version() {
    let mut f = healthy();
    f.version = Version::parse("1", "25+", "v1.25.4-eks");
    assert_eq!(findings(&f)[0].severity, Severity::Warning);
    f.out_of_service_templates = vec!["FenceAgentsRemediationTemplate workload-availability/bmc".into()];
    let found = findings(&f);
    assert_eq!(found[0].severity, Severity::Blocking);
    assert!(found[0].fix.contains("ResourceDeletion"));
    f.version = Version::parse("1", "27", "v1.27.1");
    assert_eq!(findings(&f)[0].severity, Severity::Warning);
    f.version = Version::parse("1", "28", "v1.28.0");
    assert_eq!(findings(&f)[0].severity, Severity::Ok);
}

#[test]
fn missing_permissions_block_for_the_account_and_warn_for_the_caller() {
    let mut f = healthy();
    let eviction = Permission {
        verb: "create".into(),
        group: String::new(),
        resource: "pods".into(),
        subresource: Some("eviction".into()),
        name: None,
    };
    f.access[0].denied = vec![eviction; 8];
    let found = findings(&f);
    let rbac = about(&found, "rbac", "nodemedic-controller");
    assert_eq!(rbac[0].severity, Severity::Blocking);
    assert!(rbac[0].message.contains("create pods/eviction") && rbac[0].message.contains("and 2 more"));
    f.access[0].subject = Subject::Caller;
    assert_eq!(
        about(&findings(&f), "rbac", "nodemedic-controller")[0].severity,
        Severity::Warning
    );
}

#[test]
fn nodemedic_in_another_namespace_is_pointed_at() {
    let mut f = healthy();
    f.namespace = "elsewhere".into();
    f.elsewhere = [NS.to_owned()].into();
    let found = findings(&f);
    let controller = about(&found, "controller", "elsewhere");
    assert_eq!(controller[0].severity, Severity::Blocking);
    assert!(controller[0].fix.contains("--namespace"), "{controller:?}");
}

const ROLES: [&str; 3] = [ROLE_CONTROL_PLANE, ROLE_MASTER, "node-role.kubernetes.io/worker"];
const MEANS: [Means; 4] = [
    Means::HardwareWatchdog,
    Means::Softdog,
    Means::SoftwareReboot,
    Means::None,
];
const LOOKUPS: [TemplateLookup; 3] = [
    TemplateLookup::Found,
    TemplateLookup::NotFound,
    TemplateLookup::KindNotServed,
];

/// Any cluster: nodes with any roles, any agents, checks on any role with any template.
fn any_facts() -> impl Strategy<Value = Facts> {
    let nodes = prop::collection::vec(
        (prop::collection::vec(any::<bool>(), 3), 0usize..5, any::<bool>()),
        0..5,
    );
    let checks = prop::collection::vec((0usize..3, any::<bool>(), 0usize..3, 0usize..3), 0..3);
    let far = prop::collection::vec((0usize..3, any::<bool>()), 0..2);
    let rest = (15u32..40, any::<bool>(), 0usize..3, any::<bool>(), any::<bool>());
    (nodes, checks, far, rest).prop_map(|(nodes, checks, far, (minor, oos, denied, caller, known_ns))| {
        let mut f = healthy();
        f.nodes = nodes
            .iter()
            .enumerate()
            .map(|(i, (roles, _, _))| {
                let roles: Vec<&str> = ROLES
                    .iter()
                    .zip(roles)
                    .filter(|(_, on)| **on)
                    .map(|(r, _)| *r)
                    .collect();
                node(&format!("node-{i}"), &roles)
            })
            .collect();
        f.registrations = nodes
            .iter()
            .enumerate()
            .filter(|(_, (_, means, _))| *means < MEANS.len())
            .map(|(i, (_, means, disarmed))| Registration {
                disarmed: *disarmed,
                ..agent(&format!("node-{i}"), MEANS[*means])
            })
            .collect();
        let namespaces = [NS, "openshift-workload-availability", "team"];
        f.checks = checks
            .iter()
            .enumerate()
            .map(|(i, (role, far, ns, _))| {
                let kind = if *far {
                    FENCE_AGENTS_TEMPLATE
                } else {
                    SELF_REMEDIATION_TEMPLATE
                };
                check(&format!("c{i}"), ROLES[*role], kind, namespaces[*ns], "t")
            })
            .collect();
        f.templates = f
            .checks
            .iter()
            .zip(&checks)
            .flat_map(|(c, (_, _, _, lookup))| c.templates().into_iter().map(|t| (t.clone(), LOOKUPS[*lookup])))
            .collect::<BTreeMap<_, _>>();
        let verdicts = [Verdict::Passed, Verdict::Failed("bad".into()), Verdict::NotYet];
        f.fence_templates = far
            .iter()
            .map(|(v, credentials)| FenceTemplate {
                credentials: if *credentials {
                    Verdict::Passed
                } else {
                    Verdict::Failed("401".into())
                },
                ..far_template(&verdicts[*v])
            })
            .collect();
        f.version = Version::parse("1", &minor.to_string(), "v1.x");
        if oos {
            f.out_of_service_templates = vec!["FenceAgentsRemediationTemplate workload-availability/t".into()];
        }
        f.access[0].denied = healthy_denied(denied);
        if caller {
            f.access[1].subject = Subject::Caller;
        }
        if !known_ns {
            f.namespaces.remove(NS);
        }
        f
    })
}

fn far_template(parameters: &Verdict) -> FenceTemplate {
    far("t", parameters.clone())
}

fn healthy_denied(count: usize) -> Vec<Permission> {
    (0..count)
        .map(|i| Permission {
            verb: format!("verb-{i}"),
            group: String::new(),
            resource: "nodes".into(),
            subresource: None,
            name: None,
        })
        .collect()
}

fn json_findings(f: &Facts) -> Value {
    serde_json::to_value(findings(f)).expect("findings serialise")
}

proptest! {
    #[test]
    fn every_problem_says_what_to_do(f in any_facts()) {
        for finding in findings(&f) {
            prop_assert!(!finding.subject.is_empty() && !finding.message.is_empty(), "{finding:?}");
            prop_assert_eq!(finding.fix.is_empty(), finding.severity == Severity::Ok, "{:?}", finding);
        }
        let nodes = json_findings(&f).as_array().map(|a| a.iter().filter(|v| v["check"] == "agents").count());
        prop_assert_eq!(nodes, Some(f.nodes.len()), "one agents finding per node");
    }

    /// Healthy: every node has an agent with a watchdog, the checks select nodes with templates
    /// that exist, the accounts have their permissions; whatever the topology, nothing blocks.
    #[test]
    fn a_healthy_cluster_never_blocks(f in any_facts()) {
        let mut f = f;
        // Self remediation needs a peer to accept: one node alone cannot be self-remediated.
        while f.nodes.len() < 2 {
            f.nodes.push(node(&format!("spare-{}", f.nodes.len()), &[]));
        }
        f.namespaces.insert(NS.to_owned());
        f.registrations = f.nodes.iter().map(|n| agent(&n.name, Means::Softdog)).collect();
        f.templates.values_mut().for_each(|l| *l = TemplateLookup::Found);
        f.fence_templates.iter_mut().for_each(|t| t.parameters = Verdict::Passed);
        f.access.iter_mut().for_each(|a| a.denied.clear());
        f.version = Version::parse("1", "30", "v1.30.0");
        let found = findings(&f);
        prop_assert!(blocking(&found).is_empty(), "{:#?}", found);
    }

    #[test]
    fn an_agent_lost_under_self_remediation_blocks(f in any_facts()) {
        let mut f = f;
        f.nodes.push(node("node-x", &[ROLE_CONTROL_PLANE]));
        f.checks.push(check("x", ROLE_CONTROL_PLANE, SELF_REMEDIATION_TEMPLATE, NS, "automatic"));
        f.registrations.retain(|r| r.node != "node-x");
        let found = findings(&f);
        prop_assert_eq!(about(&found, "agents", "node-x")[0].severity, Severity::Blocking);
    }
}
