//! The Kubernetes side of Node Maintenance: one reconciler over NodeMaintenances, metrics.

pub mod admission;
mod drain;
mod metrics;
mod node;
mod observe;
mod reconcile;
mod status;

use std::sync::Arc;

use futures::StreamExt;
use kube::{Api, Client, runtime::watcher};
use nodemedic_api::maintenance::NodeMaintenance;
use nodemedic_kube::{events::Events, node_lease::NodeLeases};

pub use self::metrics::Metrics;
use crate::Result;

pub struct Context {
    pub client: Client,
    /// A client that does not retry, for evictions: a budget's 429 must come back to the drain.
    pub evictions: Client,
    pub events: Events,
    pub metrics: Metrics,
    pub leases: NodeLeases,
    /// Consecutive drain passes a budget blocked, per NodeMaintenance (for the backoff).
    pub blocked_passes: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// etcd members configured outside any pod (external etcd), asked for their health.
    pub etcd: Option<nodemedic_kube::etcd::External>,
}

/// Runs the reconciler until it stops.
/// `etcd`: members configured outside any pod, for the quorum guard.
pub async fn run(
    client: Client,
    evictions: Client,
    metrics: Metrics,
    events: Events,
    etcd: Option<nodemedic_kube::etcd::External>,
) -> Result<()> {
    let leases = NodeLeases::new(client.clone());
    leases.ensure_namespace().await?;
    let ctx = Arc::new(Context {
        client: client.clone(),
        evictions,
        events,
        metrics,
        leases,
        blocked_passes: Default::default(),
        etcd,
    });
    tracing::info!("node maintenance running");
    nodemedic_kube::backoff::controller(Api::<NodeMaintenance>::all(client), watcher::Config::default())
        .shutdown_on_signal()
        .run(
            nodemedic_kube::steps::reconcile,
            nodemedic_kube::steps::error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .await;
    Ok(())
}
