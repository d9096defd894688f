//! The medik8s-compatible API of nodemedic: every custom resource kind, the well-known names
//! the operators share, and the CRD manifests generated from the types.

// kube-derive takes one `printcolumn(...)` per column; clippy reads the repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]
// The schema derives (KubeSchema, CustomResource) re-emit each type where `unreachable_pub`
// reads every one of them as unreachable, though each is used by the operators: this crate's
// surface is its resource types, public by nature; its private modules are `pub(crate)`.
#![allow(unreachable_pub)]

pub mod crds;
pub mod descheduler;
pub(crate) mod duration;
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
