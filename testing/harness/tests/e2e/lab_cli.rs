//! `nodemedic-lab ...` for people: up, status, a fault, down; and the errors a person sees when
//! the lab cannot start.

use std::process::Command;

use crate::{nodemedic_lab, text};

/// `nodemedic-lab` keeps one lab per machine in /run/nodemedic/lab-serve: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn lab_up_status_crash_and_down() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let up = nodemedic_lab(&["up", "--nodes", "2"]);
    assert!(up.status.success(), "{}", text(&up));
    assert!(text(&up).contains("export KUBECONFIG="), "{}", text(&up));
    let status = nodemedic_lab(&["status"]);
    assert!(text(&status).contains("node-2"), "{}", text(&status));
    let crash = nodemedic_lab(&["crash", "node-2"]);
    assert!(crash.status.success(), "{}", text(&crash));
    let status = nodemedic_lab(&["status"]);
    assert!(
        text(&status)
            .lines()
            .any(|l| l.starts_with("node-2") && l.contains(" off ")),
        "{}",
        text(&status)
    );
    let unknown = nodemedic_lab(&["freeze", "node-9"]);
    assert!(
        !unknown.status.success() && text(&unknown).contains("no node named node-9"),
        "{}",
        text(&unknown)
    );
    let down = nodemedic_lab(&["down"]);
    assert!(down.status.success(), "{}", text(&down));
    let after = nodemedic_lab(&["status"]);
    assert!(
        !after.status.success() && text(&after).contains("nodemedic-lab up"),
        "{}",
        text(&after)
    );
}

#[test]
fn a_lab_without_root_says_so() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // nobody may not reach the build's own directory (a clone in a 0700 mktemp dir): run a copy.
    let dir = std::env::temp_dir().join(format!("nodemedic-as-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let exe = dir.join("nodemedic-lab");
    std::fs::copy(env!("CARGO_BIN_EXE_nodemedic-lab"), &exe).expect("copy");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&exe)
        .args(["up"])
        .output()
        .expect("runuser");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    assert!(text(&out).contains("needs root"), "{}", text(&out));
}

#[test]
fn a_lab_without_its_binaries_says_what_to_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_nodemedic-lab"))
        .args(["up"])
        .env("NODEMEDIC_CACHE", "/nonexistent-nodemedic-cache")
        .env("KUBEBUILDER_ASSETS", "/nonexistent-assets")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("not found") && said.contains("make setup") && said.contains("KUBEBUILDER_ASSETS"),
        "{said}"
    );
}
