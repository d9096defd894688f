//! Status edits: medik8s's fields and nodemedic's Drained condition, edited in memory; the step
//! runner writes them (optimistically locked) only when something changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodemedic_api::{
    maintenance::{NodeMaintenanceStatus, PodReference},
    names::conditions as types,
};
use nodemedic_kube::conditions;

/// A status edit for the step runner that stamps lastUpdate when it changed anything else:
/// lastUpdate alone is no change worth a write.
pub(super) fn stamped<'a>(
    edit: impl FnOnce(&mut NodeMaintenanceStatus, &Time) + Send + 'a,
) -> impl FnOnce(&mut NodeMaintenanceStatus, &Time) -> bool + Send + 'a {
    move |s, now| {
        let before = s.clone();
        edit(s, now);
        let mut compare = s.clone();
        compare.last_update = before.last_update.clone();
        if compare == before {
            return false;
        }
        s.last_update = Some(now.clone());
        true
    }
}

/// The Drained condition (nodemedic's, next to medik8s's phase).
pub(super) fn drained(s: &mut NodeMaintenanceStatus, now: &Time, status: bool, reason: &str, message: String) {
    let list = s.conditions.get_or_insert_with(Vec::new);
    conditions::set_status(
        list,
        types::DRAINED,
        conditions::status_str(status),
        reason,
        message,
        None,
        now,
    );
}

/// The Drained condition while the drain has not begun.
pub(super) fn drained_unknown(s: &mut NodeMaintenanceStatus, now: &Time, reason: &str, message: String) {
    let list = s.conditions.get_or_insert_with(Vec::new);
    conditions::set_status(list, types::DRAINED, "Unknown", reason, message, None, now);
}

/// pendingPods and pendingPodsRefs, from the pods still to go.
pub(super) fn pending(s: &mut NodeMaintenanceStatus, refs: Vec<PodReference>) {
    s.pending_pods = Some(refs.iter().map(|r| r.name.clone()).collect());
    s.pending_pods_refs = Some(refs);
}
