//! When is a node unhealthy: some rule's condition has held for its duration, measured from the
//! condition's lastTransitionTime (an Unknown one no earlier than the outage rule allows).

use jiff::Timestamp;

use super::{
    model::{NodeFacts, UnhealthyRule},
    outage,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// A rule's condition holds, not yet for its duration: unhealthy from `at`.
    Soon {
        at: Timestamp,
    },
    Unhealthy {
        type_: String,
        status: String,
        since: Timestamp,
    },
}

/// `outage`: see [`outage::counted_since`].
pub(super) fn classify(
    node: &NodeFacts,
    rules: &[UnhealthyRule],
    now: Timestamp,
    outage: Option<outage::Window>,
) -> Health {
    let mut soonest: Option<Timestamp> = None;
    for rule in rules {
        let Some(condition) = node
            .conditions
            .iter()
            .find(|c| c.type_ == rule.type_ && c.status == rule.status)
        else {
            continue;
        };
        let at = outage::counted_since(&condition.status, condition.since, outage) + rule.duration;
        if at <= now {
            return Health::Unhealthy {
                type_: rule.type_.clone(),
                status: rule.status.clone(),
                since: condition.since,
            };
        }
        soonest = Some(soonest.map_or(at, |s| s.min(at)));
    }
    soonest.map_or(Health::Healthy, |at| Health::Soon { at })
}

/// Whether a rule holds for its duration on a condition that turned so after `after` (the peer
/// detector's PeersReachable=False after a kubelet renewal, say).
pub(super) fn unhealthy_since(node: &NodeFacts, rules: &[UnhealthyRule], now: Timestamp, after: Timestamp) -> bool {
    rules.iter().any(|rule| {
        node.conditions.iter().any(|c| {
            c.type_ == rule.type_ && c.status == rule.status && c.since > after && c.since + rule.duration <= now
        })
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::decide::model::ConditionFacts;
    use crate::decide::test_time::at;

    fn node(status: &str, since: i64) -> NodeFacts {
        NodeFacts {
            name: "n".into(),
            uid: "u".into(),
            labels: Default::default(),
            conditions: vec![ConditionFacts {
                type_: "Ready".into(),
                status: status.into(),
                since: at(since),
            }],
            confirmed_healthy: false,
            upgrading: None,
            machine: None,
        }
    }

    fn rules() -> Vec<UnhealthyRule> {
        ["False", "Unknown"]
            .into_iter()
            .map(|s| UnhealthyRule {
                type_: "Ready".into(),
                status: s.into(),
                duration: Duration::from_secs(300),
            })
            .collect()
    }

    #[test]
    fn unhealthy_only_once_the_condition_held_for_its_duration() {
        assert_eq!(classify(&node("True", 0), &rules(), at(1000), None), Health::Healthy);
        assert_eq!(
            classify(&node("Unknown", 1000), &rules(), at(1299), None),
            Health::Soon { at: at(1300) }
        );
        assert!(matches!(
            classify(&node("Unknown", 1000), &rules(), at(1300), None),
            Health::Unhealthy { .. }
        ));
        assert!(matches!(
            classify(&node("False", 0), &rules(), at(300), None),
            Health::Unhealthy { .. }
        ));
    }

    #[test]
    fn an_unknown_from_an_outage_counts_from_the_nodes_chance_to_renew() {
        let from = Some(outage::Window {
            began: at(900),
            counts_from: at(2000),
            regained: Some(at(1960)),
        });
        assert_eq!(
            classify(&node("Unknown", 1000), &rules(), at(2100), from),
            Health::Soon { at: at(2300) }
        );
        assert!(matches!(
            classify(&node("Unknown", 1000), &rules(), at(2300), from),
            Health::Unhealthy { since, .. } if since == at(1000)
        ));
        assert!(matches!(
            classify(&node("False", 1000), &rules(), at(2100), from),
            Health::Unhealthy { .. }
        ));
    }

    #[test]
    fn a_node_without_the_condition_is_healthy() {
        let mut n = node("True", 0);
        n.conditions.clear();
        assert_eq!(classify(&n, &rules(), at(1000), None), Health::Healthy);
    }
}
