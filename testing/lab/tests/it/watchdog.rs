//! The lab watchdog (each node's emulated device, served on the host): fires when its feeder
//! stops, not when the node is only cut off.

use std::time::Duration;

use nodemedic_lab::{Event, Lab, LabConfig, ProcessSpec, wait};

use crate::support::{logs, unknown_within};

/// A feeder like an agent's: open the node's watchdog device (which arms it), keep it alive
/// every 500 ms with a write, counting each feed in a file so the test can see time pass while
/// it feeds.
const FEEDER: &str = r#"
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
n = 0
while True:
    os.write(fd, b"k")
    n += 1
    open(sys.argv[2], "w").write(str(n))
    time.sleep(0.5)
"#;

fn feeds(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_power_cycles_a_node_whose_feeder_stops_but_not_one_fed_through_a_partition() {
    logs();
    let lab = Lab::start(LabConfig::seed()).await.expect("lab starts");
    let counter = lab.dir().join("feeds-node-1");
    let device = lab.watchdog_device_path("node-1");
    let feeder = ProcessSpec::new(
        "/usr/bin/python3",
        [
            "-c",
            FEEDER,
            &device.display().to_string(),
            &counter.display().to_string(),
        ],
    );
    lab.add_node_process("node-1", "feeder", feeder).expect("feeder starts");
    wait::until("the watchdog to be armed", Duration::from_secs(10), || async {
        Ok(lab.watchdog_armed("node-1").then_some(()))
    })
    .await
    .expect("armed");

    // Cut off from everything, the node still feeds its watchdog: it must not fire, even well
    // past its timeout (counted in feeds, not slept).
    lab.partition(&["node-1"]).await.expect("partition");
    let start = feeds(&counter);
    let timeout = lab.config().timings.watchdog_timeout;
    let enough = start + 3 * (timeout.as_millis() as u64 / 500);
    wait::until("three watchdog timeouts' worth of feeds", timeout * 6, || async {
        Ok((feeds(&counter) >= enough).then_some(()))
    })
    .await
    .expect("the feeder keeps feeding through the partition");
    assert!(
        !lab.timeline()
            .entries()
            .iter()
            .any(|e| matches!(e.event, Event::WatchdogExpired { .. })),
        "the watchdog fired although it was fed:\n{}",
        lab.timeline().render()
    );
    assert!(lab.condition("node-1").expect("node").powered);

    // Frozen, the feeder stops: the watchdog power-cycles the node.
    let frozen_at = jiff::Timestamp::now();
    lab.freeze("node-1").await.expect("freeze");
    let deadline = timeout + Duration::from_secs(5);
    wait::until("the watchdog to expire", deadline, || async {
        Ok(lab
            .timeline()
            .find_after(
                frozen_at,
                |e| matches!(e, Event::WatchdogExpired { node } if node == "node-1"),
            )
            .map(|_| ()))
    })
    .await
    .expect("the watchdog fires");
    wait::until("the node to power back on", Duration::from_secs(30), || async {
        Ok(lab
            .timeline()
            .find_after(
                frozen_at,
                |e| matches!(e, Event::Power { node, on: true, cause } if node == "node-1" && cause == "watchdog"),
            )
            .map(|_| ()))
    })
    .await
    .expect("power-cycled");
    let off = lab
        .timeline()
        .find_after(
            frozen_at,
            |e| matches!(e, Event::Power { node, on: false, .. } if node == "node-1"),
        )
        .expect("powered off");
    let expired = lab
        .timeline()
        .find_after(frozen_at, |e| matches!(e, Event::WatchdogExpired { .. }))
        .expect("expired");
    assert!(off.at >= expired.at, "power-off follows the expiry");
    let elapsed = (expired.at - frozen_at).total(jiff::Unit::Second).expect("seconds");
    assert!(
        elapsed >= timeout.as_secs_f64() - 0.5,
        "fired after {elapsed}s, before its timeout"
    );
    // Rebooted, it is still partitioned: it comes back only once healed.
    lab.heal("node-1").await.expect("heal");
    lab.wait_ready_status("node-1", "True", unknown_within(&lab) * 3)
        .await
        .expect("back after reboot");
}
