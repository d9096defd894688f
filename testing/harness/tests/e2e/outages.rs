//! Control-plane outages longer than any bound the licence protocol once had: no agent that
//! reaches a majority of its peers fences, however long the API server or etcd is gone, and
//! nothing healthy is remediated when it comes back.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use nodemedic_api::self_remediation::SelfNodeRemediation;
use nodemedic_lab::{Lab, LabConfig, Timings};

use crate::{
    selfremediation::{cluster_with_seed_durations, fenced},
    support::{NS, eventually, list, scenario},
};
use scenario::LabWatchdog;

const OUTAGE: Duration = Duration::from_secs(600);
/// After the control plane is back: longer than Kubernetes' default node-monitor grace (50 s)
/// plus the seed check's 10 s durations, so a node wrongly seen unhealthy would be remediated,
/// and longer than the agents' 60 s watchdog, so an agent that gave up feeding it at the end of
/// the outage would be seen power-cycled.
const AFTERMATH: Duration = Duration::from_secs(70);

#[derive(Clone, Copy, Debug)]
enum Outage {
    ApiServer,
    Etcd,
}

/// Keeps the control plane down for [`OUTAGE`], checking all along that no node fences, then
/// brings it back and checks for [`AFTERMATH`] that nothing is remediated or fenced.
async fn outage(lab: &Lab, kind: Outage) {
    match kind {
        Outage::ApiServer => lab.stop_apiserver().await,
        Outage::Etcd => lab.stop_etcd().await,
    }
    .expect("stop");
    let since = Instant::now();
    eventually(&format!("a {kind:?} outage of {OUTAGE:?}"), OUTAGE * 2, || async {
        assert!(
            fenced(lab).is_empty(),
            "a node fenced {:?} into the {kind:?} outage: {:?}",
            since.elapsed(),
            fenced(lab)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        (since.elapsed() >= OUTAGE).then_some(())
    })
    .await;
    let restarted = Instant::now();
    match kind {
        Outage::ApiServer => lab.start_apiserver().await,
        Outage::Etcd => lab.start_etcd().await,
    }
    .expect("start");
    let answering = restarted.elapsed();
    let client = lab.client();
    let back = Instant::now();
    eventually(
        &format!("{AFTERMATH:?} after the {kind:?} outage"),
        AFTERMATH * 2,
        || async {
            assert!(
                fenced(lab).is_empty(),
                "a node fenced after the {kind:?} outage: {:?}",
                fenced(lab)
            );
            let lost: Vec<String> = kube::Api::<Node>::all(client.clone())
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|all| all.iter().any(|c| c.type_ == "PeersReachable" && c.status == "False"))
                })
                .map(|n| n.metadata.name.unwrap_or_default())
                .collect();
            assert!(
                lost.is_empty(),
                "nodes unreachable by peers after the {kind:?} outage: {lost:?}"
            );
            let remediations = list::<SelfNodeRemediation>(&client, NS).await;
            assert!(
                remediations.is_empty(),
                "a healthy node was remediated after the {kind:?} outage: {:?}",
                remediations.iter().map(|r| r.metadata.name.clone()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
            (back.elapsed() >= AFTERMATH).then_some(())
        },
    )
    .await;
    println!(
        "{kind:?} outage of {OUTAGE:?}: the API answered {:.1}s after the restart, then {:.1}s of \
         aftermath; no node fenced, nothing remediated",
        answering.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
}

/// The seed's self-remediation timings (API checks every 15 s, so an agent with neither the API
/// nor its peers fences after 72 s) with the peer failure detector on, on a cluster with
/// Kubernetes' default failure detection (40 s kubelet leases, 50 s node-monitor grace), through
/// one ten-minute outage: no node fences or becomes unreachable by peers, nothing healthy is
/// remediated, and every agent still feeds its watchdog.
///
/// Each outage has a test and a lab of its own, so CI runs the two side by side (two slots for
/// labs on tolerant timings, see `nodemedic_lab::LabKind`) beside the other lab tests: one after
/// the other in one lab they took 25 minutes, the longest thread of a CI run. The outages keep
/// their full length, and what they prove only gets harder to meet, since the agents must keep
/// their peers, their watchdogs fed and their API checks on time on a machine whose CPU other
/// labs are using.
async fn survives(kind: Outage) {
    let started = Instant::now();
    let config = LabConfig::seed().with_timings(Timings::kubernetes_defaults());
    let (lab, _) = cluster_with_seed_durations(
        config,
        LabWatchdog::Device,
        &scenario::with_detector(scenario::SEED_TIMINGS_CONFIG),
    )
    .await;
    println!("cluster ready in {:?}", started.elapsed());
    outage(&lab, kind).await;
    println!("the {kind:?} outage and its aftermath done at {:?}", started.elapsed());
    assert!(
        lab.nodes().iter().all(|n| lab.watchdog_armed(n)),
        "every agent still feeds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_minute_api_server_outage_fences_nobody_and_remediates_nothing_healthy() {
    survives(Outage::ApiServer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_minute_etcd_outage_fences_nobody_and_remediates_nothing_healthy() {
    survives(Outage::Etcd).await;
}
