//! Leader election on a coordination Lease, so two controller replicas can run and one acts.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseParams};
use tokio::{sync::watch, task::JoinHandle};

use crate::Result;

pub struct Leadership {
    /// True while this process leads.
    pub is_leader: watch::Receiver<bool>,
    /// Ends only on error, or when every receiver is dropped (then the lease is released).
    pub task: JoinHandle<kube_lease_manager::Result<LeaseManager>>,
}

/// Starts competing for `lease` in `namespace` as `identity`. Callers stop acting (nodemedic
/// exits) the moment `is_leader` turns false again: a deposed leader that kept acting would be a
/// second writer.
pub async fn elect(
    client: Client,
    namespace: &str,
    lease: &str,
    identity: &str,
    duration: Duration,
) -> Result<Leadership> {
    let seconds = duration.as_secs().max(3);
    // The grace is the margin for clock skew between replicas: a third of the lease.
    let params = LeaseParams::new(identity, seconds, seconds / 3);
    let manager = LeaseManagerBuilder::new(client, lease)
        .with_namespace(namespace)
        .with_parameters(params)
        .build()
        .await?;
    let (is_leader, task) = manager.watch().await;
    Ok(Leadership { is_leader, task })
}
