//! A second witness before remediating a node whose Ready condition is Unknown: its kubelet's
//! node lease.
//!
//! Ready=Unknown says only that the node controller has not heard from the node for its grace
//! period. Right after a control-plane outage (an API server or etcd restart) it says so of
//! nodes that are perfectly healthy: none of them could renew while the API was away, and the
//! controller marks them Unknown until it notices their next renewal (longer if it is itself
//! restarting). A node whose kubelet has renewed its lease since the condition turned Unknown,
//! and whose renewal is still current, is alive and talking to the API server; fencing it would
//! be a false fence. Its remediation is held back, not refused: when the renewals stop, the
//! lease expires and the next decision goes ahead.

use std::{collections::BTreeMap, time::Duration};

use jiff::{SignedDuration, Timestamp};

use super::model::{NodeFacts, UnhealthyRule};

/// Evidence that a Ready=Unknown node is alive: when it turned Unknown and its kubelet's last
/// lease renewal since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alive {
    pub unknown_since: Timestamp,
    pub renewed: Timestamp,
}

/// How long a renewal shows life: the kubelet's default lease duration (it renews every quarter
/// of it). A node that renewed after its Unknown and then died is held back at most this long.
pub(crate) const RENEWAL_CURRENT_FOR: Duration = Duration::from_secs(40);

/// How soon to look again at a node held back: about when the node controller notices the
/// renewal, or the lease would expire.
pub(crate) const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// Renewal times are the API server's clock, Unknown transitions the node controller's, and now
/// is ours; one renewal further ahead of ours than this is not believed. Dead nodes are never
/// held back while the control plane's clocks agree to better than the node controller's grace
/// period (the last renewal of a dead node is a grace period before its Unknown).
pub(crate) const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(5);

/// When the node's Ready condition turned Unknown, if it is Unknown.
pub(crate) fn unknown_since(node: &NodeFacts) -> Option<Timestamp> {
    node.conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "Unknown")
        .map(|c| c.since)
}

pub(crate) fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// The evidence, if a renewal at `renewed` shows the node alive after it was marked Unknown at
/// `since`.
pub(crate) fn alive(since: Timestamp, renewed: Timestamp, now: Timestamp) -> Option<Alive> {
    let believable = now
        .checked_add(signed(MAX_CLOCK_AHEAD))
        .is_ok_and(|limit| renewed <= limit);
    let current = renewed
        .checked_add(signed(RENEWAL_CURRENT_FOR))
        .is_ok_and(|expires| now < expires);
    (renewed > since && believable && current).then_some(Alive {
        unknown_since: since,
        renewed,
    })
}

/// Whether the node's only unhealthy conditions (met or pending) are Ready=Unknown ones its
/// kubelet has renewed its lease since: the budget counts such a node healthy. After a
/// control-plane outage the node controller marks every node Unknown at once, and each is Ready
/// again only at its kubelet's next status update; counted unhealthy meanwhile, the living nodes
/// held back the remediation of one that really died (issue 60: 20 s). Any other condition, the
/// peer detector's included, leaves the node counted as it was.
pub(crate) fn only_a_stale_unknown(
    node: &NodeFacts,
    rules: &[UnhealthyRule],
    renewals: &BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> bool {
    let only_unknown = rules
        .iter()
        .filter_map(|rule| {
            node.conditions
                .iter()
                .find(|c| c.type_ == rule.type_ && c.status == rule.status)
        })
        .all(|c| c.type_ == "Ready" && c.status == "Unknown");
    let renewed_since = unknown_since(node)
        .zip(renewals.get(&node.name))
        .is_some_and(|(since, renewed)| alive(since, *renewed, now).is_some());
    only_unknown && renewed_since
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::decide::test_time::at;

    #[test]
    fn a_current_renewal_after_the_unknown_is_life() {
        assert!(alive(at(100), at(105), at(110)).is_some());
        assert!(alive(at(100), at(105), at(146)).is_none(), "expired");
        assert!(alive(at(100), at(95), at(110)).is_none(), "renewed before the Unknown");
        assert!(alive(at(100), at(120), at(110)).is_none(), "from a clock 10 s ahead");
    }

    proptest! {
        /// Only a believable renewal after the node went Unknown and still current counts as
        /// life; a node whose last renewal came before the Unknown is never held back.
        #[test]
        fn alive_only_when_renewed_after_and_current(since in 0i64..1000, renewed in 0i64..1000, now in 0i64..2000) {
            let found = alive(at(since), at(renewed), at(now)).is_some();
            prop_assert_eq!(found, renewed > since && renewed <= now + 5 && now < renewed + 40);
            if renewed <= since {
                prop_assert!(!found);
            }
        }
    }
}
