//! Failure detection in seconds (docs/peer-detection.md): the agents run a SWIM-style
//! detector among themselves, and the controller turns what they report into a node condition.
//! This crate holds the decisions only, as pure functions over plain data: whether detector
//! settings can detect a silent node in time, which agents confirm and report a suspicion, and
//! whether the reports about a node, its kubelet lease and the controller's own probe of the host
//! add up to "unreachable". No Kubernetes, no
//! network: the agents and the controller wrap it.
//!
//! Detection only decides *when* remediation may start. Fencing stays proven (power off
//! confirmed, or the self-remediation protocol), so a wrong verdict costs a needless remediation,
//! never two writers; the verdict is still built to be wrong as rarely as the evidence allows.

pub(crate) mod aggregate;
pub(crate) mod condition;
pub mod designation;
pub(crate) mod observer;
pub(crate) mod settings;
#[cfg(test)]
mod simulation;
pub mod swim;
pub(crate) mod verdict;

pub use aggregate::{MemberFacts, Reports, verdicts};
pub use condition::{Condition, condition};
pub use observer::{Cadence, DetectorState, Observer, Report};
pub use settings::DetectorSettings;
pub(crate) use verdict::Observation;
pub use verdict::{HostProbes, Policy, Verdict, verdict};

/// The node condition the controller sets from the verdict.
pub const CONDITION: &str = "PeersReachable";

/// `duration` for arithmetic on timestamps; settings too large for that mean "forever".
pub(crate) fn signed(duration: std::time::Duration) -> jiff::SignedDuration {
    jiff::SignedDuration::try_from(duration).unwrap_or(jiff::SignedDuration::MAX)
}
