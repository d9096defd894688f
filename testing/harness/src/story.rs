//! The story of one node failure, read from a lab's timeline: the milestones between the node
//! losing power and its remediation being removed, each the first matching entry after the
//! failure. Pure: the demo narrates it, its test checks the order, benchmarks time it.

use jiff::Timestamp;
use nodemedic_lab::timeline::{Entry, Event};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Milestone {
    PowerLost,
    NotReady,
    Unhealthy,
    RemediationCreated,
    Fenced,
    WorkloadDeleted,
    WorkloadRunningElsewhere,
    NodeBack,
    RemediationRemoved,
}

impl Milestone {
    pub const ALL: [Milestone; 9] = [
        Milestone::PowerLost,
        Milestone::NotReady,
        Milestone::Unhealthy,
        Milestone::RemediationCreated,
        Milestone::Fenced,
        Milestone::WorkloadDeleted,
        Milestone::WorkloadRunningElsewhere,
        Milestone::NodeBack,
        Milestone::RemediationRemoved,
    ];

    pub fn describe(self, node: &str, pod: &str) -> String {
        match self {
            Milestone::PowerLost => format!("{node} loses power"),
            Milestone::NotReady => format!("{node} is NotReady, or unreachable by its peers"),
            Milestone::Unhealthy => format!("the NodeHealthCheck finds {node} unhealthy"),
            Milestone::RemediationCreated => format!("a remediation for {node} is created"),
            Milestone::Fenced => format!("{node} is fenced: nothing can still run there"),
            Milestone::WorkloadDeleted => format!("{pod} on {node} is deleted"),
            Milestone::WorkloadRunningElsewhere => format!("{pod} is Running on another node"),
            Milestone::NodeBack => format!("{node} is back and Ready"),
            Milestone::RemediationRemoved => format!("the remediation for {node} is removed"),
        }
    }
}

