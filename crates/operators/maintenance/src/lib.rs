//! Node Maintenance: cordons and drains a node on request, and gives it back.
//!
//! [`decide`] holds the decisions as pure functions; the reconciler around them is to come.

pub mod decide;
