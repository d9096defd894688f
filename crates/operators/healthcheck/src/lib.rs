//! Node Health Check: decides which nodes are unhealthy and drives their remediation through
//! templates (the External Remediation API), within a budget, one control-plane node at a time.
//!
//! [`decide`] holds every decision as a pure function; [`controller`] only gathers the inputs
//! from an in-memory index fed by watches and applies the outcome.

pub mod controller;
pub mod decide;
mod error;
pub mod metrics;
pub mod spec;

pub use error::{Error, Result};
