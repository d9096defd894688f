//! Nodes joining and leaving a running lab, as a cluster autoscaler or an administrator adds and
//! removes machines. [`Lab::add_node`] gives a node everything a node made at start has;
//! [`Lab::remove_node`] powers its machine off for good, deletes its Node object and takes its
//! namespace and per-node servers away.
//!
//! What changes at runtime sits behind std locks held only for a lookup or an update, never
//! across an `.await`. Where two are held at once the order is: the process table, then the node
//! table, then the conditions.

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard, PoisonError, RwLock},
    time::Duration,
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::task::JoinHandle;

use crate::{
    Error, Lab, NodeSpec, Result, binaries,
    lab::{Inner, process_died, start_process},
    net::NODE_SLOTS,
    nodes, real_node, sysrq,
    timeline::{Event, NodeCondition},
    wait, watchdog_device,
};

/// How long an added node has to turn Ready (as at start).
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the API server has to forget a deleted Node (it has no finalizers).
const DELETE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct LabNode {
    /// Its address, veth and pod CIDR.
    index: usize,
    spec: NodeSpec,
}

/// The lab's nodes of this moment, by name: what every per-node call looks a node up in.
pub(crate) struct NodeTable(RwLock<BTreeMap<String, LabNode>>);

impl NodeTable {
    pub(crate) fn new(specs: &[NodeSpec]) -> Self {
        let nodes = specs.iter().enumerate().map(|(index, spec)| {
            let node = LabNode {
                index,
                spec: spec.clone(),
            };
            (spec.name.clone(), node)
        });
        Self(RwLock::new(nodes.collect()))
    }

    // Nothing panics while holding the lock; should something, the table is still whole.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, LabNode>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, LabNode>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn index(&self, node: &str) -> Option<usize> {
        self.read().get(node).map(|n| n.index)
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    pub(crate) fn indices(&self) -> Vec<(String, usize)> {
        self.read().iter().map(|(name, n)| (name.clone(), n.index)).collect()
    }

    /// Whether the node is real (false for a node the lab does not know).
    pub(crate) fn is_real(&self, node: &str) -> bool {
        self.read().get(node).is_some_and(|n| n.spec.real)
    }

    /// The real nodes, each with its index.
    pub(crate) fn real(&self) -> Vec<(String, usize)> {
        self.read()
            .iter()
            .filter(|(_, n)| n.spec.real)
            .map(|(name, n)| (name.clone(), n.index))
            .collect()
    }

    pub(crate) fn specs(&self) -> Vec<NodeSpec> {
        self.read().values().map(|n| n.spec.clone()).collect()
    }

    fn insert(&self, spec: &NodeSpec, index: usize) {
        let node = LabNode {
            index,
            spec: spec.clone(),
        };
        self.write().insert(spec.name.clone(), node);
    }

    fn remove(&self, node: &str) -> Option<usize> {
        self.write().remove(node).map(|n| n.index)
    }
}

/// The node namespaces that exist, by name with their index (teardown removes them), from the
/// moment an index is reserved until the namespace is gone.
pub(crate) struct Namespaces {
    made: BTreeMap<String, usize>,
    /// Where the search for the next free index starts.
    next: usize,
}

impl Namespaces {
    /// The nodes of the lab's configuration, numbered in order.
    pub(crate) fn planned(names: &[String]) -> Self {
        Self {
            made: names.iter().cloned().zip(0..).collect(),
            next: names.len(),
        }
    }

    pub(crate) fn made(&self) -> BTreeMap<String, usize> {
        self.made.clone()
    }

    /// The index after the last one given out, so a departed node's address does not come back
    /// as another machine's while peers may still remember it (ARP caches, agents' peer lists);
    /// once the bridge's addresses run out, the lowest free one.
    fn reserve(&mut self, node: &str) -> Result<usize> {
        if self.made.contains_key(node) {
            return Err(Error::Invalid(format!(
                "the lab already has a node named {node} (or is still removing it)"
            )));
        }
        let free = |i: &usize| !self.made.values().any(|used| used == i);
        let index = (self.next..NODE_SLOTS)
            .chain(0..self.next.min(NODE_SLOTS))
            .find(free)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "no address left on the node bridge for {node}: a lab has at most {NODE_SLOTS} nodes"
                ))
            })?;
        self.made.insert(node.to_owned(), index);
        self.next = index + 1;
        Ok(index)
    }

    fn release(&mut self, node: &str) {
        self.made.remove(node);
    }
}

