//! Self Node Remediation: node agents that fence themselves through a watchdog, and the manager
//! that recovers their workloads once fencing is proven. The proof is the licence protocol in
//! docs/self-remediation-protocol.md, implemented once in [`protocol`] as pure functions.

pub mod agent;
pub mod decide;
mod error;
pub mod identity;
pub mod manager;
pub mod poison_pill;
pub use nodemedic_licence_protocol as protocol;
pub mod registration;
pub mod remediation_object;
pub mod watchdog;

pub use error::{Error, Result};
