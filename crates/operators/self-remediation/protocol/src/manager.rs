//! The manager's side: may this node be self-remediated at all, has a quorum accepted its
//! remediation in every configuration the node may be counting votes in, and how long must the
//! manager then wait.

use std::{collections::BTreeSet, time::Duration};

use super::{Timing, acceptance_quorum, membership::Membership};

/// How a node fences itself, as its agent found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Means {
    /// A watchdog device that is not the kernel's software one.
    HardwareWatchdog,
    /// The kernel's software watchdog (softdog): resets the node while its kernel still runs.
    Softdog,
    /// No watchdog device: the agent's own timer reboots the node (only as sure as the agent
    /// process keeps running).
    SoftwareReboot,
    /// Nothing can fence this node.
    #[default]
    None,
}

impl Means {
    pub fn as_str(self) -> &'static str {
        match self {
            Means::HardwareWatchdog => "hardware-watchdog",
            Means::Softdog => "softdog",
            Means::SoftwareReboot => "software-reboot",
            Means::None => "none",
        }
    }

    pub fn parse(text: &str) -> Option<Means> {
        [
            Means::HardwareWatchdog,
            Means::Softdog,
            Means::SoftwareReboot,
            Means::None,
        ]
        .into_iter()
        .find(|m| m.as_str() == text)
    }
}

/// An agent's registration as the manager reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub node: String,
    /// How the node fences itself.
    pub means: Means,
    /// The watchdog timeout the agent programmed and read back (zero without a device).
    pub watchdog: Duration,
    /// The licence length the agent published (zero if it published none).
    pub licence: Duration,
    /// `(node, remediation uid)` pairs this agent has accepted.
    pub accepts: BTreeSet<(String, String)>,
    /// The newest membership epoch the agent adopted from the API.
    pub acknowledged: u64,
    /// The agent stopped deliberately and closed its watchdog (magic close): nothing fences the
    /// node until an agent registers there again.
    pub disarmed: bool,
}

impl Registration {
    pub fn acknowledgement(&self) -> super::membership::Acknowledgement {
        super::membership::Acknowledgement {
            epoch: self.acknowledged,
            disarmed: self.disarmed,
        }
    }
}

/// Acceptance of one remediation in one configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InConfiguration {
    pub epoch: u64,
    /// Members (other than the target) that accepted.
    pub by: Vec<String>,
    /// Members (other than the target) that have not.
    pub missing: Vec<String>,
    pub needed: usize,
}

