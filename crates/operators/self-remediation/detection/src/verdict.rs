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

use std::time::Duration;

use jiff::Timestamp;

/// One agent's report about the node: unreachable from it (its own probes failed) since
/// `unreachable_since`. An agent that reaches the node again withdraws its report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub observer: String,
    pub unreachable_since: Timestamp,
    pub reported_at: Timestamp,
}

/// The controller's latest probe of the node's host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostProbe {
    NotProbed,
    /// The latest probe was answered at this time.
    Answered {
        at: Timestamp,
    },
    /// The latest probe, sent at this time, went unanswered.
    Unanswered {
        sent: Timestamp,
    },
}

/// What the controller asks of the evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Independent observers needed (fewer only when the cluster has fewer other members).
    pub observers_needed: usize,
    /// Reports older than this are not evidence (their agent stopped refreshing them).
    pub report_ttl: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            observers_needed: 3,
            report_ttl: Duration::from_secs(3),
        }
    }
}

/// What the evidence says about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Fewer fresh observers than needed report it unreachable.
    Reachable { observers: usize, needed: usize },
    /// Enough observers agree since `since`, but the host has not been probed since: probe it.
    ProbeHost { since: Timestamp },
    /// Enough observers agree, but the node showed life after they did.
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
    host: HostProbe,
    now: Timestamp,
    policy: &Policy,
) -> Verdict {
    let needed = policy.observers_needed.min(other_members).max(1);
    let mut agreeing = fresh_observations(subject, observations, now, policy.report_ttl);
    if other_members == 0 || agreeing.len() < needed {
        return Verdict::Reachable {
            observers: agreeing.len(),
            needed,
        };
    }
    // From when `needed` of them agree: the latest onset among the earliest `needed`.
    agreeing.sort_by_key(|o| o.unreachable_since);
    agreeing.truncate(needed);
    let since = agreeing[needed - 1].unreachable_since;
    if let Some(at) = lease_renewed.filter(|at| *at >= since) {
        return Verdict::Refuted {
            since,
            by: Refutation::LeaseRenewed { at },
        };
    }
    match host {
        HostProbe::Answered { at } if at >= since => Verdict::Refuted {
            since,
            by: Refutation::HostAnswered { at },
        },
        HostProbe::Unanswered { sent } if sent >= since => Verdict::Unreachable {
            since,
            observers: agreeing.into_iter().map(|o| o.observer.clone()).collect(),
        },
        _ => Verdict::ProbeHost { since },
    }
}

/// The latest fresh report of each observer other than the subject, each consistent in itself.
fn fresh_observations<'a>(
    subject: &str,
    observations: &'a [Observation],
    now: Timestamp,
    ttl: Duration,
) -> Vec<&'a Observation> {
    let ttl = jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX);
    let mut latest: Vec<&Observation> = Vec::new();
    for o in observations {
        let fresh = now.duration_since(o.reported_at) <= ttl && o.reported_at <= now;
        if o.observer == subject || !fresh || o.unreachable_since > o.reported_at {
            continue;
        }
        match latest.iter_mut().find(|l| l.observer == o.observer) {
            Some(l) if l.reported_at < o.reported_at => *l = o,
            Some(_) => {}
            None => latest.push(o),
        }
    }
    latest
}

#[cfg(test)]
mod tests;
