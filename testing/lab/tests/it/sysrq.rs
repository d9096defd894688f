//! The sysrq guard: a software reboot from inside a node reaches the lab, never the host.

use std::{path::Path, time::Duration};

use jiff::Timestamp;
use nodemedic_lab::{Event, LabConfig, ProcessSpec, SYSRQ_TRIGGER, wait};

use crate::support::logs;

/// A node process that writes `b` to its `/proc/sysrq-trigger` once (it is started again at every
/// boot), and only after checking, in its own mount namespace, that a mount covers the path and
/// that the file it opened is the lab's. On a kernel without sysrq there is no such path (nor
/// anything to reach): it writes to the lab's file itself, to show the lab's side.
const WRITER: &str = r#"
import os, sys, time
trigger, marker = sys.argv[1], sys.argv[2]
if os.path.exists(marker):
    time.sleep(3600)
    sys.exit(0)
if os.path.exists("/proc/sysrq-trigger"):
    mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
    if "/proc/sysrq-trigger" not in mounts:
        sys.exit("nothing is mounted over /proc/sysrq-trigger: not writing")
    fd = os.open("/proc/sysrq-trigger", os.O_WRONLY)
    via = "/proc/sysrq-trigger"
elif os.path.exists("/proc/sys/kernel/sysrq"):
    sys.exit("no /proc/sysrq-trigger although the kernel has sysrq: not writing")
else:
    fd = os.open(trigger, os.O_WRONLY)
    via = "the lab's file (this kernel has no sysrq)"
opened, lab = os.fstat(fd), os.stat(trigger)
if (opened.st_dev, opened.st_ino) != (lab.st_dev, lab.st_ino):
    sys.exit("the file opened is not the lab's: not writing")
open(marker, "w").write(via)
os.write(fd, b"b")
time.sleep(3600)
"#;

fn host_covers_sysrq() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(SYSRQ_TRIGGER))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_b_written_to_sysrq_inside_a_node_power_cycles_that_node_and_nothing_else() {
    logs();
    let lab = nodemedic_lab::Lab::start(LabConfig::workers(2))
        .await
        .expect("lab starts");
    let kernel_has_sysrq = Path::new(SYSRQ_TRIGGER).exists();
    let trigger = lab.sysrq_trigger_path("node-1");
    let marker = lab.dir().join("sysrq-written-node-1");
    let started = Timestamp::now();
    let writer = ProcessSpec::new(
        "/usr/bin/python3",
        [
            "-c",
            WRITER,
            &trigger.display().to_string(),
            &marker.display().to_string(),
        ],
    );
    lab.add_node_process("node-1", "sysrq-writer", writer)
        .expect("the writer starts");

    let log = lab.log_path("node-1/sysrq-writer");
    wait::until("the node's software reboot", Duration::from_secs(15), || async {
        Ok(lab.timeline().find_after(
            started,
            |e| matches!(e, Event::SoftwareReboot { node } if node == "node-1"),
        ))
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}; the writer's log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    wait::until("the node to power back on", Duration::from_secs(30), || async {
        Ok(lab.timeline().find_after(
            started,
            |e| matches!(e, Event::Power { node, on: true, cause } if node == "node-1" && cause == "software-reboot"),
        ))
    })
    .await
    .expect("power-cycled");

    let via = std::fs::read_to_string(&marker).expect("the writer says where it wrote");
    if kernel_has_sysrq {
        assert_eq!(via, SYSRQ_TRIGGER);
    } else {
        eprintln!("this kernel has no sysrq: the bind mount over {SYSRQ_TRIGGER} is not exercised here");
    }
    assert_eq!(
        std::fs::read(&trigger).expect("trigger"),
        b"",
        "the lab took the command"
    );
    let reboots = lab
        .timeline()
        .entries()
        .iter()
        .filter(|e| matches!(&e.event, Event::SoftwareReboot { .. }))
        .count();
    assert_eq!(reboots, 1, "once: the writer started again does not write again");
    assert!(
        lab.timeline()
            .find_after(started, |e| matches!(e, Event::Power { node, .. } if node == "node-2"))
            .is_none(),
        "node-2 untouched"
    );
    assert!(
        !host_covers_sysrq(),
        "the bind mount stays in the node's mount namespace"
    );
    lab.wait_ready_status("node-1", "True", Duration::from_secs(60))
        .await
        .expect("node-1 back");
}
