//! What of a SelfNodeRemediation object the protocol looks at, the same for the agents and the
//! manager.

use kube::ResourceExt;
use nodemedic_api::{names::annotations, self_remediation::SelfNodeRemediation};

/// The node it remediates: the health check's annotation, else its name (medik8s's rule).
pub fn node_of(snr: &SelfNodeRemediation) -> String {
    snr.annotations()
        .get(annotations::NODE_NAME)
        .cloned()
        .unwrap_or_else(|| snr.name_any())
}

/// Whether it is an intent agents honour: not being deleted, not timed out by the health check.
/// The manager stops at once on such an object, so withdrawing an acceptance of it is safe.
pub fn is_intent(snr: &SelfNodeRemediation) -> bool {
    snr.metadata.deletion_timestamp.is_none() && !snr.annotations().contains_key(annotations::NHC_TIMED_OUT)
}
