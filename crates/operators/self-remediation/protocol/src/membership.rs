//! Who votes: numbered configurations of members, changed by agreement (docs/self-remediation-
//! protocol.md, "Membership").
//!
//! The manager keeps one committed configuration and at most one proposed one. An agent adopts
//! the newest configuration an API read shows it and records the epoch it adopted (its
//! acknowledgement); from then on it refuses every vote asked in an older configuration. A
//! proposal is committed once a majority of the committed configuration has acknowledged it, so
//! no majority of an older configuration can vote again. Nothing here expires: a configuration
//! an agent holds stays usable for as long as an outage lasts.

use std::collections::{BTreeMap, BTreeSet};

use super::vote_quorum;

/// The members whose votes count, numbered. Epochs only grow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Configuration {
    pub epoch: u64,
    pub members: BTreeSet<String>,
}

impl Configuration {
    pub fn new(epoch: u64, members: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            epoch,
            members: members.into_iter().map(Into::into).collect(),
        }
    }

    pub fn contains(&self, node: &str) -> bool {
        self.members.contains(node)
    }
}

/// The membership as the API stores it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Membership {
    pub committed: Configuration,
    /// At most one change is under way at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposed: Option<Configuration>,
}

impl Membership {
    /// The newest configuration: what an agent adopts from a read.
    pub fn latest(&self) -> &Configuration {
        self.proposed.as_ref().unwrap_or(&self.committed)
    }

    /// Every configuration an agent may be counting votes in right now and that the manager must
    /// therefore check: the committed one and the proposed one. Older ones cannot gather a
    /// majority any more (see [`commit_ready`]); newer ones do not exist yet.
    pub fn live(&self) -> impl Iterator<Item = &Configuration> {
        std::iter::once(&self.committed).chain(self.proposed.as_ref())
    }
}

/// What a registration says about an agent's part in membership changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acknowledgement {
    /// The newest epoch the agent adopted from an API read (and so refuses older ones).
    pub epoch: u64,
    /// The agent stopped deliberately: it votes for no one until it has read the API again,
    /// which is as good as having acknowledged every epoch.
    pub disarmed: bool,
}

impl Acknowledgement {
    /// Whether the agent refuses every vote in an epoch older than `epoch`.
    pub fn covers(&self, epoch: u64) -> bool {
        self.disarmed || self.epoch >= epoch
    }
}

/// Whether a majority of the committed configuration has acknowledged the proposal.
pub(crate) fn commit_ready(membership: &Membership, acks: &BTreeMap<String, Acknowledgement>) -> bool {
    let Some(proposed) = &membership.proposed else {
        return false;
    };
    let acknowledged = membership
        .committed
        .members
        .iter()
        .filter(|m| acks.get(*m).is_some_and(|a| a.covers(proposed.epoch)))
        .count();
    acknowledged >= vote_quorum(membership.committed.members.len())
}

/// The next change the manager makes to the membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// No membership yet and no agent has acknowledged any: the first configuration needs no
    /// agreement, since nobody can be counting votes in another.
    Bootstrap(Configuration),
    /// Agents acknowledged a configuration that the API no longer holds (the membership object
    /// was deleted): starting over could let an old configuration and a new one both gather a
    /// majority, so nothing changes until an administrator resets the agents.
    Lost {
        highest_acknowledged: u64,
    },
    Propose(Configuration),
    Commit,
    /// Waiting for acknowledgements, or nothing to change.
    Keep,
}

/// Decides the next membership change. `desired` are the agents that should vote (registered on
/// an existing node); `changes_held` is set while a remediation's safe time runs, because a
/// proposal would make that wait start again.
pub fn next_change(
    current: Option<&Membership>,
    desired: &BTreeSet<String>,
    acks: &BTreeMap<String, Acknowledgement>,
    changes_held: bool,
) -> Change {
    let Some(membership) = current else {
        let highest = acks.values().map(|a| a.epoch).max().unwrap_or(0);
        if highest > 0 {
            return Change::Lost {
                highest_acknowledged: highest,
            };
        }
        if desired.is_empty() {
            return Change::Keep;
        }
        return Change::Bootstrap(Configuration {
            epoch: 1,
            members: desired.clone(),
        });
    };
    if membership.proposed.is_some() {
        return if commit_ready(membership, acks) {
            Change::Commit
        } else {
            Change::Keep
        };
    }
    // An empty configuration could never gather a majority to change again.
    if changes_held || desired.is_empty() || *desired == membership.committed.members {
        return Change::Keep;
    }
    Change::Propose(Configuration {
        epoch: membership.committed.epoch + 1,
        members: desired.clone(),
    })
}

