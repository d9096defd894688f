//! Faults' effects, each a method: power, freeze, partitions, API isolation, slow links,
//! control-plane restarts, a full disk. [`crate::Fault`] names them.

use std::time::Duration;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use nix::sys::signal::Signal;

use crate::{
    Error, Lab, Result,
    lab::{Inner, process_died},
    timeline::{Event, NodeCondition},
    wait,
};

impl Inner {
    fn set_condition(&self, node: &str, change: impl FnOnce(&mut NodeCondition)) -> Result<NodeCondition> {
        self.index(node)?;
        let mut all = self
            .conditions
            .lock()
            .map_err(|_| Error::Invalid("node table poisoned".into()))?;
        let condition = all.entry(node.to_owned()).or_insert_with(NodeCondition::running);
        let before = *condition;
        change(condition);
        let after = *condition;
        drop(all);
        if before != after {
            self.timeline.record(Event::NodeCondition {
                node: node.to_owned(),
                condition: after,
            });
        }
        Ok(after)
    }

    /// Kills every process of the node and takes its link down, as pulling its power would. All under the process
    /// lock, so a boot under way sees the new epoch and stays off, and no boot can start a
    /// process or mark the node powered between the kill and the condition.
    pub(crate) fn power_off(&self, node: &str, cause: &str) -> Result<()> {
        self.power_off_if(node, cause, || true).map(|_| ())
    }

    /// The power-off of a watchdog that expired when the node had lost its power `power_losses`
    /// times, unless it lost it again since (a crash whose kill was still under way when the
    /// watchdog fired: the machine is off, and a reset would boot it again). Whether it powered
    /// the node off.
    pub(crate) fn power_off_on_expiry(&self, node: &str, power_losses: u64) -> Result<bool> {
        self.power_off_if(node, "watchdog", || self.watchdogs.powered_since(node, power_losses))
    }

    /// Powers the node off if `wanted`, asked under the process lock: no other power-off can be
    /// under way then. Whether it did.
    fn power_off_if(&self, node: &str, cause: &str, wanted: impl FnOnce() -> bool) -> Result<bool> {
        self.index(node)?;
        let mut procs = self
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        if !wanted() {
            return Ok(false);
        }
        let power = procs.power.entry(node.to_owned()).or_default();
        power.epoch += 1;
        power.booting = None;
        // The watchdog's timer loses its power at once, not once every process is dead: a kill
        // that takes longer than its timeout would otherwise see it fire, and reset a node that
        // was switched off.
        self.watchdogs.power_lost(node);
        // A real node's pods run in namespaces of their own and outlive their kubelet: its
        // cgroup holds them all. Killed first: a frozen node's processes die only once thawed,
        // which the cgroup's kill does, and waiting for one of them before it would never end.
        if self.nodes.is_real(node) {
            crate::real_node::cgroup::kill(&crate::real_node::cgroup::path(&self.id, node))?;
        }
        for p in procs.by_name.values_mut().filter(|p| p.node() == Some(node)) {
            p.kill();
        }
        // Anything else that runs in the namespace dies with the machine too.
        for pid in self.resources.net.pids(node) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Err(error) = self.resources.net.set_link(node, false) {
            tracing::warn!(%error, node, "the powered-off node's link stays up");
        }
        self.timeline.record(Event::Power {
            node: node.to_owned(),
            on: false,
            cause: cause.to_owned(),
        });
        self.set_condition(node, |c| {
            c.powered = false;
            c.frozen = false;
        })?;
        Ok(true)
    }

    /// Boots the node: after the boot delay, starts its processes again. A second power-on
    /// while a boot is under way does nothing (that boot starts them); a power-off during the
    /// boot delay cancels it.
    pub(crate) async fn power_on(&self, node: &str, cause: &str) -> Result<()> {
        self.index(node)?;
        let epoch = {
            let mut procs = self
                .resources
                .processes
                .lock()
                .map_err(|_| Error::Invalid("process table poisoned".into()))?;
            let power = procs.power.entry(node.to_owned()).or_default();
            if power.booting == Some(power.epoch) {
                return Ok(());
            }
            power.booting = Some(power.epoch);
            power.epoch
        };
        tokio::time::sleep(self.config.timings.boot_delay).await;
        self.release_kubelet_lease(node).await;
        let mut procs = self
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        let power = procs.power.entry(node.to_owned()).or_default();
        if power.epoch != epoch {
            return Ok(());
        }
        power.booting = None;
        if procs.closed {
            return Ok(());
        }
        crate::lab::record_boot(&self.resources.dir, node)?;
        self.resources.net.set_link(node, true)?;
        // The link going down took the routes through it: a real node's pods would reach
        // neither a Service (its default route) nor the other nodes' pods. Best effort: a node
        // that boots without them is still a node that boots.
        if self.nodes.is_real(node) {
            if let Err(error) = self.restore_routes(node) {
                tracing::warn!(%error, node, "the booted node's routes were not restored");
            }
            crate::real_node::forget_the_last_boot(&self.resources.dir, node)?;
        }
        for p in procs.by_name.values_mut().filter(|p| p.node() == Some(node)) {
            p.reap();
            p.start()?;
        }
        self.timeline.record(Event::Power {
            node: node.to_owned(),
            on: true,
            cause: cause.to_owned(),
        });
        self.set_condition(node, |c| c.powered = true)?;
        Ok(())
    }

