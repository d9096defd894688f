//! Node Maintenance: cordons and drains a node on request, and gives it back.
//!
//! [`decide`] holds the decisions as pure functions (what a drain does with each pod, whether
//! etcd keeps its quorum, the next step); [`controller`] observes, asks them, and acts.

pub mod controller;
pub(crate) mod decide;
mod error;

pub use error::{Error, Result};
