//! Nodes without a watchdog device: the agent still runs and says what it has. With software
//! reboot its own timer fences the node; with nothing at all the remediation fails at once and an
//! escalating health check moves on to fence agents.

use std::time::Duration;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{Api, ResourceExt};
use nodemedic_api::self_remediation::SelfNodeRemediation;
use nodemedic_lab::{BmcOptions, Event, Lab, LabConfig};
use serde_json::json;

use crate::{
    selfremediation::{exe, fenced, running_pod, snr},
    support::{NS, apply_seed, apply_seed_check, assert_witness, eventually, lab, scenario, start_controller},
};
use scenario::{LabWatchdog, node_of};

const LONG: Duration = Duration::from_secs(180);

/// Why a node's agent passed better means over, as it registered.
async fn fencing_note(lab: &Lab, node: &str) -> String {
    Api::<Lease>::namespaced(lab.client(), NS)
        .get(&format!("nodemedic-agent-{node}"))
        .await
        .expect("the registration")
        .annotations()
        .get("nodemedic.medik8s.io/fencing-note")
        .cloned()
        .unwrap_or_default()
}

/// The means a node's agent registered.
pub(crate) async fn means(lab: &Lab, node: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(lab.client(), NS)
        .get_opt(&format!("nodemedic-agent-{node}"))
        .await
        .ok()??;
    lease.annotations().get("nodemedic.medik8s.io/fencing-means").cloned()
}

/// Nodemedic with every agent on its node's emulated watchdog device except `bare`'s, which has none
/// and cannot load softdog; the SelfNodeRemediationConfig is the fast one with `patch` merged.
async fn install(lab: &Lab, bare: &str, patch: serde_json::Value) {
    install_with(lab, bare, LabWatchdog::Missing, patch).await;
}

