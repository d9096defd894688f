//! Self Node Remediation: node agents that fence themselves through a watchdog, and the manager
//! that recovers their workloads once fencing is proven. The proof is the licence protocol in
//! docs/self-remediation-protocol.md, implemented once in [`protocol`] as pure functions.

pub mod agent;
pub(crate) mod decide;
mod error;
pub(crate) mod identity;
pub mod manager;
pub(crate) mod poison_pill;
pub use nodemedic_licence_protocol as protocol;
pub mod registration;
pub(crate) mod remediation_object;
pub mod watchdog;

pub use error::{Error, Result};
