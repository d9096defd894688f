//! Status edits: the medik8s condition triple for a step, written only when something changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceAgentsRemediationStatus},
    names::conditions as types,
};
use nodemedic_kube::{CallContext, conditions};
use serde_json::json;

use crate::{Result, decide::fencing};

/// Sets `step` and its conditions with `reason`/`message`; returns whether anything changed.
pub fn set_step(
    s: &mut FenceAgentsRemediationStatus,
    now: &Time,
    step: fencing::Step,
    reason: &str,
    message: &str,
) -> bool {
    let list = s.conditions.get_or_insert_with(Vec::new);
    let mut changed = false;
    let types = [types::PROCESSING, types::FENCE_AGENT_ACTION_SUCCEEDED, types::SUCCEEDED];
    for (type_, status) in types.into_iter().zip(fencing::conditions(step)) {
        if let Some(status) = status {
            changed |= conditions::set_status(list, type_, status, reason, message.to_owned(), None, now);
        }
    }
    if changed {
        s.last_update_time = Some(now.clone());
    }
    let name = Some(step.as_str().to_owned());
    changed |= s.step != name;
    s.step = name;
    changed
}

/// Edits the status and writes it (optimistically locked) when `edit` reports a change.
pub async fn write(
    api: &Api<FenceAgentsRemediation>,
    far: &FenceAgentsRemediation,
    edit: impl FnOnce(&mut FenceAgentsRemediationStatus, &Time) -> bool,
) -> Result<bool> {
    let before = far.status.clone().unwrap_or_default();
    let mut status = before.clone();
    if !edit(&mut status, &nodemedic_kube::time::now()) {
        return Ok(false);
    }
    // Fields the edit emptied are removed, not kept as a plain merge patch would keep them.
    let status = nodemedic_kube::merge_patch::replacing(&before, &status);
    let patch = json!({"metadata": {"resourceVersion": far.resource_version()}, "status": status});
    api.patch_status(&far.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            let namespace = far.namespace().unwrap_or_default();
            format!(
                "writing the status of FenceAgentsRemediation {namespace}/{}",
                far.name_any()
            )
        })?;
    Ok(true)
}

/// The Failed step; FenceAgentActionSucceeded turns False only when the power was never
/// confirmed off.
pub fn set_failed(
    s: &mut FenceAgentsRemediationStatus,
    now: &Time,
    from: fencing::Step,
    reason: &str,
    message: &str,
) -> bool {
    let mut changed = set_step(s, now, fencing::Step::Failed, reason, message);
    if matches!(from, fencing::Step::PoweringOff | fencing::Step::ConfirmingOff) {
        let list = s.conditions.get_or_insert_with(Vec::new);
        changed |= conditions::set_status(
            list,
            types::FENCE_AGENT_ACTION_SUCCEEDED,
            "False",
            reason,
            message.to_owned(),
            None,
            now,
        );
    }
    changed
}
