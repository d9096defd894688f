//! Status edits: the medik8s condition triple for a step, written only when something changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodemedic_api::{fence_agents::FenceAgentsRemediationStatus, names::conditions as types};
use nodemedic_kube::conditions;

use crate::decide::fencing;

/// Sets `step` and its conditions with `reason`/`message`; returns whether anything changed.
pub(super) fn set_step(
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

/// The Failed step; FenceAgentActionSucceeded turns False only when the power was never
/// confirmed off.
pub(super) fn set_failed(
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