    /// Routes a real node's own traffic again after its link came back up: its default route
    /// and the other real nodes' pod networks. Their namespaces kept their routes to it (their
    /// links stayed up; one that is off has no link to route through).
    fn restore_routes(&self, node: &str) -> Result<()> {
        let net = &self.resources.net;
        let index = self.index(node)?;
        net.forward_pods(node, index)?;
        for (other, other_index) in self.nodes.real() {
            if other != node {
                net.route_pods_from(other_index, &[node])?;
            }
        }
        Ok(())
    }

    /// A kubelet that boots renews its node's lease at once: its holder identity is its node's
    /// name. kwok's is a new random one per process, so a kwok started again would wait for the
    /// lease its previous process held to expire (40 s on Kubernetes' default timings), then for
    /// its next renewal period, before it plays any pod of the node, while the node still reads
    /// Ready. Deleting the lease lets the new kwok create and hold it at once; the node lifecycle
    /// controller reads a missing lease as one not renewed. Best effort: without it the node only
    /// comes back later.
    async fn release_kubelet_lease(&self, node: &str) {
        let leases = Api::<Lease>::namespaced(self.client.clone(), "kube-node-lease");
        if let Err(error) = leases.delete(node, &DeleteParams::default()).await {
            tracing::debug!(%node, %error, "could not release the node's lease before its boot");
        }
    }

    fn set_frozen(&self, node: &str, frozen: bool) -> Result<()> {
        if self.nodes.is_real(node) {
            return crate::real_node::cgroup::set_frozen(&crate::real_node::cgroup::path(&self.id, node), frozen);
        }
        let signal = if frozen { Signal::SIGSTOP } else { Signal::SIGCONT };
        // A process that starts in the namespace while it is being stopped (a supervised one
        // restarted just then) is missed by one pass: stop what each new listing shows until a
        // listing shows nothing new.
        let mut signalled = std::collections::BTreeSet::new();
        for _ in 0..FREEZE_PASSES {
            let fresh: Vec<i32> = self
                .resources
                .net
                .pids(node)
                .into_iter()
                .filter(|pid| !signalled.contains(pid))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for pid in fresh {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
                signalled.insert(pid);
            }
            if !frozen {
                break;
            }
        }
        // A stop lands when the process next runs, which on a busy machine may be a while: the
        // freeze is over once every one of them is stopped (or gone).
        if frozen {
            let deadline = std::time::Instant::now() + FREEZE_SETTLES;
            while signalled.iter().any(|pid| running(*pid)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        Ok(())
    }
}

/// How many listings of a node's processes a freeze stops before it gives up on a node whose
/// processes keep starting, and how long it waits for the stops to land.
const FREEZE_PASSES: usize = 20;
const FREEZE_SETTLES: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the process exists and is not stopped (its state in /proc is not `T`).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(") ").next().and_then(|s| s.chars().next()))
        .is_some_and(|state| state != 'T' && state != 'Z' && state != 'X')
}

impl Lab {
    /// Records a fault of `node` (checked first: an unknown or removed node gets no entry) or of
    /// the whole lab.
    fn fault(&self, node: Option<&str>, fault: &str) -> Result<()> {
        if let Some(node) = node {
            self.inner.index(node)?;
        }
        self.inner.timeline.record(Event::Fault {
            node: node.map(str::to_owned),
            fault: fault.to_owned(),
        });
        Ok(())
    }

