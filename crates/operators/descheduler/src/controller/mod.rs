//! The KubeDescheduler reconciler: [`observe`] reads the cluster into the facts the policy
//! depends on, [`crate::decide`] renders it, [`apply`] makes the objects that run the upstream
//! descheduler, and [`tainter`] keeps the soft taints in step with Prometheus.

mod apply;
mod metrics;
pub(crate) mod objects;
mod observe;
pub(crate) mod prometheus;
mod tainter;

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    Api, Client, ResourceExt,
    runtime::{controller::Action, watcher},
};
use nodemedic_api::descheduler::{KubeDescheduler, Mode};
use nodemedic_kube::{events::Events, finalizers};

pub use self::metrics::Metrics;
use crate::{
    Error, Result,
    decide::{self, status::Outcome},
};

/// The ServiceAccount the soft tainter writes nodes as.
pub const SOFT_TAINTER_ACCOUNT: &str = "nodemedic-soft-tainter";

/// Deletes the cluster-scoped binding and the soft taints when a KubeDescheduler goes.
pub const FINALIZER: &str = "descheduler.nodemedic.io/cleanup";

/// How the operator runs the descheduler.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The upstream descheduler's image.
    pub image: String,
    /// nodemedic's own namespace: never descheduled.
    pub own_namespace: String,
    /// Prometheus, for KubeVirtRelieveAndMigrate and actual-utilization profiles.
    pub prometheus_url: Option<String>,
    /// PEM certificate authority of an https Prometheus (for the soft tainter).
    pub prometheus_ca: Option<Vec<u8>>,
    /// The descheduler image is OpenShift's, with the KubevirtMigrationAware plugin.
    pub kubevirt_migration_aware: bool,
}

pub struct Context {
    pub client: Client,
    /// The soft tainter's node writes go through this client (nodemedic-soft-tainter's identity,
    /// which an admission policy confines to soft taints).
    pub tainter: Client,
    pub events: Events,
    pub metrics: Metrics,
    pub settings: Settings,
}

pub async fn run(client: Client, tainter: Client, settings: Settings, metrics: Metrics, events: Events) -> Result<()> {
    let ctx = Arc::new(Context {
        client: client.clone(),
        tainter,
        events,
        metrics,
        settings,
    });
    tracing::info!(
        image = %ctx.settings.image,
        prometheus = ctx.settings.prometheus_url.as_deref().unwrap_or("none"),
        "descheduler operator running"
    );
    let tainter = tokio::spawn(tainter::run(ctx.clone()));
    let managed = watcher::Config::default().labels(&format!("{}={}", objects::MANAGED_BY.0, objects::MANAGED_BY.1));
    nodemedic_kube::backoff::controller(Api::<KubeDescheduler>::all(client.clone()), watcher::Config::default())
        .owns(Api::<Deployment>::all(client.clone()), managed.clone())
        .owns(Api::<ConfigMap>::all(client), managed)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
    tainter.abort();
    Ok(())
}

/// Environment changes the policy depends on (nodes labelled for KubeVirt, new openshift-*
/// namespaces) are not watched: they are read again this often.
const RECHECK: Duration = Duration::from_secs(120);

async fn reconcile(kd: Arc<KubeDescheduler>, ctx: Arc<Context>) -> Result<Action> {
    let api = nodemedic_kube::client::namespaced_api(&ctx.client, kd.as_ref())?;
    let namespace = kd.namespace().unwrap_or_default();
    if kd.name_any() != nodemedic_api::descheduler::NAME {
        return Ok(Action::await_change());
    }
    if kd.metadata.deletion_timestamp.is_some() {
        if finalizers::has(kd.as_ref(), FINALIZER) {
            apply::remove_everything(&ctx, &namespace, false).await?;
            tracing::info!(%namespace, "KubeDescheduler deleted: descheduler binding and soft taints removed");
            finalizers::remove(&api, kd.as_ref(), FINALIZER).await?;
        }
        return Ok(Action::await_change());
    }
    // Go on with the version the finalizer was added to: the status write is locked to it.
    let kd = if finalizers::has(kd.as_ref(), FINALIZER) {
        kd
    } else {
        Arc::new(finalizers::add(&api, kd.as_ref(), FINALIZER).await?)
    };

    let outcome = match observe::first_in_charge(&ctx.client, &kd).await? {
        Some(first) => Outcome::Superseded { by: first },
        None => match kd.spec.management_state.as_deref() {
            Some("Unmanaged") => Outcome::Unmanaged,
            Some("Removed") => {
                apply::remove_everything(&ctx, &namespace, true).await?;
                Outcome::Removed
            }
            _ => run_descheduler(&kd, &namespace, &ctx).await?,
        },
    };
    if let Outcome::Invalid(invalid) = &outcome {
        ctx.events
            .warning(
                &nodemedic_kube::events::reference(kd.as_ref()),
                "InvalidConfiguration",
                invalid.to_string(),
            )
            .await;
    }
    match apply::status(&api, &kd, &outcome).await {
        Ok(_) => Ok(Action::requeue(RECHECK)),
        Err(error) => nodemedic_kube::status::requeue_on_conflict(kd.as_ref(), error),
    }
}

async fn run_descheduler(kd: &KubeDescheduler, namespace: &str, ctx: &Context) -> Result<Outcome> {
    let environment = observe::environment(&ctx.client, &ctx.settings).await?;
    let rendered = decide::render(&kd.spec, &environment);
    let args = decide::deployment::descheduler_args(&kd.spec);
    match (rendered, args) {
        (Ok(rendered), Ok(args)) => {
            let ready_replicas = apply::descheduler(ctx, kd, namespace, &rendered.policy, args).await?;
            Ok(Outcome::Running {
                ready_replicas,
                predictive: kd.spec.mode == Mode::Predictive,
                notes: rendered.notes,
            })
        }
        (Err(invalid), _) | (_, Err(invalid)) => {
            apply::stop_descheduler(ctx, namespace).await?;
            Ok(Outcome::Invalid(invalid))
        }
    }
}

fn error_policy(kd: Arc<KubeDescheduler>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.kind());
    nodemedic_kube::steps::retry(kd.as_ref(), error, Duration::from_secs(5))
}