impl InConfiguration {
    pub fn met(&self) -> bool {
        self.by.len() >= self.needed
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acceptance {
    /// One entry per live configuration the target belongs to.
    pub configurations: Vec<InConfiguration>,
    /// The newest epoch the membership had when this was computed: a wait begun on it holds
    /// only while no newer configuration appears.
    pub epoch: u64,
    pub met: bool,
}

impl Acceptance {
    /// Every member that accepted, in any configuration.
    pub fn by(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.configurations.iter().flat_map(|c| &c.by).collect();
        all.into_iter().cloned().collect()
    }

    /// Members still missing in a configuration that is not met yet.
    pub fn missing(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self
            .configurations
            .iter()
            .filter(|c| !c.met())
            .flat_map(|c| &c.missing)
            .collect();
        all.into_iter().cloned().collect()
    }
}

/// More than half of the members other than `target` must have accepted remediation `uid`, in
/// every live configuration (committed and proposed) that has `target` as a member: the target
/// may be counting votes in either. Without a membership, or while the target is in no live
/// configuration, nothing is met.
pub fn acceptance(
    target: &str,
    uid: &str,
    registrations: &[Registration],
    membership: Option<&Membership>,
) -> Acceptance {
    let Some(membership) = membership else {
        return Acceptance {
            configurations: Vec::new(),
            epoch: 0,
            met: false,
        };
    };
    let key = (target.to_owned(), uid.to_owned());
    let accepted = |node: &str| registrations.iter().any(|r| r.node == node && r.accepts.contains(&key));
    let configurations: Vec<InConfiguration> = membership
        .live()
        .filter(|c| c.contains(target))
        .map(|c| {
            let (by, missing): (Vec<String>, Vec<String>) = c
                .members
                .iter()
                .filter(|m| *m != target)
                .cloned()
                .partition(|m| accepted(m));
            InConfiguration {
                epoch: c.epoch,
                needed: acceptance_quorum(c.members.len() - 1),
                by,
                missing,
            }
        })
        .collect();
    Acceptance {
        met: !configurations.is_empty() && configurations.iter().all(InConfiguration::met),
        epoch: membership.latest().epoch,
        configurations,
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
    match own.means {
        Means::HardwareWatchdog | Means::Softdog => {}
        Means::SoftwareReboot if software_reboot_enabled => {}
        Means::SoftwareReboot => {
            return Some(format!(
                "the agent on {target} has no watchdog device and isSoftwareRebootEnabled is false"
            ));
        }
        Means::None => {
            return Some(format!(
                "the agent on {target} has no watchdog device and no software reboot: nothing can fence the node"
            ));
        }
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

/// How long after its last feed a software-reboot agent's own timer reboots the node: the
/// feeder's check period and the reboot itself.
pub const SOFTWARE_REBOOT_DELAY: Duration = Duration::from_secs(1);

/// The node's own timing: the longer of the configured and the published licence (an agent may
/// still run with older settings); its watchdog's timeout, or the software reboot's delay.
pub fn timing(configured_licence: Duration, own: &Registration) -> Timing {
    let watchdog = if own.watchdog.is_zero() {
        SOFTWARE_REBOOT_DELAY
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
    use crate::membership::Configuration;

    fn reg(node: &str, accepts: &[(&str, &str)]) -> Registration {
        Registration {
            node: node.into(),
            means: Means::HardwareWatchdog,
            watchdog: Duration::from_secs(5),
            licence: Duration::from_secs(3),
            accepts: accepts.iter().map(|(n, u)| ((*n).into(), (*u).into())).collect(),
            acknowledged: 1,
            disarmed: false,
        }
    }

    fn committed(members: &[&str]) -> Membership {
        Membership {
            committed: Configuration::new(1, members.iter().copied()),
            proposed: None,
        }
    }

    #[test]
    fn a_majority_of_the_others_must_accept_that_very_remediation() {
        let m = committed(&["x", "a", "b", "c", "d"]);
        let regs = vec![
            reg("x", &[]),
            reg("a", &[("x", "u1")]),
            reg("b", &[]),
            reg("c", &[("x", "u0")]),
            reg("d", &[("x", "u1")]),
        ];
        let acc = acceptance("x", "u1", &regs, Some(&m));
        assert_eq!(
            (acc.by().len(), acc.configurations[0].needed, acc.met),
            (2, 3, false),
            "an acceptance of an older remediation does not count"
        );
        let regs = vec![
            reg("x", &[]),
            reg("a", &[("x", "u1")]),
            reg("b", &[("x", "u1")]),
            reg("c", &[("x", "u1")]),
            reg("d", &[]),
        ];
        assert!(acceptance("x", "u1", &regs, Some(&m)).met);
    }

    #[test]
    fn a_proposed_configuration_must_accept_too() {
        let mut m = committed(&["x", "a"]);
        m.proposed = Some(Configuration::new(2, ["x", "a", "b", "z"]));
        let regs = vec![reg("x", &[]), reg("a", &[("x", "u")]), reg("z", &[])];
        let acc = acceptance("x", "u", &regs, Some(&m));
        assert!(
            acc.configurations[0].met(),
            "a alone is a majority of the others in {{x, a}}"
        );
        assert!(!acc.configurations[1].met(), "1 of {{a, b, z}} is not");
        assert!(!acc.met);
        assert_eq!(acc.epoch, 2);
        assert_eq!(acc.missing(), vec!["b".to_owned(), "z".to_owned()]);
        let regs = vec![reg("x", &[]), reg("a", &[("x", "u")]), reg("z", &[("x", "u")])];
        assert!(acceptance("x", "u", &regs, Some(&m)).met);
    }

    #[test]
    fn nothing_is_met_without_a_membership_or_outside_it() {
        let regs = vec![reg("x", &[]), reg("a", &[("x", "u")])];
        assert!(!acceptance("x", "u", &regs, None).met);
        assert!(!acceptance("x", "u", &regs, Some(&committed(&["a", "b"]))).met);
        assert!(acceptance("x", "u", &regs, Some(&committed(&["x", "a"]))).met);
    }

    #[test]
    fn fencing_needs_an_agent_a_means_and_peers() {
        let mut regs = vec![reg("x", &[]), reg("a", &[])];
        assert_eq!(cannot_fence("x", &regs, false, 1), None);
        assert!(cannot_fence("y", &regs, false, 1).is_some_and(|w| w.contains("no registered")));
        regs[0].means = Means::SoftwareReboot;
        regs[0].watchdog = Duration::ZERO;
        assert!(cannot_fence("x", &regs, false, 1).is_some_and(|w| w.contains("isSoftwareRebootEnabled")));
        assert_eq!(cannot_fence("x", &regs, true, 1), None);
        regs[0].means = Means::None;
        assert!(cannot_fence("x", &regs, true, 1).is_some_and(|w| w.contains("nothing can fence")));
        regs[0].means = Means::Softdog;
        assert!(cannot_fence("x", &regs[..1], true, 1).is_some_and(|w| w.contains("minPeersForRemediation")));
        let mut disarmed = regs.clone();
        disarmed[0].disarmed = true;
        assert!(cannot_fence("x", &disarmed, true, 1).is_some_and(|w| w.contains("disarmed")));
    }

    #[test]
    fn a_software_reboot_waits_its_own_delay() {
        let mut own = reg("x", &[]);
        own.means = Means::SoftwareReboot;
        own.watchdog = Duration::ZERO;
        assert_eq!(timing(Duration::from_secs(4), &own).watchdog, SOFTWARE_REBOOT_DELAY);
        for means in [
            Means::HardwareWatchdog,
            Means::Softdog,
            Means::SoftwareReboot,
            Means::None,
        ] {
            assert_eq!(Means::parse(means.as_str()), Some(means));
        }
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
