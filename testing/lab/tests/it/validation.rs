//! The real API server accepts every seed manifest and rejects, for each schema rule of the CRDs,
//! an invalid variant with a message that names the field.

use kube::Api;
use nodemedic_api::self_remediation::{PeerDetection, SelfNodeRemediationConfig};
use nodemedic_lab::{Lab, LabConfig, seeds};

use crate::validation_descheduler as descheduler;

const NS: &str = "nodemedic-test";

fn nhc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: remediation.medik8s.io/v1alpha1\nkind: NodeHealthCheck\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
}

const TEMPLATE: &str = "  remediationTemplate: {apiVersion: self-node-remediation.medik8s.io/v1alpha1, kind: SelfNodeRemediationTemplate, name: t, namespace: nodemedic-test}\n";
const SELECTOR: &str = "  selector: {matchLabels: {role: db}}\n";

fn snrc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: self-node-remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediationConfig\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n{spec}"
    )
}

fn far(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: fence-agents-remediation.medik8s.io/v1alpha1\nkind: FenceAgentsRemediation\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  agent: fence_redfish\n{spec}"
    )
}

const CONFIG: &str = "self-node-remediation-config";

/// (what is wrong, manifest, every fragment the rejection must contain)
#[expect(clippy::too_many_lines, reason = "a table: one entry per schema rule of the CRDs")]
fn invalid_variants() -> Vec<(&'static str, String, Vec<&'static str>)> {
    let both_budgets = format!("{SELECTOR}{TEMPLATE}  minHealthy: 1\n  maxUnhealthy: 1\n");
    let escalation = |order: i32, timeout: &str| {
        format!(
            "  - {{order: {order}, timeout: {timeout}, remediationTemplate: {{apiVersion: x.io/v1, kind: FooTemplate, name: f{order}, namespace: {NS}}}}}\n"
        )
    };
    vec![
        (
            "both budgets",
            nhc("both-budgets", &both_budgets),
            vec!["spec.minHealthy", "set either minHealthy or maxUnhealthy, not both"],
        ),
        (
            "template and escalation",
            nhc(
                "both-templates",
                &format!("{SELECTOR}{TEMPLATE}  escalatingRemediations:\n{}", escalation(1, "5m")),
            ),
            vec![
                "spec.remediationTemplate",
                "set exactly one of remediationTemplate or escalatingRemediations",
            ],
        ),
        (
            "no template",
            nhc("no-template", SELECTOR),
            vec![
                "spec.remediationTemplate",
                "set exactly one of remediationTemplate or escalatingRemediations",
            ],
        ),
        (
            "maxUnhealthy with machine deletion",
            nhc(
                "mdr-max",
                &format!(
                    "{SELECTOR}  maxUnhealthy: 1\n  remediationTemplate: {{apiVersion: machine-deletion-remediation.medik8s.io/v1alpha1, kind: MachineDeletionRemediationTemplate, name: m, namespace: {NS}}}\n"
                ),
            ),
            vec![
                "spec.maxUnhealthy",
                "maxUnhealthy cannot be used with MachineDeletionRemediationTemplate",
            ],
        ),
        (
            "empty selector",
            nhc("empty-selector", &format!("  selector: {{}}\n{TEMPLATE}")),
            vec!["spec.selector", "selector must select nodes"],
        ),
        (
            "negative minHealthy",
            nhc("negative", &format!("{SELECTOR}{TEMPLATE}  minHealthy: -1\n")),
            vec!["spec.minHealthy", "count >= 0"],
        ),
        (
            "minHealthy over 100%",
            nhc("over", &format!("{SELECTOR}{TEMPLATE}  minHealthy: 150%\n")),
            vec!["spec.minHealthy", "should match"],
        ),
        (
            "template without name",
            nhc(
                "nameless",
                &format!(
                    "{SELECTOR}  remediationTemplate: {{apiVersion: x.io/v1, kind: FooTemplate, namespace: {NS}}}\n"
                ),
            ),
            vec!["spec.remediationTemplate", "needs apiVersion, kind and name"],
        ),
        (
            "template kind",
            nhc(
                "kind",
                &format!(
                    "{SELECTOR}  remediationTemplate: {{apiVersion: x.io/v1, kind: Foo, name: f, namespace: {NS}}}\n"
                ),
            ),
            vec!["spec.remediationTemplate", "ending in 'Template'"],
        ),
        (
            "short escalation timeout",
            nhc(
                "short",
                &format!("{SELECTOR}  escalatingRemediations:\n{}", escalation(1, "30s")),
            ),
            vec!["spec.escalatingRemediations[0].timeout", "at least 1m"],
        ),
        (
            "duplicate escalation order",
            nhc(
                "dup",
                &format!(
                    "{SELECTOR}  escalatingRemediations:\n{}{}",
                    escalation(1, "5m"),
                    escalation(1, "6m")
                ),
            ),
            vec!["spec.escalatingRemediations[1]", "Duplicate value"],
        ),
        (
            "bad duration",
            nhc(
                "duration",
                &format!(
                    "{SELECTOR}{TEMPLATE}  unhealthyConditions: [{{type: Ready, status: 'False', duration: 5 minutes}}]\n"
                ),
            ),
            vec!["spec.unhealthyConditions[0].duration", "should match"],
        ),
        (
            "config name",
            snrc("other", "  apiCheckInterval: 15s\n"),
            vec!["must be named self-node-remediation-config"],
        ),
        (
            "apiCheckInterval",
            snrc(CONFIG, "  apiCheckInterval: 500ms\n"),
            vec!["spec.apiCheckInterval", "at least 1s"],
        ),
        (
            "apiServerTimeout",
            snrc(CONFIG, "  apiServerTimeout: 1ms\n"),
            vec!["spec.apiServerTimeout", "at least 10ms"],
        ),
        (
            "peerApiServerTimeout",
            snrc(CONFIG, "  peerApiServerTimeout: 1ms\n"),
            vec!["spec.peerApiServerTimeout", "at least 10ms"],
        ),
        (
            "peerDialTimeout",
            snrc(CONFIG, "  peerDialTimeout: 1ms\n"),
            vec!["spec.peerDialTimeout", "at least 10ms"],
        ),
        (
            "peerRequestTimeout",
            snrc(CONFIG, "  peerRequestTimeout: 1ms\n"),
            vec!["spec.peerRequestTimeout", "at least 10ms"],
        ),
        (
            "peerUpdateInterval",
            snrc(CONFIG, "  peerUpdateInterval: 5s\n"),
            vec!["spec.peerUpdateInterval", "at least 10s"],
        ),
        (
            "maxApiErrorThreshold",
            snrc(CONFIG, "  maxApiErrorThreshold: 0\n"),
            vec!["spec.maxApiErrorThreshold", "greater than or equal to 1"],
        ),
        (
            "hostPort",
            snrc(CONFIG, "  hostPort: 0\n"),
            vec!["spec.hostPort", "greater than or equal to 1"],
        ),
        (
            "peerDetection probePeriod",
            snrc(CONFIG, "  peerDetection: {probePeriod: 50ms, probeRtt: 20ms}\n"),
            vec!["spec.peerDetection.probePeriod", "between 100ms and 60s"],
        ),
        (
            "peerDetection probeRtt",
            snrc(CONFIG, "  peerDetection: {probePeriod: 400ms, probeRtt: 300ms}\n"),
            vec!["spec.peerDetection", "at most half of probePeriod"],
        ),
        (
            "peerDetection numIndirectProbes",
            snrc(CONFIG, "  peerDetection: {numIndirectProbes: 0}\n"),
            vec!["spec.peerDetection.numIndirectProbes", "greater than or equal to 1"],
        ),
        (
            "peerDetection suspectToDownAfter",
            snrc(
                CONFIG,
                "  peerDetection: {probePeriod: 2s, probeRtt: 200ms, suspectToDownAfter: 1s}\n",
            ),
            vec!["spec.peerDetection", "at least probePeriod"],
        ),
        (
            "lab: watchdogFilePath",
            snrc(CONFIG, "  watchdogFilePath: lab:/x\n"),
            vec![
                "spec.watchdogFilePath",
                "not an absolute device path",
                "such as /dev/watchdog",
            ],
        ),
        (
            "relative watchdogFilePath",
            snrc(CONFIG, "  watchdogFilePath: dev/watchdog\n"),
            vec!["spec.watchdogFilePath", "not an absolute device path"],
        ),
        (
            "watchdogFilePath with ..",
            snrc(CONFIG, "  watchdogFilePath: /dev/../tmp/watchdog\n"),
            vec!["spec.watchdogFilePath", "not an absolute device path"],
        ),
        (
            "PoisonPillConfig lab: watchdogFilePath",
            format!(
                "apiVersion: medik8s.io/v1alpha1\nkind: PoisonPillConfig\nmetadata: {{name: poison-pill-config, namespace: {NS}}}\nspec:\n  watchdogFilePath: lab:/x\n"
            ),
            vec!["spec.watchdogFilePath", "not an absolute device path"],
        ),
        (
            "toleration operator",
            snrc(CONFIG, "  customDsTolerations: [{key: a, operator: Maybe}]\n"),
            vec!["spec.customDsTolerations[0]", "operator must be Exists or Equal"],
        ),
        (
            "toleration value",
            snrc(
                CONFIG,
                "  customDsTolerations: [{key: a, operator: Exists, value: b}]\n",
            ),
            vec!["spec.customDsTolerations[0]", "must not have a value"],
        ),
        (
            "toleration effect",
            snrc(
                CONFIG,
                "  customDsTolerations: [{key: a, operator: Exists, effect: Sometimes}]\n",
            ),
            vec!["spec.customDsTolerations[0]", "effect must be"],
        ),
        (
            "requirement operator",
            snrc(
                CONFIG,
                "  customDsNodeSelectorRequirements: [{key: a, operator: Near}]\n",
            ),
            vec!["spec.customDsNodeSelectorRequirements[0]", "operator one of"],
        ),
        (
            "requirement In",
            snrc(CONFIG, "  customDsNodeSelectorRequirements: [{key: a, operator: In}]\n"),
            vec!["spec.customDsNodeSelectorRequirements[0]", "need at least one value"],
        ),
        (
            "requirement Exists",
            snrc(
                CONFIG,
                "  customDsNodeSelectorRequirements: [{key: a, operator: Exists, values: [b]}]\n",
            ),
            vec!["spec.customDsNodeSelectorRequirements[0]", "take no values"],
        ),
        (
            "requirement Gt",
            snrc(
                CONFIG,
                "  customDsNodeSelectorRequirements: [{key: a, operator: Gt, values: [abc]}]\n",
            ),
            vec!["spec.customDsNodeSelectorRequirements[0]", "exactly one integer value"],
        ),
        (
            "agent name",
            format!(
                "apiVersion: fence-agents-remediation.medik8s.io/v1alpha1\nkind: FenceAgentsRemediation\nmetadata: {{name: agent, namespace: {NS}}}\nspec:\n  agent: ipmi\n"
            ),
            vec!["spec.agent", "should match"],
        ),
        (
            "shared action",
            far("shared-action", "  sharedparameters: {'--action': shutdown}\n"),
            vec!["spec.sharedparameters", "--action must be reboot or off"],
        ),
        (
            "shared option name",
            far("shared-name", "  sharedparameters: {'bad key!': x}\n"),
            vec!["spec.sharedparameters", "fence agent option names"],
        ),
        (
            "node action",
            far("node-action", "  nodeparameters: {'--action': {node-1: cycle}}\n"),
            vec!["spec.nodeparameters", "--action must be reboot or off"],
        ),
        (
            "node option name",
            far("node-name", "  nodeparameters: {'bad key!': {node-1: x}}\n"),
            vec!["spec.nodeparameters", "fence agent option names"],
        ),
        (
            "agent timeout",
            far("timeout", "  timeout: 100ms\n"),
            vec!["spec.timeout", "at least 1s"],
        ),
        (
            "template action",
            format!(
                "apiVersion: fence-agents-remediation.medik8s.io/v1alpha1\nkind: FenceAgentsRemediationTemplate\nmetadata: {{name: t, namespace: {NS}}}\nspec:\n  template:\n    spec:\n      agent: fence_redfish\n      sharedparameters: {{'--action': shutdown}}\n"
            ),
            vec!["spec.template.spec.sharedparameters", "--action must be reboot or off"],
        ),
        (
            "an agent that does not fence by power",
            format!(
                "apiVersion: fence-agents-remediation.medik8s.io/v1alpha1\nkind: FenceAgentsRemediationTemplate\nmetadata: {{name: sbd, namespace: {NS}}}\nspec:\n  template:\n    spec:\n      agent: fence_sbd\n"
            ),
            vec![
                "spec.template.spec.agent",
                "fence_sbd fences through a shared disk",
                "name the power agent of its BMC",
            ],
        ),
        (
            "a storage fencing agent",
            far("scsi", "").replace("fence_redfish", "fence_scsi"),
            vec!["spec.agent", "fence_scsi fences storage"],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_manifests_are_accepted_and_each_schema_rule_rejects_its_invalid_variant() {
    crate::support::logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    lab.apply_yaml(&format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"))
        .expect("namespace");

    let mut files: Vec<_> = std::fs::read_dir(seeds::dir().expect("seed dir"))
        .expect("readable")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10);
    lab.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {}}}\n",
        descheduler::SEED_NAMESPACE
    ))
    .expect("namespace");
    for file in &files {
        let manifest = seeds::load(file).expect("loads");
        // The others name OpenShift's namespaces; the descheduler's is created above, so it applies unchanged.
        let manifest = if file == descheduler::SEED {
            manifest
        } else {
            seeds::in_namespace(manifest, NS)
        };
        lab.apply_yaml(&seeds::yaml(&manifest))
            .unwrap_or_else(|e| panic!("{file} rejected: {e}"));
    }

    let mut failures = Vec::new();
    for (what, manifest, fragments) in invalid_variants().into_iter().chain(descheduler::invalid_variants()) {
        match lab.apply_yaml(&manifest) {
            Ok(out) => failures.push(format!("{what}: accepted ({out})")),
            Err(error) => {
                let text = error.to_string();
                for fragment in fragments.iter().filter(|f| !text.contains(**f)) {
                    failures.push(format!("{what}: rejection lacks {fragment:?}: {text}"));
                }
            }
        }
    }

    let immutable = "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata: {name: nodemaintenance-worker-1}\nspec: {nodeName: worker-2, reason: moved}\n";
    match lab.apply_yaml(immutable) {
        Ok(out) => failures.push(format!("nodeName change accepted: {out}")),
        Err(e) if e.to_string().contains("spec.nodeName") && e.to_string().contains("nodeName is immutable") => {}
        Err(e) => failures.push(format!("nodeName change rejected without naming the field: {e}")),
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // An absolute device path is accepted (the lab's emulated device is one too).
    lab.apply_yaml(&snrc(CONFIG, "  watchdogFilePath: /dev/watchdog1\n"))
        .expect("an absolute watchdogFilePath is valid");
    let device = lab.watchdog_device_path("node-1").display().to_string();
    lab.apply_yaml(&snrc(CONFIG, &format!("  watchdogFilePath: {device}\n")))
        .expect("the lab's emulated device path is valid");

    // An empty peerDetection turns the detector on with the documented defaults.
    lab.apply_yaml(&snrc(CONFIG, "  peerDetection: {}\n"))
        .expect("an empty peerDetection is valid");
    let config = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS)
        .get(CONFIG)
        .await
        .expect("the config");
    let detection = config.spec.peer_detection.expect("peerDetection kept");
    let defaults = PeerDetection::default();
    for (field, got, want) in [
        ("probePeriod", &detection.probe_period, &defaults.probe_period),
        ("probeRtt", &detection.probe_rtt, &defaults.probe_rtt),
        (
            "suspectToDownAfter",
            &detection.suspect_to_down_after,
            &defaults.suspect_to_down_after,
        ),
    ] {
        assert_eq!(got.duration(), want.duration(), "{field}");
    }
    assert_eq!(detection.num_indirect_probes, defaults.num_indirect_probes);
}
