//! The FenceAgentsRemediation reconciler, run by the shared step runner ([`steps`]): [`observe`]
//! reads what the decision needs, [`fencing::next`] decides, [`perform`] carries the answer out;
//! again until it is to wait. A remediation named after its Machine (a MachineHealthCheck's) first
//! has its node read from the Machine and recorded ([`machine`]).

mod machine;
mod observe;
mod perform;

use kube::Api;
use nodemedic_api::fence_agents::FenceAgentsRemediation;
use nodemedic_kube::{
    events::Events,
    machines::Resolution,
    steps::{self, Outcome},
};

use super::Context;
use crate::{
    Error, Result,
    decide::fencing::{self, Decision},
};

/// What one observation found.
pub enum Seen {
    /// Named after its Machine and its node not yet recorded; `None` while nothing is to be done
    /// (being deleted, or finished).
    Unresolved {
        current: Box<FenceAgentsRemediation>,
        resolution: Resolution,
    },
    Fencing(Box<observe::Observed>),
}

#[derive(Debug)]
pub enum Step {
    /// A Machine-named remediation's node: record it, then fence it, or say there is none.
    Resolve(Resolution),
    Fence(Decision),
}

impl steps::Operator for Context {
    type Object = FenceAgentsRemediation;
    type Observed = Seen;
    type Step = Step;
    type Error = Error;

    const NAME: &'static str = "fence agents remediation";
    const STEPS: usize = 16;

    fn api(&self, far: &FenceAgentsRemediation) -> Result<Api<FenceAgentsRemediation>> {
        Ok(nodemedic_kube::client::namespaced_api(&self.client, far)?)
    }

    async fn observe(&self, current: FenceAgentsRemediation) -> Result<Seen> {
        observe::observe(current, self).await
    }

    fn current(seen: &Seen) -> &FenceAgentsRemediation {
        match seen {
            Seen::Unresolved { current, .. } => current,
            Seen::Fencing(observed) => &observed.current,
        }
    }

    fn decide(&self, seen: &Seen) -> Step {
        match seen {
            Seen::Unresolved { resolution, .. } => Step::Resolve(resolution.clone()),
            Seen::Fencing(observed) => Step::Fence(fencing::next(&observed.facts)),
        }
    }

    fn routine(step: &Step) -> bool {
        matches!(
            step,
            Step::Resolve(Resolution::Settled) | Step::Fence(Decision::Idle | Decision::AwaitRun)
        )
    }

    async fn perform<'a>(
        &'a self,
        step: Step,
        seen: &'a Seen,
        api: &'a Api<FenceAgentsRemediation>,
    ) -> Result<Outcome<'a, Self>> {
        match (step, seen) {
            (Step::Fence(decision), Seen::Fencing(observed)) => perform::perform(decision, observed, api, self).await,
            (Step::Resolve(Resolution::RecordNode(node)), Seen::Unresolved { current, .. }) => {
                nodemedic_kube::machines::record_node(&self.client, current.as_ref(), &node).await?;
                Ok(Outcome::again())
            }
            (Step::Resolve(Resolution::NoNode(why)), Seen::Unresolved { current, .. }) => {
                Ok(machine::no_node(current, why, self))
            }
            _ => Ok(Outcome::await_change()),
        }
    }

    fn events(&self) -> &Events {
        &self.events
    }

    fn count_error(&self, error: &Error) {
        self.metrics.error(error.kind());
    }
}
