//! The chart's defaults hold no healthy node at risk. One lab of plain nodes with Kubernetes'
//! node timings and nodemedic installed from the rendered chart's defaults (the default health check
//! on PeersReachable at once and on Ready, the default configuration: the peer detector, a 2 s
//! watchdog, an 8 s licence), and, in turn, each condition that slows a live node or the control
//! plane without killing anything: the agent starved of CPU, the agent's node under memory
//! pressure, etcd and the API server slowed, every link slow and lossy. Through each window no
//! remediation is created and no node fences itself. Windows of 40 s cover the detector (about
//! 2 s), the licence and the watchdog; the Ready durations (50 s grace and 60 s more) are the
//! fault campaign's to cover with its longer episodes.

use std::time::{Duration, Instant};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Event, core::v1::Pod};
use kube::{Api, api::ListParams};
use nodemedic_api::{fence_agents::FenceAgentsRemediation, self_remediation::SelfNodeRemediation};
use nodemedic_harness::chart_defaults;
use nodemedic_lab::{Lab, LabConfig, NodeSpec, Timings};

use crate::{
    selfremediation::{exe, fenced, running_pod},
    support::{NS, assert_witness, eventually, lab, list, scenario},
};

const WINDOW: Duration = Duration::from_secs(40);

/// Watches the lab for `WINDOW`: fails at the first remediation or fencing.
async fn nothing_happens_for_a_window(lab: &Lab, under: &str) {
    let client = lab.client();
    let started = Instant::now();
    eventually(
        &format!("{WINDOW:?} under {under} with no remediation"),
        WINDOW * 2,
        || async {
            let snrs = list::<SelfNodeRemediation>(&client, NS).await;
            let fars = list::<FenceAgentsRemediation>(&client, NS).await;
            assert!(
                snrs.is_empty() && fars.is_empty() && fenced(lab).is_empty(),
                "under {under}, a healthy node was remediated: {:?} {:?}, fenced {:?}\n{}",
                snrs.iter().map(|r| r.metadata.name.clone()).collect::<Vec<_>>(),
                fars.iter().map(|r| r.metadata.name.clone()).collect::<Vec<_>>(),
                fenced(lab),
                lab.timeline().render()
            );
            (started.elapsed() >= WINDOW).then_some(())
        },
    )
    .await;
}

/// Lists every pod, event and lease of the cluster, eight reads at a time and consistent (so
/// etcd serves each), until `process`'s CPU cgroup has held it back at least once.
async fn held_back_under_reads(lab: &Lab, process: &str) {
    let client = lab.client();
    let consistent = ListParams::default();
    eventually(
        &format!("{process} held back by its CPU share"),
        Duration::from_secs(60),
        || async {
            let reads = (0..8).map(|_| async {
                let _ = Api::<Pod>::all(client.clone()).list(&consistent).await;
                let _ = Api::<Event>::all(client.clone()).list(&consistent).await;
                let _ = Api::<Lease>::all(client.clone()).list(&consistent).await;
            });
            futures::future::join_all(reads).await;
            (lab.starvation_counts(process).0 > 0).then_some(())
        },
    )
    .await;
}

/// Three plain nodes with Kubernetes' node timings and nodemedic installed from the rendered
/// chart's defaults, the StatefulSet running and the agents settled; returns the workload's node.
/// The lab device's watchdog is short (the agents program their own 2 s anyway): such a lab
/// takes a short-timings slot rather than one of the slots of labs that tolerate a busy machine,
/// which the two ten-minute outage tests hold.
pub(crate) async fn with_the_charts_defaults() -> (Lab, String) {
    let timings = Timings {
        watchdog_timeout: Duration::from_secs(10),
        ..Timings::kubernetes_defaults()
    };
    let nodes = (1..=3).map(|i| NodeSpec::plain(&format!("node-{i}"))).collect();
    let lab = lab(LabConfig::new(nodes).with_timings(timings)).await;
    let free = scenario::free_port().expect("a port");
    chart_defaults::install(&lab, &exe(), &[], free)
        .await
        .expect("the chart's defaults");
    scenario::deploy_workload(&lab).await.expect("workload");
    scenario::agents_settled(&lab).await.expect("agents settled");
    let workload_node = scenario::node_of(&running_pod(&lab.client(), &[]).await);
    (lab, workload_node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_defaults_fence_no_live_node_under_starvation_slow_control_plane_or_lossy_links() {
    let (lab, a) = with_the_charts_defaults().await;
    let agent = format!("{a}/agent");

    // The agent starved of CPU, as a CPU limit or a busy node would starve it: 2% of a CPU.
    lab.throttle_cpu(&agent, 2).expect("throttle the agent");
    nothing_happens_for_a_window(&lab, "an agent throttled to 2% of a CPU").await;
    let (throttled, _) = lab.starvation_counts(&agent);
    assert!(throttled > 0, "the agent was held back");
    lab.unthrottle_cpu(&agent).expect("unthrottle");

    // Its node short of memory: a hog keeps the agent's cgroup at its limit, and the OOM killer
    // takes the hog, never the agent.
    let pid = lab.process_pid(&agent);
    lab.squeeze_memory(&agent, 64).expect("squeeze the agent's memory");
    nothing_happens_for_a_window(&lab, "memory pressure").await;
    let (_, failures) = lab.starvation_counts(&agent);
    assert!(failures > 0, "the memory cgroup hit its limit");
    assert_eq!(lab.process_pid(&agent), pid, "the agent ran through it");
    lab.release_memory(&agent).await.expect("release");

    // The control plane slow: etcd, then the API server, starved of CPU (etcd at rest uses less
    // than a tenth of one, so its share is smaller: it must be held back to be slow).
    // A quiet control plane may stay under its share for a whole window, so the test reads
    // the whole cluster until the cgroup reports a period it was held back in.
    for (process, percent) in [("etcd", 3), ("kube-apiserver", 20)] {
        lab.throttle_cpu(process, percent).expect("throttle");
        held_back_under_reads(&lab, process).await;
        nothing_happens_for_a_window(&lab, &format!("{process} throttled to {percent}% of a CPU")).await;
        lab.unthrottle_cpu(process).expect("unthrottle");
    }

    // Every link slow and lossy: 200 ms +- 100 ms and 5% loss on every packet every node sends.
    let all: Vec<String> = lab.nodes();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    lab.slow_links(&all, Duration::from_millis(200), Duration::from_millis(100), 5.0)
        .await
        .expect("slow links");
    nothing_happens_for_a_window(&lab, "200 +- 100 ms of delay and 5% loss").await;
    lab.restore_links(&all).await.expect("restore links");

    assert_witness(&lab);
}
