//! Node Maintenance's decisions, as pure functions over plain data: which pods a drain evicts,
//! deletes or leaves, how far it got, whether the etcd quorum survives taking a control-plane
//! node away, and the next step of a maintenance.

pub mod drain;
pub mod quorum;
pub mod steps;
