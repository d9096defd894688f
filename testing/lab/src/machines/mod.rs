//! The lab's machine layer, from real parts where they can be had: Cluster API's core
//! controllers (built from the upstream module by `scripts/build-machine-layer.sh`) manage the
//! lab as a self-hosted Cluster, with the lab as their infrastructure provider; for OpenShift's
//! Machine API, whose controllers cannot be had here, the lab installs the CRDs and plays the
//! machine controller itself. Both place Machines on the same hosts: the lab's nodes first, then
//! nodes the lab adds (see [`pool`]); a deleted Machine's host is powered off and removed.

pub mod cluster_api;
mod infrastructure;
pub mod kinds;
pub mod openshift;
mod pool;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::Value;
use tokio::sync::{Mutex, Notify};

use crate::{Error, Lab, NodeSpec, Result, lab::Inner};

/// How long Cluster API has to reach the lab's cluster once its manager starts.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The machine controllers look at every Machine this often, besides on every change.
const RESYNC: Duration = Duration::from_secs(2);

impl Lab {
    /// Installs the CRDs of both machine layers (Cluster API's and OpenShift's Machine API's)
    /// and the lab's provider kinds, and waits until they are served.
    pub async fn install_machine_crds(&self) -> Result<()> {
        let dir = crate::binaries::machine_layer_dir().join("crds");
        if !dir.is_dir() {
            return Err(Error::MissingTool {
                what: format!(
                    "the machine CRDs in {} (scripts/build-machine-layer.sh fetches them)",
                    dir.display()
                ),
            });
        }
        let kubectl = self.inner.bins.kubectl.display().to_string();
        let kubeconfig = self.inner.kubeconfig.display().to_string();
        // Server-side: Cluster API's ClusterClass CRD is too large for the last-applied annotation.
        let dir = dir.display().to_string();
        crate::cmd::run(
            &kubectl,
            &["--kubeconfig", &kubeconfig, "apply", "--server-side", "-f", &dir],
        )?;
        crate::crds::install(&self.client(), kinds::crds()).await?;
        crate::crds::all_established(&self.client()).await
    }

    /// Starts the machine layer in `namespace` (where the tests' Machines, MachineSets and
    /// health checks live): the machine CRDs, Cluster API's manager (lab process `cluster-api`)
    /// with the self-hosted Cluster [`cluster_api::CLUSTER`], and the lab's infrastructure
    /// provider and OpenShift machine controller. Returns once Cluster API sees the cluster
    /// ready. The lab's nodes are the hosts new Machines adopt first.
    pub async fn start_machine_layer(&mut self, namespace: &str) -> Result<()> {
        let started = std::time::Instant::now();
        self.install_machine_crds().await?;
        tracing::info!(elapsed = ?started.elapsed(), "machine layer: CRDs served");
        let client = self.client();
        cluster_api::create_cluster(&client, namespace, &self.inner.kubeconfig).await?;
        let certificates = self.dir().join("cluster-api-webhook");
        cluster_api::certificates(&self.inner.pki, &certificates)?;
        let manager = cluster_api::manager(
            &self.inner.kubeconfig,
            &certificates,
            crate::lab::free_port()?,
            crate::lab::free_port()?,
        )?;
        self.add_host_process("cluster-api", manager)?;
        let hosts = Arc::new(Hosts::default());
        self.tasks.push(tokio::spawn(run(self.inner.clone(), hosts)));
        cluster_api::wait_cluster_ready(&client, namespace, CLUSTER_READY_TIMEOUT)
            .await
            .map_err(|error| match error {
                Error::Timeout { .. } => {
                    crate::lab::process_died(&self.inner.resources, "cluster-api").unwrap_or(error)
                }
                other => other,
            })
    }
}

/// The hosts Machines are placed on. One reconcile loop places them, so two Machines never get
/// the same host; the lock keeps that true should another caller come.
#[derive(Default)]
struct Hosts {
    /// Every node name the lab ever had, so an added host's name is always new.
    ever_named: Mutex<BTreeSet<String>>,
}

