//! Whether a NodeHealthCheck may be deleted: not while it has remediations in flight, as medik8s
//! decides. Its remediation objects are owned by it, so deleting it has the garbage collector
//! delete them mid-remediation: a node being fenced would be abandoned half way, and nothing
//! would watch for it coming back. Denying is the safe default; an administrator who means it
//! pauses the check, deletes the remediations, then the check, or (controller down) the webhook
//! is skipped anyway (failurePolicy Ignore).

use nodemedic_api::healthcheck::{NodeHealthCheck, NodeHealthCheckStatus};
use nodemedic_kube::admission::Verdict;

/// A node the status shows with remediations under way, and those remediations
/// (`Kind namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub node: String,
    pub remediations: Vec<String>,
}

/// What the status says is in flight: unhealthy nodes with remediations, and the deprecated
/// inFlightRemediations map (nodemedic keeps it empty; an older medik8s status may not).
pub(crate) fn in_flight(status: Option<&NodeHealthCheckStatus>) -> Vec<InFlight> {
    let Some(status) = status else {
        return Vec::new();
    };
    let mut found: Vec<InFlight> = status
        .unhealthy_nodes
        .iter()
        .flatten()
        .filter(|n| !n.remediations.is_empty())
        .map(|n| InFlight {
            node: n.name.clone(),
            remediations: n
                .remediations
                .iter()
                .map(|r| {
                    let o = &r.resource;
                    let kind = o.kind.as_deref().unwrap_or("remediation");
                    let name = o.name.as_deref().unwrap_or("?");
                    match o.namespace.as_deref().filter(|ns| !ns.is_empty()) {
                        Some(ns) => format!("{kind} {ns}/{name}"),
                        None => format!("{kind} {name}"),
                    }
                })
                .collect(),
        })
        .collect();
    for node in status.in_flight_remediations.iter().flat_map(|m| m.keys()) {
        if !found.iter().any(|f| f.node == *node) {
            found.push(InFlight {
                node: node.clone(),
                remediations: Vec::new(),
            });
        }
    }
    found
}

/// The decision on deleting NodeHealthCheck `name` with this status.
pub(crate) fn on_delete(name: &str, status: Option<&NodeHealthCheckStatus>) -> Verdict {
    let found = in_flight(status);
    if found.is_empty() {
        return Verdict::Allowed;
    }
    let listed: Vec<String> = found
        .iter()
        .map(|f| match f.remediations.as_slice() {
            [] => format!("node {}", f.node),
            r => format!("node {} ({})", f.node, r.join(", ")),
        })
        .collect();
    Verdict::Denied(format!(
        "NodeHealthCheck {name} has remediations in flight: {}. Deleting it now would delete them before they finish. Wait until they end (nodemedic status shows them; status.unhealthyNodes lists none), or to give them up: add an entry to spec.pauseRequests so no new one starts, delete those remediation objects, then delete {name}",
        listed.join("; ")
    ))
}

/// The decision on an update of NodeHealthCheck `name` from `old` to `new`: while remediations
/// run, its selector and templates stay (medik8s's rule). A node the new selector no longer
/// selects, or a template the check no longer uses, would leave its remediation behind with
/// nothing to finish or remove it.
pub(crate) fn on_update(name: &str, old: &NodeHealthCheck, new: &NodeHealthCheck) -> Verdict {
    let found = in_flight(old.status.as_ref());
    if found.is_empty() {
        return Verdict::Allowed;
    }
    let changed: Vec<&str> = [
        ("spec.selector", same(&old.spec.selector, &new.spec.selector)),
        (
            "spec.remediationTemplate",
            same(&old.spec.remediation_template, &new.spec.remediation_template),
        ),
        (
            "spec.escalatingRemediations",
            same(&old.spec.escalating_remediations, &new.spec.escalating_remediations),
        ),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(field, _)| field)
    .collect();
    if changed.is_empty() {
        return Verdict::Allowed;
    }
    let nodes: Vec<&str> = found.iter().map(|f| f.node.as_str()).collect();
    Verdict::Denied(format!(
        "NodeHealthCheck {name}: {} cannot change while remediations run (nodes {}): their remediations would be left behind. Wait until they end, or add an entry to spec.pauseRequests, delete those remediation objects, then make the change",
        changed.join(", "),
        nodes.join(", ")
    ))
}

