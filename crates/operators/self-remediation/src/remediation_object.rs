//! What of a SelfNodeRemediation object the protocol looks at, the same for the agents and the
//! manager.

use kube::ResourceExt;
use nodemedic_api::{
    machines::{self, NodeOf},
    names::annotations,
    self_remediation::SelfNodeRemediation,
};

/// The node it remediates: the node-name annotation (the health check's, or the one the manager
/// recorded from the owning Machine), else its name (medik8s's rule). None while a Machine-owned
/// remediation is unresolved: its name is the Machine's and may be another node's, so it is
/// nobody's intent until the manager has read the Machine's node.
pub(crate) fn node_of(snr: &SelfNodeRemediation) -> Option<String> {
    match machines::node_of(&snr.metadata) {
        NodeOf::Named(node) => Some(node),
        NodeOf::Machine(_) => None,
    }
}

/// Whether it is an intent agents honour: not being deleted, not timed out by the health check.
/// The manager stops at once on such an object, so withdrawing an acceptance of it is safe.
pub(crate) fn is_intent(snr: &SelfNodeRemediation) -> bool {
    snr.metadata.deletion_timestamp.is_none() && !snr.annotations().contains_key(annotations::NHC_TIMED_OUT)
}
