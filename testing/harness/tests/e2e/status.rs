//! `nodemedic status` (and `kubectl nodemedic`) against a lab: one row per node with its checks,
//! remediation and maintenance, as a table, JSON, YAML, and live with `--watch`.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use nodemedic_lab::{Lab, LabConfig};
use serde_json::{Value, json};

use crate::{
    support::{NS, apply_seed, lab, start_controller},
    text,
};

pub(crate) fn status(lab: &Lab, args: &[&str]) -> String {
    let out = Command::new(crate::nodemedic_exe())
        .arg("status")
        .args(args)
        .env("KUBECONFIG", lab.kubeconfig())
        .output()
        .expect("nodemedic status runs");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn row<'a>(rows: &'a Value, node: &str) -> &'a Value {
    rows.as_array()
        .and_then(|a| a.iter().find(|r| r["node"] == node))
        .unwrap_or_else(|| panic!("no row for {node} in {rows}"))
}

/// Reads `--watch -o json` documents (separated by `---`) from a child's stdout.
fn documents(child: &mut std::process::Child) -> mpsc::Receiver<Value> {
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut doc = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line == "---" {
                if let Ok(v) = serde_json::from_str(&doc) {
                    let _ = tx.send(v);
                }
                doc.clear();
            } else {
                doc.push_str(&line);
                doc.push('\n');
            }
        }
    });
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_each_node_with_its_check_remediation_and_maintenance() {
    let lab = lab(LabConfig::seed()).await;
    start_controller(
        &lab,
        "controller",
        &[
            "--disable=health-check",
            "--disable=self-remediation",
            "--disable=fence-agents",
        ],
    );
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {});
    lab.apply_yaml(
        &json!({
            "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
            "metadata": {"name": "node-2", "namespace": NS, "annotations": {"remediation.medik8s.io/node-name": "node-2"}},
            "spec": {"remediationStrategy": "Automatic"}
        })
        .to_string(),
    )
    .expect("remediation");

    let mut watch = Command::new(crate::nodemedic_exe())
        .args(["status", "--watch", "-o", "json"])
        .env("KUBECONFIG", lab.kubeconfig())
        .stdout(Stdio::piped())
        .spawn()
        .expect("status --watch");
    let updates = documents(&mut watch);
    let first = updates.recv_timeout(Duration::from_secs(60)).expect("a first view");
    assert!(row(&first, "node-1")["maintenance"].is_null(), "{first}");

    lab.apply_yaml(
        &json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": "dimm"}, "spec": {"nodeName": "node-1", "reason": "test"}
        })
        .to_string(),
    )
    .expect("maintenance");
    // The watch shows the maintenance through to the end of the drain, without being asked again.
    let drained = loop {
        let view = updates
            .recv_timeout(Duration::from_secs(120))
            .expect("the watch to show node-1's maintenance succeed");
        if row(&view, "node-1")["maintenance"]["phase"] == "Succeeded" {
            break view;
        }
    };
    let _ = watch.kill();
    let _ = watch.wait();
    let node1 = row(&drained, "node-1");
    assert_eq!(node1["schedulable"], false, "{node1}");
    assert_eq!(node1["checks"], json!(["nhc-snr-3node"]), "{node1}");
    let node2 = row(&drained, "node-2");
    assert_eq!(node2["remediations"][0]["kind"], "SelfNodeRemediation", "{node2}");
    assert_eq!(node2["remediations"][0]["name"], "node-2", "{node2}");

    let table = status(&lab, &[]);
    assert!(table.starts_with("NODE"), "{table}");
    assert!(table.contains("SelfNodeRemediation/node-2"), "{table}");
    assert!(table.contains("dimm (Succeeded)"), "{table}");
    let yaml = status(&lab, &["-o", "yaml"]);
    assert!(yaml.contains("node: node-3"), "{yaml}");

    // The same binary, named kubectl-nodemedic on the PATH, is a kubectl plugin.
    let plugins = tempfile::tempdir().expect("tempdir");
    std::fs::copy(crate::nodemedic_exe(), plugins.path().join("kubectl-nodemedic")).expect("copy");
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(lab.kubectl_path())
        .args(["nodemedic", "-o", "json"])
        .env("KUBECONFIG", lab.kubeconfig())
        .env("PATH", path)
        .output()
        .expect("kubectl nodemedic");
    assert!(out.status.success(), "{}", text(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON rows");
    assert_eq!(row(&rows, "node-1")["maintenance"]["name"], "dimm");
}
