//! The self-remediation manager (in `nodemedic controller`): the configuration, the agent
//! DaemonSet, the peer-certificate signer, the SelfNodeRemediation reconciler, and the bridge that
//! carries out the Poison Pill kinds as self remediation.

mod config;
pub mod daemonset;
pub mod detection;
mod membership;
mod metrics;
pub(crate) mod pod_security;
mod poison_pill;
mod remediation;
mod setup;
pub(crate) mod signer;

use std::{collections::HashMap, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::{apps::v1::DaemonSet, coordination::v1::Lease};
use kube::{
    Api, Client,
    core::PartialObjectMeta,
    runtime::{reflector::ObjectRef, watcher},
};
use nodemedic_api::{
    poison_pill::{PoisonPillConfig, PoisonPillRemediation},
    self_remediation::{CONFIG_NAME, SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_kube::{events::Events, steps};

pub use metrics::Metrics;

use crate::{Result, registration};

/// Where the manager runs and what its agents run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub agent_image: String,
    /// Where the agents' peer-detection reports are received; `None`: nowhere, so the agents'
    /// detectors make no node condition.
    pub peer_reports: Option<detection::Settings>,
    /// Label the namespace for privileged pods when nobody chose a Pod Security level for it
    /// ([`pod_security`]).
    pub label_namespace: bool,
    /// Each agent serves its metrics over HTTPS on this port of its node; none when unset.
    pub agent_metrics_port: Option<u16>,
}

/// Runs until the process ends.
pub async fn run(client: Client, settings: Settings, metrics: Metrics, events: Events) -> Result<()> {
    let namespace = settings.namespace.clone();
    if settings.label_namespace
        && let Err(error) = pod_security::label(&client, &namespace, &events).await
    {
        tracing::warn!(%error, "checking the namespace's Pod Security level failed; the agents may be refused");
    }
    let authority = Arc::new(setup::certificate_authority(&client, &namespace).await?);
    setup::config(&client, &namespace, &events).await?;
    setup::templates(&client, &namespace).await?;
    let out_of_service = client
        .apiserver_version()
        .await
        .map(|v| v.minor.trim_end_matches('+').parse::<u32>().unwrap_or(0) >= 28 && v.major == "1")
        .unwrap_or(true);
    tracing::info!(%namespace, out_of_service, "self remediation ready");

    match settings.peer_reports {
        Some(reports) => {
            tokio::spawn(detection::run(
                client.clone(),
                namespace.clone(),
                authority.clone(),
                reports,
                metrics.clone(),
                events.clone(),
            ));
        }
        None => {
            tracing::info!("no peer-report address (--peer-reports-advertise): peer detection makes no node condition")
        }
    }
    let signer = tokio::spawn(signer::run(
        client.clone(),
        authority,
        namespace.clone(),
        metrics.clone(),
        events.clone(),
    ));
    let config_ctx = Arc::new(config::Context {
        client: client.clone(),
        namespace: namespace.clone(),
        install: daemonset::Install {
            image: settings.agent_image.clone(),
            metrics_port: settings.agent_metrics_port,
        },
        events: events.clone(),
        metrics: metrics.clone(),
    });
    let bridge = Arc::new(poison_pill::Context {
        client: client.clone(),
        namespace: namespace.clone(),
        events: events.clone(),
    });
    let ctx = Arc::new(remediation::Context {
        client: client.clone(),
        namespace: namespace.clone(),
        events,
        metrics,
        out_of_service,
        observed: std::sync::Mutex::new(HashMap::new()),
    });
    tokio::join!(configs(config_ctx), remediations(ctx), poison_pills(bridge));
    signer.abort();
    Ok(())
}

/// The registration and membership Leases.
fn registrations() -> watcher::Config {
    watcher::Config::default().labels(&registration::registrations_and_membership_selector())
}

/// The configuration's reconciler: its DaemonSet, and the registrations and waits that decide
/// the membership.
async fn configs(ctx: Arc<config::Context>) {
    let (client, namespace) = (ctx.client.clone(), ctx.namespace.clone());
    let config_ns = namespace.clone();
    nodemedic_kube::backoff::controller(
        Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .owns(
        Api::<DaemonSet>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .watches(Api::<Lease>::namespaced(client.clone(), &namespace), registrations(), {
        let config_ns = config_ns.clone();
        move |_| Some(ObjectRef::<SelfNodeRemediationConfig>::new(CONFIG_NAME).within(&config_ns))
    })
    // A wait that ends releases the membership changes it held back.
    .watches(
        Api::<PartialObjectMeta<SelfNodeRemediation>>::all(client),
        watcher::Config::default(),
        move |_| Some(ObjectRef::<SelfNodeRemediationConfig>::new(CONFIG_NAME).within(&config_ns)),
    )
    .run(config::reconcile, config::error_policy, ctx)
    .for_each(|_| async {})
    .await;
}

/// The SelfNodeRemediation reconciler, woken by every registration change too: a registration's
/// acceptances concern every ongoing remediation.
async fn remediations(ctx: Arc<remediation::Context>) {
    let (client, namespace) = (ctx.client.clone(), ctx.namespace.clone());
    // Bounded: when hundreds of nodes fail at once, a few reconciles at a time keep the memory
    // and the API server's load flat; each one is short (no reconcile waits inside).
    let controller = nodemedic_kube::backoff::controller(
        Api::<SelfNodeRemediation>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(16));
    let store = controller.store();
    let every = move || {
        store
            .state()
            .iter()
            .map(|snr| ObjectRef::from_obj(snr.as_ref()))
            .collect::<Vec<_>>()
    };
    let also_every = every.clone();
    // The configuration's deletion disables every remediation, its return enables them.
    let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_NAME}"));
    controller
        .watches(
            Api::<Lease>::namespaced(client.clone(), &namespace),
            registrations(),
            move |_| every(),
        )
        .watches(
            Api::<SelfNodeRemediationConfig>::namespaced(client, &namespace),
            config,
            move |_| also_every(),
        )
        .run(steps::reconcile, steps::error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

/// The bridge that carries out the Poison Pill kinds as self remediation.
async fn poison_pills(bridge: Arc<poison_pill::Context>) {
    let (client, namespace) = (bridge.client.clone(), bridge.namespace.clone());
    let remediations = nodemedic_kube::backoff::controller(
        Api::<PoisonPillRemediation>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<SelfNodeRemediation>::all(client.clone()),
        watcher::Config::default(),
    )
    .run(poison_pill::reconcile, poison_pill::error_policy, bridge.clone())
    .for_each(|_| async {});
    let configs = nodemedic_kube::backoff::controller(
        Api::<PoisonPillConfig>::namespaced(client, &namespace),
        watcher::Config::default(),
    )
    .run(poison_pill::reconcile_config, poison_pill::error_policy, bridge)
    .for_each(|_| async {});
    tokio::join!(remediations, configs);
}