/// Each node's servers (its watchdog socket and device), stopped when it leaves and at teardown.
#[derive(Default)]
pub(crate) struct NodeTasks(Mutex<BTreeMap<String, Vec<JoinHandle<()>>>>);

impl NodeTasks {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Vec<JoinHandle<()>>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, node: &str, task: JoinHandle<()>) {
        self.lock().entry(node.to_owned()).or_default().push(task);
    }

    fn take(&self, node: &str) -> Vec<JoinHandle<()>> {
        self.lock().remove(node).unwrap_or_default()
    }

    pub(crate) fn abort_all(&self) {
        for task in self.lock().values().flatten() {
            task.abort();
        }
    }
}

impl Drop for NodeTasks {
    /// A lab that fails half-way through its start has no `Lab` to abort them.
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// Mounts the node's watchdog device and, for a real node, serves its CSI node plugin.
pub(crate) fn serve_node(inner: &Inner, node: &str, real: bool) -> Result<()> {
    let timeout = inner.config.timings.watchdog_timeout;
    let dir = &inner.resources.dir;
    let device = watchdog_device::mount(&inner.watchdogs, node, dir, timeout)?;
    inner.node_tasks.push(node, device);
    if real {
        let kubelet_dir = dir.join("nodes").join(node).join("kubelet");
        inner
            .node_tasks
            .push(node, real_node::csi::serve(dir, node, &kubelet_dir)?);
        let bins = inner
            .node_bins
            .as_ref()
            .ok_or_else(|| Error::Invalid(format!("node {node} is real, but the lab found no real-node binaries")))?;
        let registrar = real_node::csi::registrar(&bins.csi_registrar(), &kubelet_dir);
        start_process(&inner.resources, &format!("{node}/csi-registrar"), registrar)?;
    }
    Ok(())
}

/// The name goes into a namespace, file names and process names (`<node>/<process>`): a
/// DNS-1123 subdomain, as the API server wants of a Node's name anyway.
fn check_name(name: &str) -> Result<()> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 253
        && bytes.iter().all(|b| alnum(*b) || *b == b'-' || *b == b'.')
        && bytes.first().copied().is_some_and(alnum)
        && bytes.last().copied().is_some_and(alnum);
    if valid {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{name:?} is not a node name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )))
    }
}

impl Lab {
    /// Adds a node to the running lab, as an autoscaler or an administrator adds a machine:
    /// its namespace on the node bridge (the next free address), its Node object, its kwok, its
    /// boot file, watchdog socket and device, and its sysrq trigger; returns once it is
    /// Ready=True. Every per-node call works with it afterwards, and teardown removes it like the
    /// others. [`Lab::config`] still lists only the nodes the lab started with.
    ///
    /// Not in a lab with BMCs (a node's BMCs are made at start). When the node cannot be made
    /// or does not turn Ready, whatever was made of it is taken away again.
    pub async fn add_node(&self, spec: NodeSpec) -> Result<()> {
        self.inner.add_node(spec).await
    }

    /// Removes a node for good, as when its machine is decommissioned: powers it off (every
    /// process in it is killed, as by [`Lab::crash`]), deletes its Node object (as
    /// `kubectl delete node` does) and removes its namespace, veth and per-node servers (and its
    /// BMCs' processes and address, in a lab with BMCs). Afterwards [`Lab::nodes`] no longer
    /// lists it and per-node calls for it fail with [`Error::UnknownNode`].
    pub async fn remove_node(&self, node: &str) -> Result<()> {
        self.inner.remove_node(node).await
    }
}

