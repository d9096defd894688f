//! Status writes: edited in memory, written (optimistically locked) only when something changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use nodemedic_api::{
    maintenance::{NodeMaintenance, NodeMaintenanceStatus, PodReference},
    names::conditions as types,
};
use nodemedic_kube::{CallContext, conditions};
use serde_json::{Value, json};

use crate::Result;

/// Edits the status and writes it when `edit` changed it; returns whether it did.
pub async fn write(
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    edit: impl FnOnce(&mut NodeMaintenanceStatus, &Time),
) -> Result<bool> {
    let before = nm.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let now = nodemedic_kube::time::now();
    edit(&mut status, &now);
    // lastUpdate alone is no change worth a write.
    let mut compare = status.clone();
    compare.last_update = before.last_update.clone();
    if compare == before {
        return Ok(false);
    }
    status.last_update = Some(now);
    // A merge patch keeps what it does not mention: fields cleared in memory are sent as null.
    let mut fields = serde_json::to_value(&status)?;
    if let (Some(new), Ok(Value::Object(old))) = (fields.as_object_mut(), serde_json::to_value(&before)) {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    let patch = json!({"metadata": {"resourceVersion": nm.resource_version()}, "status": fields});
    let name = nm.name_any();
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing the status of NodeMaintenance {name}"))?;
    Ok(true)
}

/// The Drained condition (nodemedic's, next to medik8s's phase).
pub fn drained(s: &mut NodeMaintenanceStatus, now: &Time, status: bool, reason: &str, message: String) {
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
pub fn drained_unknown(s: &mut NodeMaintenanceStatus, now: &Time, reason: &str, message: String) {
    let list = s.conditions.get_or_insert_with(Vec::new);
    conditions::set_status(list, types::DRAINED, "Unknown", reason, message, None, now);
}

/// pendingPods and pendingPodsRefs, from the pods still to go.
pub fn pending(s: &mut NodeMaintenanceStatus, refs: Vec<PodReference>) {
    s.pending_pods = Some(refs.iter().map(|r| r.name.clone()).collect());
    s.pending_pods_refs = Some(refs);
}
