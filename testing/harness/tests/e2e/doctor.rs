//! `nodemedic doctor` against a misconfigured lab (the seed health check as published, a
//! fence-agents template the agent rejects, a node without its agent): each planted problem with
//! its fix, and exit status 1. The healthy case runs against the playground (`lab_cli`).

use std::{
    process::{Command, Output},
    time::Duration,
};

use kube::Api;
use nodemedic_api::{
    fence_agents::FenceAgentsRemediationTemplate,
    names::{conditions as types, labels::ROLE_CONTROL_PLANE},
    self_remediation::AUTOMATIC_TEMPLATE_NAME,
};
use nodemedic_harness::scenario::LabWatchdog;
use nodemedic_lab::{Lab, LabConfig, NodeSpec, seeds};
use serde_json::{Value, json};

use crate::{
    support::{NS, apply_seed, eventually, lab, scenario, start_controller},
    text,
};

pub(crate) fn doctor(lab: &Lab, args: &[&str]) -> Output {
    Command::new(crate::nodemedic_exe())
        .arg("doctor")
        .args(args)
        .env("KUBECONFIG", lab.kubeconfig())
        .output()
        .expect("nodemedic doctor runs")
}

pub(crate) fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("a JSON report ({e}): {}", text(out)))
}

/// The findings of `check` whose subject contains `subject`.
pub(crate) fn findings<'a>(report: &'a Value, check: &str, subject: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|f| f["check"] == check && f["subject"].as_str().is_some_and(|s| s.contains(subject)))
                .collect()
        })
        .unwrap_or_default()
}

fn blocking_subjects(report: &Value) -> Vec<String> {
    let mut subjects: Vec<String> = report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "blocking")
        .filter_map(|f| f["subject"].as_str().map(str::to_owned))
        .collect();
    subjects.sort();
    subjects.dedup();
    subjects
}

fn template_ref(api_version: &str, kind: &str, name: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "namespace": NS, "name": name})
}

fn self_remediation_template() -> Value {
    template_ref(
        "self-node-remediation.medik8s.io/v1alpha1",
        "SelfNodeRemediationTemplate",
        AUTOMATIC_TEMPLATE_NAME,
    )
}

/// A health check in plain Kubernetes terms: the control-plane label, templates in nodemedic's
/// namespace.
fn plain_health_check(spec: Value) -> String {
    let mut check = json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "plain"},
        "spec": {"selector": {"matchExpressions": [{"key": ROLE_CONTROL_PLANE, "operator": "Exists"}]}}
    });
    json_patch::merge(&mut check["spec"], &spec);
    check.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_each_planted_misconfiguration_with_its_fix() {
    // Plain Kubernetes nodes: control-plane, without OpenShift's master label.
    let nodes = (1..=3)
        .map(|i| {
            let mut node = NodeSpec::worker(&format!("node-{i}"));
            node.labels.insert(ROLE_CONTROL_PLANE.into(), String::new());
            node
        })
        .collect();
    let lab = lab(LabConfig::new(nodes)).await;
    let config = scenario::configure(&lab).await.expect("config");
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    start_controller(&lab, "controller", &[]);
    // Planted: node-3 gets no agent.
    for node in ["node-1", "node-2"] {
        scenario::start_node_agent(&lab, &crate::nodemedic_exe(), &config, node, LabWatchdog::Device).expect("agent");
    }
    scenario::members_are(&lab, &["node-1".to_owned(), "node-2".to_owned()])
        .await
        .expect("two agents registered");
    // Planted: the seed health check exactly as published (OpenShift's master label, templates
    // in openshift-workload-availability).
    let seed = seeds::load("002-nhc-snr-3node.yaml").expect("the seed health check");
    lab.apply_yaml(&seeds::yaml(&seed))
        .expect("the seed health check applies");
    // Planted: the seed fence-agents template, whose --hostname fence_redfish does not have.
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    apply_seed(&lab, "002-far-template.yaml", |_| {});
    // A correct health check that relies on self remediation (so node-3 needs its agent), then
    // on the fence-agents template.
    lab.apply_yaml(&plain_health_check(json!({"escalatingRemediations": [
        {"remediationTemplate": self_remediation_template(), "order": 0, "timeout": "5m"},
        {"remediationTemplate": template_ref("fence-agents-remediation.medik8s.io/v1alpha1",
            "FenceAgentsRemediationTemplate", "famt-3node"), "order": 1, "timeout": "5m"},
    ]})))
    .expect("the plain health check");
    let templates = Api::<FenceAgentsRemediationTemplate>::namespaced(lab.client(), NS);
    eventually(
        "the fence-agents controller to reject the template's parameters",
        Duration::from_secs(120),
        || async {
            let t = templates.get_opt("famt-3node").await.ok().flatten()?;
            let c = nodemedic_kube::conditions::find(t.status.as_ref()?.conditions.as_ref()?, types::PARAMETERS_VALID)?;
            (c.status == "False" && c.observed_generation == t.metadata.generation).then_some(())
        },
    )
    .await;

    let out = doctor(&lab, &["-o", "json"]);
    let report = report(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}\n{}", text(&out));

    let seed_style = findings(&report, "openshift", "NodeHealthCheck nhc-snr-3node");
    let selector = seed_style
        .iter()
        .find(|f| {
            f["message"]
                .as_str()
                .is_some_and(|m| m.contains("node-role.kubernetes.io/master"))
        })
        .unwrap_or_else(|| panic!("the master selector: {report:#}"));
    assert!(
        selector["fix"].as_str().is_some_and(|f| f.contains(ROLE_CONTROL_PLANE)),
        "{selector}"
    );
    let namespace = seed_style
        .iter()
        .find(|f| {
            f["message"]
                .as_str()
                .is_some_and(|m| m.contains("openshift-workload-availability"))
        })
        .unwrap_or_else(|| panic!("the OpenShift namespace: {report:#}"));
    assert_eq!(namespace["severity"], "blocking", "{namespace}");
    assert!(namespace["fix"].as_str().is_some_and(|f| f.contains(NS)), "{namespace}");

    let far = findings(&report, "fence-agents", "famt-3node");
    assert_eq!(far[0]["severity"], "blocking", "{report:#}");
    assert!(
        far[0]["message"].as_str().is_some_and(|m| m.contains("--hostname")),
        "{}",
        far[0]
    );

    let node3 = findings(&report, "agents", "node node-3");
    assert_eq!(node3[0]["severity"], "blocking", "{report:#}");
    assert!(node3[0]["fix"].as_str().is_some_and(|f| !f.is_empty()));
    for node in ["node-1", "node-2"] {
        assert_eq!(
            findings(&report, "agents", &format!("node {node}"))[0]["severity"],
            "ok"
        );
    }

    assert_eq!(
        blocking_subjects(&report),
        [
            format!("FenceAgentsRemediationTemplate {NS}/famt-3node"),
            "NodeHealthCheck nhc-snr-3node".to_owned(),
            "node node-3".to_owned(),
        ],
        "nothing else blocks: {report:#}"
    );
}
