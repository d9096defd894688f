//! Peer failure detection (docs/peer-detection.md) in the lab: the agents' detectors over their
//! mutual-TLS channels, their reports to the controller, and the `PeersReachable` condition the
//! controller writes, and the shipped example health check acting on it. The agents have no
//! means of fencing here, so no fault makes a node reboot itself.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::{Api, Client, ResourceExt};
use nix::{sys::signal::Signal, unistd::Pid};
use nodemedic_api::fence_agents::FenceAgentsRemediation;
use nodemedic_harness::bench::usage::PeakWatch;
use nodemedic_lab::{BmcOptions, LabConfig, PowerDelays};

use crate::{
    selfremediation::exe,
    support::{NS, eventually, lab, scenario, start_controller},
};

/// The seed's timings (5 s API timeouts: the slow links do not cost the agents their licences)
/// with the detector on, and no means of fencing at all: with the lab's missing watchdog and
/// software reboot off, nothing here reboots, whatever the faults.
const DETECTION_ONLY: &str = r#"{"spec": {"isSoftwareRebootEnabled": false, "peerDetection": {}}}"#;

async fn peers_reachable(client: &Client, node: &str) -> Option<NodeCondition> {
    Api::<Node>::all(client.clone())
        .get(node)
        .await
        .ok()?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "PeersReachable")
}

fn signal_agent(lab: &nodemedic_lab::Lab, node: &str, signal: Signal) {
    let pid = lab.process_pid(&format!("{node}/agent")).expect("the agent runs");
    nix::sys::signal::kill(Pid::from_raw(i32::try_from(pid).expect("a pid")), signal).expect("signalled");
}

