//! Fence Agents Remediation: power-fences nodes through their BMC with the ClusterLabs fence agents.
//!
//! [`decide`] holds every decision as pure functions; [`agent`] runs the agents; [`controller`]
//! moves data between the two and the API server.

pub mod agent;
pub mod controller;
pub(crate) mod decide;
mod error;

pub use error::{Error, Result};
