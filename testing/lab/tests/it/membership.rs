//! Nodes joining and leaving a running lab: an added node is a node like the others, a removed
//! one is gone from the API, the host and every per-node call, and teardown leaves nothing.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodemedic_lab::{BmcOptions, Error, Event, Lab, LabConfig, NodeSpec, ProcessSpec, wait};

use crate::{
    support::{listen_in, logs, unknown_within, wait_reachable},
    teardown::leftovers,
};

/// Opens the node's watchdog device and feeds it every 500 ms, as an agent would.
const FEEDER: &str = r#"
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
while True:
    os.write(fd, b"k")
    time.sleep(0.5)
"#;

/// Opens the node's watchdog device from inside the node and closes it with the magic close.
const DEVICE: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.write(fd, b"V")
os.close(fd)
"#;

fn netns_listed(name: &str) -> bool {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

/// The MAC address of the lab's node bridge, where the API server's address is.
fn bridge_mac(lab: &Lab) -> String {
    let out = std::process::Command::new("ip")
        .args(["-br", "link", "show", &format!("nm{}", lab.id())])
        .output()
        .expect("ip runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .nth(2)
        .expect("a MAC in `ip -br link`")
        .to_owned()
}

fn netns_pids(ns: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .expect("ip netns pids");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn wait_armed(lab: &Lab, node: &str, armed: bool) {
    wait::until(
        &format!("{node}'s watchdog armed={armed}"),
        Duration::from_secs(20),
        || async { Ok((lab.watchdog_armed(node) == armed).then_some(())) },
    )
    .await
    .expect("watchdog state");
}

async fn wait_event(lab: &Lab, since: Timestamp, what: &str, matches: impl Fn(&Event) -> bool) {
    wait::until(what, Duration::from_secs(30), || async {
        Ok(lab.timeline().find_after(since, &matches).map(drop))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.timeline().render()));
}

fn assert_unknown<T: std::fmt::Debug>(what: &str, result: Result<T, Error>, node: &str) {
    match result {
        Err(Error::UnknownNode(n)) if n == node => {}
        other => panic!("{what} for the removed {node}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_to_a_running_lab_is_ready_runs_processes_and_takes_every_fault() {
    logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    let added_at = Timestamp::now();
    lab.add_node(NodeSpec::worker("node-4")).await.expect("node-4 joins");

    assert_eq!(lab.nodes(), ["node-1", "node-2", "node-3", "node-4"]);
    let node = Api::<Node>::all(lab.client()).get("node-4").await.expect("Node object");
    assert!(
        node.metadata
            .labels
            .unwrap_or_default()
            .contains_key("node-role.kubernetes.io/worker")
    );
    assert!(netns_listed(&lab.netns("node-4").expect("netns")));
    let ip = lab.node_ip("node-4").expect("ip");
    for other in ["node-1", "node-2", "node-3"] {
        assert_ne!(lab.node_ip(other).expect("ip"), ip, "node-4 has an address of its own");
    }
    assert!(lab.boot_file("node-4").exists(), "boot time recorded");
    assert!(lab.condition("node-4").expect("condition").powered);
    let added = lab
        .timeline()
        .find_after(added_at, |e| matches!(e, Event::NodeAdded { node } if node == "node-4"));
    assert!(added.is_some(), "{}", lab.timeline().render());
    wait_event(
        &lab,
        added_at,
        "node-4 Ready in the timeline",
        |e| matches!(e, Event::NodeReady { node, status, .. } if node == "node-4" && status == "True"),
    )
    .await;

    // Processes in it, its peers both ways, its watchdog device.
    listen_in(&lab, "node-1");
    listen_in(&lab, "node-4");
    assert!(lab.process_running("node-4/listener"));
    wait_reachable(&lab, "node-1", "node-4").await;
    wait_reachable(&lab, "node-4", "node-1").await;
    let device = lab.watchdog_device_path("node-4").display().to_string();
    assert!(
        lab.exec_in_node("node-4", "/usr/bin/python3", &["-c", DEVICE, &device])
            .expect("guarded"),
        "the device answers from inside node-4"
    );
    let stats = lab.watchdog_device_stats("node-4").expect("stats");
    assert_eq!((stats.opens, stats.magic_closes), (1, 1), "{stats:?}");
    // Opened again and fed, as an agent does.
    let feeder = ProcessSpec::new("/usr/bin/python3", ["-c", FEEDER, &device]);
    lab.add_node_process("node-4", "feeder", feeder).expect("feeder starts");
    wait_armed(&lab, "node-4", true).await;

    // A partition cuts it off (its watchdog, on the host, is still fed); heal brings it back.
    lab.partition(&["node-4"]).await.expect("partition");
    assert!(!lab.node_can_reach("node-1", ip, 9000).expect("probe"));
    lab.wait_ready_status("node-4", "Unknown", unknown_within(&lab))
        .await
        .expect("node-4 Unknown");
    assert!(lab.watchdog_armed("node-4"), "fed through the partition");
    lab.heal("node-4").await.expect("heal");
    lab.wait_ready_status("node-4", "True", Duration::from_secs(30))
        .await
        .expect("node-4 back");

    // Its sysrq trigger is watched: a `b` power-cycles it, and its processes come back.
    let rebooted_at = Timestamp::now();
    std::fs::write(lab.sysrq_trigger_path("node-4"), "b").expect("write the trigger");
    wait_event(
        &lab,
        rebooted_at,
        "node-4's software reboot",
        |e| matches!(e, Event::Power { node, on: true, cause } if node == "node-4" && cause == "software-reboot"),
    )
    .await;
    wait_armed(&lab, "node-4", true).await;

    // A crash kills everything in it; power-on starts its processes again.
    lab.crash("node-4").await.expect("crash");
    assert!(!lab.condition("node-4").expect("condition").powered);
    assert!(!lab.process_running("node-4/listener"));
    assert!(!lab.watchdog_armed("node-4"), "the timer died with the power");
    let ns = lab.netns("node-4").expect("netns");
    wait::until("node-4's namespace empty", Duration::from_secs(10), || async {
        Ok(netns_pids(&ns).is_empty().then_some(()))
    })
    .await
    .expect("nothing runs in a crashed node");
    lab.power_on("node-4").await.expect("power on");
    assert!(lab.process_running("node-4/listener"));
    wait_reachable(&lab, "node-1", "node-4").await;
    lab.wait_ready_status("node-4", "True", Duration::from_secs(30))
        .await
        .expect("node-4 Ready after power-on");

    let id = lab.id().to_owned();
    drop(lab);
    assert_eq!(leftovers(&id), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_is_gone_from_the_api_the_host_and_every_per_node_call() {
    logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    // The MAC behind the API server's address stays put as nodes come and go: every node's ARP
    // entry for it stays right (seed 47's trials 20 and 22 lost the API for the survivors when a
    // removed node's veth had been the bridge's lowest port).
    let api_mac = bridge_mac(&lab);
    lab.add_node(NodeSpec::worker("node-4")).await.expect("node-4 joins");
    assert_eq!(bridge_mac(&lab), api_mac, "the bridge's MAC after node-4 joined");
    let nodes = Api::<Node>::all(lab.client());
    let old_ip = lab.node_ip("node-2").expect("ip");
    let ns = lab.netns("node-2").expect("netns");
    let kwok = lab.process_pid("node-2/kwok").expect("node-2's kwok runs");
    listen_in(&lab, "node-2");

    let removed_at = Timestamp::now();
    // One node the lab started with, one it added.
    for node in ["node-2", "node-4"] {
        lab.remove_node(node).await.expect("removed");
        assert!(
            nodes.get_opt(node).await.expect("API").is_none(),
            "{node}'s Node object is deleted"
        );
    }
    assert_eq!(lab.nodes(), ["node-1", "node-3"]);
    assert_eq!(bridge_mac(&lab), api_mac, "the bridge's MAC after two nodes left");
    assert!(!netns_listed(&ns), "node-2's namespace is gone");
    assert!(
        !std::path::Path::new(&format!("/proc/{kwok}")).exists(),
        "node-2's kwok is gone"
    );
    assert_eq!(lab.process_pid("node-2/listener"), None);
    for node in ["node-2", "node-4"] {
        let off = lab.timeline().find_after(
            removed_at,
            |e| matches!(e, Event::Power { node: n, on: false, cause } if n == node && cause == "node-removed"),
        );
        assert!(off.is_some(), "{node} powered off");
        let gone = lab
            .timeline()
            .find_after(removed_at, |e| matches!(e, Event::NodeRemoved { node: n } if n == node));
        assert!(gone.is_some(), "{node} removed:\n{}", lab.timeline().render());
    }

    let node = "node-2";
    assert_unknown("node_ip", lab.node_ip(node), node);
    assert_unknown("netns", lab.netns(node), node);
    assert_unknown("condition", lab.condition(node), node);
    assert_unknown("crash", lab.crash(node).await, node);
    assert_unknown("power_on", lab.power_on(node).await, node);
    assert_unknown("freeze", lab.freeze(node).await, node);
    assert_unknown("partition", lab.partition(&[node]).await, node);
    assert_unknown("heal", lab.heal(node).await, node);
    assert_unknown("isolate_from_api", lab.isolate_from_api(node).await, node);
    assert_unknown("exec_in_node", lab.exec_in_node(node, "true", &[]), node);
    assert_unknown("watchdog_device_stats", lab.watchdog_device_stats(node), node);
    let process = ProcessSpec::new("/bin/sleep", ["60"]);
    assert_unknown("add_node_process", lab.add_node_process(node, "sleep", process), node);
    assert_unknown("remove_node", lab.remove_node(node).await, node);
    assert!(!lab.watchdog_armed(node));
    assert!(
        !lab.timeline()
            .entries()
            .iter()
            .any(|e| e.at >= removed_at && matches!(&e.event, Event::Fault { node: Some(n), .. } if n == node)),
        "faults of a removed node are refused, not recorded"
    );

    // The others are untouched.
    listen_in(&lab, "node-3");
    wait_reachable(&lab, "node-1", "node-3").await;
    for node in ["node-1", "node-3"] {
        lab.wait_ready_status(node, "True", Duration::from_secs(1))
            .await
            .expect("still Ready");
    }

    // A machine of the same name joining later is a new one, at a new address.
    let rejoined_at = Timestamp::now();
    lab.add_node(NodeSpec::worker(node)).await.expect("node-2 joins again");
    assert_ne!(lab.node_ip(node).expect("ip"), old_ip);
    assert!(netns_listed(&ns));
    wait_event(
        &lab,
        rejoined_at,
        "the new node-2 Ready in the timeline",
        |e| matches!(e, Event::NodeReady { node: n, status, .. } if n == node && status == "True"),
    )
    .await;

    let id = lab.id().to_owned();
    drop(lab);
    assert_eq!(leftovers(&id), Vec::<String>::new());
}

#[test]
fn a_test_that_panics_after_adding_a_node_leaves_nothing_behind() {
    logs();
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let lab = Lab::start(LabConfig::workers(1)).await.expect("lab starts");
            tx.send(lab.id().to_owned()).expect("send");
            lab.add_node(NodeSpec::worker("node-2")).await.expect("node-2 joins");
            listen_in(&lab, "node-2");
            panic!("a deliberate failure after adding a node");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let id = rx.recv().expect("the lab started");
    assert_eq!(leftovers(&id), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lab_with_bmcs_refuses_to_add_a_node_and_removing_one_takes_its_bmcs_away() {
    logs();
    let lab = Lab::start(LabConfig::workers(2).with_bmcs(BmcOptions::default()))
        .await
        .expect("lab starts");
    match lab.add_node(NodeSpec::worker("node-3")).await {
        Err(Error::Invalid(why)) => assert!(why.contains("BMCs"), "{why}"),
        other => panic!("adding a node to a lab with BMCs: {other:?}"),
    }
    assert_eq!(lab.nodes(), ["node-1", "node-2"]);

    let bmc_ip = lab.bmc("node-2").expect("bmc").ip;
    assert!(lab.process_running("bmc-redfish-node-2"));
    lab.remove_node("node-2").await.expect("removed");
    for process in ["bmc-redfish-node-2", "bmc-ipmi-node-2"] {
        assert_eq!(lab.process_pid(process), None, "{process} is gone");
    }
    assert_unknown("bmc", lab.bmc("node-2"), "node-2");
    let addresses = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr");
    assert!(
        !String::from_utf8_lossy(&addresses.stdout).contains(&format!(" {bmc_ip}/")),
        "node-2's BMC address is gone"
    );
    lab.bmc("node-1").expect("node-1 keeps its BMC");

    let id = lab.id().to_owned();
    drop(lab);
    assert_eq!(leftovers(&id), Vec::<String>::new());
}
