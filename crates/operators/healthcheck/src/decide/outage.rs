//! A Ready=Unknown that the health check's own loss of the API server explains.
//!
//! When the API server or etcd is away, no kubelet can renew its node lease; once it is back, the
//! node controller marks every node whose renewal it missed Unknown, often before the kubelets'
//! next renewals get through (their requests from during the outage are still timing out). Those
//! Unknowns say nothing about the nodes. The health check cannot tell them from a node that died
//! meanwhile, except by time: an Unknown that began after the health check last heard from the
//! API before losing it counts towards its rule's duration only from a lease duration after the
//! API answered again, when every living node has had its chance to renew. A node that did die
//! is remediated that much later, and only after an outage; an Unknown from before the outage is
//! not delayed. A loss before that lease duration has passed continues the same outage.
//!
//! The health check's view stands for everyone's: when it cannot reach the API, it assumes the
//! kubelets could not either. Its watches fail when the API server is away, but while etcd is
//! away the API server keeps them open and silent; so when nothing has arrived for a few seconds
//! (in a living cluster the kubelets' renewals arrive all the time) it asks with a read etcd must
//! answer, and a read that fails or takes too long is a loss. Any answer to any watch or read
//! ends the outage (a watch that resumes says nothing until an object changes, so waiting for
//! each one could wait for ever). A health check started after an outage it did not see is told
//! of it when the process did see it ([`ApiContact::after`]: a controller replica that leads
//! only after an outage its leader election went through); one started by a process that did not
//! (a new pod after the outage) is not, and a node whose renewal lands before the decision is
//! still held back by the liveness rule.

use std::time::Duration;

use jiff::Timestamp;

use super::liveness::{self, signed};

/// How long a node that is alive needs, once the API answers, to renew its lease and have the
/// node controller see it: a kubelet lease duration (it renews every quarter of it, and a
/// request begun during the outage may hang until its own timeout first).
pub const RENEWAL_CHANCE: Duration = liveness::RENEWAL_CURRENT_FOR;

/// Nothing received for this long: ask the API (see [`ApiContact::silent`]).
pub(crate) const SILENCE: Duration = Duration::from_secs(5);

/// A read that takes longer than this is a loss: the API server waits on a missing etcd far
/// longer before it answers 504.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The last outage the health check saw, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApiContact {
    /// When the API last answered a watch.
    last_answer: Option<Timestamp>,
    outage: Option<Outage>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Outage {
    /// The last answer before it: an Unknown that began earlier was not caused by it.
    lost_after: Timestamp,
    /// The first answer after it; none while it lasts.
    regained: Option<Timestamp>,
}

/// The Unknown conditions an outage may explain (those since `began`) and when they may count
/// from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub began: Timestamp,
    pub counts_from: Timestamp,
    /// When the API answered again (ours), while it has not: `None`.
    pub regained: Option<Timestamp>,
}

impl Window {
    /// The window as it applies to a node whose kubelet last renewed its lease at `renewed`
    /// (the API server's clock): none once that renewal came after the API answered again. The
    /// node was alive and heard after the outage, so an Unknown it turns later is its own, not
    /// the outage's (a partition starting a few seconds after an outage is remediated on time).
    /// A renewal stamped by a server clock behind ours may be missed: then the node waits the
    /// window, the safe side.
    pub fn for_node(self, renewed: Option<Timestamp>) -> Option<Window> {
        match (self.regained, renewed) {
            (Some(regained), Some(renewed)) if renewed > regained => None,
            _ => Some(self),
        }
    }
}

/// What happened to the contact with the API, for the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Lost,
    Regained,
    Unchanged,
}

impl ApiContact {
    /// The contact of a process that went through an outage before its watches started (lost
    /// after `lost_after`, regained at `regained`, or not yet).
    pub(crate) fn after(lost_after: Timestamp, regained: Option<Timestamp>) -> Self {
        Self {
            last_answer: regained,
            outage: Some(Outage { lost_after, regained }),
        }
    }

