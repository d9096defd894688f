//! Fence Agents Remediation's decisions, as pure functions over plain data.

pub(crate) mod admission;
pub(crate) mod fencing;
pub(crate) mod metadata;
pub(crate) mod parameters;
pub(crate) mod validation;
