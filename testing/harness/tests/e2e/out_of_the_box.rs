//! Out of the box, as seed 001 describes: nodemedic installed the way the chart does watches the
//! workers with no health check written by the user (and a fresh install counts at once), and the seed's `nhc-worker-default`, written
//! for Poison Pill, works through the Poison Pill kinds nodemedic serves as self remediation.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use nodemedic_api::{
    healthcheck::{NodeHealthCheck, NodeHealthCheckPhase},
    poison_pill::{PoisonPillRemediation, PoisonPillRemediationTemplate},
    self_remediation::{SelfNodeRemediation, phases},
};
use nodemedic_harness::story::{self, Milestone, Subject};
use nodemedic_lab::{Lab, LabConfig, tools_dir, version};

use crate::{
    membership::{creation_to_running, safe_time},
    selfremediation::{exe, running_pod, snr},
    support::{NS, apply_seed, assert_witness, event_with, eventually, lab, list, scenario, start_controller},
    text,
};
use scenario::node_of;

const LONG: Duration = Duration::from_secs(120);
const DEFAULT_CHECK: &str = "nhc-worker-default";

/// The chart's default health check ConfigMap, rendered with the durations shortened (values the
/// chart offers; the default 300 s would make the test wait five minutes per crash).
fn default_check_configmap() -> String {
    let out = Command::new(tools_dir().join("helm"))
        .args(["template", "nodemedic"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/nodemedic"))
        .arg(format!("--namespace={NS}"))
        .arg(format!("--kube-version={}", version("KUBERNETES_VERSION")))
        .arg(format!(
            "--set-json=defaultHealthCheck.unhealthyConditions={}",
            scenario::test_conditions()
        ))
        .args(["--show-only", "templates/default-health-check.yaml"])
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn check(client: &Client) -> Option<NodeHealthCheck> {
    Api::<NodeHealthCheck>::all(client.clone())
        .get_opt(DEFAULT_CHECK)
        .await
        .expect("read the check")
}

async fn enabled(client: &Client) {
    eventually(&format!("{DEFAULT_CHECK} Enabled"), LONG, || async {
        check(client)
            .await
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeHealthCheckPhase::Enabled))
            .map(|_| ())
    })
    .await
}

async fn poison_pill(client: &Client, node: &str) -> Option<PoisonPillRemediation> {
    list::<PoisonPillRemediation>(client, NS).await.into_iter().find(|r| {
        r.annotations()
            .get("remediation.medik8s.io/node-name")
            .map(String::as_str)
            == Some(node)
    })
}

/// How long after `node`'s remediation was created the workload's pod there was deleted:
/// nodemedic's share of the recovery (the rest, to Running elsewhere, is Kubernetes').
async fn creation_to_release(lab: &Lab, node: &str) -> Duration {
    let remediation = snr(&lab.client(), node).await.expect("the remediation");
    let created = remediation.creation_timestamp().expect("created").0;
    let subject = Subject {
        node: node.to_owned(),
        pod: "vm/db-0".into(),
    };
    // Milestones count from the node's power loss: the only one this lab has seen so far.
    let deleted = story::milestones(&lab.timeline().entries(), &subject)
        .into_iter()
        .find(|r| r.milestone == Milestone::WorkloadDeleted)
        .expect("the timeline shows db-0 deleted")
        .at;
    Duration::try_from(deleted.duration_since(created)).expect("after")
}

/// Powers `node` on and waits until the health check has deleted its remediation.
async fn recovered(lab: &Lab, node: &str) {
    lab.power_on(node).await.expect("power on");
    let client = lab.client();
    eventually(&format!("{node}'s remediations gone"), LONG, || async {
        (snr(&client, node).await.is_none() && poison_pill(&client, node).await.is_none()).then_some(())
    })
    .await;
}

/// A fresh install as the chart installs it, with no health check written by the user: the
/// default check remediates the first node crashed ten seconds after the agents start: its
/// StatefulSet's pod is released within the safe time and 5 s of the remediation's creation
/// (nothing ages before it counts) and runs elsewhere. What is asserted is nodemedic's share;
/// Kubernetes' own, from the release to Running, is printed (on a machine a CI run saturates it
/// has taken 4.5 s: ci-20261207T231434Z). The user's edit of the check survives a controller restart.
/// Then seed 001's manifest, written for Poison Pill, remediates a crashed worker through a
/// PoisonPillRemediation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "a scenario on one lab, read whole in the order it happens: its steps share the lab, its clients and its objects"
)]
async fn a_fresh_install_remediates_with_its_default_check_and_seed_001_works_through_poison_pill() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    // Installed as the chart installs it: its default-check ConfigMap, the configuration, the
    // controller, then an agent per node. No NodeHealthCheck is written here.
    lab.apply_yaml(&default_check_configmap())
        .expect("the chart's ConfigMap");
    let config = scenario::configure(&lab).await.expect("config");
    start_controller(&lab, "controller", &[]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    enabled(&client).await;
    // The creation is reported on the ConfigMap.
    event_with(&client, "DefaultHealthCheckCreated", DEFAULT_CHECK).await;

    let started = Instant::now();
    scenario::start_agents(&lab, &exe(), &config).expect("agents");
    eventually(
        "ten seconds since the agents started",
        Duration::from_secs(20),
        || async { (started.elapsed() >= Duration::from_secs(10)).then_some(()) },
    )
    .await;
    lab.crash(&a).await.expect("crash");
    let moved = running_pod(&client, &[&a]).await;
    let b = node_of(&moved);
    let released = creation_to_release(&lab, &a).await;
    let running = creation_to_running(&lab, &a, &moved).await;
    let safe = safe_time(&client).await;
    println!(
        "fresh install: {a} crashed 10 s after the agents started; db-0 released {:.1}s after the remediation's creation (safe time {}s), Running on {b} after {:.1}s",
        released.as_secs_f64(),
        safe.as_secs(),
        running.as_secs_f64()
    );
    assert!(
        released <= safe + Duration::from_secs(5),
        "{:.1}s from the remediation's creation to the release of db-0, more than the safe time {}s + 5 s",
        released.as_secs_f64(),
        safe.as_secs()
    );
    assert_witness(&lab);
    recovered(&lab, &a).await;

    // A release with other defaults (its ConfigMap changed, the controller restarted) moves the
    // check nobody edited to them.
    lab.apply_yaml(&default_check_configmap().replace("minHealthy: \"51%\"", "minHealthy: \"40%\""))
        .expect("the next release's ConfigMap");
    lab.restart_process("controller").expect("controller restarted");
    eventually("the unedited check at the new defaults", LONG, || async {
        check(&client)
            .await
            .filter(|c| serde_json::to_value(&c.spec).expect("spec")["minHealthy"] == "40%")
            .map(|_| ())
    })
    .await;
    event_with(&client, "DefaultHealthCheckUpdated", DEFAULT_CHECK).await;

    // The user's edit stays: neither a restarted controller nor a release with other defaults
    // writes the check again.
    lab.apply_yaml(&default_check_configmap().replace("minHealthy: \"51%\"", "minHealthy: \"45%\""))
        .expect("yet another release's ConfigMap");
    let edited = serde_json::json!({"spec": {"minHealthy": "34%"}});
    Api::<NodeHealthCheck>::all(client.clone())
        .patch(DEFAULT_CHECK, &PatchParams::default(), &Patch::Merge(&edited))
        .await
        .expect("edit the check");
    lab.restart_process("controller").expect("controller restarted");
    eventually(
        "the restarted controller reading the default check's ConfigMap",
        LONG,
        || async {
            std::fs::read_to_string(lab.log_path("controller"))
                .ok()
                .filter(|log| {
                    log.matches("the default NodeHealthCheck was edited; left as it is")
                        .count()
                        >= 1
                })
                .map(|_| ())
        },
    )
    .await;
    let kept = check(&client).await.expect("the check");
    assert_eq!(
        serde_json::to_value(&kept.spec).expect("spec")["minHealthy"],
        "34%",
        "the edit survived the controller's restart"
    );

    // Seed 001 applied unchanged (its template namespace rewritten to nodemedic's): Poison Pill's
    // default template exists, so the check is Enabled.
    Api::<PoisonPillRemediationTemplate>::namespaced(client.clone(), NS)
        .get("poison-pill-default-template")
        .await
        .expect("the default PoisonPillRemediationTemplate");
    apply_seed(&lab, "001-nhc-worker-default.yaml", |_| {});
    let applied = check(&client).await.expect("the check");
    let spec = serde_json::to_value(&applied.spec).expect("spec");
    assert_eq!(spec["remediationTemplate"]["kind"], "PoisonPillRemediationTemplate");
    assert_eq!(spec["minHealthy"], "51%");
    enabled(&client).await;
    // Only the durations are shortened from here on, to keep the test short.
    let short = serde_json::json!({"spec": {"unhealthyConditions": scenario::test_conditions()}});
    Api::<NodeHealthCheck>::all(client.clone())
        .patch(DEFAULT_CHECK, &PatchParams::default(), &Patch::Merge(&short))
        .await
        .expect("shorten the durations");

    lab.crash(&b).await.expect("crash");
    let moved = running_pod(&client, &[&b]).await;
    println!("Poison Pill: crash of {b} -> db-0 Running on {}", node_of(&moved));
    assert_witness(&lab);
    let ppr = eventually("the PoisonPillRemediation finished", LONG, || async {
        poison_pill(&client, &b)
            .await
            .filter(|r| r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phases::FENCING_COMPLETED))
    })
    .await;
    let carrier: SelfNodeRemediation = snr(&client, &b).await.expect("its SelfNodeRemediation");
    assert_eq!(carrier.name_any(), ppr.name_any());
    assert!(
        carrier
            .owner_references()
            .iter()
            .any(|o| o.kind == "PoisonPillRemediation" && Some(&o.uid) == ppr.uid().as_ref()),
        "{:?}",
        carrier.owner_references()
    );
    event_with(&client, "CarrierCreated", &ppr.name_any()).await;
    // The self-remediation manager's own events reach the PoisonPillRemediation as well.
    let on_ppr = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("PoisonPillRemediation") && r.uid == ppr.uid())
        })
        .filter_map(|e| e.reason)
        .collect::<Vec<_>>();
    assert!(on_ppr.iter().any(|r| r == "NodeFenced"), "{on_ppr:?}");
    recovered(&lab, &b).await;
    assert_witness(&lab);
}
