//! An agent's side: what it reports to the controller about the other members.
//!
//! SWIM spreads suspicion by gossip, so most members that hear "X is down" never probed X
//! themselves. To count as an independent observer an agent must have failed to reach the member
//! with its own probes: hearing a suspicion makes it probe the member directly, and only its own
//! failures make a report.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

/// What the detector currently says about a member (its SWIM state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetectorState {
    Alive,
    Suspect,
    Down,
}

/// An agent's own probes and the detector's view, per member.
#[derive(Clone, Debug, Default)]
pub struct Observer {
    members: BTreeMap<String, Member>,
}

#[derive(Clone, Debug)]
struct Member {
    detector: DetectorState,
    /// Start of the current run of own failed probes.
    failing_since: Option<Timestamp>,
    last_sent: Option<Sent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sent {
    since: Timestamp,
    at: Timestamp,
}

/// A report to send: `subject` unreachable from this agent since `since` (a withdrawal when
/// `since` is `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub subject: String,
    pub since: Option<Timestamp>,
}

impl Observer {
    /// The detector's new view of `member`. Returns whether the agent should probe it itself now
    /// (it became suspect or down and the agent has no failure of its own on record).
    pub fn detector_says(&mut self, member: &str, state: DetectorState) -> bool {
        let entry = self.entry(member);
        entry.detector = state;
        state != DetectorState::Alive && entry.failing_since.is_none()
    }

    /// The outcome of the agent's own probe of `member`, sent at `at`.
    pub fn probed(&mut self, member: &str, reached: bool, at: Timestamp) {
        let entry = self.entry(member);
        entry.failing_since = match (reached, entry.failing_since) {
            (true, _) => None,
            (false, Some(since)) => Some(since),
            (false, None) => Some(at),
        };
    }

    /// A member left the cluster: nothing more to say about it.
    pub fn forget(&mut self, member: &str) {
        self.members.remove(member);
    }

    /// What to send now: a new or changed report, a refresh of one last sent `refresh` ago or
    /// more (so the controller's copy never goes stale while it holds), and withdrawals.
    pub fn reports_due(&mut self, now: Timestamp, refresh: Duration) -> Vec<Report> {
        let refresh = jiff::SignedDuration::try_from(refresh).unwrap_or(jiff::SignedDuration::MAX);
        let mut due = Vec::new();
        for (name, member) in &mut self.members {
            let unreachable = member.failing_since.filter(|_| member.detector != DetectorState::Alive);
            match (unreachable, member.last_sent) {
                (Some(since), Some(sent)) if sent.since == since && now.duration_since(sent.at) < refresh => {}
                (Some(since), _) => {
                    member.last_sent = Some(Sent { since, at: now });
                    due.push(Report {
                        subject: name.clone(),
                        since: Some(since),
                    });
                }
                (None, Some(_)) => {
                    member.last_sent = None;
                    due.push(Report {
                        subject: name.clone(),
                        since: None,
                    });
                }
                (None, None) => {}
            }
        }
        due
    }

    fn entry(&mut self, member: &str) -> &mut Member {
        self.members.entry(member.to_owned()).or_insert(Member {
            detector: DetectorState::Alive,
            failing_since: None,
            last_sent: None,
        })
    }
}

#[cfg(test)]
mod tests;
