//! The README's first command, run the way a user runs it (non-interactively): the demo narrates
//! a safe recovery, in order, and writes its report.

use std::process::Command;

use serde_json::Value;

use crate::text;

#[test]
fn the_demo_narrates_a_safe_recovery_in_order_and_writes_its_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_nodemedic-lab"))
        .args(["demo", "--report-dir"])
        .arg(dir.path())
        .output()
        .expect("nodemedic-lab demo runs");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let narration = [
        "loses power",
        "is NotReady",
        "a remediation for",
        "is fenced",
        "is deleted",
        "is Running on another node",
        "is back and Ready",
        "is removed",
        "time to recovery",
        "never ran on two nodes at once",
    ];
    let mut from = 0;
    for line in narration {
        let at = said[from..]
            .find(line)
            .unwrap_or_else(|| panic!("the demo did not say {line:?} after what came before:\n{said}"));
        from += at;
    }

    assert!(said.contains("the NodeHealthCheck finds node-"), "{said}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("timeline.json")).expect("timeline.json"))
            .expect("JSON");
    assert_eq!(report["witnessOk"], true, "{report}");
    let seconds = |name: &str| {
        report["milestones"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["milestone"] == name))
            .and_then(|m| m["seconds"].as_f64())
            .unwrap_or_else(|| panic!("milestone {name} missing: {}", report["milestones"]))
    };
    for (before, after) in [
        ("powerLost", "notReady"),
        ("notReady", "unhealthy"),
        ("notReady", "remediationCreated"),
        ("remediationCreated", "fenced"),
        ("fenced", "workloadDeleted"),
        ("workloadDeleted", "workloadRunningElsewhere"),
        ("notReady", "nodeBack"),
        ("nodeBack", "remediationRemoved"),
    ] {
        assert!(seconds(before) <= seconds(after), "{after} before {before}: {report}");
    }
    assert_eq!(
        report["recoverySeconds"].as_f64(),
        Some(seconds("workloadRunningElsewhere"))
    );
    let html = std::fs::read_to_string(dir.path().join("timeline.html")).expect("timeline.html");
    assert!(
        html.contains("<svg") && html.contains("vm/db-0"),
        "the page has its chart"
    );
}
