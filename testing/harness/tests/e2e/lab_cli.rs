//! `nodemedic-lab ...` for people: the README's "Try it" from up to down, with `nodemedic doctor`
//! and `nodemedic status` against the playground; and the errors a person sees when the lab cannot
//! start.

use std::process::Command;

use crate::{nodemedic_lab, text};

/// `nodemedic-lab` keeps one lab per machine in /run/nodemedic/lab-serve: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

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

/// Stops the lab `nodemedic-lab up` started, also when the test fails half-way.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let _ = nodemedic_lab(&["down"]);
    }
}

fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn kubectl(kubeconfig: &str, args: &[&str]) -> std::process::Output {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(nodemedic_lab::build_dir);
    Command::new(dir.join("kubectl"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .current_dir(repo())
        .output()
        .expect("kubectl runs")
}

/// Polls `probe` every second until it answers, for at most `seconds`.
fn within<T>(seconds: u64, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: not within {seconds} s");
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// The README's "Try it", step by step: a lab with nodemedic and BMCs, a person's own health
/// check applied with kubectl, `nodemedic doctor` finding nothing to fix, `nodemedic status`, a
/// crash, the workload elsewhere, the logs and the timeline, down. One playground for all of it:
/// each `up` costs a lab start.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a scenario on one lab, read whole in the order it happens: its steps share the lab, its clients and its objects"
)]
fn try_it_a_playground_with_bmcs_remediates_a_crashed_node_and_shows_its_logs_and_timeline() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let up = nodemedic_lab(&["up", "--bmcs", "--nodes", "3"]);
    let _down = Down;
    let said = text(&up);
    assert!(up.status.success(), "{said}");
    assert!(
        said.contains("lab up: 3 nodes") && said.contains("nodemedic is installed") && said.contains("BMC"),
        "{said}"
    );
    let kubeconfig = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("export KUBECONFIG="))
        .expect("up prints the KUBECONFIG")
        .to_owned();
    let status = text(&nodemedic_lab(&["status"]));
    assert!(status.contains(" bmc "), "{status}");
    assert!(
        status.contains("node-3") && !status.contains("node-4"),
        "three nodes: {status}"
    );

    let applied = kubectl(&kubeconfig, &["apply", "-f", "examples/try-it/nodehealthcheck.yaml"]);
    assert!(applied.status.success(), "{}", text(&applied));
    let where_it_runs = |kubeconfig: &str| {
        let out = kubectl(
            kubeconfig,
            &[
                "-n",
                "vm",
                "get",
                "pod",
                "db-0",
                "-o",
                "jsonpath={.status.phase} {.spec.nodeName}",
            ],
        );
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        line.strip_prefix("Running ").map(str::to_owned)
    };
    let node = within(120, "db-0 Running", || where_it_runs(&kubeconfig));
    doctor_finds_nothing_to_fix(&kubeconfig);
    let rows = nodemedic(&kubeconfig, &["status", "-o", "json"]);
    assert!(rows.status.success(), "{}", text(&rows));
    assert!(
        text(&rows).contains("try-it"),
        "the check watches every node: {}",
        text(&rows)
    );

    let crash = nodemedic_lab(&["crash", &node]);
    assert!(crash.status.success(), "{}", text(&crash));
    let status = text(&nodemedic_lab(&["status"]));
    assert!(
        status
            .lines()
            .any(|l| l.starts_with(node.as_str()) && l.contains(" off ")),
        "{status}"
    );
    let unknown = nodemedic_lab(&["freeze", "node-9"]);
    assert!(
        !unknown.status.success() && text(&unknown).contains("no node named node-9"),
        "{}",
        text(&unknown)
    );
    let elsewhere = within(240, "db-0 Running on another node", || {
        where_it_runs(&kubeconfig).filter(|n| *n != node)
    });

    let controller = nodemedic_lab(&["logs", "controller"]);
    assert!(controller.status.success(), "{}", text(&controller));
    assert!(text(&controller).contains(&node), "{}", text(&controller));
    let agent = nodemedic_lab(&["logs", &format!("{elsewhere}/agent"), "--lines", "5"]);
    assert!(agent.status.success(), "{}", text(&agent));
    assert!(text(&agent).lines().count() <= 6, "{}", text(&agent));
    let unknown = nodemedic_lab(&["logs", "nothing-by-this-name"]);
    assert!(
        !unknown.status.success() && text(&unknown).contains("controller") && text(&unknown).contains("node-1/agent"),
        "{}",
        text(&unknown)
    );
    let timeline = text(&nodemedic_lab(&["timeline"]));
    assert!(timeline.contains(&format!("fault: crash {node}")), "{timeline}");
    assert!(timeline.contains("SelfNodeRemediation"), "{timeline}");
    assert!(timeline.contains(&format!("Running on {elsewhere}")), "{timeline}");

    // Every lab fault is the playground's, and `undo` undoes one.
    for (args, shows) in [
        (vec!["fill-disk", &elsewhere], " full "),
        (vec!["undo", "fill-disk", &elsewhere], " ok "),
    ] {
        let done = nodemedic_lab(&args);
        assert!(done.status.success(), "{args:?}: {}", text(&done));
        let status = text(&nodemedic_lab(&["status"]));
        assert!(
            status
                .lines()
                .any(|l| l.starts_with(elsewhere.as_str()) && l.contains(shows)),
            "{args:?}: {status}"
        );
    }
    for args in [
        vec![
            "slow-links",
            "--delay-ms",
            "20",
            "--jitter-ms",
            "0",
            "--loss-permille",
            "0",
            "node-1",
        ],
        vec!["undo", "slow-links", "node-1"],
        vec!["hang-bmc", &elsewhere],
        vec!["undo", "hang-bmc", &elsewhere],
    ] {
        let done = nodemedic_lab(&args);
        assert!(done.status.success(), "{args:?}: {}", text(&done));
    }
    let timeline = text(&nodemedic_lab(&["timeline"]));
    for fault in ["fill-disk", "free-disk", "slow links node-1", "restore links node-1"] {
        assert!(timeline.contains(&format!("fault: {fault}")), "{fault}: {timeline}");
    }
    let nothing = nodemedic_lab(&["undo", "restart-etcd"]);
    assert!(
        !nothing.status.success() && text(&nothing).contains("nothing undoes it"),
        "{}",
        text(&nothing)
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

fn nodemedic(kubeconfig: &str, args: &[&str]) -> std::process::Output {
    Command::new(crate::nodemedic_exe())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("nodemedic runs")
}

/// What the playground installs is what doctor wants to see: every agent registered, both
/// accounts allowed what they need, the controller running, the person's check selecting nodes
/// and its template found. Nothing blocking, exit status 0, in JSON and in the table.
fn doctor_finds_nothing_to_fix(kubeconfig: &str) {
    use crate::doctor::{findings, report};
    let out = nodemedic(kubeconfig, &["doctor", "-o", "json"]);
    let report = report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{}", text(&out));
    assert_eq!(report["blocking"], 0, "{report:#}");
    for node in ["node-1", "node-2", "node-3"] {
        let agent = findings(&report, "agents", &format!("node {node}"));
        assert_eq!(agent.len(), 1, "{report:#}");
        assert_eq!(agent[0]["severity"], "ok", "{report:#}");
    }
    let check = findings(&report, "health-check", "NodeHealthCheck try-it");
    assert_eq!(check[0]["message"], "selects node-1, node-2, node-3", "{report:#}");
    assert_eq!(
        findings(&report, "template", "NodeHealthCheck try-it")[0]["severity"],
        "ok",
        "{report:#}"
    );
    for account in ["nodemedic-controller", "nodemedic-agent"] {
        assert_eq!(findings(&report, "rbac", account)[0]["severity"], "ok", "{report:#}");
    }
    assert_eq!(
        findings(&report, "controller", crate::support::NS)[0]["severity"],
        "ok",
        "{report:#}"
    );
    assert_eq!(findings(&report, "kubernetes", "Kubernetes")[0]["severity"], "ok");

    let table = nodemedic(kubeconfig, &["doctor"]);
    assert!(table.status.success(), "{}", text(&table));
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.lines().any(|l| l.starts_with("0 blocking, ")), "{table}");
}
