//! Node Maintenance's decisions, as pure functions over plain data: which pods a drain evicts,
//! deletes or leaves, how far it got, whether the etcd quorum survives taking a control-plane
//! node away, the next step of a maintenance, and whether the API server admits one.

pub(crate) mod admission;
pub(crate) mod drain;
pub(crate) mod quorum;
pub(crate) mod steps;