/// Watches every node's condition for `window` while a fault holds: none of `healthy` may be
/// unreachable by peers at any point.
async fn none_unreachable_during(client: &Client, healthy: &[String], window: Duration, fault: &str) {
    let until = Instant::now() + window;
    while Instant::now() < until {
        for node in healthy {
            if let Some(c) = peers_reachable(client, node).await {
                assert_ne!(
                    c.status, "False",
                    "{fault}: {node} is alive but unreachable by peers: {c:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn condition_reason(client: &Client, node: &str, reason: &str, within: Duration) -> NodeCondition {
    eventually(&format!("{node}: PeersReachable {reason}"), within, || async {
        let c = peers_reachable(client, node).await?;
        (c.reason.as_deref() == Some(reason)).then_some(c)
    })
    .await
}

/// Waits until the peers' suspicion of `node` is refuted; it must never be unreachable meanwhile.
async fn suspicion_refuted(client: &Client, node: &str, fault: &str) -> NodeCondition {
    eventually(
        &format!("{fault}: the suspicion refuted"),
        Duration::from_secs(60),
        || async {
            let c = peers_reachable(client, node).await?;
            assert_ne!(
                c.status, "False",
                "{fault} on a live host made {node} unreachable: {c:?}"
            );
            (c.reason.as_deref() == Some("SuspicionRefuted")).then_some(c)
        },
    )
    .await
}

/// The detector's false suspicions and its one true one, on one lab: a slow lossy network, an
/// API-isolated node, a minority partition, a frozen agent, a frozen node, then a dead node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_node_that_is_really_gone_is_unreachable_by_peers() {
    let lab = lab(LabConfig::workers(4).with_bmcs(BmcOptions {
        delays: PowerDelays::None,
        ..BmcOptions::default()
    }))
    .await;
    let client = lab.client();
    let config = scenario::configure_with(&lab, DETECTION_ONLY).await.expect("config");
    scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {}).expect("credentials");
    scenario::apply_seed(&lab, "002-far-template.yaml", |m| scenario::adapt_far_template(&lab, m)).expect("template");
    start_controller(&lab, "controller", &[]);
    let agent = scenario::sibling_executable(&exe(), "nodemedic-agent").expect("the agent is built");
    let agents_memory = PeakWatch::start(&agent);
    scenario::start_agents_with(&lab, &exe(), &config, scenario::LabWatchdog::Missing).expect("agents");
    scenario::agents_settled(&lab).await.expect("agents settled");
    let nodes = lab.nodes();
    let all: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let others = |node: &str| -> Vec<String> { nodes.iter().filter(|n| *n != node).cloned().collect() };

    // 200 ms ± 100 ms on every packet every node sends, 5% of them lost.
    lab.slow_links(&all, Duration::from_millis(200), Duration::from_millis(100), 5.0)
        .await
        .expect("netem");
    // In effect: a connection to an agent waits for its node's delayed answer.
    let agent = std::net::SocketAddr::new(lab.node_ip(&nodes[0]).expect("ip").into(), config.spec.host_port as u16);
    let dialled = Instant::now();
    tokio::net::TcpStream::connect(agent).await.expect("the agent answers");
    assert!(
        dialled.elapsed() >= Duration::from_millis(100),
        "no delay: {:?}",
        dialled.elapsed()
    );
    none_unreachable_during(&client, &nodes, Duration::from_secs(20), "slow lossy links").await;
    lab.restore_links(&all).await.expect("links restored");

    // A node cut off from the API server only: its peers still reach it.
    lab.isolate_from_api(&nodes[0]).await.expect("isolated");
    none_unreachable_during(&client, &nodes, Duration::from_secs(5), "an API-isolated node").await;
    lab.heal(&nodes[0]).await.expect("healed");

    // A minority cut off from everything: the majority is not unreachable; the minority is (it
    // is gone as far as the cluster can tell, and its reports cannot reach the controller).
    lab.partition(&[nodes[0].as_str()]).await.expect("partitioned");
    let cut_off = nodes[0].clone();
    eventually(
        "the cut-off node unreachable by peers",
        Duration::from_secs(30),
        || async {
            for node in &others(&cut_off) {
                if let Some(c) = peers_reachable(&client, node).await {
                    assert_ne!(c.status, "False", "{node} is in the majority: {c:?}");
                }
            }
            let c = peers_reachable(&client, &cut_off).await?;
            (c.status == "False").then_some(())
        },
    )
    .await;
    none_unreachable_during(
        &client,
        &others(&cut_off),
        Duration::from_secs(3),
        "a minority partition",
    )
    .await;
    lab.heal(&cut_off).await.expect("healed");
    condition_reason(&client, &cut_off, "PeersReachable", Duration::from_secs(60)).await;

    // A frozen agent on a live node: its peers lose it, but its kubelet still renews its lease
    // (the lab's renews every second), so the suspicion is refuted.
    let frozen = nodes[1].clone();
    signal_agent(&lab, &frozen, Signal::SIGSTOP);
    let refuted = suspicion_refuted(&client, &frozen, "a frozen agent").await;
    println!("frozen agent: {}", refuted.message.unwrap_or_default());
    signal_agent(&lab, &frozen, Signal::SIGCONT);
    condition_reason(&client, &frozen, "PeersReachable", Duration::from_secs(60)).await;

    // Every process of the node stopped, kubelet included, its kernel still up: the kernel
    // answers the controller's probe.
    lab.freeze(&frozen).await.expect("frozen");
    let refuted = suspicion_refuted(&client, &frozen, "a frozen node").await;
    println!("frozen node: {}", refuted.message.as_deref().unwrap_or_default());
    assert!(
        refuted.message.as_deref().is_some_and(|m| m.contains("host answered")),
        "{refuted:?}"
    );
    lab.thaw(&frozen).await.expect("thawed");
    condition_reason(&client, &frozen, "PeersReachable", Duration::from_secs(60)).await;

    // A dead node (every process killed, its link down): unreachable by peers, and fenced by
    // the example health check.
    scenario::apply_peer_detection_check(&lab, |_| {}).expect("the example health check");
    let dead = nodes[2].clone();
    lab.crash(&dead).await.expect("crash");
    let crashed = Instant::now();
    let unreachable = eventually(
        "the dead node unreachable by peers",
        Duration::from_secs(30),
        || async {
            let c = peers_reachable(&client, &dead).await?;
            (c.status == "False").then_some(c)
        },
    )
    .await;
    println!(
        "crash -> PeersReachable=False in {:.1} s: {}",
        crashed.elapsed().as_secs_f64(),
        unreachable.message.as_deref().unwrap_or_default()
    );
    assert_eq!(unreachable.reason.as_deref(), Some("UnreachableByPeers"));
    // The example health check fences it through its BMC at once, long before Ready would say
    // anything (its Ready conditions wait 300 s).
    let fars = Api::<FenceAgentsRemediation>::namespaced(client.clone(), NS);
    eventually(
        "a FenceAgentsRemediation of the dead node",
        Duration::from_secs(30),
        || async {
            let all = fars.list(&Default::default()).await.ok()?;
            all.items
                .into_iter()
                .find(|far| far.name_any().starts_with(&format!("{dead}-")))
        },
    )
    .await;
    println!(
        "fence agents remediation of {dead} {:.1} s after the crash",
        crashed.elapsed().as_secs_f64()
    );
    for node in others(&dead) {
        if let Some(c) = peers_reachable(&client, &node).await {
            assert_ne!(c.status, "False", "{node} is alive: {c:?}");
        }
    }
    crate::footprint::agents_within_their_ceiling(
        agents_memory.stop(),
        "with the peer detector through slow links, partitions, freezes and a crash",
    );
}
