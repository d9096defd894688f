//! Self remediation's membership end to end: nodes join and leave while it runs, and a wait
//! survives a controller that keeps restarting. (A fresh install remediating within seconds of
//! its agents starting is shown by `out_of_the_box`, installed as the chart installs it.)

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig};
use nodemedic_lab::{Lab, LabConfig, NodeSpec};

use crate::{
    selfremediation::{cluster, exe, running_pod, snr},
    support::{NS, assert_witness, eventually, recorded_running, scenario},
};
use scenario::{LabWatchdog, node_of};

/// The provable safe time the manager reports for the registered agents.
pub(crate) async fn safe_time(client: &Client) -> Duration {
    let config = Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), NS)
        .get(CONFIG_NAME)
        .await
        .expect("config");
    let seconds = config
        .status
        .and_then(|s| s.minimum_safe_time_seconds)
        .expect("a minimum safe time");
    Duration::from_secs(u64::try_from(seconds).expect("positive"))
}

/// From the node's remediation's creation to the moved pod Running.
pub(crate) async fn creation_to_running(lab: &Lab, node: &str, moved: &Pod) -> Duration {
    let remediation = snr(&lab.client(), node).await.expect("the remediation");
    let created = remediation.creation_timestamp().expect("created").0;
    Duration::try_from(recorded_running(lab, moved).await.duration_since(created)).expect("after")
}

/// A node added to a running cluster is a member within seconds of its agent starting; a Node
/// deleted leaves the membership with no administrator, and a remediation still completes safely
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_within_seconds_and_a_deleted_node_leaves_without_an_administrator() {
    let (lab, a) = cluster(LabConfig::seed()).await;
    let client = lab.client();
    let config = Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), NS)
        .get(CONFIG_NAME)
        .await
        .expect("config");

    lab.add_node(NodeSpec::control_plane_worker("node-4"))
        .await
        .expect("node-4 added");
    let started = Instant::now();
    scenario::start_node_agent(&lab, &exe(), &config, "node-4", LabWatchdog::Device).expect("node-4's agent");
    let all: Vec<String> = ["node-1", "node-2", "node-3", "node-4"].map(String::from).to_vec();
    scenario::members_are(&lab, &all).await.expect("node-4 joins");
    let joined = started.elapsed();
    println!(
        "node-4 is a member {:.1}s after its agent started",
        joined.as_secs_f64()
    );
    assert!(joined < Duration::from_secs(20), "joining took {joined:?}");

    let gone = lab
        .nodes()
        .into_iter()
        .find(|n| *n != a && n != "node-4")
        .expect("a node to remove");
    lab.remove_node(&gone).await.expect("node removed");
    let rest: Vec<String> = all.iter().filter(|n| **n != gone).cloned().collect();
    scenario::members_are(&lab, &rest)
        .await
        .expect("the deleted node leaves");
    eventually(
        &format!("{gone}'s registration gone"),
        Duration::from_secs(60),
        || async {
            let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), NS);
            leases
                .get_opt(&format!("nodemedic-agent-{gone}"))
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;

    lab.crash(&a).await.expect("crash");
    let moved = running_pod(&client, &[&a, &gone]).await;
    println!("after the changes: db-0 moved from {a} to {}", node_of(&moved));
    assert_witness(&lab);
}

/// The controller killed and restarted every 7 s from the moment of a crash (shorter than the
/// 15 s safe time): each new leader continues the wait on the API server's clock, so the workload
/// still comes back, within the safe time and 10 s of the remediation's creation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_every_seven_seconds_still_brings_the_workload_back() {
    let (lab, a) = cluster(LabConfig::seed()).await;
    let client = lab.client();
    let safe = safe_time(&client).await;
    lab.crash(&a).await.expect("crash");
    let not_on = [a.as_str()];
    let moved = scenario::running_pod(&client, &not_on, Duration::from_secs(300));
    tokio::pin!(moved);
    let every = Duration::from_secs(7);
    let mut restarts = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut count = 0;
    let moved = loop {
        tokio::select! {
            pod = &mut moved => break pod.expect("db-0 Running elsewhere"),
            _ = restarts.tick() => {
                lab.restart_process("controller").expect("controller restarted");
                count += 1;
            }
        }
    };
    let took = creation_to_running(&lab, &a, &moved).await;
    println!(
        "{count} controller restarts: db-0 Running on {} {:.1}s after the remediation's creation (safe time {}s)",
        node_of(&moved),
        took.as_secs_f64(),
        safe.as_secs()
    );
    assert!(count >= 3, "the controller restarted only {count} times");
    assert!(
        took <= safe + Duration::from_secs(10),
        "{:.1}s from the remediation's creation to Running",
        took.as_secs_f64()
    );
    assert_witness(&lab);
}