/// The membership after `change` (None for changes that write nothing).
pub fn apply(current: Option<&Membership>, change: &Change) -> Option<Membership> {
    match change {
        Change::Bootstrap(first) => Some(Membership {
            committed: first.clone(),
            proposed: None,
        }),
        Change::Propose(next) => current.map(|m| Membership {
            committed: m.committed.clone(),
            proposed: Some(next.clone()),
        }),
        Change::Commit => current.and_then(|m| {
            m.proposed.clone().map(|p| Membership {
                committed: p,
                proposed: None,
            })
        }),
        Change::Lost { .. } | Change::Keep => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn acks(pairs: &[(&str, u64)]) -> BTreeMap<String, Acknowledgement> {
        pairs
            .iter()
            .map(|(n, e)| {
                (
                    (*n).to_owned(),
                    Acknowledgement {
                        epoch: *e,
                        disarmed: false,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_fresh_install_bootstraps_with_every_registered_agent() {
        let change = next_change(None, &set(&["a", "b", "c"]), &acks(&[]), false);
        assert_eq!(change, Change::Bootstrap(Configuration::new(1, ["a", "b", "c"])));
    }

    #[test]
    fn a_lost_membership_is_not_started_over() {
        let change = next_change(None, &set(&["a", "b"]), &acks(&[("a", 4)]), false);
        assert_eq!(
            change,
            Change::Lost {
                highest_acknowledged: 4
            }
        );
    }

    #[test]
    fn a_change_is_proposed_then_committed_by_a_majority_of_the_old_configuration() {
        let m = Membership {
            committed: Configuration::new(3, ["a", "b", "c"]),
            proposed: None,
        };
        let desired = set(&["a", "b", "c", "d"]);
        let change = next_change(Some(&m), &desired, &acks(&[]), false);
        assert_eq!(change, Change::Propose(Configuration::new(4, ["a", "b", "c", "d"])));
        let m = apply(Some(&m), &change).expect("proposed");
        assert_eq!(m.latest().epoch, 4);
        assert_eq!(m.live().count(), 2);
        assert_eq!(
            next_change(Some(&m), &desired, &acks(&[("a", 4), ("d", 4)]), false),
            Change::Keep,
            "the joining member's acknowledgement does not count towards the old majority"
        );
        assert_eq!(
            next_change(Some(&m), &desired, &acks(&[("a", 4), ("b", 4)]), false),
            Change::Commit
        );
        let m = apply(Some(&m), &Change::Commit).expect("committed");
        assert_eq!(m.committed, Configuration::new(4, ["a", "b", "c", "d"]));
        assert_eq!(next_change(Some(&m), &desired, &acks(&[]), false), Change::Keep);
    }

    #[test]
    fn a_dead_member_need_not_acknowledge_its_removal_and_a_disarmed_one_counts() {
        let m = Membership {
            committed: Configuration::new(1, ["a", "b", "dead"]),
            proposed: Some(Configuration::new(2, ["a", "b"])),
        };
        assert!(commit_ready(&m, &acks(&[("a", 2), ("b", 2)])));
        let mut stopped = acks(&[("a", 2)]);
        stopped.insert(
            "b".into(),
            Acknowledgement {
                epoch: 1,
                disarmed: true,
            },
        );
        assert!(commit_ready(&m, &stopped));
        assert!(!commit_ready(&m, &acks(&[("a", 2), ("b", 1)])));
    }

    #[test]
    fn no_change_is_proposed_while_a_wait_runs_or_towards_an_empty_configuration() {
        let m = Membership {
            committed: Configuration::new(1, ["a", "b"]),
            proposed: None,
        };
        assert_eq!(next_change(Some(&m), &set(&["a"]), &acks(&[]), true), Change::Keep);
        assert_eq!(next_change(Some(&m), &set(&[]), &acks(&[]), false), Change::Keep);
    }

    proptest! {
        /// Whatever the acknowledgements, at most one proposal is ever pending, epochs grow by
        /// one, and a commit happens only with a majority of the old configuration behind it.
        #[test]
        fn changes_go_one_at_a_time(
            steps in proptest::collection::vec(
                (proptest::collection::btree_set(0..5u8, 0..5), proptest::collection::btree_map(0..5u8, 0..6u64, 0..5), any::<bool>()),
                1..12,
            )
        ) {
            let mut current: Option<Membership> = None;
            for (desired, acked, held) in steps {
                let desired: BTreeSet<String> = desired.iter().map(|n| format!("n{n}")).collect();
                let acks: BTreeMap<String, Acknowledgement> = acked
                    .iter()
                    .map(|(n, e)| (format!("n{n}"), Acknowledgement { epoch: *e, disarmed: false }))
                    .collect();
                let change = next_change(current.as_ref(), &desired, &acks, held);
                match (&current, &change) {
                    (Some(m), Change::Propose(p)) => {
                        prop_assert!(m.proposed.is_none());
                        prop_assert_eq!(p.epoch, m.committed.epoch + 1);
                        prop_assert!(!held);
                    }
                    (Some(m), Change::Commit) => prop_assert!(commit_ready(m, &acks)),
                    (Some(_), Change::Bootstrap(_)) => prop_assert!(false, "bootstrapped twice"),
                    _ => {}
                }
                if let Some(next) = apply(current.as_ref(), &change) {
                    prop_assert!(!next.latest().members.is_empty());
                    current = Some(next);
                }
            }
        }
    }
}
