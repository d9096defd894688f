//! Rebalancing, as OpenShift's Kube Descheduler Operator does it: a KubeDescheduler's profiles
//! become a policy for the upstream descheduler (kubernetes-sigs/descheduler), which does the
//! descheduling; the soft tainter steers the scheduler away from hot nodes meanwhile.
//!
//! [`decide`] holds every decision as a pure function; [`controller`] reads the cluster into its
//! facts and carries the answers out.

pub mod controller;
pub mod decide;
mod error;

pub use error::{Error, Result};
