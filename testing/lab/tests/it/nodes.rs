//! Nodes: crash, power, partitions, freeze, API isolation, slow links, a full disk, each checked from inside the node's
//! namespace and from the API.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodemedic_lab::{Event, Fault, Lab, LabConfig};

use crate::support::{has_taint, listen_in, logs, unknown_within, wait_reachable};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_node_turns_unknown_and_unreachable_while_the_others_stay_ready_and_power_on_brings_it_back() {
    logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    let crashed_at = jiff::Timestamp::now();
    lab.crash("node-1").await.expect("crash");
    assert!(lab.nodes().iter().all(|_| true));
    assert!(!lab.condition("node-1").expect("node").powered);
    assert!(
        !lab.node_can_reach("node-2", lab.node_ip("node-1").expect("ip"), 9000)
            .expect("probe")
    );

    lab.wait_ready_status("node-1", "Unknown", unknown_within(&lab))
        .await
        .expect("node-1 turns Unknown within the grace");
    nodemedic_lab::wait::until("unreachable taint", Duration::from_secs(10), || async {
        Ok(has_taint(&lab, "node-1", "node.kubernetes.io/unreachable")
            .await
            .then_some(()))
    })
    .await
    .expect("node-1 gets the unreachable taint");
    // The timeline learns the status from its own watch, which may lag behind the read above.
    let unknown_at = nodemedic_lab::wait::until(
        "the timeline to record node-1 Unknown",
        Duration::from_secs(15),
        || async {
            Ok(lab.timeline().find_after(
                crashed_at,
                |e| matches!(e, Event::NodeReady { node, status, .. } if node == "node-1" && status == "Unknown"),
            ))
        },
    )
    .await
    .expect("recorded");
    let after = unknown_at.at - crashed_at;
    assert!(
        after.total(jiff::Unit::Second).expect("seconds") <= unknown_within(&lab).as_secs_f64(),
        "Unknown after {after:?}"
    );

    lab.power_on("node-1").await.expect("power on");
    lab.wait_ready_status("node-1", "True", Duration::from_secs(30))
        .await
        .expect("node-1 Ready again");
    let others_flapped = lab
        .timeline()
        .entries()
        .iter()
        .any(|e| matches!(&e.event, Event::NodeReady { node, status, .. } if node != "node-1" && status != "True"));
    assert!(
        !others_flapped,
        "node-2 and node-3 stayed Ready:\n{}",
        lab.timeline().render()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_of_one_and_of_two_nodes_cut_exactly_what_they_promise() {
    logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    for node in lab.nodes() {
        listen_in(&lab, &node);
    }
    wait_reachable(&lab, "node-1", "node-2").await;
    let (api, port) = (lab.api_ip(), lab.api_port());
    assert!(lab.node_can_reach("node-1", api, port).expect("probe"));

    // One node alone: nothing in, nothing out.
    lab.partition(&["node-1"]).await.expect("partition");
    assert!(
        !lab.node_can_reach("node-1", api, port).expect("probe"),
        "node-1 reaches the API server"
    );
    assert!(
        !lab.node_can_reach("node-1", lab.node_ip("node-2").expect("ip"), 9000)
            .expect("probe"),
        "node-1 reaches node-2"
    );
    assert!(
        !lab.node_can_reach("node-2", lab.node_ip("node-1").expect("ip"), 9000)
            .expect("probe"),
        "node-2 reaches node-1"
    );
    assert!(
        lab.node_can_reach("node-2", api, port).expect("probe"),
        "node-2 lost the API server"
    );
    lab.wait_ready_status("node-1", "Unknown", unknown_within(&lab))
        .await
        .expect("node-1 Unknown");
    lab.heal("node-1").await.expect("heal");
    lab.wait_ready_status("node-1", "True", Duration::from_secs(30))
        .await
        .expect("node-1 back");

    // Two nodes together: they see each other, nothing else.
    lab.partition(&["node-1", "node-2"]).await.expect("partition");
    wait_reachable(&lab, "node-1", "node-2").await;
    wait_reachable(&lab, "node-2", "node-1").await;
    for node in ["node-1", "node-2"] {
        assert!(
            !lab.node_can_reach(node, api, port).expect("probe"),
            "{node} reaches the API server"
        );
        assert!(
            !lab.node_can_reach(node, lab.node_ip("node-3").expect("ip"), 9000)
                .expect("probe"),
            "{node} reaches node-3"
        );
    }
    lab.wait_ready_status("node-1", "Unknown", unknown_within(&lab))
        .await
        .expect("node-1 Unknown");
    lab.wait_ready_status("node-2", "Unknown", Duration::from_secs(5))
        .await
        .expect("node-2 Unknown");
    lab.wait_ready_status("node-3", "True", Duration::from_secs(1))
        .await
        .expect("node-3 still Ready");
    lab.heal("node-1").await.expect("heal");
    lab.heal("node-2").await.expect("heal");
    for node in ["node-1", "node-2"] {
        lab.wait_ready_status(node, "True", Duration::from_secs(30))
            .await
            .expect("back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_stops_every_process_api_isolation_keeps_peers_reachable_a_link_slows_again_after_a_restart_and_a_full_disk_is_reported()
 {
    logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    for node in lab.nodes() {
        listen_in(&lab, &node);
    }
    wait_reachable(&lab, "node-1", "node-2").await;

    lab.freeze("node-3").await.expect("freeze");
    let ns = lab.netns("node-3").expect("ns");
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", &ns])
        .output()
        .expect("ip netns pids");
    let pids = String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert!(!pids.is_empty());
    for pid in &pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
        assert_eq!(state, Some('T'), "process {pid} of node-3 is stopped");
    }
    lab.wait_ready_status("node-3", "Unknown", unknown_within(&lab))
        .await
        .expect("frozen node turns Unknown");
    lab.thaw("node-3").await.expect("thaw");
    lab.wait_ready_status("node-3", "True", Duration::from_secs(30))
        .await
        .expect("thawed node back");

    lab.isolate_from_api("node-1").await.expect("isolate");
    assert!(
        !lab.node_can_reach("node-1", lab.api_ip(), lab.api_port())
            .expect("probe"),
        "node-1 still reaches the API server"
    );
    assert!(
        lab.node_can_reach("node-1", lab.node_ip("node-2").expect("ip"), 9000)
            .expect("probe"),
        "node-1 lost its peer"
    );
    assert!(
        lab.node_can_reach("node-2", lab.node_ip("node-1").expect("ip"), 9000)
            .expect("probe"),
        "node-2 lost node-1"
    );
    lab.wait_ready_status("node-1", "Unknown", unknown_within(&lab))
        .await
        .expect("API-isolated node turns Unknown");
    lab.heal("node-1").await.expect("heal");
    lab.wait_ready_status("node-1", "True", Duration::from_secs(30))
        .await
        .expect("back");

    // A slow link holds what the node sends for the delay. A process the lab starts while the
    // link is slow (as it starts an agent after a power cycle) must not keep the next slow link
    // from starting once this one is restored.
    let node_2 = lab.node_ip("node-2").expect("ip");
    let delay = Duration::from_millis(300);
    lab.slow_links(&["node-1"], delay, Duration::ZERO, 0.0)
        .await
        .expect("slow");
    let probe_started = Instant::now();
    assert!(
        lab.node_can_reach("node-1", node_2, 9000).expect("probe"),
        "a slow link still carries packets"
    );
    assert!(probe_started.elapsed() >= delay, "the connection waited for the delay");
    lab.restart_process("node-1/listener")
        .expect("a process restarted while the link is slow");
    lab.restore_links(&["node-1"]).await.expect("restore");
    lab.slow_links(&["node-1"], delay, Duration::ZERO, 0.0)
        .await
        .expect("the link slows again while the process started in the last slow window lives");
    lab.restore_links(&["node-1"]).await.expect("restore");
    wait_reachable(&lab, "node-1", "node-2").await;

    // A full disk: the node's kubelet reports DiskPressure and the node controller taints it;
    // the node stays Ready and connected. Undone, both go.
    let fill = Fault::FillDisk { node: "node-2".into() };
    lab.inject(&fill).await.expect("fill the disk");
    assert!(lab.condition("node-2").expect("node").disk_full);
    disk_pressure(&lab, "node-2", "True").await;
    nodemedic_lab::wait::until("the disk-pressure taint", Duration::from_secs(30), || async {
        Ok(has_taint(&lab, "node-2", DISK_PRESSURE_TAINT).await.then_some(()))
    })
    .await
    .expect("node-2 tainted for its disk");
    lab.wait_ready_status("node-2", "True", Duration::from_secs(1))
        .await
        .expect("a node with a full disk stays Ready");
    lab.undo(&fill).await.expect("free the disk");
    assert!(!lab.condition("node-2").expect("node").disk_full);
    disk_pressure(&lab, "node-2", "False").await;
    nodemedic_lab::wait::until("the disk-pressure taint gone", Duration::from_secs(30), || async {
        Ok((!has_taint(&lab, "node-2", DISK_PRESSURE_TAINT).await).then_some(()))
    })
    .await
    .expect("node-2's disk taint removed");
}

const DISK_PRESSURE_TAINT: &str = "node.kubernetes.io/disk-pressure";

/// Waits until the node's DiskPressure condition has this status.
async fn disk_pressure(lab: &Lab, node: &str, status: &str) {
    let nodes = Api::<Node>::all(lab.client());
    nodemedic_lab::wait::until(
        &format!("{node} DiskPressure={status}"),
        Duration::from_secs(30),
        || async {
            let current = nodes.get(node).await.ok().and_then(|n| n.status?.conditions);
            Ok(current
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "DiskPressure" && c.status == status)
                .then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}
