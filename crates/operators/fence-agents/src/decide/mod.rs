//! Fence Agents Remediation's decisions, as pure functions over plain data.

pub mod metadata;
pub mod parameters;