impl Hosts {
    /// A host for `machine`: the one asked for, else a lab node no Machine holds, else a node
    /// added now (once Ready).
    async fn provision(&self, inner: &Inner, machine: &str, wanted: Option<&str>) -> Result<String> {
        let mut ever_named = self.ever_named.lock().await;
        let nodes: BTreeSet<String> = inner.nodes.names().into_iter().collect();
        ever_named.extend(nodes.iter().cloned());
        let held = held_nodes(&inner.client).await?;
        match pool::place(&nodes, &held, &ever_named, wanted) {
            pool::Placement::Adopt(node) => {
                tracing::info!(%machine, %node, "machine layer: adopting a lab node");
                Ok(node)
            }
            pool::Placement::Add(node) => {
                tracing::info!(%machine, %node, "machine layer: adding a node");
                ever_named.insert(node.clone());
                inner.add_node(NodeSpec::worker(&node)).await?;
                Ok(node)
            }
            pool::Placement::Unavailable(why) => Err(Error::Invalid(format!("no host for {machine}: {why}"))),
        }
    }

    /// Provisions a host for the Machine-like object `name` of `api` and records it there as
    /// `spec.providerID` (what the host's Node says too); returns the node.
    async fn provision_into<K>(&self, inner: &Inner, api: &Api<K>, name: &str, wanted: Option<&str>) -> Result<String>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let node = self.provision(inner, name, wanted).await?;
        let patch = serde_json::json!({"spec": {"providerID": crate::nodes::provider_id(&node)}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(node)
    }

    /// Powers a deleted Machine's host off for good and takes it out of the lab (its Node
    /// object too, as a cloud's node lifecycle does); nothing if it is gone already.
    async fn decommission(inner: &Inner, node: &str, machine: &str) -> Result<()> {
        if inner.index(node).is_err() {
            return Ok(());
        }
        tracing::info!(%machine, %node, "machine layer: removing the host of a deleted Machine");
        inner.remove_node(node).await
    }
}

/// The nodes some Machine of either layer holds (its providerID names them).
async fn held_nodes(client: &Client) -> Result<BTreeSet<String>> {
    let mut ids: Vec<String> = Api::<kinds::LabMachine>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|m| m.spec.provider_id)
        .collect();
    for machine in openshift::all(client, "Machine")
        .list(&ListParams::default())
        .await?
        .items
    {
        if let Some(id) = machine.data.pointer("/spec/providerID").and_then(Value::as_str) {
            ids.push(id.to_owned());
        }
    }
    Ok(ids
        .iter()
        .filter_map(|id| pool::node_of(id))
        .map(str::to_owned)
        .collect())
}

/// The lab's machine controllers: on every change of a LabMachine or an OpenShift Machine or
/// MachineSet, and every [`RESYNC`], everything is reconciled in turn.
async fn run(inner: Arc<Inner>, hosts: Arc<Hosts>) {
    let changed = Arc::new(Notify::new());
    let client = inner.client.clone();
    let mut watches = vec![tokio::spawn(notify_on_change(
        watcher(
            Api::<kinds::LabMachine>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(nodemedic_kube::backoff::prompt())
        .touched_objects()
        .map(|e| e.map(|_| ()))
        .boxed(),
        changed.clone(),
    ))];
    for kind in ["Machine", "MachineSet"] {
        watches.push(tokio::spawn(notify_on_change(
            watcher(openshift::all(&client, kind), watcher::Config::default())
                .backoff(nodemedic_kube::backoff::prompt())
                .touched_objects()
                .map(|e| e.map(|_| ()))
                .boxed(),
            changed.clone(),
        )));
    }
    let _stop_watches_with_me = AbortOnDrop(watches);
    loop {
        if let Err(error) = infrastructure::reconcile(&inner, &hosts).await {
            report("lab infrastructure provider", &error);
        }
        if let Err(error) = openshift::reconcile(&inner, &hosts).await {
            report("lab OpenShift machine controller", &error);
        }
        let _ = tokio::time::timeout(RESYNC, changed.notified()).await;
    }
}

/// A conflict is the normal race with Cluster API's own writes to the same object (owner
/// references, labels): the next round reads it again.
fn report(controller: &str, error: &Error) {
    let conflict = match error {
        Error::Kube(kube::Error::Api(status)) => status.code == 409,
        Error::Request(error) => error.api_status() == Some(409),
        _ => false,
    };
    if conflict {
        tracing::debug!(%error, "{controller}: conflict, retried");
    } else {
        tracing::warn!(%error, "{controller}: reconcile failed (retried)");
    }
}

async fn notify_on_change(
    mut changes: futures::stream::BoxStream<'static, std::result::Result<(), watcher::Error>>,
    changed: Arc<Notify>,
) {
    while let Some(change) = changes.next().await {
        if change.is_ok() {
            changed.notify_one();
        }
    }
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
