//! The MachineDeletionRemediation reconciler: [`observe`] reads the remediation, its Machine and
//! the Machine's owner into [`crate::decide::Facts`], [`crate::decide::next`] decides, and
//! [`perform`] carries the step out, the shared step runner ([`steps`]) writing the status and
//! publishing the events each step returns; again until the answer is to wait.

mod metrics;
mod observe;
mod perform;

use std::sync::Arc;

use futures::StreamExt;
use kube::{Api, Client, runtime::watcher};
use nodemedic_api::machine_deletion::MachineDeletionRemediation;
use nodemedic_kube::{
    events::Events,
    steps::{self, Outcome},
};

pub use self::metrics::Metrics;
use crate::{Error, Result, decide};

pub struct Context {
    pub client: Client,
    pub events: Events,
    pub metrics: Metrics,
}

pub async fn run(client: Client, metrics: Metrics, events: Events) -> Result<()> {
    let ctx = Arc::new(Context {
        client: client.clone(),
        events,
        metrics,
    });
    tracing::info!("machine deletion remediation running");
    nodemedic_kube::backoff::controller(
        Api::<MachineDeletionRemediation>::all(client),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(steps::reconcile, steps::error_policy, ctx)
    .for_each(|_| async {})
    .await;
    Ok(())
}

impl steps::Operator for Context {
    type Object = MachineDeletionRemediation;
    type Observed = observe::Observed;
    type Step = decide::Step;
    type Error = Error;

    const NAME: &'static str = "machine deletion remediation";
    const STEPS: usize = 8;

    fn api(&self, mdr: &MachineDeletionRemediation) -> Result<Api<MachineDeletionRemediation>> {
        Ok(nodemedic_kube::client::namespaced_api(&self.client, mdr)?)
    }

    async fn observe(&self, current: MachineDeletionRemediation) -> Result<observe::Observed> {
        observe::observe(current, self).await
    }

    fn current(seen: &observe::Observed) -> &MachineDeletionRemediation {
        &seen.current
    }

    fn decide(&self, seen: &observe::Observed) -> decide::Step {
        decide::next(&seen.facts)
    }

    fn routine(step: &decide::Step) -> bool {
        matches!(step, decide::Step::Idle)
    }

    async fn perform<'a>(
        &'a self,
        step: decide::Step,
        seen: &'a observe::Observed,
        api: &'a Api<MachineDeletionRemediation>,
    ) -> Result<Outcome<'a, Self>> {
        perform::perform(step, seen, api, self).await
    }

    fn events(&self) -> &Events {
        &self.events
    }

    fn count_error(&self, error: &Error) {
        self.metrics.error(error.kind());
    }
}
