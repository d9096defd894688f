//! Exhaustive model check of the agent's licence loop ([`Rounds`]) against its registration:
//! every interleaving, within bounds, of its rounds (each read of the peers, the remediations and
//! the registration answering or not, each announcement landing or not), the publisher's writes
//! landing late, membership changes, a peer's remediation created and deleted, crashes (a write in
//! flight landing or lost) and deliberate stops, each followed by a new agent process. Time is
//! relative to "now", as in the protocol's model. Invariants, in every state:
//! - a landed write never lowers the acknowledged epoch, nor drops the acceptance of a
//!   remediation that still exists;
//! - an agent holds a configuration only after its registration saying it is armed landed;
//! - no agent process can grant a vote in an epoch older than its registration acknowledges.

use std::time::Duration;

use super::{
    Tick,
    agent::{AgentState, ApiRead, Intent, Verdict},
    membership::Configuration,
    rounds::{Answer, Record, Rounds},
};

const NOW: Tick = Tick(1000);
/// `peerUpdateInterval`, in ticks.
const INTERVAL: Duration = Duration::from_secs(2);
const PEER: &str = "n1";

/// Ways to break the loop, each of which the checker must catch.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Broken {
    Nothing,
    /// The peers (and the membership) read before the armed registration landed.
    PeersBeforeAnnouncement,
    /// The registration written from what the agent holds before its record was read.
    WriteBeforeKept,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Registration {
    record: Record,
    disarmed: bool,
    /// The agent process that wrote it.
    by: u8,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct State {
    rounds: Rounds<Tick>,
    agent: AgentState<Tick>,
    /// The running agent process (`None`: none runs).
    process: Option<u8>,
    /// The registration as stored.
    stored: Option<Registration>,
    /// The publisher's write not landed yet.
    pending: Option<Registration>,
    /// The membership's newest epoch.
    epoch: u64,
    /// The uid of the peer's remediation, while it exists.
    remediation: Option<u8>,
    uids_left: u8,
    changes_left: u8,
    faults_left: u8,
    broken: Broken,
}

fn configuration(epoch: u64) -> Configuration {
    Configuration::new(epoch, ["n0", PEER, "n2"])
}

fn fresh_agent() -> AgentState<Tick> {
    AgentState::new("n0", Duration::from_secs(3))
}

fn earlier(t: Tick) -> Tick {
    let long_ago = NOW.0 - INTERVAL.as_secs() - 1;
    Tick(t.0.saturating_sub(1).max(long_ago))
}

fn initial(broken: Broken) -> State {
    State {
        rounds: Rounds::default(),
        agent: fresh_agent(),
        process: Some(0),
        stored: None,
        pending: None,
        epoch: 1,
        remediation: None,
        uids_left: 2,
        changes_left: 2,
        faults_left: 2,
        broken,
    }
}

/// Lands a write, checking what it overwrites.
fn land(s: &mut State, write: Registration) -> Result<(), String> {
    if let Some(old) = &s.stored {
        if write.record.epoch < old.record.epoch {
            return Err(format!(
                "a write lowered the acknowledged epoch from {} to {}",
                old.record.epoch, write.record.epoch
            ));
        }
        let dropped = old
            .record
            .accepts
            .difference(&write.record.accepts)
            .any(|(node, uid)| node == PEER && s.remediation.is_some_and(|u| u.to_string() == *uid));
        if dropped {
            return Err("a write dropped the acceptance of a remediation that still exists".into());
        }
    }
    s.stored = Some(write);
    Ok(())
}

/// The publisher's next write: the agent's registration as its record says, armed.
fn wanted(s: &State, by: u8) -> Registration {
    Registration {
        record: s.rounds.record().clone(),
        disarmed: false,
        by,
    }
}

/// One round, with every combination of its reads answering or not.
fn rounds(s: &State, by: u8, next: &mut Vec<State>) -> Result<(), String> {
    let plan = s.rounds.plan(NOW, INTERVAL);
    let read_peers = plan.read_peers || s.broken == Broken::PeersBeforeAnnouncement;
    let peer_outcomes: &[bool] = if read_peers { &[true, false] } else { &[false] };
    for &peers_read in peer_outcomes {
        for intents_read in [true, false] {
            let mut x = s.clone();
            if peers_read {
                x.rounds.on_peers(NOW, Some(&configuration(s.epoch)), &mut x.agent);
            }
            let read = intents_read.then(|| ApiRead {
                sent: NOW,
                intents: s
                    .remediation
                    .map(|uid| Intent {
                        node: PEER.into(),
                        uid: uid.to_string(),
                        released: None,
                    })
                    .into_iter()
                    .collect(),
                configuration: None,
            });
            let answer = x.rounds.on_intents(read.as_ref(), &mut x.agent);
            if let Answer::Answered { record: Some(_), .. } = answer {
                x.pending = Some(wanted(&x, by));
            } else if x.broken == Broken::WriteBeforeKept && read.is_some() && !x.rounds.kept() {
                let accepts = x.agent.accepted().iter().map(|(n, u)| (n.clone(), u.clone())).collect();
                let record = Record {
                    accepts,
                    epoch: x.agent.epoch(),
                };
                x.pending = Some(Registration {
                    record,
                    disarmed: false,
                    by,
                });
            }
            after_reads(&x, by, next)?;
        }
    }
    Ok(())
}

/// The end of a round: the registration read while not kept, then the announcement.
fn after_reads(s: &State, by: u8, next: &mut Vec<State>) -> Result<(), String> {
    let registration_reads: &[bool] = if s.rounds.kept() { &[false] } else { &[true, false] };
    for &read in registration_reads {
        let mut x = s.clone();
        if read {
            x.rounds.on_registration(x.stored.as_ref().map(|r| r.record.clone()));
        }
        if !x.rounds.wants_announcement() {
            next.push(x);
            continue;
        }
        let write = wanted(&x, by);
        let mut lost = x.clone();
        lost.pending = Some(write.clone());
        lost.rounds.on_announced(false);
        next.push(lost);
        x.pending = None;
        land(&mut x, write)?;
        x.rounds.on_announced(true);
        next.push(x);
    }
    Ok(())
}

fn successors(s: &State) -> Result<Vec<State>, String> {
    let mut next = Vec::new();
    let mut tick = s.clone();
    tick.rounds.map_moments(earlier);
    tick.agent.map_moments(earlier);
    next.push(tick);
    if let Some(write) = &s.pending {
        let mut x = s.clone();
        x.pending = None;
        land(&mut x, write.clone())?;
        next.push(x);
    }
    if s.changes_left > 0 {
        let mut x = s.clone();
        x.changes_left -= 1;
        x.epoch += 1;
        x.rounds.on_membership_changed();
        next.push(x);
    }
    match s.remediation {
        Some(_) => {
            let mut x = s.clone();
            x.remediation = None;
            next.push(x);
        }
        None if s.uids_left > 0 => {
            let mut x = s.clone();
            x.uids_left -= 1;
            x.remediation = Some(x.uids_left);
            next.push(x);
        }
        None => {}
    }
    match s.process {
        Some(by) => {
            rounds(s, by, &mut next)?;
            if s.faults_left > 0 {
                processes_end(s, by, &mut next)?;
            }
        }
        None => {
            let mut x = s.clone();
            let by = x
                .stored
                .as_ref()
                .map_or(0, |r| r.by)
                .max(x.pending.as_ref().map_or(0, |r| r.by))
                + 1;
            x.process = Some(by);
            x.rounds = Rounds::default();
            x.agent = fresh_agent();
            next.push(x);
        }
    }
    Ok(next)
}

/// A crash (its write in flight landing or lost) or a deliberate stop (it stops voting, its
/// writes land, then its registration says disarmed).
fn processes_end(s: &State, by: u8, next: &mut Vec<State>) -> Result<(), String> {
    let mut ended = s.clone();
    ended.faults_left -= 1;
    ended.process = None;
    let mut lost = ended.clone();
    lost.pending = None;
    next.push(lost);
    if let Some(write) = ended.pending.take() {
        let mut landed = ended.clone();
        land(&mut landed, write)?;
        next.push(landed.clone());
        ended = landed;
    }
    if let Some(stored) = ended.stored.as_mut() {
        stored.disarmed = true;
        stored.by = by;
    }
    next.push(ended);
    Ok(())
}

fn check(s: &State) -> Result<(), String> {
    let Some(by) = s.process else { return Ok(()) };
    if s.agent.configuration().is_some() && !s.stored.as_ref().is_some_and(|r| r.by == by && !r.disarmed) {
        return Err("the agent took a configuration in before its armed registration landed".into());
    }
    if let Some(stored) = s.stored.as_ref().filter(|r| !r.disarmed) {
        for older in 1..stored.record.epoch {
            if s.agent.vote_for("n2", older, None) == Verdict::Granted {
                return Err(format!(
                    "the agent grants a vote in epoch {older}, older than the {} its registration acknowledges",
                    stored.record.epoch
                ));
            }
        }
    }
    Ok(())
}

/// Explores every reachable state; returns how many, or the first violation.
fn explore(broken: Broken) -> Result<usize, String> {
    crate::explore::explore(initial(broken), check, successors)
}

/// How many states the documentation says the agent loop's check explores
/// (docs/self-remediation-protocol.md, "Model check"): asserted, so a model that silently stops
/// exploring fails.
const DOCUMENTED_STATES: usize = 306_371;

#[test]
fn no_interleaving_of_the_agent_loop_breaks_what_its_registration_says() {
    let started = std::time::Instant::now();
    let explored = explore(Broken::Nothing).unwrap_or_else(|violation| panic!("{violation}"));
    eprintln!("agent loop: {explored} states in {:?}", started.elapsed());
    crate::explore::assert_coverage("the agent loop", explored, DOCUMENTED_STATES);
}

#[test]
fn the_agent_loops_state_count_is_the_documented_one() {
    let figure = crate::explore::with_commas(DOCUMENTED_STATES);
    assert!(
        crate::explore::PROTOCOL_DOC.contains(&format!("{figure} states")),
        "docs/self-remediation-protocol.md does not state the agent loop's {figure} states"
    );
}

#[test]
fn the_model_finds_peers_read_before_the_announcement() {
    let found = explore(Broken::PeersBeforeAnnouncement).expect_err("caught");
    assert!(found.contains("before its armed registration landed"), "{found}");
}

#[test]
fn the_model_finds_a_registration_written_before_its_record_was_read() {
    let found = explore(Broken::WriteBeforeKept).expect_err("caught");
    assert!(found.contains("lowered") || found.contains("dropped"), "{found}");
}
