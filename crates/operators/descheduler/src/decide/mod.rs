//! The operator's decisions, over plain data: the policy a KubeDescheduler stands for, how the
//! descheduler is started, and which soft taints each node should carry.

pub mod deployment;
pub mod policy;
pub(crate) mod render;
pub mod soft_taints;
pub(crate) mod status;
pub mod tainting;

pub use render::{Environment, Invalid, render};
