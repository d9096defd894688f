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
    let unhealthy = unhealthy_since(entries, nodes, since);
    let mut created: BTreeMap<&str, Timestamp> = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.at >= since) {
        if let Event::Remediation { node, change, .. } = &entry.event
            && change == "created"
            && unhealthy.get(node.as_str()).is_some_and(|t| *t <= entry.at)
        {
            created.entry(node.as_str()).or_insert(entry.at);
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

/// When the first of `nodes` turned unhealthy (Ready≠True) at or after `since`: until then, a
/// controller that only watches had nothing to do for them.
pub fn first_unhealthy(entries: &[Entry], nodes: &BTreeSet<String>, since: Timestamp) -> Option<Timestamp> {
    unhealthy_since(entries, nodes, since).into_values().min()
}

/// Each of `nodes`' first Ready≠True at or after `since`: its transition time as the API states
/// it, as the lab saw it when absent.
fn unhealthy_since<'a>(
    entries: &[Entry],
    nodes: &'a BTreeSet<String>,
    since: Timestamp,
) -> BTreeMap<&'a str, Timestamp> {
    let mut unhealthy = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.at >= since) {
        if let Event::NodeReady {
            node,
            status,
            since: transition,
            ..
        } = &entry.event
            && status != "True"
            && let Some(node) = nodes.get(node)
        {
            unhealthy.entry(node.as_str()).or_insert(transition.unwrap_or(entry.at));
        }
    }
    unhealthy
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
            revision: None,
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
            revision: None,
            event: Event::Remediation {
                kind: "SelfNodeRemediation".into(),
                name: node.into(),
                node: node.into(),
                change: "created".into(),
                created_at: None,
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
    fn the_first_failure_is_the_earliest_transition_of_the_nodes_watched() {
        let mut b = ready("b", "Unknown", 2_500);
        if let Event::NodeReady { since, .. } = &mut b.event {
            *since = Some(at(2_000));
        }
        let entries = vec![
            ready("a", "Unknown", 500),
            ready("c", "Unknown", 1_000),
            ready("a", "True", 1_200),
            ready("a", "Unknown", 3_000),
            b,
        ];
        let nodes: BTreeSet<String> = ["a", "b"].map(String::from).into();
        assert_eq!(first_unhealthy(&entries, &nodes, at(1_000)), Some(at(2_000)));
        assert_eq!(first_unhealthy(&entries, &nodes, at(3_500)), None);
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
