//! Status edits: medik8s's Processing/Succeeded pair and nodemedic's own conditions.

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use nodemedic_api::self_remediation::{SelfNodeRemediation, SelfNodeRemediationStatus};
use nodemedic_kube::{CallContext, conditions};
use serde_json::json;

use crate::Result;

pub fn condition(
    s: &mut SelfNodeRemediationStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
) -> bool {
    let list = s.conditions.get_or_insert_with(Vec::new);
    conditions::set(
        list,
        conditions::Desired {
            type_,
            status,
            reason,
            message,
        },
        None,
        now,
    )
}

pub fn processing(
    s: &mut SelfNodeRemediationStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    why: &str,
) -> bool {
    conditions::set_processing(
        s.conditions.get_or_insert_with(Vec::new),
        "RemediationStarted",
        why,
        now,
    )
}

pub fn finished(
    s: &mut SelfNodeRemediationStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    ok: bool,
    reason: &str,
    why: &str,
) -> bool {
    let changed = conditions::set_finished(s.conditions.get_or_insert_with(Vec::new), ok, reason, why, now);
    let error = (!ok).then(|| why.to_owned());
    let error_changed = s.last_error != error;
    s.last_error = error;
    changed | error_changed
}

/// Edits the status; writes it only when `edit` reports a change. Returns whether it wrote.
pub async fn set_status(
    api: &Api<SelfNodeRemediation>,
    snr: &SelfNodeRemediation,
    edit: impl FnOnce(&mut SelfNodeRemediationStatus, &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> bool,
) -> Result<bool> {
    let before = snr.status.clone().unwrap_or_default();
    let mut status = before.clone();
    if !edit(&mut status, &nodemedic_kube::time::now()) {
        return Ok(false);
    }
    // A field the edit emptied (a wait that must start over, an error that is gone) is removed,
    // not kept: a plain merge patch would leave the old value in place.
    let status = nodemedic_kube::merge_patch::replacing(&before, &status);
    let patch = json!({"metadata": {"resourceVersion": snr.resource_version()}, "status": status});
    api.patch_status(&snr.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            let namespace = snr.namespace().unwrap_or_default();
            format!(
                "writing the status of SelfNodeRemediation {namespace}/{}",
                snr.name_any()
            )
        })?;
    Ok(true)
}
