//! A remediation a MachineHealthCheck created: named after its Machine, which may be another
//! node's name, so its node is read from the Machine and recorded before anything is fenced.

use kube::ResourceExt;
use nodemedic_api::fence_agents::FenceAgentsRemediation;
use nodemedic_kube::{events::Note, steps::Outcome};

use super::{
    super::{Context, status::set_failed},
    observe::current_step,
};
use crate::decide::fencing::FailureReason;

/// The Machine names no node: the remediation ends (NodeNotFound), said once.
pub(super) fn no_node<'a>(far: &FenceAgentsRemediation, why: String, ctx: &'a Context) -> Outcome<'a, Context> {
    let step = current_step(far);
    let reason = FailureReason::NodeNotFound.as_str();
    let name = far.name_any();
    let note = Note::warning(reason, why.clone());
    let logged = why.clone();
    Outcome::await_change()
        .status(move |s, now| set_failed(s, now, step, reason, &why))
        .then(async move {
            tracing::warn!(remediation = %name, why = %logged, "fence agents remediation cannot start");
            ctx.metrics.finished(reason);
            Ok(())
        })
        .event_if_changed(note)
}
