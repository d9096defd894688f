//! The manager's side: may this node be self-remediated at all, has a quorum accepted its
//! remediation, and how long must the manager then wait.

use std::{collections::BTreeSet, time::Duration};

use jiff::Timestamp;

use super::{Timing, acceptance_quorum};

/// An agent's registration as the manager reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub node: String,
    /// When the registration was created (server time).
    pub registered: Timestamp,
    /// Zero when the agent has no watchdog.
    pub watchdog: Duration,
    /// The licence length the agent published (zero if it published none).
    pub licence: Duration,
    pub software_reboot: bool,
    /// `(node, remediation uid)` pairs this agent has accepted.
    pub accepts: BTreeSet<(String, String)>,
    /// The agent stopped deliberately and closed its watchdog (magic close): nothing fences the
    /// node until an agent registers there again.
    pub disarmed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acceptance {
    /// Settled members that accepted.
    pub by: Vec<String>,
    /// Members (other than the target) that have not, or whose acceptance does not count yet.
    pub missing: Vec<String>,
    pub needed: usize,
    pub met: bool,
}

/// More than half of the registrations other than `target` must have accepted remediation `uid`.
/// Only registrations older than the agents' view freshness count as acceptors (the target's view
/// may not know younger ones); all count in the denominator.
pub fn acceptance(
    target: &str,
    uid: &str,
    registrations: &[Registration],
    now: Timestamp,
    view_freshness: Duration,
) -> Acceptance {
    let others: Vec<&Registration> = registrations.iter().filter(|r| r.node != target).collect();
    let needed = acceptance_quorum(others.len());
    let key = (target.to_owned(), uid.to_owned());
    let settled = |r: &Registration| r.registered + view_freshness <= now;
    let (by, missing): (Vec<&Registration>, Vec<&Registration>) =
        others.iter().partition(|r| r.accepts.contains(&key) && settled(r));
    let by: Vec<String> = by.into_iter().map(|r| r.node.clone()).collect();
    Acceptance {
        met: by.len() >= needed,
        by,
        missing: missing.into_iter().map(|r| r.node.clone()).collect(),
        needed,
    }
}

/// Why self remediation cannot be proven safe for a node, if it cannot.
pub fn cannot_fence(
    target: &str,
    registrations: &[Registration],
    software_reboot_enabled: bool,
    min_peers: usize,
) -> Option<String> {
    let Some(own) = registrations.iter().find(|r| r.node == target) else {
        return Some(format!(
            "node {target} has no registered nodemedic agent: nothing can fence it"
        ));
    };
    if own.disarmed {
        return Some(format!(
            "the agent on {target} stopped deliberately and disarmed its watchdog: nothing can fence the node until its agent runs again"
        ));
    }
    if own.watchdog.is_zero() && !(software_reboot_enabled && own.software_reboot) {
        return Some(format!(
            "the agent on {target} has no working watchdog and software reboot is disabled"
        ));
    }
    let others = registrations.len() - 1;
    if others < min_peers.max(1) {
        return Some(format!(
            "{others} other agents are registered and at least {} are needed to accept the remediation (minPeersForRemediation)",
            min_peers.max(1)
        ));
    }
    None
}

/// The node's own timing: the longer of the configured and the published licence (an agent may
/// still run with older settings); a software-reboot-only agent reboots within a second.
pub fn timing(configured_licence: Duration, own: &Registration) -> Timing {
    let watchdog = if own.watchdog.is_zero() {
        Duration::from_secs(1)
    } else {
        own.watchdog
    };
    Timing {
        licence: configured_licence.max(own.licence),
        watchdog,
    }
}

/// The safe time used, and the configured value it replaced when that was below the provable
/// minimum.
pub fn safe_time(minimum: Duration, configured: Option<Duration>) -> (Duration, Option<Duration>) {
    match configured {
        Some(c) if c >= minimum => (c, None),
        Some(c) => (minimum, Some(c)),
        None => (minimum, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(node: &str, age: i64, accepts: &[(&str, &str)]) -> Registration {
        Registration {
            node: node.into(),
            registered: Timestamp::from_second(1000 - age).expect("valid"),
            watchdog: Duration::from_secs(5),
            licence: Duration::from_secs(3),
            software_reboot: false,
            accepts: accepts.iter().map(|(n, u)| ((*n).into(), (*u).into())).collect(),
            disarmed: false,
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1000).expect("valid")
    }

    #[test]
    fn a_majority_of_the_others_must_accept_that_very_remediation() {
        let v = Duration::from_secs(60);
        let regs = vec![
            reg("x", 100, &[]),
            reg("a", 100, &[("x", "u1")]),
            reg("b", 100, &[]),
            reg("c", 100, &[("x", "u0")]),
            reg("d", 100, &[("x", "u1")]),
        ];
        let acc = acceptance("x", "u1", &regs, now(), v);
        assert_eq!(
            (acc.by.len(), acc.needed, acc.met),
            (2, 3, false),
            "an acceptance of an older remediation does not count"
        );
        let regs = vec![
            reg("x", 100, &[]),
            reg("a", 100, &[("x", "u1")]),
            reg("b", 100, &[("x", "u1")]),
            reg("c", 100, &[("x", "u1")]),
            reg("d", 100, &[]),
        ];
        assert!(acceptance("x", "u1", &regs, now(), v).met);
    }

    #[test]
    fn young_registrations_count_against_but_not_for() {
        let v = Duration::from_secs(60);
        let regs = vec![
            reg("x", 100, &[]),
            reg("a", 100, &[("x", "u")]),
            reg("e", 10, &[("x", "u")]),
        ];
        let acc = acceptance("x", "u", &regs, now(), v);
        assert_eq!((acc.by.clone(), acc.needed, acc.met), (vec!["a".to_owned()], 2, false));
        assert!(acc.missing.contains(&"e".to_owned()));
    }

    #[test]
    fn fencing_needs_an_agent_a_watchdog_and_peers() {
        let mut regs = vec![reg("x", 100, &[]), reg("a", 100, &[])];
        assert_eq!(cannot_fence("x", &regs, false, 1), None);
        assert!(cannot_fence("y", &regs, false, 1).is_some_and(|w| w.contains("no registered")));
        regs[0].watchdog = Duration::ZERO;
        assert!(cannot_fence("x", &regs, false, 1).is_some_and(|w| w.contains("no working watchdog")));
        regs[0].software_reboot = true;
        assert_eq!(cannot_fence("x", &regs, true, 1), None);
        assert!(cannot_fence("x", &regs[..1], true, 1).is_some_and(|w| w.contains("minPeersForRemediation")));
        let mut disarmed = regs.clone();
        disarmed[0].disarmed = true;
        assert!(cannot_fence("x", &disarmed, true, 1).is_some_and(|w| w.contains("disarmed")));
    }

    #[test]
    fn a_configured_safe_time_below_the_minimum_is_not_used() {
        let min = Duration::from_secs(30);
        assert_eq!(
            safe_time(min, Some(Duration::from_secs(10))),
            (min, Some(Duration::from_secs(10)))
        );
        assert_eq!(
            safe_time(min, Some(Duration::from_secs(180))),
            (Duration::from_secs(180), None)
        );
        assert_eq!(safe_time(min, None), (min, None));
    }
}
