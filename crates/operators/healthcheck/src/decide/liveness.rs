//! A second witness before remediating a node whose Ready condition is Unknown: its kubelet's
//! node lease.
//!
//! Ready=Unknown says only that the node controller has not heard from the node for its grace
//! period. Right after a control-plane outage (an API server or etcd restart) it says so of
//! nodes that are perfectly healthy: none of them could renew while the API was away, and the
//! controller marks them Unknown until it notices their next renewal. A node whose kubelet has
//! renewed its lease since the condition turned Unknown, and whose renewal is still current, is
//! alive and talking to the API server; fencing it would be a false fence. Its remediation is
//! held back (not refused): if the renewals stop, the lease expires and the next decision goes
//! ahead.

use std::{collections::BTreeMap, time::Duration};

use jiff::{SignedDuration, Timestamp};

use super::model::{Decision, LeaseAction, NodeFacts, Severity};

/// A node's kubelet lease, as last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeletLease {
    pub renewed: Timestamp,
    pub duration: Duration,
}

/// How soon to look again at a node held back: about when the node controller notices the
/// renewal, or the lease would expire.
const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// When the node's Ready condition turned Unknown, if it is Unknown.
pub fn unknown_since(node: &NodeFacts) -> Option<Timestamp> {
    node.conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "Unknown")
        .map(|c| c.since)
}

/// Whether the lease shows the node alive after it was marked Unknown.
pub fn alive_since(unknown_since: Timestamp, lease: KubeletLease, now: Timestamp) -> bool {
    let duration = SignedDuration::try_from(lease.duration).unwrap_or(SignedDuration::MAX);
    lease.renewed > unknown_since && lease.renewed.checked_add(duration).is_ok_and(|expires| now < expires)
}

/// Removes from `decision` the new remediations (and their node-lease requests) of nodes the
/// kubelet leases show alive; `evidence` maps a node to when it turned Unknown and its lease.
/// Returns how many nodes were held back.
pub fn hold_back_living(
    decision: &mut Decision,
    evidence: &BTreeMap<String, (Timestamp, KubeletLease)>,
    now: Timestamp,
) -> usize {
    let living: BTreeMap<&str, (Timestamp, KubeletLease)> = evidence
        .iter()
        .filter(|(_, (since, lease))| alive_since(*since, *lease, now))
        .map(|(node, found)| (node.as_str(), *found))
        .collect();
    if living.is_empty() {
        return 0;
    }
    decision.create.retain(|new| !living.contains_key(new.node.as_str()));
    decision.leases.retain(|action| match action {
        LeaseAction::Request { node, .. } => !living.contains_key(node.as_str()),
        LeaseAction::Release { .. } => true,
    });
    let held = living.len();
    for (node, (since, lease)) in living {
        decision.notice(
            Some(node),
            Severity::Normal,
            "RemediationHeldBack",
            format!(
                "Node {node} is Ready=Unknown since {since}, but its kubelet renewed its node lease at {}, after that: the status is stale (as after a control-plane outage), so no remediation is created while the renewals go on",
                lease.renewed
            ),
        );
    }
    decision.requeue(LOOK_AGAIN);
    held
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::decide::model::{NewRemediation, TemplateRef};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    fn lease(renewed: i64) -> KubeletLease {
        KubeletLease {
            renewed: at(renewed),
            duration: Duration::from_secs(40),
        }
    }

    fn creating(nodes: &[&str]) -> Decision {
        let mut d = Decision::default();
        for node in nodes {
            d.create.push(NewRemediation {
                node: (*node).into(),
                template: TemplateRef {
                    api_version: String::new(),
                    kind: String::new(),
                    namespace: None,
                    name: String::new(),
                },
                api_version: String::new(),
                kind: String::new(),
                namespace: String::new(),
                name: None,
                spec: serde_json::Value::Null,
                control_plane: false,
            });
            d.leases.push(LeaseAction::Request {
                node: (*node).into(),
                duration: Duration::from_secs(60),
            });
        }
        d
    }

    #[test]
    fn a_renewal_after_the_unknown_holds_the_remediation_back() {
        let mut d = creating(&["alive", "dead"]);
        let evidence = BTreeMap::from([
            ("alive".to_owned(), (at(100), lease(105))),
            ("dead".to_owned(), (at(100), lease(60))),
        ]);
        assert_eq!(hold_back_living(&mut d, &evidence, at(110)), 1);
        let nodes: Vec<_> = d.create.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(nodes, ["dead"]);
        assert_eq!(d.leases.len(), 1);
        assert_eq!(d.notices.len(), 1);
        assert_eq!(d.notices[0].reason, "RemediationHeldBack");
        assert_eq!(d.requeue_after, Some(LOOK_AGAIN));
    }

    #[test]
    fn an_expired_renewal_holds_nothing_back() {
        let mut d = creating(&["n"]);
        let evidence = BTreeMap::from([("n".to_owned(), (at(100), lease(105)))]);
        assert_eq!(hold_back_living(&mut d, &evidence, at(146)), 0);
        assert_eq!(d.create.len(), 1);
        assert!(d.notices.is_empty());
        assert_eq!(d.requeue_after, None);
    }

    proptest! {
        /// Only a renewal after the node went Unknown and still current counts as life; a node
        /// that died (its last renewal before the Unknown) is never held back.
        #[test]
        fn alive_only_when_renewed_after_and_current(since in 0i64..1000, renewed in 0i64..1000, now in 0i64..2000) {
            let alive = alive_since(at(since), lease(renewed), at(now));
            prop_assert_eq!(alive, renewed > since && now < renewed + 40);
            if renewed <= since {
                prop_assert!(!alive);
            }
        }
    }
}
