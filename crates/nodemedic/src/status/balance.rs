//! Rebalancing in `nodemedic status`: each node's soft taint, and the descheduler's recent
//! evictions (its events), from plain objects.

use jiff::Timestamp;
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use nodemedic_descheduler::decide::soft_taints::{APPROPRIATE, OVERUTILIZED};
use serde::Serialize;

/// The descheduler's event recorder names itself so.
const DESCHEDULER: &str = "sigs.k8s.io.descheduler";
/// Evictions listed at most.
const RECENT: usize = 10;

/// `overutilized`, `appropriate`, or `-`: the soft tainter's verdict on the node.
pub(super) fn soft_taint(node: &Node) -> String {
    let keys: Vec<&str> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| t.key.as_str())
        .collect();
    if keys.contains(&OVERUTILIZED) {
        "overutilized".into()
    } else if keys.contains(&APPROPRIATE) {
        "appropriate".into()
    } else {
        "-".into()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EvictionView {
    pub pod: String,
    /// The strategy that evicted it (the event's reason), e.g. RemoveDuplicates.
    pub strategy: String,
    pub note: String,
    pub age_seconds: i64,
}

/// The descheduler's most recent evictions, newest first.
pub(super) fn recent_evictions(events: &[Event], now: Timestamp) -> Vec<EvictionView> {
    let mut evictions: Vec<(Timestamp, EvictionView)> = events
        .iter()
        .filter(|e| {
            e.reporting_controller.as_deref() == Some(DESCHEDULER) && e.action.as_deref() == Some("Descheduled")
        })
        .filter_map(|e| {
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
            let regarding = e.regarding.as_ref()?;
            Some((
                at,
                EvictionView {
                    pod: format!(
                        "{}/{}",
                        regarding.namespace.as_deref().unwrap_or_default(),
                        regarding.name.as_deref().unwrap_or_default()
                    ),
                    strategy: e.reason.clone().unwrap_or_default(),
                    note: e.note.clone().unwrap_or_default(),
                    age_seconds: now.duration_since(at).as_secs().max(0),
                },
            ))
        })
        .collect();
    evictions.sort_by_key(|e| std::cmp::Reverse(e.0));
    evictions.into_iter().take(RECENT).map(|(_, e)| e).collect()
}

/// The lines under the table.
pub(super) fn section(evictions: &[EvictionView]) -> String {
    if evictions.is_empty() {
        return String::new();
    }
    let mut text = String::from("\nRecent descheduler evictions:\n");
    for e in evictions {
        text.push_str(&format!(
            "  {:>7}  {}  {}: {}\n",
            super::view::human_age(e.age_seconds),
            e.pod,
            e.strategy,
            e.note
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn soft_taints_and_the_descheduler_evictions_read_plainly() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"taints": [
            {"key": APPROPRIATE, "value": "true", "effect": "PreferNoSchedule"},
            {"key": OVERUTILIZED, "value": "true", "effect": "PreferNoSchedule"}]}}))
        .expect("node");
        assert_eq!(soft_taint(&node), "overutilized");
        let events: Vec<Event> = serde_json::from_value(json!([
            {"metadata": {"name": "a"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": DESCHEDULER,
             "action": "Descheduled", "reason": "RemoveDuplicates", "note": "pod eviction from node-1 node by sigs.k8s.io/descheduler",
             "regarding": {"kind": "Pod", "namespace": "shop", "name": "web-1"}},
            {"metadata": {"name": "b"}, "eventTime": "2026-01-01T00:00:30.000000Z", "reportingController": DESCHEDULER,
             "action": "Descheduled", "reason": "LowNodeUtilization", "note": "pod eviction from node-1 node by sigs.k8s.io/descheduler",
             "regarding": {"kind": "Pod", "namespace": "vms", "name": "web-2"}},
            {"metadata": {"name": "c"}, "eventTime": "2026-01-01T00:00:40.000000Z", "reportingController": "nodemedic-controller",
             "action": "Fenced", "reason": "X", "regarding": {"kind": "Node", "name": "node-1"}}
        ]))
        .expect("events");
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().expect("time");
        let recent = recent_evictions(&events, now);
        assert_eq!(
            recent
                .iter()
                .map(|e| (e.pod.as_str(), e.age_seconds))
                .collect::<Vec<_>>(),
            [("vms/web-2", 30), ("shop/web-1", 60)]
        );
        let text = section(&recent);
        assert!(
            text.contains("30s  vms/web-2  LowNodeUtilization: pod eviction from node-1"),
            "{text}"
        );
    }
}
