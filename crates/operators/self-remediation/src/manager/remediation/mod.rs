//! The SelfNodeRemediation reconciler, run by the shared step runner ([`steps`]): gathers the
//! facts ([`observe`]), asks [`crate::decide::next`] for the step, performs it ([`perform`]), and
//! asks again until the answer is to wait. A remediation named after its Machine first has its
//! node read from the Machine and recorded.

mod audience;
mod observe;
mod perform;
mod status;

use std::{collections::HashMap, sync::Mutex, time::Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Api, Client, ResourceExt};
use nodemedic_api::self_remediation::SelfNodeRemediation;
use nodemedic_kube::{
    events::Events,
    machines::{self, Resolution},
    steps::{self, Outcome},
};

use super::Metrics;
use crate::{
    Error, Result,
    decide::{self, Step},
};

pub(super) struct Context {
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
        Step::Disabled => "disabled",
        Step::Enabled => "enabled",
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

/// Waits, not worth a log line or a count.
fn routine_step(step: &Step) -> bool {
    matches!(step, Step::Idle | Step::Wait(_) | Step::AwaitAcceptance)
}

/// What one observation found.
pub(super) enum Seen {
    /// Named after its Machine and its node not yet recorded; `None` while being deleted.
    Unresolved {
        current: SelfNodeRemediation,
        resolution: Resolution,
    },
    Remediating {
        current: SelfNodeRemediation,
        observed: Box<observe::Observed>,
    },
}

#[derive(Debug)]
pub(super) enum Act {
    /// A Machine-named remediation's node: record it, then remediate it, or say there is none.
    Resolve(Resolution),
    Remediate(Step),
}

impl steps::Operator for Context {
    type Object = SelfNodeRemediation;
    type Observed = Seen;
    type Step = Act;
    type Error = Error;

    const NAME: &'static str = "self remediation";
    /// Each step changes what the next one reads: re-read, at most this many times.
    const STEPS: usize = 16;

    fn api(&self, snr: &SelfNodeRemediation) -> Result<Api<SelfNodeRemediation>> {
        Ok(Api::namespaced(
            self.client.clone(),
            &snr.namespace().unwrap_or_default(),
        ))
    }

    async fn observe(&self, current: SelfNodeRemediation) -> Result<Seen> {
        if crate::remediation_object::node_of(&current).is_none() {
            let resolution = machines::resolution(&self.client, &current.metadata, false).await?;
            return Ok(Seen::Unresolved { current, resolution });
        }
        let observed = Box::new(observe::observe(&current, self).await?);
        Ok(Seen::Remediating { current, observed })
    }

    fn current(seen: &Seen) -> &SelfNodeRemediation {
        match seen {
            Seen::Unresolved { current, .. } | Seen::Remediating { current, .. } => current,
        }
    }

    fn decide(&self, seen: &Seen) -> Act {
        match seen {
            Seen::Unresolved { resolution, .. } => Act::Resolve(resolution.clone()),
            Seen::Remediating { observed, .. } => Act::Remediate(decide::next(&observed.facts)),
        }
    }

    fn routine(act: &Act) -> bool {
        match act {
            Act::Resolve(resolution) => *resolution == Resolution::Settled,
            Act::Remediate(step) => routine_step(step),
        }
    }

    async fn perform<'a>(
        &'a self,
        act: Act,
        seen: &'a Seen,
        api: &'a Api<SelfNodeRemediation>,
    ) -> Result<Outcome<'a, Self>> {
        match (act, seen) {
            (Act::Remediate(step), Seen::Remediating { current, observed }) => {
                if !routine_step(&step) {
                    self.metrics.step(step_name(&step));
                }
                perform::perform(step, current, observed, api, self).await
            }
            (Act::Resolve(Resolution::RecordNode(node)), Seen::Unresolved { current, .. }) => {
                machines::record_node(&self.client, current, &node).await?;
                Ok(Outcome::again())
            }
            (Act::Resolve(Resolution::NoNode(why)), Seen::Unresolved { .. }) => Ok(perform::no_node(why)),
            _ => Ok(Outcome::await_change()),
        }
    }

    fn audience(&self, snr: &SelfNodeRemediation) -> Vec<ObjectReference> {
        audience::of(snr)
    }

    fn events(&self) -> &Events {
        &self.events
    }

    fn count_error(&self, error: &Error) {
        self.metrics
            .errors
            .get_or_create(&super::metrics::ResultLabels {
                result: error.kind().to_owned(),
            })
            .inc();
    }
}
