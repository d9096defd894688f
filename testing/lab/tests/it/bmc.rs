//! The lab's BMCs, driven by the real fence agents: their power off really kills the node (before
//! the agent hears Off), their power on boots it, a hung BMC does not answer, a wrong password
//! changes nothing.

use std::{process::Stdio, time::Duration};

use jiff::Timestamp;
use nodemedic_lab::{Bmc, BmcOptions, Event, Lab, LabConfig, PowerDelays, wait};
use tokio::io::AsyncWriteExt;

use crate::support::{logs, unknown_within};

/// Runs a fence agent with its options on stdin, as FAR does; its exit code, or None when it
/// had not finished after `deadline` (then it is killed).
async fn agent(program: &str, options: &str, deadline: Duration) -> Option<i32> {
    let mut child = tokio::process::Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the fence agent starts");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(options.as_bytes()).await.expect("options");
    drop(stdin);
    tokio::time::timeout(deadline, child.wait())
        .await
        .ok()
        .map(|status| status.expect("wait").code().unwrap_or(-1))
}

fn redfish(bmc: &Bmc, action: &str, extra: &str) -> String {
    format!(
        "ip={}\nipport={}\nusername={}\npassword={}\nsystems_uri={}\nssl_insecure=1\naction={action}\n{extra}",
        bmc.ip, bmc.redfish_port, bmc.username, bmc.password, bmc.systems_uri
    )
}

fn ipmi(bmc: &Bmc, action: &str, extra: &str) -> String {
    format!(
        "ip={}\nipport={}\nlanplus=1\ncipher=3\nusername={}\npassword={}\naction={action}\n{extra}",
        bmc.ip, bmc.ipmi_port, bmc.username, bmc.password
    )
}

const AGENT_DEADLINE: Duration = Duration::from_secs(30);

async fn fence_redfish(bmc: &Bmc, action: &str) -> Option<i32> {
    agent("fence_redfish", &redfish(bmc, action, ""), AGENT_DEADLINE).await
}

async fn fence_ipmilan(bmc: &Bmc, action: &str) -> Option<i32> {
    agent("fence_ipmilan", &ipmi(bmc, action, ""), AGENT_DEADLINE).await
}

fn bmc_power(lab: &Lab, node: &str, on: bool, since: Timestamp) -> bool {
    lab.timeline()
        .find_after(
            since,
            |e| matches!(e, Event::Power { node: n, on: o, cause } if n == node && *o == on && cause == "bmc"),
        )
        .is_some()
}

/// Right after the agent's Off: nothing of the node runs any more.
fn assert_dead(lab: &Lab, node: &str, since: Timestamp) {
    assert!(!lab.condition(node).expect("node").powered, "{node} still powered");
    assert!(
        !lab.process_running(&format!("{node}/kwok")),
        "{node}'s kwok still runs"
    );
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", &lab.netns(node).expect("netns")])
        .output()
        .expect("ip netns pids");
    assert!(pids.stdout.trim_ascii().is_empty(), "processes left in {node}");
    assert!(bmc_power(lab, node, false, since), "no BMC power-off of {node}");
}

