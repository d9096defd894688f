//! Kubernetes plumbing shared by nodemedic's operators. Decisions live in the operator crates;
//! this crate only moves data to and from the API server, and keeps the few pure helpers that
//! every operator needs (conditions, taints, node-lease rules).

pub mod admission;
pub mod backoff;
pub mod client;
pub mod conditions;
pub(crate) mod context;
pub mod defaults;
pub mod etcd;
pub mod events;
pub mod finalizers;
pub mod leader;
pub mod logging;
pub mod machines;
pub(crate) mod merge_patch;
pub mod metrics_server;
pub mod node_lease;
pub mod paged;
pub mod pki;
pub mod shutdown;
pub mod status;
pub mod steps;
pub mod taints;
pub mod time;
pub(crate) mod tls;
pub mod webhook;
pub mod workloads;

pub use client::{Error, Result};
pub use context::CallContext;
