//! A remediation a MachineHealthCheck created: named after its Machine, which may be another
//! node's name, so its node is read from the Machine and recorded before anything is fenced.

use kube::{Api, ResourceExt, runtime::controller::Action};
use nodemedic_api::fence_agents::FenceAgentsRemediation;
use nodemedic_kube::machines::{self, Resolved};

use super::{
    super::{
        Context,
        status::{set_failed, write},
    },
    observe::current_step,
};
use crate::{Result, decide::fencing::FailureReason};

/// Records the Machine's node on the remediation (`None`: go on and fence it), or ends the
/// remediation when the Machine names no node.
pub async fn resolve(
    api: &Api<FenceAgentsRemediation>,
    far: &FenceAgentsRemediation,
    ctx: &Context,
) -> Result<Option<Action>> {
    let step = current_step(far);
    if far.metadata.deletion_timestamp.is_some() || step.finished() {
        return Ok(Some(Action::await_change()));
    }
    let why = match machines::resolve_node(&ctx.client, &far.metadata).await? {
        Resolved::Node(node) => {
            machines::record_node(&ctx.client, far, &node).await?;
            tracing::info!(remediation = %far.name_any(), %node, "node of the owning Machine recorded");
            return Ok(None);
        }
        unresolved => unresolved.why_no_node().unwrap_or_default(),
    };
    let reason = FailureReason::NodeNotFound.as_str();
    if write(api, far, |s, now| set_failed(s, now, step, reason, &why)).await? {
        let on = nodemedic_kube::events::reference(far);
        ctx.events.warning(&on, reason, why.clone()).await;
        tracing::warn!(remediation = %far.name_any(), %why, "fence agents remediation cannot start");
        ctx.metrics.finished(reason);
    }
    Ok(Some(Action::await_change()))
}
