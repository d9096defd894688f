//! The `PeersReachable` node condition the controller writes from a [`Verdict`].

use crate::verdict::{Refutation, Verdict};

/// A condition to write: status, reason and message, as `kubectl describe node` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The condition for `verdict`, or `None` to leave the current one as it is (the peers agree
/// and the controller's host probe is on its way: neither clear a suspicion it cannot yet
/// refute nor declare one it has not confirmed).
pub fn condition(verdict: &Verdict) -> Option<Condition> {
    match verdict {
        Verdict::Reachable { needed: 0, .. } => Some(Condition {
            status: "True",
            reason: "NoPeers",
            message: "this node has no peers to observe it".into(),
        }),
        Verdict::Reachable { observers: 0, .. } => Some(Condition {
            status: "True",
            reason: "PeersReachable",
            message: "no peer reports this node unreachable".into(),
        }),
        Verdict::Reachable { observers, needed } => Some(Condition {
            status: "True",
            reason: "TooFewObservers",
            message: format!("{observers} peer(s) report this node unreachable; {needed} must agree"),
        }),
        Verdict::ProbeHost { .. } => None,
        Verdict::Refuted { since, by } => Some(Condition {
            status: "True",
            reason: "SuspicionRefuted",
            message: match by {
                Refutation::LeaseRenewed { at } => {
                    format!("peers lost this node at {since}, but its kubelet renewed its lease at {at}")
                }
                Refutation::HostAnswered { at } => {
                    format!("peers lost this node at {since}, but its host answered the controller at {at}")
                }
            },
        }),
        Verdict::Unreachable { since, observers } => Some(Condition {
            status: "False",
            reason: "UnreachableByPeers",
            message: format!(
                "unreachable since {since} from {}, its kubelet lease not renewed since and its host not answering",
                observers.join(", ")
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;

    #[test]
    fn each_verdict_reads_as_what_the_evidence_says() {
        let since = Timestamp::from_second(1_800_000_000).expect("in range");
        let unreachable = condition(&Verdict::Unreachable {
            since,
            observers: vec!["node-2".into(), "node-3".into()],
        })
        .expect("a condition");
        assert_eq!(
            (unreachable.status, unreachable.reason),
            ("False", "UnreachableByPeers")
        );
        assert!(
            unreachable.message.contains("node-2, node-3"),
            "{}",
            unreachable.message
        );
        assert_eq!(condition(&Verdict::ProbeHost { since }), None);
        let refuted = condition(&Verdict::Refuted {
            since,
            by: Refutation::HostAnswered { at: since },
        })
        .expect("a condition");
        assert_eq!(refuted.status, "True");
        assert!(refuted.message.contains("host answered"), "{}", refuted.message);
        let few = condition(&Verdict::Reachable {
            observers: 1,
            needed: 3,
        })
        .expect("a condition");
        assert_eq!((few.status, few.reason), ("True", "TooFewObservers"));
    }
}
