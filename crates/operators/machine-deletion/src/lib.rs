//! Machine Deletion Remediation: a node's Machine is deleted so that its owner (a MachineSet, a
//! control plane) provisions a replacement. medik8s's remediator for OpenShift's Machine API,
//! here for Cluster API too.
//!
//! [`decide`] holds every decision as a pure function; [`controller`] reads the cluster into its
//! facts and carries the answer out.

pub mod controller;
pub(crate) mod decide;
mod error;

pub use error::{Error, Result};
