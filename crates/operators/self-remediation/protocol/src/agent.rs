//! An agent's side of the licence protocol: when it may feed its watchdog, when it must fence at
//! once, how it votes for its peers, and which configuration it counts votes in. Generic over the
//! clock so the model checker can drive it with integer ticks; the agent uses
//! `std::time::Instant`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    ops::Add,
    time::Duration,
};

use super::{membership::Configuration, vote_quorum};

/// A monotonic moment.
pub trait Moment: Copy + Ord + Add<Duration, Output = Self> + Debug {}
impl<T: Copy + Ord + Add<Duration, Output = T> + Debug> Moment for T {}

/// A remediation object an API read showed (timed-out and deleting ones are not intents).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Intent {
    pub node: String,
    pub uid: String,
    /// When its workloads were already released (phase Fencing-Completed): its creation time.
    /// A boot of its node that began after then runs none of the instances it fenced.
    pub released: Option<jiff::Timestamp>,
}

impl Intent {
    /// Whether the remediation is over for its node's boot that began at `booted`: its
    /// workloads were released, and that boot began after it was created (an unknown boot time
    /// counts as before).
    pub fn over_for(&self, booted: Option<jiff::Timestamp>) -> bool {
        self.released.zip(booted).is_some_and(|(created, boot)| created < boot)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Granted,
    /// The voter has accepted a remediation of the asker: the asker must fence.
    Remediating,
    /// The voter restarted and has not read the API yet, or is stopping: it votes for no one.
    NotReady,
    /// The voter adopted a newer configuration than the one the asker counts in; here it is.
    Stale(Configuration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceReason {
    OwnRemediation,
    PeerSaysRemediating,
    /// An earlier agent process of this boot let its licence lapse (or was fencing) and died
    /// before the watchdog fired.
    InheritedLapse,
}

/// What a consistent API read returned.
#[derive(Clone, Debug)]
pub struct ApiRead<I> {
    /// When the request was sent (a licence is measured from here).
    pub sent: I,
    pub intents: Vec<Intent>,
    /// The newest configuration, when the membership was part of this read.
    pub configuration: Option<Configuration>,
}

/// How a vote round ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    Licensed,
    NoMajority,
    Fenced,
    /// A voter knew a newer configuration, which the agent adopted: ask again in it.
    Adopted,
    /// The agent has no configuration from the API yet, or is not a member of its own.
    CannotCount,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AgentState<I> {
    node: String,
    licence_until: Option<I>,
    fence: Option<FenceReason>,
    /// Has read the remediations since it started.
    read_intents: bool,
    /// Target node -> remediation uid this agent has accepted.
    accepted: BTreeMap<String, String>,
    /// The accepted remediations whose workloads were released, by target node.
    released: BTreeMap<String, Intent>,
    /// When this node booted (`None`: unknown), for its own remediation.
    booted: Option<jiff::Timestamp>,
    /// The newest configuration it knows (first from an API read, then also from peers).
    configuration: Option<Configuration>,
    /// Stopping deliberately: it votes for no one any more.
    stopping: bool,
    licence: Duration,
}

impl<I: Moment> AgentState<I> {
    /// A freshly started agent: no licence, votes for no one until it has read the API.
    pub fn new(node: &str, licence: Duration) -> Self {
        Self {
            node: node.to_owned(),
            licence_until: None,
            fence: None,
            read_intents: false,
            accepted: BTreeMap::new(),
            released: BTreeMap::new(),
            booted: None,
            configuration: None,
            stopping: false,
            licence,
        }
    }

    /// The agent of a node that booted at `booted`.
    pub fn booted_at(mut self, booted: Option<jiff::Timestamp>) -> Self {
        self.booted = booted;
        self
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn fenced(&self) -> Option<FenceReason> {
        self.fence
    }

    /// When the licence ends (`None`: it has none, or is fenced).
    pub fn licence_until(&self) -> Option<I> {
        self.licence_until
    }

    pub fn accepted(&self) -> &BTreeMap<String, String> {
        &self.accepted
    }

    pub fn configuration(&self) -> Option<&Configuration> {
        self.configuration.as_ref()
    }

    /// The epoch it has adopted (0: none yet).
    pub fn epoch(&self) -> u64 {
        self.configuration.as_ref().map_or(0, |c| c.epoch)
    }

    /// The other members of its configuration, to ask for votes.
    pub fn peers(&self) -> Vec<String> {
        self.configuration
            .as_ref()
            .map(|c| c.members.iter().filter(|n| **n != self.node).cloned().collect())
            .unwrap_or_default()
    }

    fn extend(&mut self, from: I) {
        self.extend_to(from + self.licence);
    }

    fn fence(&mut self, why: FenceReason) {
        self.fence.get_or_insert(why);
        self.licence_until = None;
    }

    /// Takes over the licence an earlier agent process of this boot held (`None`: it lapsed):
    /// the licence belongs to the node's boot, and the kernel's keep-alive when that process died
    /// must not buy the node more time.
    pub fn inherit(&mut self, until: Option<I>) {
        match until {
            Some(until) => self.extend_to(until),
            None => self.fence(FenceReason::InheritedLapse),
        }
    }

    fn extend_to(&mut self, until: I) {
        if self.fence.is_none() {
            self.licence_until = Some(self.licence_until.map_or(until, |l| l.max(until)));
        }
    }

    /// Configurations only move forward: an adopted epoch is never given up.
    fn adopt(&mut self, newer: &Configuration) -> bool {
        if self.epoch() < newer.epoch {
            self.configuration = Some(newer.clone());
            return true;
        }
        false
    }

    /// Takes in a configuration read from the API (on its own, when the remediations could not be
    /// read in the same round).
    pub(crate) fn on_configuration(&mut self, configuration: &Configuration) {
        self.adopt(configuration);
    }

    /// Takes in a consistent read; returns whether the accepted set changed (to be recorded).
    pub(crate) fn on_api_read(&mut self, read: &ApiRead<I>) -> bool {
        if let Some(configuration) = &read.configuration {
            self.adopt(configuration);
        }
        self.read_intents = true;
        match read.intents.iter().find(|i| i.node == self.node) {
            // Its workloads are gone already: nothing of the old instances can run here.
            Some(own) if own.over_for(self.booted) => self.extend(read.sent),
            Some(_) => self.fence(FenceReason::OwnRemediation),
            None => self.extend(read.sent),
        }
        let accepted: BTreeMap<String, String> = read
            .intents
            .iter()
            .filter(|i| i.node != self.node)
            .map(|i| (i.node.clone(), i.uid.clone()))
            .collect();
        self.released = read
            .intents
            .iter()
            .filter(|i| i.node != self.node && i.released.is_some())
            .map(|i| (i.node.clone(), i.clone()))
            .collect();
        let changed = accepted != self.accepted;
        self.accepted = accepted;
        changed
    }

    /// Takes in the answers (voter, verdict) to a round asked in epoch `asked_in` and sent at
    /// `sent`. Only members of that configuration count, each once, the agent itself included
    /// while it has not seen its own remediation.
    pub fn on_votes(&mut self, sent: I, asked_in: u64, answers: &[(String, Verdict)]) -> Round {
        if answers.iter().any(|(_, v)| *v == Verdict::Remediating) {
            self.fence(FenceReason::PeerSaysRemediating);
            return Round::Fenced;
        }
        // A configuration learnt from a peer is adopted only by an agent that has read the API
        // since it started: a rebooted node must read its own remediation first.
        let newest = answers
            .iter()
            .filter_map(|(_, v)| match v {
                Verdict::Stale(c) => Some(c),
                _ => None,
            })
            .max_by_key(|c| c.epoch);
        if let Some(newer) = newest
            && self.configuration.is_some()
            && self.adopt(newer)
        {
            return Round::Adopted;
        }
        let Some(configuration) = &self.configuration else {
            return Round::CannotCount;
        };
        if configuration.epoch != asked_in || !configuration.contains(&self.node) {
            return Round::CannotCount;
        }
        let voters: BTreeSet<&str> = answers
            .iter()
            .filter(|(voter, v)| *v == Verdict::Granted && *voter != self.node && configuration.contains(voter))
            .map(|(voter, _)| voter.as_str())
            .collect();
        if voters.len() + 1 >= vote_quorum(configuration.members.len()) {
            self.extend(sent);
            Round::Licensed
        } else {
            Round::NoMajority
        }
    }

    /// Has held no licence since it started (nor taken one over) and is not fencing: its
    /// watchdog, armed at the start, runs out unless a read or a vote grants one soon.
    pub fn awaits_first_licence(&self) -> bool {
        self.fence.is_none() && self.licence_until.is_none()
    }

    /// Whether the watchdog may be fed at `now`, keeping `margin` before the licence ends.
    pub fn may_feed(&self, now: I, margin: Duration) -> bool {
        self.fence.is_none() && self.licence_until.is_some_and(|until| now + margin < until)
    }

    /// Moves every stored moment (the model checker keeps time relative to "now").
    #[cfg(test)]
    pub(crate) fn map_moments(&mut self, f: impl Fn(I) -> I) {
        self.licence_until = self.licence_until.map(&f);
    }

    /// A deliberate stop: from now on it votes for no one (before its registration says
    /// `disarmed`, which the manager counts as an acknowledgement of every epoch).
    pub fn stop_voting(&mut self) {
        self.stopping = true;
    }

    /// The answer to `asker`, whose boot began at `asker_booted` (`None`: unknown), counting
    /// votes in epoch `asked_in`. A remediation it accepted is over for the asker on the same
    /// terms as the asker's own read ([`Intent::over_for`]): a node back after its workloads were
    /// released is not told to fence by a voter that has not yet read its remediation's deletion.
    pub fn vote_for(&self, asker: &str, asked_in: u64, asker_booted: Option<jiff::Timestamp>) -> Verdict {
        let Some(configuration) = &self.configuration else {
            return Verdict::NotReady;
        };
        let over = self.released.get(asker).is_some_and(|r| r.over_for(asker_booted));
        if self.stopping || !self.read_intents {
            Verdict::NotReady
        } else if self.accepted.contains_key(asker) && !over {
            Verdict::Remediating
        } else if configuration.epoch > asked_in {
            Verdict::Stale(configuration.clone())
        } else {
            Verdict::Granted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tick;

    fn read(sent: u64, intents: &[(&str, bool)], members: Option<(u64, &[&str])>) -> ApiRead<Tick> {
        ApiRead {
            sent: Tick(sent),
            intents: intents
                .iter()
                .map(|(n, c)| Intent {
                    node: (*n).into(),
                    uid: format!("uid-{n}"),
                    released: c.then_some(at(CREATED)),
                })
                .collect(),
            configuration: members.map(|(epoch, m)| Configuration::new(epoch, m.iter().copied())),
        }
    }

    /// The remediations of [`read`] were created at this second, before [`agent`]s booted.
    const CREATED: i64 = 1_000;
    const BOOTED: i64 = 2_000;

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(second).expect("a valid second")
    }

    fn agent(node: &str) -> AgentState<Tick> {
        AgentState::new(node, Duration::from_secs(5)).booted_at(Some(at(BOOTED)))
    }

    const ABC: Option<(u64, &[&str])> = Some((1, &["a", "b", "c"]));

    fn granted(voters: &[&str]) -> Vec<(String, Verdict)> {
        voters.iter().map(|v| ((*v).to_owned(), Verdict::Granted)).collect()
    }

    #[test]
    fn only_a_fresh_agent_that_is_not_fencing_awaits_its_first_licence() {
        let mut fresh = agent("a");
        assert!(fresh.awaits_first_licence());
        fresh.on_votes(Tick(0), 1, &granted(&["a", "b"]));
        assert!(
            fresh.awaits_first_licence(),
            "no configuration yet: votes count for nothing"
        );
        fresh.on_api_read(&read(0, &[], ABC));
        assert!(!fresh.awaits_first_licence(), "licensed by a read");

        let mut successor = agent("a");
        successor.inherit(Some(Tick(3)));
        assert!(!successor.awaits_first_licence(), "took a licence over");

        let mut remediated = agent("a");
        remediated.on_api_read(&read(0, &[("a", false)], ABC));
        assert!(!remediated.awaits_first_licence(), "fencing, not waiting");
    }

    #[test]
    fn an_api_read_without_its_remediation_licenses_from_the_send_time() {
        let mut a = agent("a");
        assert!(!a.may_feed(Tick(0), Duration::ZERO));
        a.on_api_read(&read(10, &[], ABC));
        assert_eq!(a.licence_until(), Some(Tick(15)));
        assert!(a.may_feed(Tick(13), Duration::from_secs(1)));
        assert!(!a.may_feed(Tick(14), Duration::from_secs(1)), "keeps a margin");
    }

    #[test]
    fn its_own_remediation_fences_at_once_and_for_good() {
        let mut a = agent("a");
        a.on_api_read(&read(10, &[], ABC));
        a.on_api_read(&read(11, &[("a", false)], None));
        assert_eq!(a.fenced(), Some(FenceReason::OwnRemediation));
        assert!(!a.may_feed(Tick(11), Duration::ZERO));
        a.on_api_read(&read(12, &[], None));
        assert!(
            !a.may_feed(Tick(12), Duration::ZERO),
            "a fenced agent never feeds again"
        );
    }

    #[test]
    fn a_restarted_agent_takes_over_its_predecessor_s_licence_or_its_lapse() {
        let mut a = agent("a");
        a.inherit(Some(Tick(20)));
        assert!(a.may_feed(Tick(19), Duration::ZERO));
        assert!(!a.may_feed(Tick(20), Duration::ZERO));
        let mut b = agent("b");
        b.inherit(None);
        assert_eq!(b.fenced(), Some(FenceReason::InheritedLapse));
        b.on_api_read(&read(1, &[], ABC));
        assert!(!b.may_feed(Tick(2), Duration::ZERO), "a lapse fences for good");
    }

    #[test]
    fn a_completed_remediation_lets_a_rebooted_node_run() {
        let mut a = agent("a");
        a.on_api_read(&read(10, &[("a", true)], ABC));
        assert!(a.may_feed(Tick(11), Duration::ZERO));

        let mut unknown_boot = AgentState::new("a", Duration::from_secs(5));
        unknown_boot.on_api_read(&read(10, &[("a", true)], ABC));
        assert_eq!(unknown_boot.fenced(), Some(FenceReason::OwnRemediation));
    }

    #[test]
    fn a_voter_lets_a_node_back_after_its_remediation_completed_run_as_its_own_read_would() {
        let mut b = agent("b");
        b.on_api_read(&read(1, &[("a", true), ("c", false)], ABC));
        assert_eq!(
            b.vote_for("a", 1, Some(at(BOOTED))),
            Verdict::Granted,
            "booted after its released remediation was created"
        );
        assert_eq!(
            b.vote_for("a", 1, Some(at(CREATED - 1))),
            Verdict::Remediating,
            "the boot the remediation fenced"
        );
        assert_eq!(b.vote_for("a", 1, None), Verdict::Remediating, "boot unknown");
        assert_eq!(
            b.vote_for("c", 1, Some(at(BOOTED))),
            Verdict::Remediating,
            "its workloads not yet released"
        );
        assert_eq!(b.accepted().len(), 2, "both stay accepted for the manager to count");
    }

    #[test]
    fn votes_license_with_a_majority_of_its_configuration_however_old_the_read() {
        let mut a = agent("a");
        assert_eq!(a.on_votes(Tick(1), 0, &granted(&["b", "c"])), Round::CannotCount);
        a.on_api_read(&read(10, &[], Some((1, &["a", "b", "c", "d", "e"]))));
        assert_eq!(
            a.on_votes(
                Tick(20),
                1,
                &[("b".into(), Verdict::Granted), ("c".into(), Verdict::NotReady)]
            ),
            Round::NoMajority,
            "2 of 5 is no majority"
        );
        assert_eq!(a.licence_until(), Some(Tick(15)));
        assert_eq!(
            a.on_votes(Tick(20), 1, &granted(&["b", "b", "x"])),
            Round::NoMajority,
            "a voter counts once, and a stranger not at all"
        );
        assert_eq!(a.on_votes(Tick(20), 1, &granted(&["b", "c"])), Round::Licensed);
        assert_eq!(a.licence_until(), Some(Tick(25)));
        assert_eq!(
            a.on_votes(Tick(100_000), 1, &granted(&["b", "c"])),
            Round::Licensed,
            "no freshness bound: an outage of any length"
        );
        assert_eq!(
            a.on_votes(
                Tick(100_001),
                1,
                &[("b".into(), Verdict::Granted), ("c".into(), Verdict::Remediating)]
            ),
            Round::Fenced
        );
        assert_eq!(a.fenced(), Some(FenceReason::PeerSaysRemediating));
    }

    #[test]
    fn a_stale_answer_moves_the_asker_to_the_newer_configuration() {
        let mut a = agent("a");
        a.on_api_read(&read(10, &[], ABC));
        let newer = Configuration::new(2, ["a", "b", "c", "d"]);
        assert_eq!(
            a.on_votes(
                Tick(11),
                1,
                &[
                    ("b".into(), Verdict::Stale(newer.clone())),
                    ("c".into(), Verdict::Granted)
                ]
            ),
            Round::Adopted
        );
        assert_eq!(a.epoch(), 2);
        assert_eq!(
            a.on_votes(Tick(12), 1, &granted(&["b", "c"])),
            Round::CannotCount,
            "asked in the old epoch"
        );
        assert_eq!(a.on_votes(Tick(12), 2, &granted(&["b", "c"])), Round::Licensed);
        a.on_api_read(&read(13, &[], ABC));
        assert_eq!(a.epoch(), 2, "epochs never go back");
    }

    #[test]
    fn an_agent_without_a_configuration_from_the_api_adopts_none_from_peers() {
        let mut a = agent("a");
        let c = Configuration::new(5, ["a", "b", "c"]);
        assert_eq!(
            a.on_votes(Tick(1), 0, &[("b".into(), Verdict::Stale(c))]),
            Round::CannotCount
        );
        assert_eq!(a.epoch(), 0);
    }

    #[test]
    fn a_voter_refuses_what_it_accepted_older_epochs_and_everything_while_stopping() {
        let mut b = agent("b");
        assert_eq!(b.vote_for("a", 1, None), Verdict::NotReady);
        assert!(b.on_api_read(&read(1, &[("a", false)], Some((2, &["a", "b", "c"])))));
        assert_eq!(b.vote_for("a", 2, None), Verdict::Remediating);
        assert_eq!(b.vote_for("c", 2, None), Verdict::Granted);
        assert_eq!(
            b.vote_for("c", 3, None),
            Verdict::Granted,
            "a newer epoch it does not know yet"
        );
        assert!(matches!(b.vote_for("c", 1, None), Verdict::Stale(c) if c.epoch == 2));
        assert!(
            b.on_api_read(&read(2, &[], None)),
            "withdrawn when the remediation is gone"
        );
        assert_eq!(b.vote_for("a", 2, None), Verdict::Granted);
        b.stop_voting();
        assert_eq!(b.vote_for("a", 2, None), Verdict::NotReady);
    }

    proptest::proptest! {
        /// Whatever the remediation's state and the boots: a voter that has read the asker's
        /// remediation tells it to fence exactly when the asker's own read of it would fence it.
        #[test]
        fn a_voter_tells_the_asker_to_fence_exactly_when_its_own_read_would(
            released in proptest::option::of(0i64..4),
            asker_booted in proptest::option::of(0i64..4),
        ) {
            let intent = Intent { node: "a".into(), uid: "uid-a".into(), released: released.map(at) };
            let read = ApiRead { sent: Tick(1), intents: vec![intent], configuration: Some(Configuration::new(1, ["a", "b", "c"])) };
            let mut voter = agent("b");
            voter.on_api_read(&read);
            let mut asker = AgentState::new("a", Duration::from_secs(5)).booted_at(asker_booted.map(at));
            asker.on_api_read(&read);
            proptest::prop_assert_eq!(
                voter.vote_for("a", 1, asker_booted.map(at)) == Verdict::Remediating,
                asker.fenced() == Some(FenceReason::OwnRemediation)
            );
        }
    }
}
