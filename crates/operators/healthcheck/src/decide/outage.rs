//! A Ready=Unknown that the health check's own loss of the API server explains.
//!
//! When the API server or etcd is away, no kubelet can renew its node lease; once it is back, the
//! node controller marks every node whose renewal it missed Unknown, often before the kubelets'
//! next renewals get through (their requests from during the outage are still timing out). Those
//! Unknowns say nothing about the nodes. The health check cannot tell them from a node that died
//! meanwhile, except by time: after it reaches the API again, every node gets one lease duration
//! to renew before an Unknown that began earlier starts counting towards its rule's duration. A
//! node that did die is remediated that much later, and only after an outage.
//!
//! The health check's view stands for everyone's: when its watches fail, the API is unreachable
//! or failing (it cannot know whether the kubelets fared better, so it assumes they did not).

use std::{collections::BTreeSet, time::Duration};

use jiff::{SignedDuration, Timestamp};

/// How long a node that is alive needs, once the API answers, to renew its lease and have the
/// node controller see it: a kubelet lease duration (it renews every quarter of it, and a
/// request begun during the outage may hang until its own timeout first).
pub const RENEWAL_CHANCE: Duration = Duration::from_secs(40);

/// Whether the health check's watches reach the API server, from what they last reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiContact {
    /// The watches whose last report was a failure.
    failing: BTreeSet<&'static str>,
    /// When the last watch recovered after a failure (all of them answering again).
    regained: Option<Timestamp>,
}

/// What happened to the contact with the API, for the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Lost,
    Regained,
    Same,
}

impl ApiContact {
    /// The watch `watch` failed (the API unreachable or answering with errors).
    pub fn failed(&mut self, watch: &'static str) -> Change {
        let was_failing = !self.failing.is_empty();
        self.failing.insert(watch);
        if was_failing { Change::Same } else { Change::Lost }
    }

    /// The watch `watch` received something: it reaches the API again, if it failed before.
    pub fn answered(&mut self, watch: &'static str, now: Timestamp) -> Change {
        if self.failing.remove(watch) && self.failing.is_empty() {
            self.regained = Some(now);
            Change::Regained
        } else {
            Change::Same
        }
    }

    /// The earliest time an Unknown condition may count from: `now` while a watch fails (no
    /// Unknown counts at all), a lease duration after the API was regained, or none if it never
    /// was lost.
    pub fn unknown_counts_from(&self, now: Timestamp) -> Option<Timestamp> {
        if !self.failing.is_empty() {
            return Some(now.saturating_add(signed(RENEWAL_CHANCE)).unwrap_or(now));
        }
        self.regained
            .map(|at| at.saturating_add(signed(RENEWAL_CHANCE)).unwrap_or(at))
    }
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// When a condition that has had `status` since `since` starts counting: an Unknown no earlier
/// than `unknown_counts_from`.
pub fn counted_since(status: &str, since: Timestamp, unknown_counts_from: Option<Timestamp>) -> Timestamp {
    match unknown_counts_from {
        Some(from) if status == "Unknown" => since.max(from),
        _ => since,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    #[test]
    fn the_contact_is_regained_when_every_failing_watch_answers() {
        let mut contact = ApiContact::default();
        assert_eq!(contact.unknown_counts_from(at(0)), None, "never lost");
        assert_eq!(contact.answered("nodes", at(1)), Change::Same, "nothing had failed");
        assert_eq!(contact.failed("nodes"), Change::Lost);
        assert_eq!(contact.failed("leases"), Change::Same);
        assert_eq!(contact.unknown_counts_from(at(100)), Some(at(140)), "while lost");
        assert_eq!(contact.answered("nodes", at(110)), Change::Same, "leases still fail");
        assert_eq!(contact.answered("leases", at(120)), Change::Regained);
        assert_eq!(contact.unknown_counts_from(at(1000)), Some(at(160)));
        assert_eq!(contact.answered("leases", at(130)), Change::Same, "already regained");
        assert_eq!(contact.unknown_counts_from(at(1000)), Some(at(160)));
    }

    #[test]
    fn only_unknown_conditions_are_discounted() {
        assert_eq!(counted_since("Unknown", at(10), Some(at(50))), at(50));
        assert_eq!(counted_since("Unknown", at(60), Some(at(50))), at(60));
        assert_eq!(counted_since("False", at(10), Some(at(50))), at(10));
        assert_eq!(counted_since("Unknown", at(10), None), at(10));
    }

    proptest! {
        /// Whatever the watches report, in any order: an Unknown never counts from before the
        /// last recovery plus a lease duration, nor from before now plus one while a watch fails.
        #[test]
        fn an_unknown_never_counts_from_inside_an_outage(
            reports in proptest::collection::vec((0usize..3, any::<bool>()), 0..30),
            since in 0i64..400,
        ) {
            const WATCHES: [&str; 3] = ["nodes", "leases", "renewals"];
            let mut contact = ApiContact::default();
            let mut failing = BTreeSet::new();
            let mut regained = None;
            for (i, (watch, ok)) in reports.into_iter().enumerate() {
                let now = at(i as i64 * 10);
                if ok {
                    if failing.remove(WATCHES[watch]) && failing.is_empty() {
                        regained = Some(now);
                    }
                    contact.answered(WATCHES[watch], now);
                } else {
                    failing.insert(WATCHES[watch]);
                    contact.failed(WATCHES[watch]);
                }
            }
            let now = at(1000);
            let counted = counted_since("Unknown", at(since), contact.unknown_counts_from(now));
            prop_assert!(counted >= at(since));
            if !failing.is_empty() {
                prop_assert!(counted >= at(1040));
            } else if let Some(r) = regained {
                prop_assert!(counted >= r + RENEWAL_CHANCE);
            } else {
                prop_assert_eq!(counted, at(since));
            }
        }
    }
}
