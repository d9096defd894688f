//! The FenceAgentsRemediation reconciler: [`observe`] reads what the decision needs,
//! [`fencing::next`] decides, [`perform`] carries the answer out; again until it is to wait.

mod machine;
mod observe;
mod perform;

use std::{sync::Arc, time::Duration};

use kube::{Api, ResourceExt, runtime::controller::Action};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    machines::{self, NodeOf},
};

use super::Context;
use crate::{
    Error, Result,
    decide::fencing::{self, Decision},
};

/// More steps than a remediation has; each pass reads the remediation afresh.
const STEPS_PER_RECONCILE: usize = 16;

pub async fn reconcile(far: Arc<FenceAgentsRemediation>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = far.namespace().ok_or_else(|| Error::Unnamespaced(far.name_any()))?;
    let api = Api::<FenceAgentsRemediation>::namespaced(ctx.client.clone(), &namespace);
    let name = far.name_any();
    if matches!(machines::node_of(&far.metadata), NodeOf::Machine(_))
        && let Some(action) = machine::resolve(&api, &far, &ctx).await?
    {
        return Ok(action);
    }
    for _ in 0..STEPS_PER_RECONCILE {
        let Some(seen) = observe::observe(&api, &name, &namespace, &ctx).await? else {
            return Ok(Action::await_change());
        };
        let decision = fencing::next(&seen.facts);
        if !matches!(decision, Decision::Idle | Decision::AwaitRun) {
            tracing::info!(remediation = %name, node = %seen.node, step = seen.facts.step.as_str(), ?decision, "fence agents remediation");
        }
        if let Some(action) = perform::perform(decision, seen, &api, &ctx).await? {
            return Ok(action);
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}
