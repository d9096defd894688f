//! The licence protocol (docs/self-remediation-protocol.md) as pure functions: the agent's
//! licence and votes, the manager's acceptance quorum, membership changes and the safe time,
//! shared by the real agent and manager and by the model checker. No Kubernetes, no I/O: the
//! self-remediation crate wraps it. A crate of its own so that only it is built optimised in
//! debug builds (the model checker explores millions of states), not the operator around it.

pub mod agent;
#[cfg(test)]
mod explore;
pub mod manager;
pub mod membership;
#[cfg(test)]
mod model;
pub mod rounds;
#[cfg(test)]
mod rounds_model;
pub mod wait;

use std::time::Duration;

/// Bound on how far any clock's rate may be off (NTP slews monotonic clocks by at most 0.0005).
pub(crate) const CLOCK_RATE_BOUND: f64 = 0.01;
/// Added to every safe time.
pub(crate) const SAFETY_MARGIN: Duration = Duration::from_secs(1);

/// Strict majority of a view of `members` (the asker included).
pub(crate) fn vote_quorum(members: usize) -> usize {
    members / 2 + 1
}

/// Acceptances needed from the members other than the target: more than half of them.
pub(crate) fn acceptance_quorum(members_other_than_target: usize) -> usize {
    members_other_than_target / 2 + 1
}

/// The timings the licence protocol depends on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// `L`: how long a licence lasts from the send time of the request that earned it.
    pub licence: Duration,
    /// `W`: the node's watchdog timeout.
    pub watchdog: Duration,
}

impl Timing {
    /// `T_safe = (L + 3W)·(1+ρ)/(1−ρ) + δ`: after the manager observes the remediation object and
    /// the acceptance quorum, the node is dead within this long on the manager's clock. One `W`
    /// is the watchdog itself; one covers a feed written late by a stall that stopped just short
    /// of firing the watchdog; one the keep-alive the kernel sends when an agent process dies
    /// with its device open (a restarted agent inherits its predecessor's licence, so a crash
    /// loop adds nothing more).
    pub fn safe_time(&self) -> Duration {
        let drift = (1.0 + CLOCK_RATE_BOUND) / (1.0 - CLOCK_RATE_BOUND);
        (self.licence + self.watchdog * 3).mul_f64(drift) + SAFETY_MARGIN
    }
}

/// The agent settings that shape a licence (medik8s's SelfNodeRemediationConfig fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LicenceSettings {
    pub api_check_interval: Duration,
    pub api_server_timeout: Duration,
    pub max_api_error_threshold: u32,
    pub peer_dial_timeout: Duration,
    pub peer_request_timeout: Duration,
}

impl LicenceSettings {
    /// `L`: the agent rides out `maxApiErrorThreshold` failed API checks plus one peer round
    /// before its licence lapses.
    pub fn licence(&self) -> Duration {
        (self.api_check_interval + self.api_server_timeout) * self.max_api_error_threshold
            + self.peer_dial_timeout
            + self.peer_request_timeout
    }
}

/// Whole seconds of a model clock (tests and the model checker).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Tick(pub u64);

#[cfg(test)]
impl std::ops::Add<Duration> for Tick {
    type Output = Tick;
    fn add(self, d: Duration) -> Tick {
        Tick(self.0 + d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorums_intersect_for_every_cluster_size() {
        for n in 1..64usize {
            // X's voters other than itself and the acceptors, both among the other n-1 members.
            let voters_other = vote_quorum(n) - 1;
            let acceptors = acceptance_quorum(n - 1);
            assert!(
                voters_other + acceptors > n - 1,
                "n={n}: {voters_other} + {acceptors} do not overlap in {}",
                n - 1
            );
        }
    }

    #[test]
    fn safe_time_with_medik8s_defaults_and_a_fast_lab_config() {
        let defaults = LicenceSettings {
            api_check_interval: Duration::from_secs(15),
            api_server_timeout: Duration::from_secs(5),
            max_api_error_threshold: 3,
            peer_dial_timeout: Duration::from_secs(5),
            peer_request_timeout: Duration::from_secs(7),
        };
        assert_eq!(defaults.licence(), Duration::from_secs(72));
        let t = Timing {
            licence: defaults.licence(),
            watchdog: Duration::from_secs(60),
        };
        assert_eq!(
            t.safe_time().as_secs(),
            258,
            "(72 + 180) x 1.0202 + 1: {:?}",
            t.safe_time()
        );
        let fast = LicenceSettings {
            api_check_interval: Duration::from_millis(500),
            api_server_timeout: Duration::from_millis(500),
            max_api_error_threshold: 2,
            peer_dial_timeout: Duration::from_millis(500),
            peer_request_timeout: Duration::from_millis(500),
        };
        let t = Timing {
            licence: fast.licence(),
            watchdog: Duration::from_secs(2),
        };
        assert_eq!(t.licence, Duration::from_secs(3));
        assert!(t.safe_time() < Duration::from_secs(12), "{:?}", t.safe_time());
    }
}