/// [`install`], `bare`'s agent with `watchdog`.
async fn install_with(lab: &Lab, bare: &str, watchdog: LabWatchdog, patch: serde_json::Value) {
    let mut config: serde_json::Value = serde_json::from_str(scenario::FAST_CONFIG).expect("json");
    json_patch::merge(&mut config, &patch);
    let config = scenario::configure_with(lab, &config.to_string())
        .await
        .expect("config");
    for node in lab.nodes() {
        let watchdog = if node == bare { watchdog } else { LabWatchdog::Device };
        scenario::start_node_agent(lab, &exe(), &config, &node, watchdog).expect("agent");
    }
    scenario::agents_settled(lab).await.expect("agents settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_watchdog_device_fences_itself_by_software_reboot() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    start_controller(&lab, "controller", &[]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    install(&lab, &a, json!({"spec": {"isSoftwareRebootEnabled": true}})).await;
    assert_eq!(means(&lab, &a).await.as_deref(), Some("software-reboot"));
    let node = Api::<Node>::all(client.clone()).get(&a).await.expect("node");
    assert_eq!(
        node.annotations()
            .get("is-reboot-capable.self-node-remediation.medik8s.io")
            .map(String::as_str),
        Some("true")
    );
    let status = crate::status::status(&lab, &["-o", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&status).expect("json");
    let row = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["node"] == a.as_str()))
        .expect("a row");
    assert_eq!(
        row["fencing"], "software-reboot",
        "nodemedic status shows its means: {status}"
    );
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});

    // Cut off, it cannot renew its licence: its own timer reboots it (sysrq, which the lab
    // catches), and its workload moves once that is proven.
    lab.partition(&[&a]).await.expect("partition");
    let moved = running_pod(&client, &[&a]).await;
    println!("{a} without a watchdog device: db-0 moved to {}", node_of(&moved));
    let rebooted = lab
        .timeline()
        .entries()
        .into_iter()
        .any(|e| matches!(&e.event, Event::SoftwareReboot { node } if *node == a));
    assert!(
        rebooted,
        "{a} rebooted itself by software:\n{}",
        lab.timeline().render()
    );
    assert_eq!(fenced(&lab), vec![a.clone()], "only the cut-off node fenced");
    assert_witness(&lab);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_no_means_fails_at_once_and_an_escalating_check_moves_on_to_fence_agents() {
    let lab = lab(LabConfig::seed().with_bmcs(BmcOptions::default())).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    apply_seed(&lab, "002-far-template.yaml", |m| scenario::adapt_far_template(&lab, m));
    start_controller(&lab, "controller", &[]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    install(&lab, &a, json!({"spec": {"isSoftwareRebootEnabled": false}})).await;
    assert_eq!(
        means(&lab, &a).await.as_deref(),
        Some("none"),
        "the agent runs and says so"
    );
    let note = fencing_note(&lab, &a).await;
    assert!(
        note.contains("no such device") && note.contains("Module softdog not found"),
        "the registration says why neither a device nor softdog: {note}"
    );
    let report = crate::doctor::report(&crate::doctor::doctor(&lab, &["-o", "json"]));
    let found = crate::doctor::findings(&report, "agents", &a);
    assert!(
        found.iter().any(|f| f["fix"]
            .as_str()
            .is_some_and(|fix| fix.contains("Module softdog not found"))),
        "doctor passes it on: {found:#?}"
    );
    let node = Api::<Node>::all(client.clone()).get(&a).await.expect("node");
    assert_eq!(
        node.annotations()
            .get("is-reboot-capable.self-node-remediation.medik8s.io")
            .map(String::as_str),
        Some("false")
    );
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |m| {
        let spec = m["spec"].as_object_mut().expect("spec");
        let snr = spec.remove("remediationTemplate").expect("template");
        let far = json!({"apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
            "kind": "FenceAgentsRemediationTemplate", "namespace": NS,
            "name": "famt-3node"});
        spec.insert(
            "escalatingRemediations".into(),
            json!([{"remediationTemplate": snr, "order": 0, "timeout": "300s"},
                   {"remediationTemplate": far, "order": 1, "timeout": "300s"}]),
        );
    });

    lab.partition(&[&a]).await.expect("partition");
    // FencingSafe=False says why (Succeeded=False says so too, until the escalating health check
    // times the remediation out and it reports that instead).
    let (remediation, condition) = eventually("the self remediation fails at once", LONG, || async {
        let r: SelfNodeRemediation = snr(&client, &a).await?;
        let not_safe = r
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "FencingSafe" && c.status == "False")?
            .clone();
        Some((r, not_safe))
    })
    .await;
    assert!(
        condition.message.contains("nothing can fence the node"),
        "{}",
        condition.message
    );
    let created = remediation.creation_timestamp().expect("created").0;
    let waited = Duration::try_from(condition.last_transition_time.0.duration_since(created)).expect("after");
    assert!(
        waited < Duration::from_secs(10),
        "it failed {waited:?} after its creation"
    );
    let moved = running_pod(&client, &[&a]).await;
    println!(
        "{a} with no means: escalated to fence agents, db-0 moved to {}",
        node_of(&moved)
    );
    let powered_off_by_bmc = lab
        .timeline()
        .entries()
        .into_iter()
        .any(|e| matches!(&e.event, Event::Power { node, on: false, cause } if *node == a && cause == "bmc"));
    assert!(
        powered_off_by_bmc,
        "fence agents powered {a} off:\n{}",
        lab.timeline().render()
    );
    assert_witness(&lab);
}

/// Seed 004: a node without a watchdog device falls back to softdog. The agent loads it (through
/// the lab's stand-in for modprobe, which makes the node's softdog appear on its lab watchdog),
/// registers it, and when cut off stops feeding it: softdog resets the node, and the workload
/// moves once that is proven.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_watchdog_device_loads_softdog_and_it_fences_the_node() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    start_controller(&lab, "controller", &[]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    install_with(
        &lab,
        &a,
        LabWatchdog::Softdog,
        json!({"spec": {"isSoftwareRebootEnabled": false}}),
    )
    .await;
    assert_eq!(means(&lab, &a).await.as_deref(), Some("softdog"));
    let note = fencing_note(&lab, &a).await;
    assert!(
        note.contains("no such device"),
        "the configured device was missing: {note}"
    );
    assert!(
        lab.watchdog_device_stats(&a).expect("stats").opens >= 1,
        "the softdog the agent loaded is the node's lab watchdog"
    );
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});

    lab.partition(&[&a]).await.expect("partition");
    let moved = running_pod(&client, &[&a]).await;
    println!("{a} with softdog: db-0 moved to {}", node_of(&moved));
    let expired = lab
        .timeline()
        .entries()
        .into_iter()
        .any(|e| matches!(&e.event, Event::WatchdogExpired { node } if *node == a));
    assert!(expired, "softdog reset {a}:\n{}", lab.timeline().render());
    assert_eq!(fenced(&lab), vec![a.clone()], "only the cut-off node fenced");
    assert_witness(&lab);
}