impl Inner {
    /// See [`Lab::add_node`].
    pub(crate) async fn add_node(&self, spec: NodeSpec) -> Result<()> {
        let inner = self;
        let name = spec.name.clone();
        if inner.config.bmcs.is_some() {
            return Err(Error::Invalid(format!(
                "cannot add node {name}: adding nodes to a lab with BMCs is not supported"
            )));
        }
        check_name(&name)?;
        let index = lock_namespaces(inner).reserve(&name)?;
        tracing::info!(lab = %inner.id, node = %name, index, "adding a node");
        // The Node object first: if one of that name exists already (not the lab's to delete),
        // nothing else has been made yet.
        if let Err(error) = create_node_object(&inner.client, &spec).await {
            lock_namespaces(inner).release(&name);
            return Err(error);
        }
        if let Err(error) = self.join(&spec, index) {
            self.dismantle_logged(&name, index).await;
            return Err(error);
        }
        inner.timeline.record(Event::NodeAdded { node: name.clone() });
        if let Err(error) = self.wait_joined(&name).await {
            // A node that never turned Ready is taken out again rather than left half in.
            if let Err(cleanup) = self.remove_node(&name).await {
                tracing::warn!(error = %cleanup, node = %name, "removing a node that did not join failed");
            }
            return Err(error);
        }
        Ok(())
    }

    /// See [`Lab::remove_node`].
    pub(crate) async fn remove_node(&self, node: &str) -> Result<()> {
        let inner = self;
        inner.index(node)?;
        tracing::info!(lab = %inner.id, %node, "removing a node");
        inner.power_off(node, "node-removed")?;
        // Per-node calls fail from here on; a removal racing this one finds it gone.
        let index = inner
            .nodes
            .remove(node)
            .ok_or_else(|| Error::UnknownNode(node.to_owned()))?;
        let removed = self.dismantle(node, index).await;
        inner.timeline.record(Event::NodeRemoved { node: node.to_owned() });
        removed
    }

    /// Everything of an added node after its Node object, up to its kubelet running.
    fn join(&self, spec: &NodeSpec, index: usize) -> Result<()> {
        let inner = self;
        let (name, dir, net) = (spec.name.as_str(), &inner.resources.dir, &inner.resources.net);
        if spec.real && inner.node_bins.is_none() {
            return Err(Error::Invalid(format!(
                "cannot add real node {name}: the lab started without real nodes (start it with one)"
            )));
        }
        net.create_node(name, index)?;
        sysrq::prepare(&sysrq::trigger_file(dir, name))?;
        serve_node(inner, name, spec.real)?;
        lock_conditions(inner).insert(name.to_owned(), NodeCondition::running());
        inner.kubelets().start(spec, index)?;
        inner.nodes.insert(spec, index);
        if spec.real {
            real_node::route_pods(net, &inner.nodes.real(), &[(name.to_owned(), index)])?;
        }
        Ok(())
    }