/// Spec fields compared by their JSON, as the API server stores them.
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time};
    use nodemedic_api::healthcheck::{Remediation, UnhealthyNode};
    use proptest::prelude::*;

    use super::*;

    fn remediation(kind: &str, name: &str) -> Remediation {
        Remediation {
            resource: ObjectReference {
                kind: Some(kind.into()),
                namespace: Some("workload-availability".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            started: Time(jiff::Timestamp::UNIX_EPOCH),
            timed_out: None,
            template_name: None,
        }
    }

    fn node(name: &str, remediations: Vec<Remediation>) -> UnhealthyNode {
        UnhealthyNode {
            name: name.into(),
            remediations,
            conditions_healthy_timestamp: None,
            healthy_delayed: None,
        }
    }

    fn status(nodes: Vec<UnhealthyNode>) -> NodeHealthCheckStatus {
        NodeHealthCheckStatus {
            unhealthy_nodes: Some(nodes),
            ..Default::default()
        }
    }

    fn check(selector: &str, status: Option<NodeHealthCheckStatus>) -> NodeHealthCheck {
        let mut check: NodeHealthCheck = serde_json::from_value(serde_json::json!({
            "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
            "metadata": {"name": "nhc"},
            "spec": {"selector": {"matchLabels": {selector: ""}},
                "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                    "kind": "SelfNodeRemediationTemplate", "namespace": "ns", "name": "snr"}}
        }))
        .expect("a check");
        check.status = status;
        check
    }

    #[test]
    fn while_remediating_the_selector_and_templates_stay_and_the_rest_may_change() {
        let remediating = Some(status(vec![node("w1", vec![remediation("SelfNodeRemediation", "w1")])]));
        let old = check("worker", remediating.clone());
        let Verdict::Denied(message) = on_update("nhc", &old, &check("infra", None)) else {
            panic!("denied")
        };
        assert!(
            message.contains("spec.selector cannot change") && message.contains("nodes w1"),
            "{message}"
        );
        assert!(message.contains("spec.pauseRequests"), "{message}");
        let mut paused = check("worker", None);
        paused.spec.pause_requests = Some(vec!["maintenance window".into()]);
        assert_eq!(
            on_update("nhc", &old, &paused),
            Verdict::Allowed,
            "other fields may change"
        );
        let idle = check("worker", None);
        assert_eq!(
            on_update("nhc", &idle, &check("infra", None)),
            Verdict::Allowed,
            "nothing runs"
        );
    }

    #[test]
    fn without_remediations_the_check_may_go() {
        assert_eq!(on_delete("nhc", None), Verdict::Allowed);
        assert_eq!(
            on_delete("nhc", Some(&NodeHealthCheckStatus::default())),
            Verdict::Allowed
        );
        // Unhealthy but not (or no longer) remediated: nothing to abandon.
        assert_eq!(
            on_delete("nhc", Some(&status(vec![node("w1", vec![])]))),
            Verdict::Allowed
        );
    }

    #[test]
    fn a_remediation_in_flight_denies_naming_it_and_the_way_out() {
        let s = status(vec![
            node("w1", vec![remediation("SelfNodeRemediation", "w1")]),
            node("w2", vec![]),
        ]);
        let Verdict::Denied(message) = on_delete("nhc", Some(&s)) else {
            panic!("denied")
        };
        assert!(
            message.contains("node w1 (SelfNodeRemediation workload-availability/w1)"),
            "{message}"
        );
        assert!(!message.contains("w2"), "{message}");
        assert!(message.contains("spec.pauseRequests"), "{message}");
    }

    #[test]
    fn the_deprecated_map_counts_too() {
        let s = NodeHealthCheckStatus {
            in_flight_remediations: Some(BTreeMap::from([("w3".to_owned(), Time(jiff::Timestamp::UNIX_EPOCH))])),
            ..Default::default()
        };
        assert!(matches!(on_delete("nhc", Some(&s)), Verdict::Denied(m) if m.contains("node w3")));
    }

    proptest! {
        /// Denied exactly when some node has a remediation, and then every such node is named.
        #[test]
        fn denied_exactly_while_something_is_in_flight(counts in proptest::collection::vec(0usize..3, 0..5)) {
            let nodes: Vec<UnhealthyNode> = counts
                .iter()
                .enumerate()
                .map(|(i, n)| node(&format!("w{i}"), (0..*n).map(|j| remediation("FenceAgentsRemediation", &format!("w{i}-{j}"))).collect()))
                .collect();
            let s = status(nodes);
            match on_delete("nhc", Some(&s)) {
                Verdict::Allowed => prop_assert!(counts.iter().all(|n| *n == 0)),
                Verdict::Denied(message) => {
                    for (i, n) in counts.iter().enumerate() {
                        prop_assert_eq!(message.contains(&format!("node w{i} ")), *n > 0);
                    }
                }
                Verdict::Unchecked(_) => prop_assert!(false, "pure decisions are never unchecked"),
            }
        }
    }
}
