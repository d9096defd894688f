//! The SelfNodeRemediation reconciler: gathers the facts ([`observe`]), asks
//! [`crate::decide::next`] for the step, performs it ([`perform`]), and asks again until the
//! answer is to wait.

mod audience;
mod observe;
mod perform;
mod status;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::{Api, Client, ResourceExt, runtime::controller::Action};
use nodemedic_api::self_remediation::SelfNodeRemediation;
use nodemedic_kube::{
    CallContext,
    events::Events,
    machines::{self, Resolved},
};

use super::Metrics;
use crate::{
    Error, Result,
    decide::{self, Step},
};

pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub events: Events,
    pub metrics: Metrics,
    /// Kubernetes >= 1.28: the out-of-service taint is GA.
    pub out_of_service: bool,
    /// When this manager first saw each remediation's acceptance quorum (by uid), on its own
    /// monotonic clock, and the membership epoch it was counted in. The status records the
    /// start on the API server's clock too, for a new leader to continue from.
    pub observed: Mutex<HashMap<String, (Instant, u64)>>,
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::RemoveOutOfServiceTaint => "remove_out_of_service_taint",
        Step::RemoveNoScheduleTaint => "remove_no_schedule_taint",
        Step::RemoveFinalizer => "remove_finalizer",
        Step::Idle => "idle",
        Step::Stop => "stop",
        Step::NodeNotFound => "node_not_found",
        Step::Excluded => "excluded",
        Step::CannotFence(_) => "cannot_fence",
        Step::AddFinalizer => "add_finalizer",
        Step::AddNoScheduleTaint => "add_no_schedule_taint",
        Step::Start => "start",
        Step::AwaitAcceptance => "await_acceptance",
        Step::ObserveAcceptance => "observe_acceptance",
        Step::Wait(_) => "wait",
        Step::MarkRebooted => "mark_rebooted",
        Step::AddOutOfServiceTaint => "add_out_of_service_taint",
        Step::DeletePods => "delete_pods",
        Step::DeleteAttachments => "delete_attachments",
        Step::MarkCompleted => "mark_completed",
    }
}

pub async fn reconcile(snr: Arc<SelfNodeRemediation>, ctx: Arc<Context>) -> Result<Action> {
    let api = Api::<SelfNodeRemediation>::namespaced(ctx.client.clone(), &snr.namespace().unwrap_or_default());
    let name = snr.name_any();
    // Each step changes what the next one reads: re-read, at most a bounded number of times.
    for _ in 0..16 {
        let Some(current) = api.get_opt(&name).await.with_context(|| {
            let namespace = snr.namespace().unwrap_or_default();
            format!("reading SelfNodeRemediation {namespace}/{name}")
        })?
        else {
            return Ok(Action::await_change());
        };
        if crate::remediation_object::node_of(&current).is_none() {
            match machines::resolve_node(&ctx.client, &current.metadata).await? {
                Resolved::Node(node) => {
                    machines::record_node(&ctx.client, &current, &node).await?;
                    tracing::info!(remediation = %name, %node, "node of the owning Machine recorded");
                    continue;
                }
                unresolved => return perform::unresolved(&current, &unresolved, &api, &ctx).await,
            }
        }
        let seen = observe::observe(&current, &ctx).await?;
        let step = decide::next(&seen.facts);
        if !matches!(step, Step::Idle | Step::Wait(_) | Step::AwaitAcceptance) {
            ctx.metrics.step(step_name(&step));
            tracing::info!(remediation = %name, node = %seen.node, step = step_name(&step), "self remediation step");
        }
        match perform::perform(&step, &current, &seen, &api, &ctx).await? {
            Some(action) => return Ok(action),
            None => continue,
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Performs one step; `Some(action)` ends the reconcile.
pub fn error_policy(snr: Arc<SelfNodeRemediation>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&super::metrics::ResultLabels {
            result: error.kind().to_owned(),
        })
        .inc();
    tracing::warn!(remediation = %snr.name_any(), %error, "self remediation reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}
