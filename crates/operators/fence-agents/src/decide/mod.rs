//! Fence Agents Remediation's decisions, as pure functions over plain data.

pub mod fencing;
pub mod metadata;
pub mod parameters;
pub mod validation;