    /// A watch failed for want of the API (unreachable, failing or overloaded). A loss before
    /// the nodes have had their chance to renew since the last outage continues that outage:
    /// the Unknowns it may explain still may, and now count from a lease duration after this
    /// loss ends. (Starting a new outage instead would have left them counting from when they
    /// began, as a lab run found: an answer, a failed read five seconds later, and a node the
    /// outage had turned Unknown was remediated at once.)
    pub(crate) fn failed(&mut self, now: Timestamp) -> Change {
        match &mut self.outage {
            Some(o) if o.regained.is_none() => Change::Unchanged,
            Some(o) if o.regained.is_some_and(|r| now < after_chance(r)) => {
                o.regained = None;
                Change::Lost
            }
            _ => {
                self.outage = Some(Outage {
                    lost_after: self.last_answer.unwrap_or(now),
                    regained: None,
                });
                Change::Lost
            }
        }
    }

    /// A watch received something from the API.
    pub(crate) fn answered(&mut self, now: Timestamp) -> Change {
        self.last_answer = Some(now);
        match &mut self.outage {
            Some(o) if o.regained.is_none() => {
                o.regained = Some(now);
                Change::Regained
            }
            _ => Change::Unchanged,
        }
    }

    /// Whether nothing has been received for [`SILENCE`]: time to ask.
    pub(crate) fn silent(&self, now: Timestamp) -> bool {
        self.last_answer
            .is_none_or(|t| t.checked_add(signed(SILENCE)).is_ok_and(|quiet| now >= quiet))
    }

    /// The Unknowns the last outage may explain; while it lasts they count from no earlier than
    /// a lease duration from now.
    pub(crate) fn window(&self, now: Timestamp) -> Option<Window> {
        let outage = self.outage?;
        let regained = outage.regained.unwrap_or(now);
        Some(Window {
            // The node controller's clock against ours: see liveness::MAX_CLOCK_AHEAD.
            began: outage
                .lost_after
                .checked_sub(signed(liveness::MAX_CLOCK_AHEAD))
                .unwrap_or(outage.lost_after),
            counts_from: after_chance(regained),
            regained: outage.regained,
        })
    }
}

/// When every living node has had its chance to renew after the API answered at `regained`.
fn after_chance(regained: Timestamp) -> Timestamp {
    regained.checked_add(signed(RENEWAL_CHANCE)).unwrap_or(regained)
}

