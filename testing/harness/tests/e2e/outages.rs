//! Control-plane outages longer than any bound the licence protocol once had: no agent that
//! reaches a majority of its peers fences, however long the API server or etcd is gone, and
//! nothing healthy is remediated when it comes back; and a node that crashes right after the
//! control plane is back is remediated as fast as one that crashes at any other time.

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod},
};
use nodemedic_api::{
    healthcheck::NodeHealthCheck,
    self_remediation::{SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_harness::story::{self, Milestone, Subject};
use nodemedic_lab::{Lab, LabConfig, Timings};

use crate::{
    defaults::with_the_charts_defaults,
    selfremediation::{cluster_with_seed_durations, fenced, snr},
    support::{NS, assert_witness, eventually, list, scenario},
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
    let answering = outage_for(lab, kind, OUTAGE, &[]).await;
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

/// An outage of several minutes: long enough for every backoff involved to reach its cap
/// (kube-runtime's watches and client-go's reflectors in Kubernetes' own controllers double from
/// 0.8 s to 30 s, capped after about a minute and a half with jitter; the controller's lease
/// expires after 15 s), so a longer one brings nothing back later; short enough for CI.
const SEVERAL_MINUTES: Duration = Duration::from_secs(180);
/// When the workload's node crashes after the control plane answers again: inside the window
/// where a watch asleep in a 30 s backoff has not yet come back (issue 60's 30 s).
const CRASH_AFTER_RETURN: Duration = Duration::from_secs(30);
/// How much later than at rest nodemedic may release the workload after the outage.
const SLACK: Duration = Duration::from_secs(5);
/// How long the test waits, after the release, to show Kubernetes' share after the outage: its
/// StatefulSet controller may wait minutes for its informers to catch up after an API server
/// restart (73 s and more than 160 s in two runs), which is not nodemedic's to shorten.
const KUBERNETES_SHARE_SHOWN: Duration = Duration::from_secs(60);

/// One crash of the workload's node, as the lab timeline tells it.
struct Recovery {
    /// Where the workload runs now, if it ran elsewhere within the time allowed.
    moved_to: Option<String>,
    /// Crash to the workload's pod deleted (released by nodemedic, its fencing proven): what
    /// nodemedic controls.
    released: Duration,
    /// Crash to the workload Running elsewhere: the release and then Kubernetes' own share (the
    /// StatefulSet controller's new pod, the scheduler, the volume's attachment).
    running: Option<Duration>,
    /// Each milestone's seconds after the crash.
    story: String,
}

impl Recovery {
    /// Kubernetes' share, from the release to Running elsewhere.
    fn kubernetes_share(&self) -> String {
        self.running.map_or_else(
            || "not Running yet".to_owned(),
            |running| format!("{:.1}s", running.saturating_sub(self.released).as_secs_f64()),
        )
    }
}

/// How long the workload may take to be released after a crash (nodemedic's share).
const RELEASE_WITHIN: Duration = Duration::from_secs(180);

/// Crashes `node` (the workload's) and waits until the timeline shows the workload released, then
/// up to `running_within` for it to run elsewhere.
async fn crash(lab: &Lab, node: &str, running_within: Duration) -> Recovery {
    let crashed = Instant::now();
    let since = jiff::Timestamp::now();
    lab.crash(node).await.expect("crash");
    let subject = Subject {
        node: node.to_owned(),
        pod: "vm/db-0".into(),
    };
    let milestones = || {
        let entries: Vec<_> = lab.timeline().entries().into_iter().filter(|e| e.at >= since).collect();
        story::milestones(&entries, &subject)
    };
    eventually(
        &format!("db-0 released after {node}'s crash"),
        RELEASE_WITHIN,
        || async {
            milestones()
                .iter()
                .any(|r| r.milestone == Milestone::WorkloadDeleted)
                .then_some(())
        },
    )
    .await;
    let moved = scenario::running_pod(&lab.client(), &[node], running_within).await.ok();
    let running = moved.as_ref().map(|_| crashed.elapsed());
    let reached = milestones();
    let after =
        |at: jiff::Timestamp| Duration::from_secs_f64((at - since).total(jiff::Unit::Second).unwrap_or(0.0).max(0.0));
    let released = reached
        .iter()
        .find(|r| r.milestone == Milestone::WorkloadDeleted)
        .map(|r| after(r.at))
        .expect("the timeline shows the workload's pod deleted");
    let told: Vec<String> = reached
        .iter()
        .map(|r| format!("{:?} +{:.1}s", r.milestone, after(r.at).as_secs_f64()))
        .collect();
    Recovery {
        moved_to: moved.as_ref().map(scenario::node_of),
        released,
        running,
        story: told.join(", "),
    }
}

/// Whether the API server serves a list of `api`'s kind (one item is enough).
async fn served<K>(api: kube::Api<K>) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .is_ok()
}

/// After an etcd outage the API server answers `/readyz` while some of its storage (each custom
/// resource's, say) is still reconnecting to etcd by gRPC's backoff, up to two minutes: reads of
/// those kinds fail with 500 and writes hang until a 504. nodemedic can act on nothing it cannot
/// read or write, so the crash waits until every kind it uses is served; returns how long that
/// took.
async fn serving_every_kind(lab: &Lab) -> Duration {
    let since = Instant::now();
    let client = lab.client();
    eventually(
        "the API server serving every kind nodemedic uses",
        Duration::from_secs(300),
        || async {
            let lists = [
                served(kube::Api::<Node>::all(client.clone())).await,
                served(kube::Api::<Lease>::namespaced(client.clone(), "kube-node-lease")).await,
                served(kube::Api::<Lease>::namespaced(client.clone(), NS)).await,
                served(kube::Api::<ConfigMap>::namespaced(client.clone(), NS)).await,
                served(kube::Api::<Pod>::namespaced(client.clone(), "vm")).await,
                served(kube::Api::<SelfNodeRemediation>::all(client.clone())).await,
                served(kube::Api::<NodeHealthCheck>::all(client.clone())).await,
                served(kube::Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), NS)).await,
            ];
            if lists.iter().all(|served| *served) {
                return Some(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            None
        },
    )
    .await;
    since.elapsed()
}

/// Powers `node` on and waits until it is a healthy member again: Ready, its remediation gone,
/// every agent settled, so the next crash starts from the state the first one did.
async fn back_in_service(lab: &Lab, node: &str) {
    lab.power_on(node).await.expect("power on");
    lab.wait_ready_status(node, "True", Duration::from_secs(180))
        .await
        .expect("Ready again");
    let client = lab.client();
    eventually(
        &format!("{node}'s remediation deleted once it is healthy"),
        Duration::from_secs(180),
        || async { snr(&client, node).await.is_none().then_some(()) },
    )
    .await;
    scenario::agents_settled(lab).await.expect("agents settled");
}

/// Holds the control plane down for `length`, checking that nobody fences; returns how long
/// the API took to answer after the restart.
async fn outage_for(lab: &Lab, kind: Outage, length: Duration, fenced_before: &[String]) -> Duration {
    match kind {
        Outage::ApiServer => lab.stop_apiserver().await,
        Outage::Etcd => lab.stop_etcd().await,
    }
    .expect("stop");
    let since = Instant::now();
    eventually(&format!("a {kind:?} outage of {length:?}"), length * 2, || async {
        assert_eq!(
            fenced(lab),
            fenced_before,
            "a node fenced {:?} into the {kind:?} outage",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        (since.elapsed() >= length).then_some(())
    })
    .await;
    let restarted = Instant::now();
    match kind {
        Outage::ApiServer => lab.start_apiserver().await,
        Outage::Etcd => lab.start_etcd().await,
    }
    .expect("start");
    restarted.elapsed()
}

/// The chart's defaults on plain nodes with Kubernetes' node timings: the workload's node crashes
/// once at rest (the normal time, in this lab: crash to Running 19.4 s p50 and 19.8 s p99 in the
/// recovery bench's out-of-the-box series, so one sample is a fair measure), comes back, then the
/// control plane is down for [`SEVERAL_MINUTES`] and the workload's node crashes
/// [`CRASH_AFTER_RETURN`] after the API server serves every kind nodemedic uses again
/// ([`serving_every_kind`]): nodemedic releases the workload (its pod deleted once fencing is
/// proven) within the normal time + [`SLACK`].
///
/// What is asserted is nodemedic's share. Kubernetes' own, from the release to the new pod
/// Running, is printed beside it: after an API server restart the StatefulSet controller of
/// kube-controller-manager waits for its informer ("read version ... is not as new as written
/// version"), which comes back by client-go's own backoff, and that share can be minutes longer
/// than at rest (bench/results/outages-20261207/, issue 60).
async fn back_at_full_speed(kind: Outage) {
    let started = Instant::now();
    let (lab, first) = with_the_charts_defaults().await;
    println!("cluster ready in {:?}", started.elapsed());

    let at_rest = crash(&lab, &first, Duration::from_secs(180)).await;
    let second = at_rest
        .moved_to
        .clone()
        .expect("db-0 Running elsewhere after the crash at rest");
    back_in_service(&lab, &first).await;
    println!(
        "at rest: crash of {first} -> db-0 released in {:.1}s, Running on {second} {} later ({})",
        at_rest.released.as_secs_f64(),
        at_rest.kubernetes_share(),
        at_rest.story
    );

    let fenced_before = fenced(&lab);
    let answering = outage_for(&lab, kind, SEVERAL_MINUTES, &fenced_before).await;
    let serving = serving_every_kind(&lab).await;
    let back = Instant::now();
    eventually(
        &format!("{CRASH_AFTER_RETURN:?} after the {kind:?} outage"),
        CRASH_AFTER_RETURN * 2,
        || async {
            assert_eq!(fenced(&lab), fenced_before, "a node fenced after the {kind:?} outage");
            tokio::time::sleep(Duration::from_millis(500)).await;
            (back.elapsed() >= CRASH_AFTER_RETURN).then_some(())
        },
    )
    .await;
    let after = crash(&lab, &second, KUBERNETES_SHARE_SHOWN).await;
    println!(
        "{kind:?} outage of {SEVERAL_MINUTES:?} (/readyz ok {:.1}s after the restart, every kind nodemedic uses served \
         {:.1}s after that): crash of {second} {CRASH_AFTER_RETURN:?} later -> db-0 released in {:.1}s (at rest \
         {:.1}s); Kubernetes' share, release to Running, {} (at rest {}) ({})",
        answering.as_secs_f64(),
        serving.as_secs_f64(),
        after.released.as_secs_f64(),
        at_rest.released.as_secs_f64(),
        after.kubernetes_share(),
        at_rest.kubernetes_share(),
        after.story
    );
    assert!(
        after.released <= at_rest.released + SLACK,
        "after the {kind:?} outage nodemedic released the workload {:.1}s after the crash ({}), against {:.1}s at rest \
         ({}; +{SLACK:?} allowed)\n{}",
        after.released.as_secs_f64(),
        after.story,
        at_rest.released.as_secs_f64(),
        at_rest.story,
        lab.timeline().render()
    );
    assert_witness(&lab);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_several_minute_api_server_outage_a_crash_is_remediated_at_full_speed() {
    back_at_full_speed(Outage::ApiServer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_several_minute_etcd_outage_a_crash_is_remediated_at_full_speed() {
    back_at_full_speed(Outage::Etcd).await;
}
