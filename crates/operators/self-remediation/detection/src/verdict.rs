//! The controller's verdict on one node: is it unreachable, by evidence enough to set
//! `PeersReachable=False` on it?
//!
//! Three independent kinds of evidence must agree, because each alone has a way of being wrong:
//! - **peers**: several agents, each from its own probes, cannot reach the node. A minority
//!   partition sees the majority as unreachable, so peers alone are not enough;
//! - **the kubelet lease**: not renewed since the peers agreed. A node whose kubelet still renews
//!   is alive, whatever its agent does (the health check assumes the same);
//! - **the host**: the controller's own probe of the node's address, sent after the peers agreed,
//!   went unanswered. The kernel answers a connection attempt even when every process on the node
//!   is stopped, so a frozen agent on a live host is refuted here within a probe, without waiting
//!   for the lease's next renewal, which may be ten seconds away.
//!
//! Life refutes what came before it, not what comes after: a node that renewed its lease or
//! whose host answered after the peers lost it, and that the peers still cannot reach, is probed
//! again every [`Policy::reprobe_after`], and is unreachable once a probe sent after its last
//! sign of life goes unanswered. A crash whose kernel answered a moment longer than its agent
//! lived (the lab's crash kills the processes, then the link) was otherwise refuted for as long
//! as the peers kept their reports, and never found (ci-20261207T203556Z).

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

use crate::signed;

/// One agent's report about the node: unreachable from it (its own probes failed) since
/// `unreachable_since` on the agent's clock; `reported_at` is when the controller received it,
/// on the controller's clock. An agent that reaches the node again withdraws its report, so the
/// controller keeps at most one per observer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub observer: String,
    pub unreachable_since: Timestamp,
    pub reported_at: Timestamp,
}

/// The controller's probes of the node's host, on its own clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostProbes {
    /// When the host last answered.
    pub last_answered: Option<Timestamp>,
    /// When the latest probe that went unanswered was sent.
    pub last_unanswered_sent: Option<Timestamp>,
}

/// What the controller asks of the evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Independent observers needed (fewer only when the cluster has fewer other members).
    pub observers_needed: usize,
    /// Reports older than this are not evidence (their agent stopped refreshing them).
    pub report_ttl: Duration,
    /// How far apart the agents', kubelets' and controller's clocks may be: a lease renewal this
    /// much before the agreement still refutes it, and a host probe counts only when sent this
    /// much after it.
    pub max_clock_skew: Duration,
    /// How long a sign of life refutes before the host is probed again, while the peers still
    /// cannot reach the node.
    pub reprobe_after: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            observers_needed: 3,
            report_ttl: Duration::from_secs(3),
            max_clock_skew: Duration::from_millis(250),
            reprobe_after: Duration::from_secs(2),
        }
    }
}

/// What the evidence says about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Fewer fresh observers than needed report it unreachable (none can when `needed` is 0:
    /// the node has no peers).
    Reachable { observers: usize, needed: usize },
    /// Enough observers agree since `since`, but the host has not been probed since (or since
    /// its last sign of life, [`Policy::reprobe_after`] ago): probe it.
    ProbeHost { since: Timestamp },
    /// Enough observers agree, but the node showed life after they did, less than
    /// [`Policy::reprobe_after`] ago.
    Refuted { since: Timestamp, by: Refutation },
    /// Unreachable by every kind of evidence since `since`: the condition turns False.
    Unreachable { since: Timestamp, observers: Vec<String> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refutation {
    LeaseRenewed { at: Timestamp },
    HostAnswered { at: Timestamp },
}

/// The verdict on `subject` at `now`. `other_members` is how many agents other than the
/// subject's are members (the most observers there can be); `lease_renewed` the latest renew
/// time of its kubelet lease, if any.
pub fn verdict(
    subject: &str,
    observations: &[Observation],
    other_members: usize,
    lease_renewed: Option<Timestamp>,
    host: HostProbes,
    now: Timestamp,
    policy: &Policy,
) -> Verdict {
    if other_members == 0 {
        return Verdict::Reachable {
            observers: 0,
            needed: 0,
        };
    }
    let needed = policy.observers_needed.clamp(1, other_members);
    let mut agreeing = fresh_observations(subject, observations, now, policy);
    if agreeing.len() < needed {
        return Verdict::Reachable {
            observers: agreeing.len(),
            needed,
        };
    }
    // From when `needed` of them agree: the latest onset among the earliest `needed`. Taking the
    // latest onset of all would let one observer that was itself cut off long ago pull `since`
    // back before a renewal that proves the node alive.
    agreeing.sort_by_key(|o| o.unreachable_since);
    agreeing.truncate(needed);
    let since = agreeing[needed - 1].unreachable_since;
    let skew = signed(policy.max_clock_skew);
    let life_refutes_from = since.saturating_sub(skew).unwrap_or(since);
    let life = last_life(lease_renewed, host.last_answered).filter(|life| life.at() >= life_refutes_from);
    // A probe counts when sent a clock skew after the agreement, or after the last life since.
    let silent_from = life
        .map_or(since, |life| life.at())
        .saturating_add(skew)
        .unwrap_or(since);
    if host
        .last_unanswered_sent
        .is_some_and(|sent| sent >= silent_from && sent <= now)
    {
        return Verdict::Unreachable {
            since,
            observers: agreeing.into_iter().map(|o| o.observer.clone()).collect(),
        };
    }
    match life {
        Some(by) if now < by.at().saturating_add(signed(policy.reprobe_after)).unwrap_or(now) => {
            Verdict::Refuted { since, by }
        }
        _ => Verdict::ProbeHost { since },
    }
}

impl Refutation {
    fn at(self) -> Timestamp {
        match self {
            Self::LeaseRenewed { at } | Self::HostAnswered { at } => at,
        }
    }
}

/// The latest sign of life: a lease renewal or a host answer (the renewal on a tie).
fn last_life(lease_renewed: Option<Timestamp>, host_answered: Option<Timestamp>) -> Option<Refutation> {
    match (lease_renewed, host_answered) {
        (Some(renewed), Some(answered)) if answered > renewed => Some(Refutation::HostAnswered { at: answered }),
        (Some(at), _) => Some(Refutation::LeaseRenewed { at }),
        (None, Some(at)) => Some(Refutation::HostAnswered { at }),
        (None, None) => None,
    }
}

/// Each observer's latest report (the earlier onset when two arrived at once), when it is
/// fresh, consistent in itself and not the subject's own.
fn fresh_observations<'a>(
    subject: &str,
    observations: &'a [Observation],
    now: Timestamp,
    policy: &Policy,
) -> Vec<&'a Observation> {
    let mut latest: BTreeMap<&str, &Observation> = BTreeMap::new();
    for o in observations.iter().filter(|o| o.observer != subject) {
        let newer = latest.get(o.observer.as_str()).is_none_or(|l| {
            (o.reported_at, std::cmp::Reverse(o.unreachable_since))
                > (l.reported_at, std::cmp::Reverse(l.unreachable_since))
        });
        if newer {
            latest.insert(&o.observer, o);
        }
    }
    let (ttl, skew) = (signed(policy.report_ttl), signed(policy.max_clock_skew));
    latest
        .into_values()
        .filter(|o| o.reported_at <= now && now.duration_since(o.reported_at) <= ttl)
        // The onset is on the agent's clock, the receipt on the controller's.
        .filter(|o| o.unreachable_since <= o.reported_at.saturating_add(skew).unwrap_or(o.reported_at))
        .collect()
}

#[cfg(test)]
mod tests;
