//! The Kubernetes side of Fence Agents Remediation: the remediation and template reconcilers,
//! the background agent runs, metrics.

pub mod admission;
mod metrics;
pub(crate) mod options;
mod remediation;
mod runs;
mod status;
mod template;

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{controller::Action, watcher},
};
use nodemedic_api::fence_agents::{FenceAgentsRemediation, FenceAgentsRemediationTemplate};
use nodemedic_kube::{events::Events, steps};

pub use self::metrics::Metrics;
use crate::{Error, Result, agent::Agents};

pub struct Context {
    pub client: Client,
    pub events: Events,
    pub metrics: Metrics,
    pub agents: Agents,
    runs: runs::Runs,
}

/// Runs both reconcilers until one stops.
pub async fn run(client: Client, agents: Agents, metrics: Metrics, events: Events) -> Result<()> {
    let ctx = Arc::new(Context {
        client: client.clone(),
        events,
        metrics,
        agents,
        runs: runs::Runs::default(),
    });
    let remediations = nodemedic_kube::backoff::controller(
        Api::<FenceAgentsRemediation>::all(client.clone()),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(steps::reconcile, steps::error_policy, ctx.clone())
    .for_each(|_| async {});
    let templates = nodemedic_kube::backoff::controller(
        Api::<FenceAgentsRemediationTemplate>::all(client),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(template::reconcile, error_policy, ctx)
    .for_each(|_| async {});
    tracing::info!("fence agents remediation running");
    tokio::join!(remediations, templates);
    Ok(())
}

fn error_policy(template: Arc<FenceAgentsRemediationTemplate>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.kind());
    steps::retry(template.as_ref(), error, Duration::from_secs(2))
}
