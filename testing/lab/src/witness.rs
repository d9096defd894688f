//! The at-most-one witness: from a timeline alone, find every moment a StatefulSet pod or a pod
//! using a ReadWriteOnce claim ran while the instance it replaces may still have been running.
//!
//! An instance (a pod uid running on a node) ends when its node powers off, when it completes,
//! or when it is deleted while its node is connected (its kubelet saw the deletion and stopped
//! it). Deleted while its node was frozen or cut off, it keeps running until the node powers off
//! or reconnects. After a power cycle, an instance starts again only when the pod is seen Running
//! again. Every claim in the lab is ReadWriteOnce.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Serialize;

use crate::timeline::{Entry, Event, NodeCondition, PodId};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Violation {
    /// `pod:<ns>/<name>` or `pvc:<ns>/<claim>`.
    pub identity: String,
    pub started: PodId,
    pub started_on: String,
    pub at: Timestamp,
    pub still_running: PodId,
    pub still_running_on: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} ({}) started on {} at {} while {} ({}) may still run on {}",
            self.identity,
            self.started,
            self.started.uid,
            self.started_on,
            self.at,
            self.still_running,
            self.still_running.uid,
            self.still_running_on
        )
    }
}

struct Instance {
    pod: PodId,
    node: String,
    identities: Vec<String>,
    /// Deleted while its node could not see it: ends once the node powers off or reconnects.
    orphaned: bool,
}

pub fn identities(pod: &PodId, claims: &[String], stateful: bool) -> Vec<String> {
    let mut ids: Vec<String> = claims.iter().map(|c| format!("pvc:{}/{c}", pod.namespace)).collect();
    if stateful {
        ids.push(format!("pod:{}/{}", pod.namespace, pod.name));
    }
    ids
}

pub fn check(entries: &[Entry]) -> Vec<Violation> {
    let mut nodes: BTreeMap<String, NodeCondition> = BTreeMap::new();
    let mut running: BTreeMap<String, Instance> = BTreeMap::new(); // by uid
    let mut violations = Vec::new();
    let connected =
        |nodes: &BTreeMap<String, NodeCondition>, node: &str| nodes.get(node).is_none_or(NodeCondition::connected);

    for entry in entries {
        match &entry.event {
            Event::NodeCondition { node, condition } => {
                nodes.insert(node.clone(), *condition);
                if !condition.powered {
                    running.retain(|_, i| &i.node != node);
                } else if condition.connected() {
                    running.retain(|_, i| !(i.orphaned && &i.node == node));
                }
            }
            Event::PodPhase {
                pod,
                node: Some(node),
                phase,
                claims,
                stateful,
            } => match phase.as_str() {
                "Running" if !running.contains_key(&pod.uid) => {
                    let ids = identities(pod, claims, *stateful);
                    for other in running.values() {
                        if let Some(shared) = other.identities.iter().find(|id| ids.contains(id)) {
                            violations.push(Violation {
                                identity: shared.clone(),
                                started: pod.clone(),
                                started_on: node.clone(),
                                at: entry.at,
                                still_running: other.pod.clone(),
                                still_running_on: other.node.clone(),
                            });
                        }
                    }
                    if !ids.is_empty() {
                        running.insert(
                            pod.uid.clone(),
                            Instance {
                                pod: pod.clone(),
                                node: node.clone(),
                                identities: ids,
                                orphaned: false,
                            },
                        );
                    }
                }
                "Succeeded" | "Failed" => {
                    running.remove(&pod.uid);
                }
                _ => {}
            },
            Event::PodGone { pod, .. } => {
                if let Some(instance) = running.get_mut(&pod.uid) {
                    if connected(&nodes, &instance.node) {
                        running.remove(&pod.uid);
                    } else {
                        instance.orphaned = true;
                    }
                }
            }
            _ => {}
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Script {
        t: i64,
        entries: Vec<Entry>,
    }

    impl Script {
        fn new() -> Self {
            Self {
                t: 0,
                entries: Vec::new(),
            }
        }
        fn push(&mut self, event: Event) -> &mut Self {
            self.t += 1;
            self.entries.push(Entry {
                at: Timestamp::from_second(self.t).expect("valid"),
                revision: None,
                event,
            });
            self
        }
        fn node(&mut self, node: &str, powered: bool, partitioned: bool) -> &mut Self {
            let condition = NodeCondition {
                powered,
                partitioned,
                ..NodeCondition::default()
            };
            self.push(Event::NodeCondition {
                node: node.into(),
                condition,
            })
        }
        fn running(&mut self, uid: &str, node: &str) -> &mut Self {
            self.push(Event::PodPhase {
                pod: pod(uid),
                node: Some(node.into()),
                phase: "Running".into(),
                claims: vec!["data-db-0".into()],
                stateful: true,
            })
        }
        fn gone(&mut self, uid: &str, node: &str) -> &mut Self {
            self.push(Event::PodGone {
                pod: pod(uid),
                node: Some(node.into()),
            })
        }
    }

    fn pod(uid: &str) -> PodId {
        PodId {
            namespace: "ns".into(),
            name: "db-0".into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn a_replacement_after_power_off_is_safe() {
        let mut s = Script::new();
        s.running("u1", "a")
            .node("a", false, false)
            .gone("u1", "a")
            .running("u2", "b");
        assert!(check(&s.entries).is_empty());
    }

    #[test]
    fn a_graceful_move_between_connected_nodes_is_safe() {
        let mut s = Script::new();
        s.running("u1", "a").gone("u1", "a").running("u2", "b");
        assert!(check(&s.entries).is_empty());
    }

    #[test]
    fn deleting_the_pod_of_a_partitioned_node_and_starting_it_elsewhere_is_caught() {
        let mut s = Script::new();
        s.running("u1", "a")
            .node("a", true, true)
            .gone("u1", "a")
            .running("u2", "b");
        let v = check(&s.entries);
        assert_eq!(v.len(), 1, "one violation per pair of overlapping instances: {v:?}");
        assert_eq!(v[0].still_running_on, "a");
        assert_eq!(v[0].started_on, "b");
    }

    #[test]
    fn an_orphan_ends_when_its_node_reconnects_or_powers_off() {
        let mut s = Script::new();
        s.running("u1", "a")
            .node("a", true, true)
            .gone("u1", "a")
            .node("a", true, false)
            .running("u2", "b");
        assert!(check(&s.entries).is_empty());
        let mut s = Script::new();
        s.running("u1", "a")
            .node("a", true, true)
            .gone("u1", "a")
            .node("a", false, true)
            .running("u2", "b");
        assert!(check(&s.entries).is_empty());
    }

    #[test]
    fn two_claimants_of_one_volume_without_a_power_off_are_caught() {
        let mut s = Script::new();
        s.running("u1", "a").running("u2", "b");
        assert!(!check(&s.entries).is_empty());
    }
}
