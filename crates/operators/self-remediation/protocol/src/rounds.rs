//! The agent's licence loop as a pure state machine: when it reads the peers and the membership
//! beside the remediations, what a read changes in its registration, when it votes instead, when
//! it announces itself and records its licence for a successor. The agent's `licence` module only
//! performs the I/O this asks for; the model checker explores it (`model::rounds`).
//!
//! Two rules carry the protocol's safety:
//! - nothing is written to the registration before its record (acceptances, acknowledged epoch)
//!   was read and taken over, so a restarted agent never lowers what an earlier one acknowledged;
//! - the peers and the membership are read only once the registration saying the agent is armed
//!   (`disarmed: false`) has landed: the manager counts a disarmed registration as acknowledging
//!   every epoch, which only an agent that votes for no one does.

use std::{collections::BTreeSet, time::Duration};

use super::{
    agent::{AgentState, ApiRead, Moment, Round},
    membership::Configuration,
};

/// Vote rounds in a row while answers keep moving the agent to newer configurations.
pub(crate) const ROUNDS_PER_CHECK: usize = 3;

/// What the agent's registration records for the manager.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Record {
    /// (node, remediation uid) of every remediation it accepted.
    pub accepts: BTreeSet<(String, String)>,
    /// The newest membership epoch it acknowledged: only ever raised.
    pub epoch: u64,
}

/// What a round reads besides the remediations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub read_peers: bool,
}

/// What the remediations read changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The API answered; `back`: after failing. `record`: the registration's new record to write.
    Answered { back: bool, record: Option<Change> },
    /// The API did not answer: vote. `first`: the first failure of an outage.
    Failed { first: bool },
}

/// A change to the registration's record, with what it newly says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub newly_accepted: Vec<String>,
    pub epoch_raised: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rounds<I> {
    /// The registration's record was read (an absent registration counts) and taken over.
    kept: bool,
    /// The registration saying this agent is armed landed.
    announced: bool,
    /// The peers and the membership are read in the next round whatever their interval says.
    peers_due: bool,
    last_peer_read: Option<I>,
    api_up: bool,
    /// The licence last recorded for a successor process (`None`: nothing recorded yet).
    recorded_licence: Option<Option<I>>,
    record: Record,
}

impl<I: Moment> Default for Rounds<I> {
    fn default() -> Self {
        Self {
            kept: false,
            announced: false,
            peers_due: true,
            last_peer_read: None,
            api_up: true,
            recorded_licence: None,
            record: Record::default(),
        }
    }
}

impl<I: Moment> Rounds<I> {
    pub fn record(&self) -> &Record {
        &self.record
    }

    pub fn kept(&self) -> bool {
        self.kept
    }

    pub fn announced(&self) -> bool {
        self.announced
    }

    /// What the round starting at `now` reads besides the remediations.
    pub fn plan(&self, now: I, peer_update_interval: Duration) -> Plan {
        let interval_passed = self.last_peer_read.is_none_or(|t| t + peer_update_interval <= now);
        Plan {
            read_peers: self.announced && (self.peers_due || interval_passed),
        }
    }

    /// The peers, read in the round sent at `sent`, with the newest configuration they hold.
    pub fn on_peers(&mut self, sent: I, latest: Option<&Configuration>, agent: &mut AgentState<I>) {
        if let Some(latest) = latest {
            agent.on_configuration(latest);
            self.peers_due = false;
        }
        self.last_peer_read = Some(sent);
    }

    /// The remediations read (`None`: the read failed).
    pub fn on_intents(&mut self, read: Option<&ApiRead<I>>, agent: &mut AgentState<I>) -> Answer {
        let Some(read) = read else {
            let first = self.api_up;
            self.api_up = false;
            return Answer::Failed { first };
        };
        agent.on_api_read(read);
        let back = !self.api_up;
        self.api_up = true;
        Answer::Answered {
            back,
            record: self.update_record(agent),
        }
    }

    /// The record follows what the agent accepts and the epoch it adopted, once the recorded one
    /// was kept; the epoch is only ever raised, so what it says stays true.
    fn update_record(&mut self, agent: &AgentState<I>) -> Option<Change> {
        let accepts: BTreeSet<(String, String)> =
            agent.accepted().iter().map(|(n, u)| (n.clone(), u.clone())).collect();
        let epoch = agent.epoch();
        if !self.kept || (accepts == self.record.accepts && epoch <= self.record.epoch) {
            return None;
        }
        let change = Change {
            newly_accepted: accepts
                .difference(&self.record.accepts)
                .map(|(node, _)| node.clone())
                .collect(),
            epoch_raised: (epoch > self.record.epoch).then_some(epoch),
        };
        self.record.accepts = accepts;
        self.record.epoch = self.record.epoch.max(epoch);
        Some(change)
    }

    /// Whether to vote again after a round ended so, `done` rounds in: only while answers moved
    /// the agent to a newer configuration, and a bounded number of times.
    pub fn vote_again(round: Round, done: usize) -> bool {
        round == Round::Adopted && done < ROUNDS_PER_CHECK
    }

    /// The licence to record for a successor process of this boot, when it changed since the
    /// last record (`Some(None)`: none, lapsed or fencing).
    pub fn licence_to_record(&self, agent: &AgentState<I>) -> Option<Option<I>> {
        let until = agent.licence_until().filter(|_| agent.fenced().is_none());
        (self.recorded_licence != Some(until)).then_some(until)
    }

    pub fn licence_recorded(&mut self, until: Option<I>) {
        self.recorded_licence = Some(until);
    }

