//! An agent's side of the licence protocol: when it may feed its watchdog, when it must fence at
//! once, and how it votes for its peers. Generic over the clock so the model checker can drive it
//! with integer ticks; the agent uses `std::time::Instant`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    ops::Add,
    time::Duration,
};

use super::vote_quorum;

/// A monotonic moment.
pub trait Moment: Copy + Ord + Add<Duration, Output = Self> + Debug {}
impl<T: Copy + Ord + Add<Duration, Output = T> + Debug> Moment for T {}

/// A remediation object an API read showed (timed-out and deleting ones are not intents).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Intent {
    pub node: String,
    pub uid: String,
    /// Its workloads were already recovered (phase Fencing-Completed).
    pub completed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Granted,
    /// The voter has accepted a remediation of the asker: the asker must fence.
    Remediating,
    /// The voter restarted and has not read the API yet.
    NotReady,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceReason {
    OwnRemediation,
    PeerSaysRemediating,
}

/// What a consistent API read returned.
#[derive(Clone, Debug)]
pub struct ApiRead<I> {
    /// When the request was sent (a licence is measured from here).
    pub sent: I,
    pub intents: Vec<Intent>,
    /// The registered agents.
    pub members: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AgentState<I> {
    node: String,
    licence_until: Option<I>,
    fence: Option<FenceReason>,
    read_api: bool,
    /// Target node -> remediation uid this agent has accepted.
    accepted: BTreeMap<String, String>,
    view: Option<(BTreeSet<String>, I)>,
    licence: Duration,
    view_freshness: Duration,
}

impl<I: Moment> AgentState<I> {
    /// A freshly started agent: no licence, votes for no one until it has read the API.
    pub fn new(node: &str, licence: Duration, view_freshness: Duration) -> Self {
        Self {
            node: node.to_owned(),
            licence_until: None,
            fence: None,
            read_api: false,
            accepted: BTreeMap::new(),
            view: None,
            licence,
            view_freshness,
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn fenced(&self) -> Option<FenceReason> {
        self.fence
    }

    pub fn licence_until(&self) -> Option<I> {
        self.licence_until
    }

    pub fn accepted(&self) -> &BTreeMap<String, String> {
        &self.accepted
    }

    /// The other members of the last view, to ask for votes.
    pub fn peers(&self) -> Vec<String> {
        self.view
            .as_ref()
            .map(|(m, _)| m.iter().filter(|n| **n != self.node).cloned().collect())
            .unwrap_or_default()
    }

    fn extend(&mut self, from: I) {
        if self.fence.is_none() {
            let until = from + self.licence;
            self.licence_until = Some(self.licence_until.map_or(until, |l| l.max(until)));
        }
    }

    fn fence(&mut self, why: FenceReason) {
        self.fence.get_or_insert(why);
        self.licence_until = None;
    }

    /// Takes in a consistent read; returns whether the accepted set changed (to be recorded).
    pub fn on_api_read(&mut self, read: &ApiRead<I>) -> bool {
        self.read_api = true;
        self.view = Some((read.members.clone(), read.sent));
        match read.intents.iter().find(|i| i.node == self.node) {
            // Its workloads are gone already: nothing of the old instances can run here.
            Some(own) if own.completed => self.extend(read.sent),
            Some(_) => self.fence(FenceReason::OwnRemediation),
            None => self.extend(read.sent),
        }
        let accepted: BTreeMap<String, String> = read
            .intents
            .iter()
            .filter(|i| i.node != self.node)
            .map(|i| (i.node.clone(), i.uid.clone()))
            .collect();
        let changed = accepted != self.accepted;
        self.accepted = accepted;
        changed
    }

    /// Takes in the answers to a vote round sent at `sent`.
    pub fn on_votes(&mut self, sent: I, answers: &[Verdict]) {
        if answers.contains(&Verdict::Remediating) {
            return self.fence(FenceReason::PeerSaysRemediating);
        }
        let Some((members, read_at)) = &self.view else { return };
        // Counting votes needs a view recent enough to know every settled member.
        if sent > *read_at + self.view_freshness || !members.contains(&self.node) {
            return;
        }
        let granted = 1 + answers.iter().filter(|v| **v == Verdict::Granted).count();
        if granted >= vote_quorum(members.len()) {
            self.extend(sent);
        }
    }

    /// Whether the watchdog may be fed at `now`, keeping `margin` before the licence ends.
    pub fn may_feed(&self, now: I, margin: Duration) -> bool {
        self.fence.is_none() && self.licence_until.is_some_and(|until| now + margin < until)
    }

    /// Moves every stored moment (the model checker keeps time relative to "now").
    #[cfg(test)]
    pub(crate) fn map_moments(&mut self, f: impl Fn(I) -> I) {
        self.licence_until = self.licence_until.map(&f);
        if let Some((_, at)) = &mut self.view {
            *at = f(*at);
        }
    }

    pub fn vote_for(&self, asker: &str) -> Verdict {
        if !self.read_api {
            Verdict::NotReady
        } else if self.accepted.contains_key(asker) {
            Verdict::Remediating
        } else {
            Verdict::Granted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Tick;

    fn read(sent: u64, intents: &[(&str, bool)], members: &[&str]) -> ApiRead<Tick> {
        ApiRead {
            sent: Tick(sent),
            intents: intents
                .iter()
                .map(|(n, c)| Intent {
                    node: (*n).into(),
                    uid: format!("uid-{n}"),
                    completed: *c,
                })
                .collect(),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    fn agent(node: &str) -> AgentState<Tick> {
        AgentState::new(node, Duration::from_secs(5), Duration::from_secs(30))
    }

    #[test]
    fn an_api_read_without_its_remediation_licenses_from_the_send_time() {
        let mut a = agent("a");
        assert!(!a.may_feed(Tick(0), Duration::ZERO));
        a.on_api_read(&read(10, &[], &["a", "b", "c"]));
        assert_eq!(a.licence_until(), Some(Tick(15)));
        assert!(a.may_feed(Tick(13), Duration::from_secs(1)));
        assert!(!a.may_feed(Tick(14), Duration::from_secs(1)), "keeps a margin");
    }

    #[test]
    fn its_own_remediation_fences_at_once_and_for_good() {
        let mut a = agent("a");
        a.on_api_read(&read(10, &[], &["a", "b", "c"]));
        a.on_api_read(&read(11, &[("a", false)], &["a", "b", "c"]));
        assert_eq!(a.fenced(), Some(FenceReason::OwnRemediation));
        assert!(!a.may_feed(Tick(11), Duration::ZERO));
        a.on_api_read(&read(12, &[], &["a", "b", "c"]));
        assert!(
            !a.may_feed(Tick(12), Duration::ZERO),
            "a fenced agent never feeds again"
        );
    }

    #[test]
    fn a_completed_remediation_lets_a_rebooted_node_run() {
        let mut a = agent("a");
        a.on_api_read(&read(10, &[("a", true)], &["a", "b", "c"]));
        assert!(a.may_feed(Tick(11), Duration::ZERO));
    }

    #[test]
    fn votes_license_only_with_a_majority_and_a_fresh_view() {
        let mut a = agent("a");
        a.on_votes(Tick(1), &[Verdict::Granted, Verdict::Granted]);
        assert_eq!(a.licence_until(), None, "no view: cannot count");
        a.on_api_read(&read(10, &[], &["a", "b", "c", "d", "e"]));
        a.on_votes(Tick(20), &[Verdict::Granted, Verdict::NotReady]);
        assert_eq!(a.licence_until(), Some(Tick(15)), "2 of 5 is no majority");
        a.on_votes(Tick(20), &[Verdict::Granted, Verdict::Granted]);
        assert_eq!(a.licence_until(), Some(Tick(25)));
        a.on_votes(Tick(41), &[Verdict::Granted, Verdict::Granted, Verdict::Granted]);
        assert_eq!(
            a.licence_until(),
            Some(Tick(25)),
            "a view older than its freshness bound counts nothing"
        );
        a.on_votes(Tick(21), &[Verdict::Granted, Verdict::Remediating]);
        assert_eq!(a.fenced(), Some(FenceReason::PeerSaysRemediating));
    }

    #[test]
    fn a_voter_refuses_what_it_accepted_and_votes_only_after_reading_the_api() {
        let mut b = agent("b");
        assert_eq!(b.vote_for("a"), Verdict::NotReady);
        assert!(b.on_api_read(&read(1, &[("a", false)], &["a", "b", "c"])));
        assert_eq!(b.vote_for("a"), Verdict::Remediating);
        assert_eq!(b.vote_for("c"), Verdict::Granted);
        assert!(
            b.on_api_read(&read(2, &[], &["a", "b", "c"])),
            "withdrawn when the remediation is gone"
        );
        assert_eq!(b.vote_for("a"), Verdict::Granted);
    }
}
