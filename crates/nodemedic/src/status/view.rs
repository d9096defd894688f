//! What `nodemedic status` shows, built from plain lists of objects (no I/O): one row per node.

use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    ResourceExt,
    core::{Selector, SelectorExt},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    healthcheck::NodeHealthCheck,
    maintenance::{MaintenancePhase, NodeMaintenance},
    self_remediation::SelfNodeRemediation,
};
use nodemedic_self_remediation::registration::Published;
use serde::Serialize;

/// Everything one view is built from.
#[derive(Default)]
pub(crate) struct Snapshot {
    pub nodes: Vec<Node>,
    pub checks: Vec<NodeHealthCheck>,
    pub self_remediations: Vec<SelfNodeRemediation>,
    pub fence_remediations: Vec<FenceAgentsRemediation>,
    pub maintenances: Vec<NodeMaintenance>,
    /// The self-remediation agents' registration Leases.
    pub registrations: Vec<Lease>,
    /// Events (the descheduler's evictions among them).
    pub events: Vec<k8s_openapi::api::events::v1::Event>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeRow {
    pub node: String,
    /// The Ready condition's status: True, False or Unknown.
    pub ready: String,
    pub schedulable: bool,
    /// healthy, unhealthy, or unwatched (no NodeHealthCheck selects the node).
    pub health: String,
    /// The NodeHealthChecks whose selector matches the node.
    pub checks: Vec<String>,
    pub remediations: Vec<RemediationView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceView>,
    /// How the node fences itself for self remediation, as its agent registered it
    /// (hardware-watchdog, softdog, software-reboot, none), `disarmed` when its agent stopped
    /// deliberately, or `-` without an agent.
    pub fencing: String,
    /// Why the agent fences by less than the configured device (`-o json`; the table shows the
    /// means, `nodemedic doctor` the fix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_note: Option<String>,
    /// The soft tainter's verdict: overutilized, appropriate, or `-`.
    pub balance: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RemediationView {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub age_seconds: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MaintenanceView {
    pub name: String,
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_progress: Option<i32>,
}

fn remediated_node<K: kube::Resource>(r: &K) -> String {
    match nodemedic_api::machines::node_of(r.meta()) {
        nodemedic_api::machines::NodeOf::Named(node) => node,
        nodemedic_api::machines::NodeOf::Machine(machine) => format!("(the node of Machine {})", machine.name),
    }
}

fn age(created: Option<Timestamp>, now: Timestamp) -> i64 {
    created.map(|c| now.duration_since(c).as_secs().max(0)).unwrap_or(0)
}

fn view<K: ResourceExt>(r: &K, kind: &str, phase: Option<String>, now: Timestamp) -> RemediationView {
    RemediationView {
        kind: kind.into(),
        namespace: r.namespace().unwrap_or_default(),
        name: r.name_any(),
        phase: phase.unwrap_or_else(|| "Pending".into()),
        age_seconds: age(r.creation_timestamp().map(|t| t.0), now),
    }
}

fn fencing_note(registrations: &[Lease], node: &str) -> Option<String> {
    registrations
        .iter()
        .filter_map(Published::from_lease)
        .find(|p| p.node == node)
        .map(|p| p.fencing_note)
        .filter(|note| !note.is_empty())
}

fn fencing(registrations: &[Lease], node: &str) -> String {
    registrations
        .iter()
        .filter_map(Published::from_lease)
        .find(|p| p.node == node)
        .map_or("-".to_owned(), |p| {
            if p.disarmed {
                "disarmed".to_owned()
            } else {
                p.means.as_str().to_owned()
            }
        })
}

pub(crate) fn rows(s: &Snapshot, now: Timestamp) -> Vec<NodeRow> {
    let selectors: Vec<(String, Option<Selector>)> = s
        .checks
        .iter()
        .map(|c| (c.name_any(), Selector::try_from(c.spec.selector.clone()).ok()))
        .collect();
    let mut out: Vec<NodeRow> = s
        .nodes
        .iter()
        .map(|node| {
            let name = node.name_any();
            let ready = node
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into());
            let checks: Vec<String> = selectors
                .iter()
                .filter(|(_, sel)| sel.as_ref().is_some_and(|sel| sel.matches(node.labels())))
                .map(|(n, _)| n.clone())
                .collect();
            let unhealthy = s.checks.iter().any(|c| {
                c.status
                    .as_ref()
                    .and_then(|st| st.unhealthy_nodes.as_ref())
                    .is_some_and(|u| u.iter().any(|u| u.name == name))
            });
            let health = if unhealthy {
                "unhealthy"
            } else if checks.is_empty() {
                "unwatched"
            } else {
                "healthy"
            };
            let mut remediations: Vec<RemediationView> = s
                .self_remediations
                .iter()
                .filter(|r| remediated_node(*r) == name)
                .map(|r| {
                    view(
                        r,
                        "SelfNodeRemediation",
                        r.status.as_ref().and_then(|st| st.phase.clone()),
                        now,
                    )
                })
                .chain(
                    s.fence_remediations
                        .iter()
                        .filter(|r| remediated_node(*r) == name)
                        .map(|r| {
                            view(
                                r,
                                "FenceAgentsRemediation",
                                r.status.as_ref().and_then(|st| st.step.clone()),
                                now,
                            )
                        }),
                )
                .collect();
            remediations.sort_by_key(|r| std::cmp::Reverse(r.age_seconds));
            // The maintenance in force, not a refused duplicate.
            let mut mine: Vec<&NodeMaintenance> = s
                .maintenances
                .iter()
                .filter(|m| m.spec.node_name == name && m.metadata.deletion_timestamp.is_none())
                .collect();
            mine.sort_by_key(|m| m.status.as_ref().and_then(|st| st.phase) == Some(MaintenancePhase::Failed));
            let maintenance = mine
                .into_iter()
                .map(|m| MaintenanceView {
                    name: m.name_any(),
                    phase: m
                        .status
                        .as_ref()
                        .and_then(|st| st.phase)
                        .map(|p| format!("{p:?}"))
                        .unwrap_or_else(|| "Pending".into()),
                    drain_progress: m.status.as_ref().and_then(|st| st.drain_progress),
                })
                .next();
            NodeRow {
                fencing: fencing(&s.registrations, &name),
                fencing_note: fencing_note(&s.registrations, &name),
                balance: super::balance::soft_taint(node),
                node: name,
                ready,
                schedulable: !node.spec.as_ref().and_then(|sp| sp.unschedulable).unwrap_or(false),
                health: health.into(),
                checks,
                remediations,
                maintenance,
            }
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// What a person must know beyond the rows: health checks that watch no node (their
/// NodesSelected condition is False), with the condition's reason why.
pub(super) fn warnings(s: &Snapshot) -> Vec<String> {
    s.checks
        .iter()
        .filter_map(|check| {
            let condition = check
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == nodemedic_api::names::conditions::NODES_SELECTED && c.status == "False")?;
            Some(format!(
                "WARNING: NodeHealthCheck {} selects no nodes: {}",
                check.metadata.name.as_deref().unwrap_or_default(),
                condition.message
            ))
        })
        .collect()
}

/// `42s`, `3m05s`, `2h10m`, `3d4h`.
pub(super) fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// A kubectl-style table.
pub(crate) fn table(rows: &[NodeRow]) -> String {
    let header = [
        "NODE",
        "READY",
        "HEALTH",
        "CHECKS",
        "REMEDIATION",
        "PHASE",
        "AGE",
        "MAINTENANCE",
        "FENCING",
        "BALANCE",
    ];
    let mut lines: Vec<[String; 10]> = vec![header.map(str::to_owned)];
    for r in rows {
        let first = r.remediations.first();
        let ready = if r.schedulable {
            r.ready.clone()
        } else {
            format!("{},SchedulingDisabled", r.ready)
        };
        let maintenance = r
            .maintenance
            .as_ref()
            .map_or("-".to_owned(), |m| match m.drain_progress {
                Some(p) if m.phase == "Running" => format!("{} ({}, {p}%)", m.name, m.phase),
                _ => format!("{} ({})", m.name, m.phase),
            });
        let more = r.remediations.len().saturating_sub(1);
        lines.push([
            r.node.clone(),
            ready,
            r.health.clone(),
            if r.checks.is_empty() {
                "-".into()
            } else {
                r.checks.join(",")
            },
            first.map_or("-".into(), |f| {
                let extra = if more > 0 { format!(" (+{more})") } else { String::new() };
                format!("{}/{}{extra}", f.kind, f.name)
            }),
            first.map_or("-".into(), |f| f.phase.clone()),
            first.map_or("-".into(), |f| human_age(f.age_seconds)),
            maintenance,
            r.fencing.clone(),
            r.balance.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..10)
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("valid object")
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            nodes: vec![
                obj(json!({"metadata": {"name": "node-2", "labels": {"role": "worker"}},
                    "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})),
                obj(json!({"metadata": {"name": "node-1", "labels": {"role": "worker"}},
                    "spec": {"unschedulable": true},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
                obj(json!({"metadata": {"name": "cp-1"},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
            ],
            checks: vec![obj(json!({
                "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
                "metadata": {"name": "workers"},
                "spec": {"selector": {"matchLabels": {"role": "worker"}}},
                "status": {"unhealthyNodes": [{"name": "node-2"}]}
            }))],
            self_remediations: vec![obj(json!({
                "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
                "metadata": {"name": "node-2", "namespace": "wa", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {}, "status": {"phase": "Fencing-Started"}
            }))],
            fence_remediations: vec![],
            maintenances: vec![obj(json!({
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                "metadata": {"name": "dimm"}, "spec": {"nodeName": "node-1"},
                "status": {"phase": "Running", "drainProgress": 50}
            }))],
            registrations: vec![
                obj(json!({"metadata": {"name": "nodemedic-agent-node-1", "annotations": {
                    "nodemedic.medik8s.io/fencing-means": "softdog",
                    "nodemedic.medik8s.io/fencing-note": "/dev/watchdog: no such device"}}})),
                obj(json!({"metadata": {"name": "nodemedic-agent-node-2", "annotations": {
                    "nodemedic.medik8s.io/fencing-means": "hardware-watchdog",
                    "nodemedic.medik8s.io/disarmed": "true"}}})),
            ],
            events: vec![],
        }
    }

    #[test]
    fn one_row_per_node_with_its_check_remediation_and_maintenance() {
        let now: Timestamp = "2026-01-01T00:01:05Z".parse().expect("time");
        let rows = rows(&snapshot(), now);
        let names: Vec<&str> = rows.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(names, ["cp-1", "node-1", "node-2"]);
        assert_eq!(rows[0].health, "unwatched");
        assert_eq!(rows[1].health, "healthy");
        assert!(!rows[1].schedulable);
        assert_eq!(rows[1].maintenance.as_ref().and_then(|m| m.drain_progress), Some(50));
        assert_eq!(rows[2].health, "unhealthy");
        assert_eq!(rows[2].remediations[0].phase, "Fencing-Started");
        assert_eq!(rows[2].remediations[0].age_seconds, 65);
        let text = table(&rows);
        assert!(text.starts_with("NODE"), "{text}");
        assert!(text.contains("SelfNodeRemediation/node-2"), "{text}");
        assert!(text.contains("1m05s"), "{text}");
        assert!(text.contains("True,SchedulingDisabled"), "{text}");
        assert!(text.contains("dimm (Running, 50%)"), "{text}");
        let fencing: Vec<&str> = rows.iter().map(|r| r.fencing.as_str()).collect();
        assert_eq!(
            fencing,
            ["-", "softdog", "disarmed"],
            "each node's means, from its agent"
        );
        assert_eq!(rows[1].fencing_note.as_deref(), Some("/dev/watchdog: no such device"));
        assert_eq!(rows[2].fencing_note, None);
        assert!(text.contains("FENCING"), "{text}");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(7), "7s");
        assert_eq!(human_age(185), "3m05s");
        assert_eq!(human_age(7800), "2h10m");
        assert_eq!(human_age(3 * 86400 + 4 * 3600), "3d4h");
    }

    #[test]
    fn a_check_that_selects_no_nodes_is_a_warning_line() {
        let mut s = snapshot();
        assert!(warnings(&s).is_empty());
        s.checks.push(obj(json!({
            "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": "nhc-snr-3node"},
            "spec": {"selector": {"matchLabels": {"node-role.kubernetes.io/master": ""}}},
            "status": {"conditions": [{"type": "NodesSelected", "status": "False", "reason": "NoNodesSelected",
                "message": "the selector matches none of the cluster's 3 nodes", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        })));
        assert_eq!(
            warnings(&s),
            [
                "WARNING: NodeHealthCheck nhc-snr-3node selects no nodes: the selector matches none of the cluster's 3 nodes"
            ]
        );
    }
}