    /// Powers the node off and leaves it off.
    pub async fn crash(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "crash")?;
        self.inner.power_off(node, "crash")
    }

    pub async fn power_off(&self, node: &str) -> Result<()> {
        self.inner.power_off(node, "power-off")
    }

    /// Starts the node's processes again after the boot delay (returns once they run, or at
    /// once when a boot is already under way).
    pub async fn power_on(&self, node: &str) -> Result<()> {
        self.inner.power_on(node, "power-on").await
    }

    /// Power cycle.
    pub async fn reset(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "reset")?;
        self.inner.power_off(node, "reset")?;
        self.inner.power_on(node, "reset").await
    }

    /// Stops every process of the node (a hung kernel): a real node's freezer cgroup, its pods
    /// included; a simulated one's processes by SIGSTOP.
    pub async fn freeze(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "freeze")?;
        self.inner.set_frozen(node, true)?;
        self.inner.set_condition(node, |c| c.frozen = true)?;
        Ok(())
    }

    pub async fn thaw(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "thaw")?;
        self.inner.set_frozen(node, false)?;
        self.inner.set_condition(node, |c| c.frozen = false)?;
        Ok(())
    }

    /// Cuts these nodes from everything (the API server, the other nodes) except each other.
    pub async fn partition(&self, nodes: &[&str]) -> Result<()> {
        let ips = nodes.iter().map(|n| self.node_ip(n)).collect::<Result<Vec<_>>>()?;
        self.fault(None, &format!("partition {}", nodes.join(",")))?;
        for node in nodes {
            let others: Vec<_> = ips
                .iter()
                .copied()
                .filter(|ip| self.node_ip(node).is_ok_and(|own| own != *ip))
                .collect();
            self.inner.resources.net.cut_off(node, &others)?;
            self.inner.set_condition(node, |c| {
                c.partitioned = true;
                c.api_isolated = false;
            })?;
        }
        Ok(())
    }

    /// Drops only the node's traffic to and from the API server; its peers stay reachable.
    pub async fn isolate_from_api(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "isolate-from-api")?;
        self.inner
            .resources
            .net
            .isolate_from(node, self.api_ip(), self.api_port())?;
        self.inner.set_condition(node, |c| {
            c.api_isolated = true;
            c.partitioned = false;
        })?;
        Ok(())
    }

    /// A slow, lossy network: every packet each of `nodes` sends is delayed by `delay` ±
    /// `jitter`, and `loss_percent` of them are lost, until [`Lab::restore_links`].
    pub async fn slow_links(&self, nodes: &[&str], delay: Duration, jitter: Duration, loss_percent: f64) -> Result<()> {
        self.fault(
            None,
            &format!(
                "slow links {} ({} ms ± {} ms, {loss_percent}% lost)",
                nodes.join(","),
                delay.as_millis(),
                jitter.as_millis()
            ),
        )?;
        let impairment = crate::slow_link::Impairment {
            delay,
            jitter,
            loss_percent,
        };
        for node in nodes {
            self.inner.index(node)?;
            let link = crate::slow_link::SlowLink::start(&self.inner.resources.net.netns(node), impairment)?;
            self.inner
                .slow_links
                .lock()
                .map_err(|_| Error::Invalid("slow-link table poisoned".into()))?
                .insert((*node).to_owned(), link);
        }
        Ok(())
    }

    pub async fn restore_links(&self, nodes: &[&str]) -> Result<()> {
        self.fault(None, &format!("restore links {}", nodes.join(",")))?;
        let mut links = self
            .inner
            .slow_links
            .lock()
            .map_err(|_| Error::Invalid("slow-link table poisoned".into()))?;
        for node in nodes {
            links.remove(*node);
        }
        Ok(())
    }

    /// The nodes whose links are slowed.
    pub(crate) fn slowed_nodes(&self) -> Result<Vec<String>> {
        Ok(self
            .inner
            .slow_links
            .lock()
            .map_err(|_| Error::Invalid("slow-link table poisoned".into()))?
            .keys()
            .cloned()
            .collect())
    }

    /// Fills the node's disk: its kubelet reports DiskPressure until [`Lab::free_disk`]. A kwok
    /// node has no disk of its own to fill, so the lab marks its Node and the kwok stage
    /// `node-disk-pressure` reports the condition, as a kubelet's eviction manager would; the mark
    /// outlives a reboot, as a full disk does.
    pub async fn fill_disk(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "fill-disk")?;
        self.mark_disk_full(node, true).await?;
        self.inner.set_condition(node, |c| c.disk_full = true)?;
        Ok(())
    }

    pub async fn free_disk(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "free-disk")?;
        self.mark_disk_full(node, false).await?;
        self.inner.set_condition(node, |c| c.disk_full = false)?;
        Ok(())
    }

    async fn mark_disk_full(&self, node: &str, full: bool) -> Result<()> {
        let value = full.then_some("true");
        let patch = serde_json::json!({"metadata": {"annotations": {crate::nodes::DISK_FULL_ANNOTATION: value}}});
        Api::<Node>::all(self.client())
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                Error::Invalid(format!(
                    "marking {node}'s disk {}: {e}",
                    if full { "full" } else { "free" }
                ))
            })?;
        Ok(())
    }

    /// Undoes a partition or an API isolation of the node.
    pub async fn heal(&self, node: &str) -> Result<()> {
        self.fault(Some(node), "heal")?;
        self.inner.resources.net.heal(node)?;
        self.inner.set_condition(node, |c| {
            c.partitioned = false;
            c.api_isolated = false;
        })?;
        Ok(())
    }

    pub async fn stop_apiserver(&self) -> Result<()> {
        self.fault(None, "stop-apiserver")?;
        self.kill_process("kube-apiserver")
    }

    pub async fn start_apiserver(&self) -> Result<()> {
        self.fault(None, "start-apiserver")?;
        self.restart_process("kube-apiserver")?;
        self.wait_api(Duration::from_secs(60)).await
    }

    /// Stops etcd and leaves it stopped: the API server still answers, with errors.
    pub async fn stop_etcd(&self) -> Result<()> {
        self.fault(None, "stop-etcd")?;
        self.kill_process("etcd")
    }

    /// Starts etcd again. After a long outage the API server's etcd client has backed off to
    /// gRPC's two-minute reconnect interval, so the API can take that long to answer again.
    pub async fn start_etcd(&self) -> Result<()> {
        self.fault(None, "start-etcd")?;
        self.restart_process("etcd")?;
        self.wait_api(Duration::from_secs(180)).await
    }

    pub async fn restart_etcd(&self) -> Result<()> {
        self.fault(None, "restart-etcd")?;
        self.restart_process("etcd")?;
        self.wait_api(Duration::from_secs(60)).await
    }

    /// Kills a process the lab runs (by name, e.g. `kube-apiserver`, `controller-0`,
    /// `node-1/agent`) and starts it again.
    pub fn restart_process(&self, name: &str) -> Result<()> {
        let mut procs = self
            .inner
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        let p = procs
            .by_name
            .get_mut(name)
            .ok_or_else(|| Error::UnknownProcess(name.to_owned()))?;
        p.kill();
        p.start()
    }

    /// On a real control plane kube-controller-manager and kube-scheduler are static pods, which
    /// the kubelet starts again when they exit; and both exit on purpose on some errors (the
    /// scheduler when its cache is corrupted, e.g. by an API server restart in the middle of a
    /// binding). Starts whichever of them exited, notes it in the timeline, returns their names.
    pub fn revive_control_plane(&self) -> Result<Vec<String>> {
        let mut revived = Vec::new();
        for name in ["kube-controller-manager", "kube-scheduler"] {
            if !self.process_running(name) {
                self.restart_process(name)?;
                self.inner.timeline.note(format!(
                    "{name} had exited; started again, as a kubelet restarts a static pod"
                ));
                revived.push(name.to_owned());
            }
        }
        Ok(revived)
    }

    /// Kills a process the lab runs and leaves it stopped.
    pub fn kill_process(&self, name: &str) -> Result<()> {
        let mut procs = self
            .inner
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        procs
            .by_name
            .get_mut(name)
            .ok_or_else(|| Error::UnknownProcess(name.to_owned()))?
            .kill();
        Ok(())
    }

    /// Asks a process the lab runs to stop (SIGTERM to its group), as Kubernetes stops a pod;
    /// it is not started again.
    pub fn terminate_process(&self, name: &str) -> Result<()> {
        let procs = self
            .inner
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        procs
            .by_name
            .get(name)
            .ok_or_else(|| Error::UnknownProcess(name.to_owned()))?
            .signal(Signal::SIGTERM);
        Ok(())
    }

    /// Whether the named process is running.
    pub fn process_running(&self, name: &str) -> bool {
        self.inner
            .resources
            .processes
            .lock()
            .ok()
            .and_then(|mut p| p.by_name.get_mut(name).map(|p| p.running()))
            .unwrap_or(false)
    }

    /// How the named process ended when it stopped on its own (after [`Self::terminate_process`],
    /// say); `None` while it runs.
    pub fn process_exit_status(&self, name: &str) -> Option<std::process::ExitStatus> {
        self.inner
            .resources
            .processes
            .lock()
            .ok()?
            .by_name
            .get_mut(name)?
            .exit_status()
    }

    /// The error a dead process left, with its log tail.
    pub fn process_error(&self, name: &str) -> Option<Error> {
        process_died(&self.inner.resources, name)
    }

    async fn wait_api(&self, timeout: Duration) -> Result<()> {
        let client = crate::readiness::quiet_client(self.kubeconfig()).await?;
        wait::until("the API server to answer", timeout, || {
            let client = client.clone();
            async move { Ok(crate::readiness::api_ready(&client).await?.then_some(())) }
        })
        .await
    }
}