    /// The registration was read: its record (`None`: there is none) is taken over.
    pub fn on_registration(&mut self, recorded: Option<Record>) {
        if let Some(recorded) = recorded {
            self.record = recorded;
        }
        self.kept = true;
    }

    /// Whether to write the registration saying the agent is armed and wait for it to land.
    pub fn wants_announcement(&self) -> bool {
        self.kept && !self.announced
    }

    /// The announcement landed or not; returns whether the next round starts at once (to read
    /// the peers and the membership, after it landed).
    pub fn on_announced(&mut self, landed: bool) -> bool {
        if landed {
            self.announced = true;
            self.peers_due = true;
        }
        landed
    }

    /// The membership changed: the next round reads it.
    pub fn on_membership_changed(&mut self) {
        self.peers_due = true;
    }

    /// Moves every stored moment (the model checker's relative time).
    pub fn map_moments(&mut self, mut f: impl FnMut(I) -> I) {
        self.last_peer_read = self.last_peer_read.map(&mut f);
        if let Some(Some(until)) = self.recorded_licence.as_mut() {
            *until = f(*until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Tick, agent::Intent};

    const INTERVAL: Duration = Duration::from_secs(5);

    fn agent() -> AgentState<Tick> {
        AgentState::new("n0", Duration::from_secs(3))
    }

    fn read(at: u64, remediated: &[&str]) -> ApiRead<Tick> {
        ApiRead {
            sent: Tick(at),
            intents: remediated
                .iter()
                .map(|n| Intent {
                    node: (*n).to_owned(),
                    uid: format!("uid-{n}"),
                    released: None,
                })
                .collect(),
            configuration: None,
        }
    }

    fn configuration(epoch: u64) -> Configuration {
        Configuration::new(epoch, ["n0", "n1", "n2"].map(str::to_owned))
    }

    #[test]
    fn the_peers_are_read_only_after_the_announcement_landed() {
        let mut rounds = Rounds::<Tick>::default();
        assert!(!rounds.plan(Tick(0), INTERVAL).read_peers);
        rounds.on_registration(None);
        assert!(rounds.wants_announcement());
        assert!(!rounds.on_announced(false));
        assert!(!rounds.plan(Tick(0), INTERVAL).read_peers);
        assert!(rounds.on_announced(true));
        assert!(rounds.plan(Tick(0), INTERVAL).read_peers);
        assert!(!rounds.wants_announcement());
    }

    #[test]
    fn the_peers_are_read_again_after_their_interval_or_a_membership_change() {
        let mut rounds = Rounds::<Tick>::default();
        let mut a = agent();
        rounds.on_registration(None);
        rounds.on_announced(true);
        rounds.on_peers(Tick(10), Some(&configuration(1)), &mut a);
        assert_eq!(a.epoch(), 1);
        assert!(!rounds.plan(Tick(14), INTERVAL).read_peers);
        assert!(rounds.plan(Tick(15), INTERVAL).read_peers);
        rounds.on_membership_changed();
        assert!(rounds.plan(Tick(11), INTERVAL).read_peers);
    }

    #[test]
    fn nothing_is_recorded_before_the_registration_was_read_and_the_epoch_never_goes_down() {
        let mut rounds = Rounds::<Tick>::default();
        let mut a = agent();
        let answer = rounds.on_intents(Some(&read(1, &["n1"])), &mut a);
        assert_eq!(
            answer,
            Answer::Answered {
                back: false,
                record: None
            }
        );
        rounds.on_registration(Some(Record {
            accepts: BTreeSet::new(),
            epoch: 4,
        }));
        a.on_configuration(&configuration(2));
        let Answer::Answered {
            record: Some(change), ..
        } = rounds.on_intents(Some(&read(2, &["n1"])), &mut a)
        else {
            panic!("the acceptance is recorded");
        };
        assert_eq!(change.newly_accepted, ["n1"]);
        assert_eq!(change.epoch_raised, None);
        assert_eq!(rounds.record().epoch, 4);
        let again = rounds.on_intents(Some(&read(3, &["n1"])), &mut a);
        assert_eq!(
            again,
            Answer::Answered {
                back: false,
                record: None
            }
        );
    }

    #[test]
    fn an_outage_is_said_once_and_its_end_too() {
        let mut rounds = Rounds::<Tick>::default();
        let mut a = agent();
        assert_eq!(rounds.on_intents(None, &mut a), Answer::Failed { first: true });
        assert_eq!(rounds.on_intents(None, &mut a), Answer::Failed { first: false });
        assert!(matches!(
            rounds.on_intents(Some(&read(1, &[])), &mut a),
            Answer::Answered { back: true, .. }
        ));
    }

    #[test]
    fn the_licence_is_recorded_when_it_changes_and_not_while_fencing() {
        let mut rounds = Rounds::<Tick>::default();
        let mut a = agent();
        assert_eq!(rounds.licence_to_record(&a), Some(None));
        rounds.licence_recorded(None);
        assert_eq!(rounds.licence_to_record(&a), None);
        rounds.on_intents(Some(&read(1, &[])), &mut a);
        assert_eq!(rounds.licence_to_record(&a), Some(Some(Tick(4))));
        rounds.licence_recorded(Some(Tick(4)));
        rounds.on_intents(Some(&read(2, &["n0"])), &mut a);
        assert_eq!(rounds.licence_to_record(&a), Some(None));
    }

    #[test]
    fn votes_repeat_only_while_answers_move_the_agent_on() {
        assert!(Rounds::<Tick>::vote_again(Round::Adopted, 1));
        assert!(!Rounds::<Tick>::vote_again(Round::Adopted, ROUNDS_PER_CHECK));
        assert!(!Rounds::<Tick>::vote_again(Round::Licensed, 1));
    }
}