    /// Waits for a node (started with the lab, or added) to turn Ready. A real node whose boot
    /// failed says why at once (its boot names what is wrong); a kwok that died says more than
    /// the timeout (it may die of its startup race and be started again meanwhile).
    pub(crate) async fn wait_joined(&self, node: &str) -> Result<()> {
        let kubelet = format!("{node}/{}", self.kubelet_process(node));
        let boot_failed = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if self.nodes.is_real(node)
                    && let Some(died) = process_died(&self.resources, &kubelet)
                {
                    return died;
                }
            }
        };
        tokio::select! {
            ready = self.wait_ready_status(node, "True", JOIN_TIMEOUT) => ready.map_err(|error| match error {
                Error::Timeout { .. } => process_died(&self.resources, &kubelet).unwrap_or(error),
                other => other,
            }),
            died = boot_failed => Err(Error::NodeBoot { node: node.to_owned(), detail: died.to_string() }),
        }
    }

    /// The process that is the node's kubelet (a real node's boot supervises its own).
    pub(crate) fn kubelet_process(&self, node: &str) -> &'static str {
        if self.nodes.is_real(node) { "boot" } else { "kwok" }
    }

    async fn dismantle_logged(&self, node: &str, index: usize) {
        if let Err(error) = self.dismantle(node, index).await {
            tracing::warn!(%error, %node, "taking away a node that could not be added failed");
        }
    }

    /// Takes away whatever exists of the node (tolerating what was never made): its processes,
    /// servers and files, its Node object, then its namespace. Best effort throughout; the Node
    /// object's deletion is what can fail.
    async fn dismantle(&self, node: &str, index: usize) -> Result<()> {
        let inner = self;
        inner.nodes.remove(node);
        lock_conditions(inner).remove(node);
        self.stop_processes(node);
        for task in inner.node_tasks.take(node) {
            task.abort();
            // Once it is gone its listener is closed and its device session unmounted.
            let _ = task.await;
        }
        inner.watchdogs.forget(node);
        let dir = &inner.resources.dir;
        let device = watchdog_device::mount_point(dir, node);
        // The device's session unmounts as its task ends; this catches one that did not.
        watchdog_device::unmount_under(&device);
        for file in [inner.boot_file(node), sysrq::trigger_file(dir, node)] {
            let _ = std::fs::remove_file(file);
        }
        // Never remove_dir_all: a mount still there must not be walked into.
        let _ = std::fs::remove_dir(&device);
        // Before the name is free again, so a node of the same name joining next cannot lose
        // its new object to this deletion.
        let deleted = delete_node_object(&inner.client, node).await;
        let net = &inner.resources.net;
        if inner.config.bmcs.is_some() {
            net.remove_bmc_address(index);
        }
        net.destroy_node(node, index);
        lock_namespaces(inner).release(node);
        deleted
    }

    /// Kills and forgets every process of the node (and its BMCs'), then anything else still in
    /// its namespace.
    fn stop_processes(&self, node: &str) {
        let inner = self;
        let bmcs = match inner.config.bmcs {
            Some(_) => crate::bmc::process_names(node).to_vec(),
            None => Vec::new(),
        };
        {
            let mut procs = inner.resources.processes.lock().unwrap_or_else(PoisonError::into_inner);
            // A new power epoch, so a boot under way starts nothing. It stays recorded: a boot
            // begun before the removal still finds it changed if a node of this name rejoins.
            let power = procs.power.entry(node.to_owned()).or_default();
            power.epoch += 1;
            power.booting = None;
            let names: Vec<String> = procs
                .by_name
                .iter()
                .filter(|(name, p)| p.node() == Some(node) || bmcs.contains(name))
                .map(|(name, _)| name.clone())
                .collect();
            for name in &names {
                if let Some(mut p) = procs.by_name.remove(name) {
                    p.kill();
                }
            }
            procs.order.retain(|name| !names.contains(name));
        }
        for pid in inner.resources.net.pids(node) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn lock_namespaces(inner: &Inner) -> MutexGuard<'_, Namespaces> {
    inner.resources.nodes.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock_conditions(inner: &Inner) -> MutexGuard<'_, BTreeMap<String, NodeCondition>> {
    inner.conditions.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn create_node_object(client: &Client, spec: &NodeSpec) -> Result<()> {
    let node = nodes::node_object(spec, binaries::version("KUBERNETES_VERSION"));
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(Error::Invalid(format!(
            "a Node object named {} already exists in the API",
            spec.name
        ))),
        Err(error) => Err(error.into()),
    }
}

/// Deletes the Node object as `kubectl delete node` does, and waits until the API forgets it.
async fn delete_node_object(client: &Client, node: &str) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    match api.delete(node, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(error.into()),
    }
    wait::until(&format!("Node {node} to be deleted"), DELETE_TIMEOUT, || {
        let api = api.clone();
        async move { Ok(api.get_opt(node).await?.is_none().then_some(())) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_not_reused_until_the_bridge_runs_out() {
        let mut made = Namespaces::planned(&["node-1".into(), "node-2".into()]);
        assert_eq!(made.reserve("node-3").expect("free"), 2);
        made.release("node-2");
        assert_eq!(
            made.reserve("node-4").expect("free"),
            3,
            "node-2's index is not reused at once"
        );
        assert!(made.reserve("node-4").is_err(), "one node of a name");
        for i in 4..NODE_SLOTS {
            made.reserve(&format!("n{i}")).expect("free");
        }
        assert_eq!(made.reserve("late").expect("wraps around"), 1);
        assert!(made.reserve("one-too-many").is_err());
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for good in ["node-4", "a", "worker.example-1"] {
            check_name(good).expect(good);
        }
        for bad in ["", "Node-4", "node/4", "-node", "node-", "a b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