async fn wait_booted(lab: &Lab, node: &str, since: Timestamp) {
    wait::until(&format!("{node} to boot"), Duration::from_secs(30), || async {
        Ok((bmc_power(lab, node, true, since) && lab.process_running(&format!("{node}/kwok"))).then_some(()))
    })
    .await
    .expect("booted by its BMC");
    lab.wait_ready_status(node, "True", unknown_within(lab))
        .await
        .expect("Ready again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_redfish_and_fence_ipmilan_power_a_node_off_for_real_and_back_on() {
    logs();
    let lab = Lab::start(LabConfig::workers(2).with_bmcs(BmcOptions::default()))
        .await
        .expect("lab starts");

    // Redfish, as the seed's FAR template addresses it (system "1", options on stdin).
    let bmc = lab.bmc("node-1").expect("bmc");
    let off_at = Timestamp::now();
    assert_eq!(fence_redfish(&bmc, "off").await, Some(0));
    assert_dead(&lab, "node-1", off_at);
    assert!(lab.condition("node-2").expect("node").powered, "node-2 untouched");
    assert_eq!(fence_redfish(&bmc, "status").await, Some(2));
    lab.wait_ready_status("node-1", "Unknown", unknown_within(&lab))
        .await
        .expect("the API sees node-1 gone");
    let on_at = Timestamp::now();
    assert_eq!(fence_redfish(&bmc, "on").await, Some(0));
    wait_booted(&lab, "node-1", on_at).await;

    // A reboot (what FAR asks for) is an off and an on.
    let reboot_at = Timestamp::now();
    assert_eq!(fence_redfish(&bmc, "reboot").await, Some(0));
    assert!(bmc_power(&lab, "node-1", false, reboot_at), "reboot powered off");
    wait_booted(&lab, "node-1", reboot_at).await;

    // IPMI against ipmi_sim.
    let bmc = lab.bmc("node-2").expect("bmc");
    let off_at = Timestamp::now();
    assert_eq!(fence_ipmilan(&bmc, "off").await, Some(0));
    assert_dead(&lab, "node-2", off_at);
    assert_eq!(fence_ipmilan(&bmc, "status").await, Some(2));
    let on_at = Timestamp::now();
    assert_eq!(fence_ipmilan(&bmc, "on").await, Some(0));
    wait_booted(&lab, "node-2", on_at).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_bmc_answers_nothing_a_wrong_password_changes_nothing_and_a_crash_leaves_the_bmc_on() {
    logs();
    let lab = Lab::start(LabConfig::workers(2).with_bmcs(BmcOptions::default()))
        .await
        .expect("lab starts");
    let bmc = lab.bmc("node-1").expect("bmc");
    let start = Timestamp::now();

    // Hung: fence_redfish has no network timeout of its own (its --login-timeout and
    // --power-timeout do not bound an HTTP request), so only the caller's deadline ends it.
    lab.hang_bmc("node-1").await.expect("hang");
    let short = "login_timeout=2\npower_timeout=2\n";
    let hung = agent("fence_redfish", &redfish(&bmc, "status", short), Duration::from_secs(8)).await;
    assert_ne!(hung, Some(0), "a hung Redfish BMC answered");
    let hung = agent("fence_ipmilan", &ipmi(&bmc, "status", short), AGENT_DEADLINE).await;
    assert_ne!(hung, Some(0), "a hung IPMI BMC answered");
    assert!(lab.condition("node-1").expect("node").powered, "the node runs on");
    lab.resume_bmc("node-1").await.expect("resume");
    assert_eq!(fence_redfish(&bmc, "status").await, Some(0));
    assert_eq!(fence_ipmilan(&bmc, "status").await, Some(0));

    // A wrong password: refused, the node untouched.
    let wrong = Bmc {
        password: "wrong".into(),
        ..bmc.clone()
    };
    assert_eq!(fence_redfish(&wrong, "off").await, Some(1));
    assert_eq!(fence_ipmilan(&wrong, "off").await, Some(1));
    assert!(lab.condition("node-1").expect("node").powered, "node-1 powered off");
    assert!(lab.process_running("node-1/kwok"));
    assert!(
        lab.timeline()
            .find_after(start, |e| matches!(e, Event::Power { .. }))
            .is_none(),
        "no power change:\n{}",
        lab.timeline().render()
    );
    let faults: Vec<String> = lab
        .timeline()
        .entries()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::Fault { node: Some(n), fault } if n == "node-1" => Some(fault),
            _ => None,
        })
        .collect();
    assert_eq!(faults, ["hang-bmc", "resume-bmc"]);

    // A crash is the node's power loss, not the BMC's: it still says On, and powering off a
    // dead node is fine. One BMC, two protocols: off through Redfish is off through IPMI.
    let bmc = lab.bmc("node-2").expect("bmc");
    lab.crash("node-2").await.expect("crash");
    assert_eq!(fence_redfish(&bmc, "status").await, Some(0));
    let off_at = Timestamp::now();
    assert_eq!(fence_redfish(&bmc, "off").await, Some(0));
    assert_dead(&lab, "node-2", off_at);
    assert_eq!(fence_ipmilan(&bmc, "status").await, Some(2));
    let on_at = Timestamp::now();
    assert_eq!(fence_ipmilan(&bmc, "on").await, Some(0));
    wait_booted(&lab, "node-2", on_at).await;
    assert_eq!(fence_redfish(&bmc, "status").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_realistic_delays_the_node_is_dead_by_the_time_the_bmc_says_off() {
    logs();
    let options = BmcOptions {
        delays: PowerDelays::Realistic,
        ..BmcOptions::default()
    };
    let lab = Lab::start(LabConfig::workers(1).with_bmcs(options))
        .await
        .expect("lab starts");
    let bmc = lab.bmc("node-1").expect("bmc");
    // The emulator takes 1-11 s to apply ForceOff; fence_redfish polls until it reads Off.
    let off_at = Timestamp::now();
    assert_eq!(fence_redfish(&bmc, "off").await, Some(0));
    assert_dead(&lab, "node-1", off_at);
    assert_eq!(fence_ipmilan(&bmc, "status").await, Some(2));
    let on_at = Timestamp::now();
    assert_eq!(fence_redfish(&bmc, "on").await, Some(0));
    wait_booted(&lab, "node-1", on_at).await;
}
