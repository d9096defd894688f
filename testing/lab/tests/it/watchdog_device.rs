//! The emulated watchdog device: the product's Linux driver, unmodified, against a node's device.

use std::{path::Path, time::Duration};

use jiff::Timestamp;
use nodemedic_lab::{Event, Lab, LabConfig, WATCHDOG_DEVICE_IDENTITY, wait};
use nodemedic_self_remediation::watchdog::{LinuxWatchdog, Reboot, Watchdog};

use crate::support::logs;

/// From inside the node: the identity and timeout through `ioctl`, then the magic close. Checks it
/// runs in a mount namespace other than the host's.
const IN_NODE: &str = r#"
import fcntl, os, struct, sys
device, identity, timeout, host_ns = sys.argv[1:5]
assert os.readlink("/proc/self/ns/mnt") != host_ns, "not in the node's mount namespace"
fd = os.open(device, os.O_WRONLY)
info = bytearray(40)
fcntl.ioctl(fd, 0x80285700, info)
assert bytes(info[8:]).split(b"\0")[0].decode() == identity, info
seconds = bytearray(4)
fcntl.ioctl(fd, 0x80045707, seconds)
assert struct.unpack("i", seconds)[0] == int(timeout), seconds
os.write(fd, b"V")
os.close(fd)
"#;

async fn wait_armed(lab: &Lab, node: &str, armed: bool) {
    wait::until(
        &format!("{node}'s watchdog armed={armed}"),
        Duration::from_secs(10),
        || async { Ok((lab.watchdog_armed(node) == armed).then_some(())) },
    )
    .await
    .expect("watchdog state");
}

fn power_events_after(lab: &Lab, node: &str, since: Timestamp) -> usize {
    lab.timeline()
        .entries()
        .iter()
        .filter(|e| e.at >= since && matches!(&e.event, Event::Power { node: n, .. } if n == node))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_linux_driver_arms_feeds_and_closes_the_device_and_an_unclosed_handle_power_cycles_the_node() {
    logs();
    let lab = Lab::start(LabConfig::workers(2)).await.expect("lab starts");
    let node = "node-1";
    let path = lab.watchdog_device_path(node);
    let default = lab.config().timings.watchdog_timeout;
    let started = Timestamp::now();

    let host_ns = std::fs::read_link("/proc/self/ns/mnt").expect("host mount namespace");
    let args = [
        "-c",
        IN_NODE,
        &path.display().to_string(),
        WATCHDOG_DEVICE_IDENTITY,
        &default.as_secs().to_string(),
        &host_ns.display().to_string(),
    ];
    assert!(
        lab.exec_in_node(node, "/usr/bin/python3", &args).expect("guarded"),
        "the device answers from inside the node"
    );
    wait_armed(&lab, node, false).await;
    let stats = lab.watchdog_device_stats(node).expect("stats");
    assert_eq!(
        (stats.opens, stats.magic_closes, stats.keepalives),
        (1, 1, 1),
        "{stats:?}"
    );

    // The driver as an agent uses it: programs a timeout other than the default (the driver
    // leaves an equal one alone), reads back what was applied and who it is.
    let programmed = default + Duration::from_secs(1);
    let mut wd = open(&path, programmed);
    assert_eq!(wd.timeout(), programmed);
    assert_eq!(wd.identity(), WATCHDOG_DEVICE_IDENTITY);
    assert!(!wd.is_softdog());
    let stats = lab.watchdog_device_stats(node).expect("stats");
    assert_eq!(stats.programmed_timeout, Some(programmed));
    assert!(lab.watchdog_armed(node));

    // Fed every half second for three of its timeouts, it stays armed and never fires.
    let before = stats.keepalives;
    let feeds = 6 * programmed.as_secs();
    for _ in 0..feeds {
        wd.feed().expect("feed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(lab.watchdog_armed(node), "armed while fed");
    }
    assert_eq!(
        lab.watchdog_device_stats(node).expect("stats").keepalives,
        before + feeds
    );
    wd.disarm().expect("magic close");
    wait_armed(&lab, node, false).await;
    assert_eq!(lab.watchdog_device_stats(node).expect("stats").magic_closes, 2);
    assert_eq!(
        power_events_after(&lab, node, started),
        0,
        "{}",
        lab.timeline().render()
    );

    // Closed without the magic close, it stays armed and resets the node at its timeout.
    let dropped_at = Timestamp::now();
    drop(open(&path, programmed));
    assert!(lab.watchdog_armed(node), "still armed after a plain close");
    let expired = wait::until("the device's watchdog to expire", Duration::from_secs(10), || async {
        Ok(lab.timeline().find_after(
            dropped_at,
            |e| matches!(e, Event::WatchdogExpired { node: n } if n == node),
        ))
    })
    .await
    .expect("the watchdog fires");
    let elapsed = (expired.at - dropped_at).total(jiff::Unit::Second).expect("seconds");
    let timeout = programmed.as_secs_f64();
    assert!(
        elapsed >= timeout - 0.5,
        "fired after {elapsed}s, before its {timeout} s timeout"
    );
    wait::until("the node to power back on", Duration::from_secs(30), || async {
        Ok(lab.timeline().find_after(
            dropped_at,
            |e| matches!(e, Event::Power { node: n, on: true, cause } if n == node && cause == "watchdog"),
        ))
    })
    .await
    .expect("power-cycled");
    assert_eq!(power_events_after(&lab, "node-2", started), 0, "only node-1 reset");

    // Booted again, the device starts from the driver's default; a handle from before a power
    // cycle neither feeds nor re-arms it.
    let mut stale = open(&path, Duration::ZERO);
    assert_eq!(stale.timeout(), default, "the default timeout after a boot");
    lab.reset(node).await.expect("reset");
    assert!(!lab.watchdog_armed(node), "a power cycle stops the timer");
    assert!(stale.feed().is_err(), "a stale handle cannot feed");
    assert!(!lab.watchdog_armed(node), "nor re-arm");
    drop(stale);
    let stats = lab.watchdog_device_stats(node).expect("stats");
    assert_eq!(stats.opens, 4, "{stats:?}");
}

fn open(path: &Path, timeout: Duration) -> LinuxWatchdog {
    LinuxWatchdog::open(path, timeout, Reboot::Refused).expect("the driver opens the device")
}