/// What the story follows: the failed node and the workload's pod (`namespace/name`).
#[derive(Clone, Debug)]
pub struct Subject {
    pub node: String,
    pub pod: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reached {
    pub milestone: Milestone,
    pub at: Timestamp,
    /// The API's revision of the change, where a watch saw it (see `Entry::revision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The entry's own words (which node the pod moved to, which phase ...).
    pub detail: String,
}

fn matches(m: Milestone, s: &Subject, event: &Event) -> bool {
    let pod_is = |id: &nodemedic_lab::PodId| id.to_string() == s.pod;
    match (m, event) {
        (Milestone::PowerLost, Event::Power { node, on: false, .. }) => *node == s.node,
        (Milestone::NotReady, Event::NodeReady { node, status, .. }) => *node == s.node && status != "True",
        // The peer failure detector's condition: the node is seen failing before NotReady.
        (Milestone::NotReady, Event::PeersReachable { node, status, .. }) => *node == s.node && status == "False",
        (
            Milestone::Unhealthy,
            Event::HealthCheck {
                node, unhealthy: true, ..
            },
        ) => *node == s.node,
        (Milestone::RemediationCreated, Event::Remediation { node, change, .. }) => {
            *node == s.node && change == "created"
        }
        // Self remediation: the manager proved the node rebooted (the safe time passed);
        // fence agents: the BMC confirmed the power off.
        (Milestone::Fenced, Event::Remediation { node, change, .. }) => {
            *node == s.node && (change == "phase Reboot-Completed" || change == "step RecoveringWorkloads")
        }
        (Milestone::WorkloadDeleted, Event::PodGone { pod, node }) => pod_is(pod) && node.as_deref() == Some(&s.node),
        (Milestone::WorkloadRunningElsewhere, Event::PodPhase { pod, node, phase, .. }) => {
            pod_is(pod) && phase == "Running" && node.as_deref().is_some_and(|n| n != s.node)
        }
        (Milestone::NodeBack, Event::NodeReady { node, status, .. }) => *node == s.node && status == "True",
        (Milestone::NodeBack, Event::PeersReachable { node, status, .. }) => *node == s.node && status == "True",
        (Milestone::RemediationRemoved, Event::Remediation { node, change, .. }) => {
            *node == s.node && change == "removed"
        }
        _ => false,
    }
}

/// Each milestone's first entry after the power loss (NodeBack: after NotReady), in the order
/// they happened; a milestone not reached yet is absent.
pub fn milestones(entries: &[Entry], s: &Subject) -> Vec<Reached> {
    let Some(lost) = entries.iter().find(|e| matches(Milestone::PowerLost, s, &e.event)) else {
        return Vec::new();
    };
    let mut out = vec![reached(Milestone::PowerLost, lost)];
    let not_ready = entries
        .iter()
        .find(|e| e.at >= lost.at && matches(Milestone::NotReady, s, &e.event))
        .map(|e| e.at);
    for m in &Milestone::ALL[1..] {
        let since = if *m == Milestone::NodeBack {
            not_ready
        } else {
            Some(lost.at)
        };
        let Some(since) = since else { continue };
        if let Some(e) = entries.iter().find(|e| e.at >= since && matches(*m, s, &e.event)) {
            out.push(reached(*m, e));
        }
    }
    out.sort_by_key(|r| r.at);
    out
}

fn reached(milestone: Milestone, e: &Entry) -> Reached {
    Reached {
        milestone,
        at: e.at,
        revision: e.revision,
        detail: nodemedic_lab::timeline::describe(&e.event),
    }
}

/// Whether the milestones happened in the order a safe recovery must follow: detection before
/// the remediation, fencing before the workload is deleted, deleted before it runs elsewhere.
pub fn in_safe_order(reached: &[Reached]) -> Result<(), String> {
    let find = |m: Milestone| reached.iter().find(|r| r.milestone == m);
    let missing: Vec<String> = Milestone::ALL
        .iter()
        .filter(|m| find(**m).is_none())
        .map(|m| format!("{m:?}"))
        .collect();
    if !missing.is_empty() {
        return Err(format!("not reached: {}", missing.join(", ")));
    }
    // The health check writes the node into its status just after creating the remediation, so
    // those two are not ordered against each other.
    let must = [
        (Milestone::PowerLost, Milestone::NotReady),
        (Milestone::NotReady, Milestone::Unhealthy),
        (Milestone::NotReady, Milestone::RemediationCreated),
        (Milestone::RemediationCreated, Milestone::Fenced),
        (Milestone::Fenced, Milestone::WorkloadDeleted),
        (Milestone::WorkloadDeleted, Milestone::WorkloadRunningElsewhere),
        (Milestone::NotReady, Milestone::NodeBack),
        (Milestone::NodeBack, Milestone::RemediationRemoved),
    ];
    for (before, after) in must {
        if let (Some(b), Some(a)) = (find(before), find(after))
            && happened_before(a, b)
        {
            return Err(format!("{after:?} came before {before:?}"));
        }
    }
    Ok(())
}

/// Two changes the API made are ordered by their revisions: the lab saw them through separate
/// watches, and a watch may deliver later than another one that saw a later change. Anything
/// else (a power loss is the lab's own act) is ordered by when the lab saw it.
fn happened_before(a: &Reached, b: &Reached) -> bool {
    match (a.revision, b.revision) {
        (Some(a), Some(b)) => a < b,
        _ => a.at < b.at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodemedic_lab::PodId;

    fn entry(s: i64, event: Event) -> Entry {
        Entry {
            at: Timestamp::from_second(s).expect("time"),
            revision: None,
            event,
        }
    }

    fn pod() -> PodId {
        PodId {
            namespace: "vm".into(),
            name: "db-0".into(),
            uid: "u".into(),
        }
    }

    fn remediation(s: i64, change: &str) -> Entry {
        entry(
            s,
            Event::Remediation {
                kind: "SelfNodeRemediation".into(),
                name: "node-2".into(),
                node: "node-2".into(),
                change: change.into(),
                created_at: None,
            },
        )
    }

    fn ready(s: i64, status: &str) -> Entry {
        entry(
            s,
            Event::NodeReady {
                node: "node-2".into(),
                status: status.into(),
                reason: String::new(),
                since: None,
            },
        )
    }

    fn subject() -> Subject {
        Subject {
            node: "node-2".into(),
            pod: "vm/db-0".into(),
        }
    }

    /// node-2 fails at 1 s and comes back at 40 s; its remediation is removed at 45 s.
    fn a_recovery() -> Vec<Entry> {
        vec![
            ready(0, "True"),
            entry(
                1,
                Event::Power {
                    node: "node-2".into(),
                    on: false,
                    cause: "crash".into(),
                },
            ),
            ready(11, "Unknown"),
            entry(
                16,
                Event::HealthCheck {
                    check: "c".into(),
                    node: "node-2".into(),
                    unhealthy: true,
                },
            ),
            remediation(16, "created"),
            remediation(32, "phase Reboot-Completed"),
            entry(
                33,
                Event::PodGone {
                    pod: pod(),
                    node: Some("node-2".into()),
                },
            ),
            entry(
                35,
                Event::PodPhase {
                    pod: pod(),
                    node: Some("node-1".into()),
                    phase: "Running".into(),
                    claims: vec![],
                    stateful: true,
                },
            ),
            ready(40, "True"),
            remediation(45, "removed"),
        ]
    }

    #[test]
    fn a_recovery_reads_as_nine_milestones_in_order() {
        let entries = a_recovery();
        let subject = subject();
        let story = milestones(&entries, &subject);
        assert_eq!(story.iter().map(|r| r.milestone).collect::<Vec<_>>(), Milestone::ALL);
        assert_eq!(in_safe_order(&story), Ok(()));
        // The Ready=True before the failure is not "back".
        assert_eq!(story[7].at, Timestamp::from_second(40).expect("time"));
        // A workload that moved before the node was fenced is out of order.
        let mut early = entries.clone();
        early[5].at = Timestamp::from_second(34).expect("time");
        early.sort_by_key(|e| e.at);
        assert!(in_safe_order(&milestones(&early, &subject)).is_err());
        assert!(in_safe_order(&story[..5]).is_err_and(|e| e.contains("not reached")));
    }

    #[test]
    fn changes_seen_through_separate_watches_are_ordered_by_the_api_s_revisions() {
        let (back, removed) = (8, 9);
        let seen = |back_at: i64, removed_at: i64, revisions: Option<(u64, u64)>| {
            let mut entries = a_recovery();
            entries[back].at = Timestamp::from_second(back_at).expect("time");
            entries[removed].at = Timestamp::from_second(removed_at).expect("time");
            entries[back].revision = revisions.map(|r| r.0);
            entries[removed].revision = revisions.map(|r| r.1);
            entries.sort_by_key(|e| e.at);
            in_safe_order(&milestones(&entries, &subject()))
        };
        // The remediation's watch delivered first, yet the API wrote Ready=True before it.
        assert_eq!(seen(45, 44, Some((900, 901))), Ok(()));
        // Without revisions, what the lab saw is all there is.
        assert_eq!(
            seen(45, 44, None),
            Err("RemediationRemoved came before NodeBack".to_string())
        );
        // Seen in order, written out of order: the revisions win.
        assert_eq!(
            seen(40, 45, Some((902, 901))),
            Err("RemediationRemoved came before NodeBack".to_string())
        );
    }
}
