//! An agent's side: what it reports to the controller about the other members.
//!
//! SWIM spreads suspicion by gossip, so most members that hear "X is down" never probed X
//! themselves. To count as an independent observer an agent must have failed to reach the member
//! with its own probes: while its detector distrusts a member it probes that member itself, and
//! only its own recent failures make a report.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

use crate::signed;

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
    /// Members forgotten while the controller still holds a report about them.
    withdrawals: Vec<String>,
    /// When set, the agent confirms only the members it is a designated observer of.
    designation: Option<Designation>,
}

#[derive(Clone, Debug)]
struct Designation {
    me: String,
    observers_per_member: usize,
}

#[derive(Clone, Debug)]
struct Member {
    detector: DetectorState,
    /// Start of the current run of own failed probes.
    failing_since: Option<Timestamp>,
    /// When the agent last probed the member itself (sent a probe whose outcome came back).
    last_probe: Option<Timestamp>,
    /// When the agent last sent a probe of the member, answered or not yet.
    last_attempt: Option<Timestamp>,
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

/// How often an agent reports and probes: it refreshes a report every `refresh` (well within
/// the controller's freshness limit), and a report stands only on an own failed probe at most
/// `evidence_ttl` old, so it probes a member the detector distrusts every `probe_interval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    pub refresh: Duration,
    pub evidence_ttl: Duration,
    pub probe_interval: Duration,
}

impl Observer {
    /// The observer of agent `me`, which confirms (probes itself, and so may report) only the
    /// members it is one of `observers_per_member` designated observers of
    /// ([`crate::designation`]), as it sees the cluster: among the members the detector last
    /// called alive. Without it ([`Observer::default`]) an agent confirms every member its
    /// detector distrusts.
    pub fn designated(me: &str, observers_per_member: usize) -> Self {
        Self {
            designation: Some(Designation {
                me: me.to_owned(),
                observers_per_member,
            }),
            ..Self::default()
        }
    }

    /// The detector's new view of `member`. When it calls the member alive (it heard from it,
    /// directly or by gossip) the agent's own run of failures ends: a report must rest on
    /// failures since.
    pub fn detector_says(&mut self, member: &str, state: DetectorState) {
        let entry = self.entry(member);
        entry.detector = state;
        if state == DetectorState::Alive {
            entry.failing_since = None;
        }
    }

    /// The outcome of the agent's own probe of `member`, sent at `at`.
    pub fn probed(&mut self, member: &str, reached: bool, at: Timestamp) {
        let entry = self.entry(member);
        entry.last_probe = Some(entry.last_probe.map_or(at, |last| last.max(at)));
        entry.failing_since = match (reached, entry.failing_since) {
            (true, _) => None,
            (false, Some(since)) => Some(since),
            (false, None) => Some(at),
        };
    }

    /// The agent sent its own probe of `member` at `at`: the next one is due a probe interval
    /// later even while this one is still out (a confirming probe can take a whole period).
    pub fn probe_sent(&mut self, member: &str, at: Timestamp) {
        let entry = self.entry(member);
        entry.last_attempt = Some(entry.last_attempt.map_or(at, |last| last.max(at)));
    }

    /// Members to probe now: those the detector calls suspect or down that the agent has not
    /// probed itself within `cadence.probe_interval`, and, with a designation, observes.
    pub fn probes_due(&self, now: Timestamp, cadence: &Cadence) -> Vec<String> {
        let interval = signed(cadence.probe_interval);
        let alive: Vec<&str> = match self.designation {
            Some(_) => self
                .members
                .iter()
                .filter(|(_, m)| m.detector == DetectorState::Alive)
                .map(|(name, _)| name.as_str())
                .collect(),
            None => Vec::new(),
        };
        self.members
            .iter()
            .filter(|(_, m)| m.detector != DetectorState::Alive)
            .filter(|(_, m)| {
                m.last_probe
                    .max(m.last_attempt)
                    .is_none_or(|last| now.duration_since(last) >= interval)
            })
            .filter(|(name, _)| {
                self.designation.as_ref().is_none_or(|d| {
                    crate::designation::observes(&d.me, name, alive.iter().copied(), d.observers_per_member)
                })
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether anything is under way: a member the detector distrusts, a report the controller
    /// holds, or a withdrawal to send. Otherwise nothing is due until the detector's view changes.
    pub fn attentive(&self) -> bool {
        !self.withdrawals.is_empty()
            || self
                .members
                .values()
                .any(|m| m.detector != DetectorState::Alive || m.last_sent.is_some())
    }

    /// A member left the cluster: nothing more to say about it, and a report the controller
    /// holds is withdrawn.
    pub fn forget(&mut self, member: &str) {
        if self.members.remove(member).is_some_and(|m| m.last_sent.is_some()) {
            self.withdrawals.push(member.to_owned());
        }
    }

    /// What to send now: a new or changed report, a refresh of one last sent `cadence.refresh`
    /// ago or more (so the controller's copy never goes stale while it holds), and withdrawals.
    pub fn reports_due(&mut self, now: Timestamp, cadence: &Cadence) -> Vec<Report> {
        let (refresh, evidence_ttl) = (signed(cadence.refresh), signed(cadence.evidence_ttl));
        let mut due: Vec<Report> = self
            .withdrawals
            .drain(..)
            .map(|subject| Report { subject, since: None })
            .collect();
        for (name, member) in &mut self.members {
            let recent = member
                .last_probe
                .is_some_and(|last| now.duration_since(last) <= evidence_ttl);
            let unreachable = member
                .failing_since
                .filter(|_| member.detector != DetectorState::Alive && recent);
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
            last_probe: None,
            last_attempt: None,
            last_sent: None,
        })
    }
}

#[cfg(test)]
mod tests;
