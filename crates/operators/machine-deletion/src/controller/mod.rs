//! The MachineDeletionRemediation reconciler: [`observe`] reads the remediation, its Machine and
//! the Machine's owner into [`crate::decide::Facts`], [`crate::decide::next`] decides, and
//! [`perform`] carries the step out; again until the answer is to wait.

mod metrics;
mod observe;
mod perform;

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use nodemedic_api::machine_deletion::MachineDeletionRemediation;
use nodemedic_kube::events::Events;

pub use self::metrics::Metrics;
use crate::{Error, Result, decide};

pub struct Context {
    pub client: Client,
    pub events: Events,
    pub metrics: Metrics,
}

/// More steps than a remediation has; each pass reads everything afresh.
const STEPS_PER_RECONCILE: usize = 8;

pub async fn run(client: Client, metrics: Metrics, events: Events) -> Result<()> {
    let ctx = Arc::new(Context {
        client: client.clone(),
        events,
        metrics,
    });
    tracing::info!("machine deletion remediation running");
    Controller::new(
        Api::<MachineDeletionRemediation>::all(client),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx)
    .for_each(|_| async {})
    .await;
    Ok(())
}

async fn reconcile(mdr: Arc<MachineDeletionRemediation>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = mdr.namespace().ok_or_else(|| Error::Unnamespaced(mdr.name_any()))?;
    let api = Api::<MachineDeletionRemediation>::namespaced(ctx.client.clone(), &namespace);
    let name = mdr.name_any();
    for _ in 0..STEPS_PER_RECONCILE {
        let Some(seen) = observe::observe(&api, &name, &ctx).await? else {
            return Ok(Action::await_change());
        };
        let step = decide::next(&seen.facts);
        if !matches!(step, decide::Step::Idle) {
            tracing::info!(remediation = %name, %namespace, ?step, "machine deletion remediation");
        }
        if let Some(action) = perform::perform(step, &seen, &api, &ctx).await? {
            return Ok(action);
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

fn error_policy(mdr: Arc<MachineDeletionRemediation>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.kind());
    tracing::warn!(remediation = %mdr.name_any(), %error, "machine deletion reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}
