//! A fleet: many simulated nodes behind one kwok process on the host, for scale measurements.
//! Fleet nodes have no namespace, agent, watchdog or BMC; one fails by going silent (kwok stops
//! managing it, so its lease is no longer renewed and the node lifecycle controller marks it
//! Unknown), exactly as a dead kubelet looks to the cluster.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    Lab, NodeSpec, Result,
    binaries::{self, Binaries},
    nodes,
    process::ProcessSpec,
    wait,
};

/// The label kwok's fleet process selects nodes by; `managed` or `silenced`.
pub const FLEET_LABEL: &str = "lab.nodemedic.io/fleet";
const MANAGED: &str = "managed";
const SILENCED: &str = "silenced";
/// Concurrent API writes when creating or failing fleet nodes.
const PARALLEL_WRITES: usize = 32;

/// Fleet node names, `fleet-00001` onwards.
pub(crate) fn names(count: usize) -> Vec<String> {
    (1..=count).map(|i| format!("fleet-{i:05}")).collect()
}

fn spec(name: &str) -> NodeSpec {
    let mut spec = NodeSpec::worker(name);
    spec.labels.insert(FLEET_LABEL.into(), MANAGED.into());
    spec
}

pub(crate) fn kwok(
    bins: &Binaries,
    kubeconfig: &std::path::Path,
    stages: &std::path::Path,
    lease_seconds: u32,
) -> ProcessSpec {
    ProcessSpec::new(
        &bins.kwok,
        [
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--config={}", stages.display()),
            format!("--manage-nodes-with-label-selector={FLEET_LABEL}={MANAGED}"),
            "--cidr=10.128.0.0/9".into(),
            format!("--node-lease-duration-seconds={lease_seconds}"),
        ],
    )
}

/// Creates `count` fleet nodes and waits until all are Ready.
pub(crate) async fn create(lab: &Lab, count: usize) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let api = Api::<Node>::all(lab.client());
    let version = binaries::version("KUBERNETES_VERSION");
    futures::stream::iter(names(count))
        .map(|name| {
            let api = api.clone();
            async move {
                let node = nodes::node_object(&spec(&name), version);
                match api.create(&PostParams::default(), &node).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(crate::Error::from(e)),
                }
            }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .try_collect::<Vec<()>>()
        .await?;
    let timeout = Duration::from_secs(120 + count as u64 / 10);
    wait::until_every(
        &format!("{count} fleet nodes Ready"),
        timeout,
        Duration::from_secs(3),
        || {
            let api = api.clone();
            async move { Ok((ready_count(&api).await? >= count).then_some(())) }
        },
    )
    .await
}

/// Fleet nodes whose Ready condition is True (read from the API server's cache).
async fn ready_count(api: &Api<Node>) -> Result<usize> {
    let params = ListParams::default().labels(FLEET_LABEL).match_any();
    Ok(api
        .list(&params)
        .await?
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count())
}

impl Lab {
    /// The fleet's node names (empty without a fleet).
    pub fn fleet_nodes(&self) -> Vec<String> {
        names(self.inner.config.fleet)
    }

    /// Silences fleet nodes at once: kwok stops renewing their leases and reporting for them.
    /// Returns once every label is written; a task then makes sure kwok heard of each (see
    /// [`keep_silent`]).
    pub async fn silence_fleet_nodes(&self, nodes: &[String]) -> Result<()> {
        self.timeline()
            .note(format!("fault: {} fleet nodes silenced", nodes.len()));
        let since = jiff::Timestamp::now();
        label(&self.client(), nodes, SILENCED).await?;
        let lease_seconds = self.inner.config.timings.node_lease_seconds;
        tokio::spawn(keep_silent(self.inner.clone(), nodes.to_vec(), since, lease_seconds));
        Ok(())
    }

    /// Gives silenced fleet nodes back to kwok, which makes them Ready again.
    pub async fn revive_fleet_nodes(&self, nodes: &[String]) -> Result<()> {
        self.timeline()
            .note(format!("healed: {} fleet nodes revived", nodes.len()));
        label(&self.client(), nodes, MANAGED).await
    }
}

async fn label(client: &kube::Client, nodes: &[String], value: &str) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    let patch = json!({"metadata": {"labels": {FLEET_LABEL: value}}});
    futures::stream::iter(nodes.iter().cloned())
        .map(|name| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
                    .map_err(crate::Error::from)
            }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Rounds of [`keep_silent`] before it leaves what kwok still renews as it is.
const SILENCE_ROUNDS: usize = 3;

/// kwok learns that a node is no longer its own from its watch of nodes, which says "deleted"
/// when a node stops matching the label selector. An API server short of CPU closes a watcher
/// that does not keep up ("Forcing nodes watcher close due to unresponsiveness", in
/// ci-20261207T043900Z while 200 of 2,000 nodes were silenced); kwok watches again from a fresh
/// list, where a node silenced meanwhile is simply absent, and goes on renewing its lease for
/// good. So a node whose lease is still renewed a renewal period after its silence is handed back
/// to kwok and silenced again, which its new watch does hear.
async fn keep_silent(
    inner: std::sync::Arc<crate::lab::Inner>,
    nodes: Vec<String>,
    since: jiff::Timestamp,
    lease_seconds: u32,
) {
    let renewal = Duration::from_secs(u64::from(lease_seconds / 4).max(1));
    let mut since = since;
    for round in 1..=SILENCE_ROUNDS {
        tokio::time::sleep(renewal + Duration::from_secs(10)).await;
        if inner.resources.processes.lock().map(|p| p.closed).unwrap_or(true) {
            return;
        }
        let still_renewed = match renewed_after(&inner.client, &nodes, since + jiff::SignedDuration::from_secs(5)).await
        {
            Ok(names) => names,
            Err(error) => {
                tracing::warn!(%error, "reading the silenced fleet nodes' leases");
                return;
            }
        };
        if still_renewed.is_empty() {
            return;
        }
        inner.timeline.note(format!(
            "lab: kwok missed the silence of {} fleet nodes (round {round}); silenced again",
            still_renewed.len()
        ));
        tracing::warn!(
            nodes = still_renewed.len(),
            round,
            "kwok still renews silenced fleet nodes: silencing them again"
        );
        since = jiff::Timestamp::now();
        let again = async {
            label(&inner.client, &still_renewed, MANAGED).await?;
            label(&inner.client, &still_renewed, SILENCED).await
        };
        if let Err(error) = again.await {
            tracing::warn!(%error, "silencing fleet nodes again");
            return;
        }
    }
}

/// Those of `nodes` whose lease was renewed after `after`.
async fn renewed_after(client: &kube::Client, nodes: &[String], after: jiff::Timestamp) -> Result<Vec<String>> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .list(&ListParams::default())
        .await?;
    let renewed: std::collections::BTreeSet<String> = leases
        .items
        .into_iter()
        .filter(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .is_some_and(|t| t.0 > after)
        })
        .filter_map(|l| l.metadata.name)
        .collect();
    Ok(nodes.iter().filter(|n| renewed.contains(*n)).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_names_sort_in_creation_order() {
        let names = names(12);
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names[0], "fleet-00001");
    }

    #[test]
    fn fleet_nodes_are_workers_kwok_manages() {
        let spec = spec("fleet-00001");
        assert_eq!(spec.labels.get(FLEET_LABEL).map(String::as_str), Some(MANAGED));
        assert!(spec.labels.contains_key(nodemedic_api::names::labels::ROLE_WORKER));
    }
}
