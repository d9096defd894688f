//! The medik8s-compatible API of nodemedic: every custom resource kind, the well-known names
//! the operators share, and the CRD manifests generated from the types.

// kube-derive takes one `printcolumn(...)` per column; clippy reads the repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod crds;
pub mod descheduler;
pub mod duration;
pub mod fence_agents;
pub mod healthcheck;
pub mod machine_deletion;
pub mod machines;
pub mod maintenance;
pub mod names;
pub mod poison_pill;
pub(crate) mod schema;
pub mod self_remediation;

pub use duration::{GoDuration, SignedGoDuration};