/// When a condition that has had `status` since `since` starts counting: an Unknown that began
/// inside the window no earlier than the window allows.
pub(crate) fn counted_since(status: &str, since: Timestamp, window: Option<Window>) -> Timestamp {
    match window {
        Some(w) if status == "Unknown" && since >= w.began => since.max(w.counts_from),
        _ => since,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::decide::test_time::at;

    #[test]
    fn an_outage_lasts_from_the_last_answer_to_the_next() {
        let mut contact = ApiContact::default();
        assert_eq!(contact.window(at(0)), None, "never lost");
        assert_eq!(contact.answered(at(100)), Change::Unchanged);
        assert_eq!(contact.failed(at(110)), Change::Lost);
        assert_eq!(contact.failed(at(150)), Change::Unchanged);
        let lasting = contact.window(at(200)).expect("an outage");
        assert_eq!((lasting.began, lasting.counts_from), (at(95), at(240)));
        assert_eq!(contact.answered(at(300)), Change::Regained);
        assert_eq!(contact.answered(at(310)), Change::Unchanged);
        let over = contact.window(at(1000)).expect("an outage");
        assert_eq!((over.began, over.counts_from), (at(95), at(340)));
        assert_eq!(contact.failed(at(400)), Change::Lost, "a new outage");
        assert_eq!(contact.window(at(400)).map(|w| w.began), Some(at(305)));
    }

    /// A controller replica that led only after an outage its election went through: its health
    /// check holds back the Unknowns the outage caused as if its watches had seen it.
    #[test]
    fn an_outage_the_process_saw_before_the_health_check_started_counts() {
        let mut ongoing = ApiContact::after(at(100), None);
        assert_eq!(ongoing.answered(at(300)), Change::Regained);
        let window = ongoing.window(at(301)).expect("an outage");
        assert_eq!((window.began, window.counts_from), (at(95), at(340)));
        let over = ApiContact::after(at(100), Some(at(300)));
        assert_eq!(over.window(at(301)), Some(window));
        assert_eq!(counted_since("Unknown", at(305), Some(window)), at(340));
    }

    /// The lab's etcd outage: the API answered again, a read failed five seconds later, and
    /// answered again a second after that; a node the outage turned Unknown (at 433, before the
    /// first answer) must still wait a lease duration from the last answer.
    #[test]
    fn a_loss_soon_after_an_outage_continues_it() {
        let mut contact = ApiContact::default();
        contact.answered(at(380));
        assert_eq!(contact.failed(at(390)), Change::Lost);
        assert_eq!(contact.answered(at(439)), Change::Regained);
        assert_eq!(contact.failed(at(444)), Change::Lost, "within the chance to renew");
        assert_eq!(contact.answered(at(445)), Change::Regained);
        let window = contact.window(at(446)).expect("an outage");
        assert_eq!((window.began, window.counts_from), (at(375), at(485)));
        assert_eq!(counted_since("Unknown", at(433), Some(window)), at(485));
        assert_eq!(contact.failed(at(485)), Change::Lost, "after the chance: a new outage");
        assert_eq!(contact.window(at(485)).map(|w| w.began), Some(at(440)));
    }

    #[test]
    fn silence_is_a_question_not_a_loss() {
        let mut contact = ApiContact::default();
        assert!(contact.silent(at(0)), "nothing heard yet");
        contact.answered(at(10));
        assert!(!contact.silent(at(14)));
        assert!(contact.silent(at(15)));
        assert_eq!(contact.window(at(100)), None);
    }

    #[test]
    fn a_renewal_after_the_api_answered_again_takes_the_node_out_of_the_window() {
        let window = Window {
            began: at(100),
            counts_from: at(300),
            regained: Some(at(260)),
        };
        assert_eq!(window.for_node(None), Some(window), "no renewal known");
        assert_eq!(
            window.for_node(Some(at(250))),
            Some(window),
            "renewed before the API came back"
        );
        assert_eq!(window.for_node(Some(at(261))), None);
        let ongoing = Window {
            regained: None,
            ..window
        };
        assert_eq!(ongoing.for_node(Some(at(1000))), Some(ongoing), "the outage goes on");
    }

    #[test]
    fn only_unknowns_that_began_in_the_window_wait() {
        let window = Some(Window {
            began: at(100),
            counts_from: at(300),
            regained: Some(at(260)),
        });
        assert_eq!(counted_since("Unknown", at(150), window), at(300));
        assert_eq!(counted_since("Unknown", at(400), window), at(400));
        assert_eq!(
            counted_since("Unknown", at(50), window),
            at(50),
            "from before the outage"
        );
        assert_eq!(
            counted_since("False", at(150), window),
            at(150),
            "the kubelet's own word"
        );
        assert_eq!(counted_since("Unknown", at(150), None), at(150));
    }

    proptest! {
        /// Whatever the watches report, in any order: an Unknown that began after the last
        /// answer before an outage counts from no earlier than a lease duration after the
        /// first answer after it (or after now, while it lasts), and exactly from then; a loss
        /// within that lease duration continues the outage.
        #[test]
        fn an_unknown_from_an_outage_counts_from_its_chance_to_renew(
            reports in proptest::collection::vec(any::<bool>(), 1..30),
            since in 0i64..400,
        ) {
            let mut contact = ApiContact::default();
            for (i, answered) in reports.iter().enumerate() {
                let now = at(i as i64 * 10);
                if *answered { contact.answered(now); } else { contact.failed(now); }
            }
            let now = at(1000);
            let counted = counted_since("Unknown", at(since), contact.window(now));
            prop_assert!(counted >= at(since));
            // Runs of failures: where each starts, and the answer that ends it.
            let runs: Vec<(usize, Option<usize>)> = (0..reports.len())
                .filter(|i| !reports[*i] && (*i == 0 || reports[i - 1]))
                .map(|start| (start, (start..reports.len()).find(|i| reports[*i])))
                .collect();
            let Some(&(_, regained)) = runs.last() else {
                prop_assert_eq!(counted, at(since), "never lost");
                return Ok(());
            };
            // The last outage: the last run and every run before it that started within a
            // lease duration of the previous one's end.
            let chance = RENEWAL_CHANCE.as_secs() as usize / 10;
            let mut first = runs.len() - 1;
            while first > 0 && runs[first - 1].1.is_some_and(|end| runs[first].0 < end + chance) {
                first -= 1;
            }
            let start = runs[first].0;
            let before = (0..start).rev().find(|i| reports[*i]).map_or(start, |i| i);
            let began = at(before as i64 * 10 - 5);
            let counts_from = regained.map_or(now, |i| at(i as i64 * 10)) + RENEWAL_CHANCE;
            if at(since) >= began {
                prop_assert_eq!(counted, at(since).max(counts_from));
            } else {
                prop_assert_eq!(counted, at(since));
            }
        }
    }
}
