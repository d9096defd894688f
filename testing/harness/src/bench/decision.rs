//! Decision latency at scale: from the moment a node's unhealthy condition has lasted the health
//! check's duration (its lastTransitionTime plus the duration: when the check's rule fires) to
//! the lab's watch seeing the remediation object, read from the lab timeline.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use nodemedic_lab::timeline::{Entry, Event};

#[derive(Debug, Default, PartialEq)]
pub struct Decisions {
    /// Seconds, for each node that got its remediation.
    pub latencies: BTreeMap<String, f64>,
    /// Nodes that went unhealthy but got no remediation in the timeline.
    pub missing: Vec<String>,
}

/// For each of `nodes`: its first Ready≠True at or after `since`, then the first remediation
/// created for it after that; the latency runs from the condition's transition time (as the API
/// states it; as the lab saw it when absent) plus `duration` (seconds) to that creation.
pub fn latencies(entries: &[Entry], nodes: &BTreeSet<String>, since: Timestamp, duration: f64) -> Decisions {
    let mut unhealthy: BTreeMap<&str, Timestamp> = BTreeMap::new();
    let mut created: BTreeMap<&str, Timestamp> = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.at >= since) {
        match &entry.event {
            Event::NodeReady {
                node,
                status,
                since: transition,
                ..
            } if status != "True" && nodes.contains(node) => {
                unhealthy.entry(node.as_str()).or_insert(transition.unwrap_or(entry.at));
            }
            Event::Remediation { node, change, .. }
                if change == "created" && unhealthy.get(node.as_str()).is_some_and(|t| *t <= entry.at) =>
            {
                created.entry(node.as_str()).or_insert(entry.at);
            }
            _ => {}
        }
    }
    let mut out = Decisions::default();
    for node in nodes {
        match (unhealthy.get(node.as_str()), created.get(node.as_str())) {
            (Some(from), Some(to)) => {
                let gap = (*to - *from).total(jiff::Unit::Second).unwrap_or(0.0);
                out.latencies.insert(node.clone(), gap - duration);
            }
            _ => out.missing.push(node.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).expect("time")
    }

    fn ready(node: &str, status: &str, ms: i64) -> Entry {
        Entry {
            at: at(ms),
            event: Event::NodeReady {
                node: node.into(),
                status: status.into(),
                reason: String::new(),
                since: None,
            },
        }
    }

    fn created(node: &str, ms: i64) -> Entry {
        Entry {
            at: at(ms),
            event: Event::Remediation {
                kind: "SelfNodeRemediation".into(),
                name: node.into(),
                node: node.into(),
                change: "created".into(),
            },
        }
    }

    #[test]
    fn latency_is_the_gap_beyond_the_duration() {
        let entries = vec![
            ready("a", "True", 0),
            ready("a", "Unknown", 1_000),
            ready("b", "Unknown", 1_500),
            created("a", 11_250),
            created("b", 12_000),
            created("c", 12_000),
        ];
        let nodes: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let d = latencies(&entries, &nodes, at(0), 10.0);
        assert_eq!(
            d.latencies,
            BTreeMap::from([("a".to_owned(), 0.25), ("b".to_owned(), 0.5)])
        );
        assert_eq!(d.missing, vec!["c".to_owned()], "c never went unhealthy");
    }

    #[test]
    fn the_apis_transition_time_is_the_start_when_known() {
        let mut unknown = ready("a", "Unknown", 1_700);
        if let Event::NodeReady { since, .. } = &mut unknown.event {
            *since = Some(at(1_000));
        }
        let entries = vec![unknown, created("a", 11_100)];
        let nodes: BTreeSet<String> = ["a"].map(String::from).into();
        let d = latencies(&entries, &nodes, at(0), 10.0);
        assert_eq!(d.latencies.len(), 1);
        assert!((d.latencies["a"] - 0.1).abs() < 1e-9);
    }

    #[test]
    fn a_remediation_from_before_the_failure_does_not_count() {
        let entries = vec![created("a", 500), ready("a", "Unknown", 1_000)];
        let nodes: BTreeSet<String> = ["a"].map(String::from).into();
        let d = latencies(&entries, &nodes, at(0), 10.0);
        assert!(d.latencies.is_empty());
        assert_eq!(d.missing, vec!["a".to_owned()]);
    }
}
