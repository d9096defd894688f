//! Starting and tearing down a lab.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::{
    Api, Client, Config,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::{sync::mpsc, task::JoinHandle};

use crate::{
    Error, LabConfig, NodeSpec, Result,
    binaries::{self, Binaries},
    container::{ContainerSpec, Containers},
    control_plane::{self, API_PORT, EtcdAddress},
    error::io,
    lock::{self, LabLock, SetupLock},
    membership::{Namespaces, NodeTable, NodeTasks},
    net::Network,
    nodes::{self, KwokArgs},
    observer,
    pki::LabPki,
    process::{ProcessSpec, Supervised},
    real_node::{self, NodeBinaries, RealNode},
    storage,
    timeline::{Event, NodeCondition, Timeline},
    wait,
    watchdog::Watchdogs,
};

/// A running lab. Dropping it stops every process it started and removes every namespace,
/// bridge, rule and file it made, also when a test panics (then its logs are kept and their
/// path printed).
pub struct Lab {
    pub(crate) inner: Arc<Inner>,
    pub(crate) tasks: Vec<JoinHandle<()>>,
    _lock: LabLock,
}

pub(crate) struct Inner {
    pub id: String,
    pub config: LabConfig,
    pub bins: Binaries,
    /// What real nodes run, when the lab has any.
    pub node_bins: Option<NodeBinaries>,
    pub kubeconfig: PathBuf,
    pub client: Client,
    /// The lab's nodes of this moment: nodes join and leave a running lab (see `membership`).
    pub nodes: NodeTable,
    /// Each node's servers (its watchdog device; a real node's CSI plugin), stopped when the
    /// node leaves.
    pub node_tasks: NodeTasks,
    pub conditions: Arc<Mutex<BTreeMap<String, NodeCondition>>>,
    /// Nodes whose link is slowed ([`Lab::slow_links`]); dropped before the namespaces go.
    pub slow_links: Mutex<BTreeMap<String, crate::slow_link::SlowLink>>,
    pub watchdogs: Watchdogs,
    pub timeline: Timeline,
    pub resources: Resources,
    pub pki: LabPki,
    pub server: String,
    /// Every manifest [`Lab::apply_yaml_once`] applied.
    pub applied_once: Mutex<BTreeSet<String>>,
}

/// Everything that must be undone, owned from the first step of start-up on, so a failed start
/// cleans up as well as a finished lab.
pub(crate) struct Resources {
    pub dir: PathBuf,
    pub shm: PathBuf,
    pub net: Network,
    /// Every node namespace made, from the moment its index is reserved until it is removed.
    pub nodes: Mutex<Namespaces>,
    pub processes: Mutex<Processes>,
    pub containers: Containers,
    torn_down: AtomicBool,
    /// Keep the logs at teardown: true until start-up succeeds, so a failed start can be read.
    keep_logs: AtomicBool,
}

#[derive(Default)]
pub(crate) struct Processes {
    pub by_name: BTreeMap<String, Supervised>,
    /// Start order, so teardown can go in reverse.
    pub order: Vec<String>,
    pub closed: bool,
    /// Each node's power epochs, kept under this lock with the processes they start and kill.
    pub power: BTreeMap<String, PowerEpoch>,
}

/// A power-off starts a new epoch; a boot started in an older one must not start anything.
#[derive(Default)]
pub(crate) struct PowerEpoch {
    pub epoch: u64,
    /// The epoch a boot is under way in, if any.
    pub booting: Option<u64>,
}

impl Resources {
    fn teardown(&self) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Ok(mut procs) = self.processes.lock() {
            procs.closed = true;
            let order: Vec<String> = procs.order.iter().rev().cloned().collect();
            for name in order {
                if let Some(p) = procs.by_name.get_mut(&name) {
                    p.kill();
                }
            }
        }
        // Real nodes' pods outlive their kubelet and live in namespaces of their own: their
        // cgroups hold them all.
        if let Err(error) = real_node::cgroup::kill(&real_node::cgroup::lab_path(&self.net.id)) {
            tracing::warn!(%error, "stopping the real nodes' processes failed");
        }
        // Also when a panic poisoned the lock: teardown must still find every namespace.
        let made = self.nodes.lock().unwrap_or_else(PoisonError::into_inner).made();
        for node in made.keys() {
            for pid in self.net.pids(node) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        self.net.destroy(&made);
        self.containers.remove_all();
        crate::watchdog_device::unmount_under(&self.dir);
        // NODEMEDIC_KEEP_LAB_LOGS: keep a finished lab's logs too, to read what a run did.
        let asked = std::env::var("NODEMEDIC_KEEP_LAB_LOGS").is_ok_and(|v| !v.is_empty() && v != "0");
        let keep = std::thread::panicking() || asked || self.keep_logs.load(Ordering::SeqCst);
        if keep {
            keep_logs_on_disk(&self.shm.join("logs"), &self.dir.join("logs"));
        }
        let _ = std::fs::remove_dir_all(&self.shm);
        if keep {
            let _ = std::fs::write(self.dir.join("torn-down"), "");
            eprintln!("lab logs kept in {}", self.dir.join("logs").display());
        } else {
            crate::lock::remove_in_background(&self.dir);
        }
    }
}

/// Replaces the link to the in-memory logs with a copy of them (best effort: teardown goes on).
fn keep_logs_on_disk(memory: &Path, link: &Path) {
    if !link.is_symlink() {
        return;
    }
    let _ = std::fs::remove_file(link);
    if std::fs::create_dir_all(link).is_err() {
        return;
    }
    for entry in std::fs::read_dir(memory).into_iter().flatten().flatten() {
        let _ = std::fs::copy(entry.path(), link.join(entry.file_name()));
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.inner.node_tasks.abort_all();
        self.inner.resources.teardown();
    }
}

pub(crate) fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener.local_addr().map_err(io("finding a free port"))?.port())
}

/// Checks what a lab needs (root, `ip`, `nft`, the control-plane binaries) and says what to do
/// when something is missing.
pub fn preflight() -> Result<Binaries> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::NotRoot);
    }
    binaries::tool("ip")?;
    binaries::tool("nft")?;
    Binaries::locate()
}

async fn client_from(path: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(Client::try_from(config)?)
}

/// A lab id no lab on this machine has (another may be running beside this one).
fn unused_id() -> (String, PathBuf) {
    loop {
        let id = format!("{:04x}", rand::random::<u16>());
        let dir = lock::labs_root().join(&id);
        if !dir.exists() {
            return (id, dir);
        }
    }
}

impl Lab {
    #[expect(
        clippy::too_many_lines,
        reason = "the lab's boot in the order it must happen: each step uses what the steps before it started, under the locks taken first"
    )]
    pub async fn start(config: LabConfig) -> Result<Self> {
        let bins = preflight()?;
        if config.bmcs.is_some() {
            crate::bmc::preflight()?;
        }
        let node_bins = if config.nodes.iter().any(|n| n.real) {
            real_node::refuse_unsafe_host()?;
            Some(NodeBinaries::locate(config.network_policies)?)
        } else {
            None
        };
        let lock = LabLock::acquire(config.kinds()).await?;
        let setup = SetupLock::acquire().await?;
        lock::sweep();

        let (id, dir) = unused_id();
        for sub in ["pids", "pki", "nodes"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io(format!("creating {}", dir.display())))?;
        }
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string()).map_err(io("recording the lab owner"))?;
        let shm = PathBuf::from(format!("/dev/shm/nodemedic-{id}"));
        std::fs::create_dir_all(shm.join("logs")).map_err(io("creating the tmpfs directory"))?;
        // Every process's log and the audit log are written in memory: the API server writes an
        // audit event before it answers, and a write to a disk busy with someone else's writeback
        // could wait for seconds, long enough for agents' API checks to fail. Copied to disk
        // when kept.
        std::os::unix::fs::symlink(shm.join("logs"), dir.join("logs")).map_err(io("linking the lab's logs"))?;
        let net = Network::plan(&id)?;
        crate::cpu_share::create(&id)?;
        let node_names: Vec<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
        let resources = Resources {
            dir: dir.clone(),
            shm: shm.clone(),
            net: net.clone(),
            nodes: Mutex::new(Namespaces::planned(&node_names)),
            processes: Mutex::new(Processes::default()),
            containers: Containers::new(&shm, &id),
            torn_down: AtomicBool::new(false),
            keep_logs: AtomicBool::new(true),
        };
        tracing::info!(lab = %id, nodes = node_names.len(), "starting lab");

        net.create_bridges()?;
        // The network is claimed: another lab's plan sees these addresses.
        drop(setup);
        for (index, node) in node_names.iter().enumerate() {
            net.create_node(node, index)?;
        }
        let pki = LabPki::create(&dir.join("pki"), net.host_ip())?;
        let server = format!("https://{}:{API_PORT}", net.host_ip());
        let kubeconfig = dir.join("kubeconfig");
        pki.kubeconfig("admin", &server, &kubeconfig)?;

        let etcd = EtcdAddress::of_lab(net.host_ip());
        start_process(&resources, "etcd", control_plane::etcd(&bins, &shm.join("etcd"), &etcd))?;
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, control_plane::audit_policy()).map_err(io("writing the audit policy"))?;
        let audit = control_plane::Audit {
            policy: &audit_policy,
            log: &dir.join("logs").join("audit.log"),
        };
        let admission = match config.pod_security {
            Some(level) => {
                let file = dir.join("admission.yaml");
                std::fs::write(&file, control_plane::pod_security_admission(level))
                    .map_err(io("writing the admission configuration"))?;
                Some(file)
            }
            None => None,
        };
        start_process(
            &resources,
            "kube-apiserver",
            control_plane::apiserver(
                &bins,
                &pki,
                net.host_ip(),
                &etcd,
                &config.timings,
                &audit,
                admission.as_deref(),
            ),
        )?;
        let client = client_from(&kubeconfig).await?;
        wait_ready(&resources, &crate::readiness::quiet_client(&kubeconfig).await?).await?;
        start_process(
            &resources,
            "kube-controller-manager",
            control_plane::controller_manager(&bins, &pki, &kubeconfig, &config.timings),
        )?;
        start_process(
            &resources,
            "kube-scheduler",
            control_plane::scheduler(&bins, &kubeconfig),
        )?;

        crate::crds::install(&client, nodemedic_api::crds::all()).await?;
        if config.storage {
            storage::install(&client, config.persistent_volumes).await?;
        }

        let stages = nodes::stages_file(&dir);
        std::fs::write(&stages, nodes::KWOK_STAGES).map_err(io("writing kwok stages"))?;
        let node_api = Api::<Node>::all(client.clone());
        let k8s_version = binaries::version("KUBERNETES_VERSION");
        let kubelets = Kubelets {
            resources: &resources,
            bins: &bins,
            node_bins: node_bins.as_ref(),
            pki: &pki,
            kubeconfig: &kubeconfig,
            server: &server,
            lease_seconds: config.timings.node_lease_seconds,
            images: &config.node_images,
        };
        for (index, spec) in config.nodes.iter().enumerate() {
            node_api
                .create(&PostParams::default(), &nodes::node_object(spec, k8s_version))
                .await?;
            // A real node boots once its watchdog device is served (below).
            if !spec.real {
                kubelets.start(spec, index)?;
            }
        }
        let real: Vec<(String, usize)> = config
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, spec)| spec.real)
            .map(|(index, spec)| (spec.name.clone(), index))
            .collect();
        real_node::route_pods(&net, &real, &real)?;
        if !real.is_empty() {
            real_node::publish_api_endpoint(&client, net.host_ip(), API_PORT).await?;
            if config.network_policies {
                real_node::network_policies::authorize(&client).await?;
            }
        }

        if config.fleet > 0 {
            start_process(
                &resources,
                "fleet/kwok",
                crate::fleet::kwok(&bins, &kubeconfig, &stages, config.timings.node_lease_seconds),
            )?;
        }

        let conditions = Arc::new(Mutex::new(
            node_names
                .iter()
                .map(|n| (n.clone(), NodeCondition::running()))
                .collect(),
        ));
        let timeline = Timeline::default();
        let watchdogs = Watchdogs::default();
        let nodes = NodeTable::new(&config.nodes);
        let inner = Arc::new(Inner {
            id,
            config,
            bins,
            node_bins,
            kubeconfig,
            client: client.clone(),
            nodes,
            node_tasks: NodeTasks::default(),
            conditions,
            watchdogs,
            timeline,
            resources,
            pki,
            server,
            applied_once: Mutex::default(),
            slow_links: Mutex::default(),
        });
        let mut tasks = observer::spawn(&client, &inner.timeline);
        if inner.config.storage {
            tasks.push(tokio::spawn(storage::run(
                client.clone(),
                inner.conditions.clone(),
                inner.timeline.clone(),
            )));
        }
        for spec in &inner.config.nodes {
            crate::membership::serve_node(&inner, &spec.name, spec.real)?;
        }
        for (index, spec) in inner.config.nodes.iter().enumerate().filter(|(_, spec)| spec.real) {
            inner.kubelets().start(spec, index)?;
        }
        tasks.push(crate::sysrq::watch(inner.clone())?);
        let (expired_tx, expired_rx) = mpsc::unbounded_channel();
        tasks.push(inner.watchdogs.expiries(expired_tx));
        tasks.push(tokio::spawn(power_cycle_on_expiry(inner.clone(), expired_rx)));
        tasks.push(tokio::spawn(restart_kwok_after_its_startup_race(inner.clone())));
        let mut lab = Self {
            inner,
            tasks,
            _lock: lock,
        };
        lab.start_bmcs()?;

        for node in &node_names {
            lab.inner.wait_joined(node).await?;
        }
        lab.wait_bmcs().await?;
        crate::fleet::create(&lab, lab.inner.config.fleet).await?;
        // kube-controller-manager is working once it has created the default ServiceAccount.
        let sa = Api::<ServiceAccount>::namespaced(client, "default");
        wait::until(
            "kube-controller-manager to create the default ServiceAccount",
            Duration::from_secs(60),
            || {
                let sa = sa.clone();
                async move { Ok(sa.get_opt("default").await?.map(|_| ())) }
            },
        )
        .await?;
        lab.inner.resources.keep_logs.store(false, Ordering::SeqCst);
        tracing::info!(lab = %lab.inner.id, "lab ready");
        Ok(lab)
    }

    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Admin kubeconfig of the lab (valid on the host and inside the nodes' namespaces).
    pub fn kubeconfig(&self) -> &Path {
        &self.inner.kubeconfig
    }

    pub fn dir(&self) -> &Path {
        &self.inner.resources.dir
    }

    pub fn timeline(&self) -> &Timeline {
        &self.inner.timeline
    }

    pub fn config(&self) -> &LabConfig {
        &self.inner.config
    }

    pub fn nodes(&self) -> Vec<String> {
        self.inner.nodes.names()
    }

    /// The address the API server listens on (the host's side of the node bridge).
    pub fn api_ip(&self) -> Ipv4Addr {
        self.inner.resources.net.host_ip()
    }

    pub fn api_port(&self) -> u16 {
        API_PORT
    }

    pub fn node_ip(&self, node: &str) -> Result<Ipv4Addr> {
        Ok(self.inner.resources.net.node_ip(self.inner.index(node)?))
    }

    pub fn netns(&self, node: &str) -> Result<String> {
        self.inner.index(node)?;
        Ok(self.inner.resources.net.netns(node))
    }

    /// The file the lab writes the node's boot time into at each simulated boot (what `btime`
    /// in /proc/stat is on a real machine), for an agent's `--boot-time-file`.
    pub fn boot_file(&self, node: &str) -> PathBuf {
        self.inner.boot_file(node)
    }

    pub fn watchdog_armed(&self, node: &str) -> bool {
        self.inner.watchdogs.armed(node)
    }

    pub fn condition(&self, node: &str) -> Result<NodeCondition> {
        self.inner.index(node)?;
        Ok(self
            .inner
            .conditions
            .lock()
            .ok()
            .and_then(|c| c.get(node).copied())
            .unwrap_or_default())
    }

    pub fn kubectl_path(&self) -> &Path {
        &self.inner.bins.kubectl
    }

    /// `kubectl <args>` with the lab's admin kubeconfig; its standard output.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let kubeconfig = self.inner.kubeconfig.display().to_string();
        let all: Vec<&str> = ["--kubeconfig", kubeconfig.as_str()]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        crate::cmd::run(&self.inner.bins.kubectl.display().to_string(), &all)
    }

    /// `kubectl apply -f -` with the lab's admin kubeconfig.
    pub fn apply_yaml(&self, yaml: &str) -> Result<String> {
        crate::cmd::run_with_stdin(
            &self.inner.bins.kubectl.display().to_string(),
            &[
                "--kubeconfig",
                &self.inner.kubeconfig.display().to_string(),
                "apply",
                "-f",
                "-",
            ],
            Some(yaml),
        )
    }

    /// [`Lab::apply_yaml`] unless this lab already applied exactly this text through here: for
    /// what every controller and agent a test starts needs in place (the chart's RBAC), where a
    /// kubectl run per process would add seconds to each test.
    pub fn apply_yaml_once(&self, yaml: &str) -> Result<()> {
        let mut applied = self.inner.applied_once.lock().unwrap_or_else(PoisonError::into_inner);
        if !applied.contains(yaml) {
            self.apply_yaml(yaml)?;
            applied.insert(yaml.to_owned());
        }
        Ok(())
    }

    /// Gives every control-plane node a kubeadm-style etcd mirror pod (see
    /// [`crate::workloads::etcd_mirror_pod`]), for checks of etcd quorum.
    pub fn add_etcd_members(&self) -> Result<()> {
        let control_plane = self
            .inner
            .nodes
            .specs()
            .into_iter()
            .filter(|n| n.labels.contains_key(nodemedic_api::names::labels::ROLE_CONTROL_PLANE));
        for node in control_plane {
            self.apply_yaml(&crate::workloads::etcd_mirror_pod(&node.name))?;
        }
        Ok(())
    }

    /// What OpenShift shows of its etcd members: a guard pod on each control-plane node, in
    /// namespace openshift-etcd (created here).
    pub fn add_etcd_guard_pods(&self) -> Result<()> {
        self.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: openshift-etcd}\n")?;
        let control_plane = self
            .inner
            .nodes
            .specs()
            .into_iter()
            .filter(|n| n.labels.contains_key(nodemedic_api::names::labels::ROLE_CONTROL_PLANE));
        for node in control_plane {
            self.apply_yaml(&crate::workloads::etcd_guard_pod(&node.name))?;
        }
        Ok(())
    }

    /// Runs a real etcd cluster outside any pod, one member on each of `nodes` (in the node's
    /// network namespace, on its IP, stopped and started with the node; process
    /// `<node>/etcd`), as external etcd on the control-plane hosts runs; returns each member's
    /// node and client URL, as `--etcd-member` takes them.
    pub fn start_etcd_cluster(&self, nodes: &[&str]) -> Result<Vec<(String, String)>> {
        let peer = |ip: Ipv4Addr| format!("http://{ip}:2380");
        let mut members = Vec::new();
        for node in nodes {
            members.push((node.to_string(), self.node_ip(node)?));
        }
        let initial = members
            .iter()
            .map(|(node, ip)| format!("{node}={}", peer(*ip)))
            .collect::<Vec<_>>()
            .join(",");
        let mut urls = Vec::new();
        for (node, ip) in &members {
            let client = format!("http://{ip}:2379");
            let spec = ProcessSpec::new(
                &self.inner.bins.etcd,
                [
                    format!("--name={node}"),
                    format!("--data-dir={}", self.dir().join(format!("etcd-{node}")).display()),
                    format!("--listen-client-urls={client}"),
                    format!("--advertise-client-urls={client}"),
                    format!("--listen-peer-urls={}", peer(*ip)),
                    format!("--initial-advertise-peer-urls={}", peer(*ip)),
                    format!("--initial-cluster={initial}"),
                    "--initial-cluster-state=new".to_owned(),
                    "--listen-metrics-urls=".to_owned(),
                    "--unsafe-no-fsync=true".to_owned(),
                    "--log-level=warn".to_owned(),
                ],
            );
            self.add_node_process(node, "etcd", spec)?;
            urls.push((node.clone(), client));
        }
        Ok(urls)
    }

    /// Runs `program args` inside the node's network namespace (behind the sysrq guard, see
    /// [`Lab::sysrq_trigger_path`]) and returns whether it succeeded; an error if the guard
    /// refused to start it.
    pub fn exec_in_node(&self, node: &str, program: &str, args: &[&str]) -> Result<bool> {
        let ns = self.netns(node)?;
        crate::sysrq::exec(&ns, &self.sysrq_trigger_path(node), program, args)
    }

    /// Whether a TCP connection from inside `node` to `ip:port` succeeds within two seconds.
    pub fn node_can_reach(&self, node: &str, ip: Ipv4Addr, port: u16) -> Result<bool> {
        let script = format!("exec 3<>/dev/tcp/{ip}/{port}");
        self.exec_in_node(node, "timeout", &["2", "bash", "-c", &script])
    }

    /// Waits until the API shows the node's Ready condition with `status`.
    pub async fn wait_ready_status(&self, node: &str, status: &str, timeout: Duration) -> Result<()> {
        self.inner.wait_ready_status(node, status, timeout).await
    }

    /// Adds a process to a node (started now if the node is powered, and again on every
    /// power-on), e.g. its agent. `spec.netns` is set to the node's. It runs with the node's
    /// sysrq trigger over `/proc/sysrq-trigger` (see [`Lab::sysrq_trigger_path`]); the node's
    /// boot time is in [`Lab::boot_file`].
    pub fn add_node_process(&self, node: &str, name: &str, spec: ProcessSpec) -> Result<()> {
        self.inner.add_node_process(node, name, spec)
    }

    /// Adds a process on the host (outside every node), e.g. a controller replica.
    pub fn add_host_process(&self, name: &str, spec: ProcessSpec) -> Result<()> {
        start_process(&self.inner.resources, name, spec)
    }

    /// Runs an image as container `name` on the host, in the host's network as a pod with
    /// `hostNetwork` (it reaches the API server and the BMCs); its output is the process's log.
    pub fn add_host_container(&self, name: &str, spec: &ContainerSpec) -> Result<()> {
        let process = self.inner.resources.containers.process(name, spec)?;
        self.add_host_process(name, process)
    }

    /// Runs an image as container `<node>/<name>` in the node's network namespace, started on
    /// every power-on and killed by every power-off like the node's other processes.
    pub fn add_node_container(&self, node: &str, name: &str, spec: &ContainerSpec) -> Result<()> {
        let mut spec = spec.clone();
        spec.network = Some(PathBuf::from("/run/netns").join(self.netns(node)?));
        let process = self
            .inner
            .resources
            .containers
            .process(&format!("{node}/{name}"), &spec)?;
        self.inner.add_to_node(node, name, process)
    }

    /// Runs an image to completion as container `name` on the host (e.g. a command that lists
    /// what the image holds); returns its output.
    pub fn run_container(&self, name: &str, spec: &ContainerSpec) -> Result<String> {
        self.inner.resources.containers.run(name, spec)
    }

    /// The lab's certificate authority (what a pod finds as its service account's `ca.crt`).
    pub fn ca_certificate(&self) -> PathBuf {
        self.inner.pki.path("ca.crt")
    }

    /// A kubeconfig for a client certificate of `user` in `groups` (e.g. an agent's node
    /// identity), written into the lab directory.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        // Files of their own for each call: rewriting a certificate and key that a process started
        // earlier is still reading gave it a truncated key (two controllers of one account,
        // ci-20261207T092105Z).
        static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = ISSUED.fetch_add(1, Ordering::Relaxed);
        let file = format!("{}-{serial}", user.replace(':', "-"));
        self.inner.pki.issue_client(&file, user, groups)?;
        let path = self.dir().join(format!("{file}.kubeconfig"));
        self.inner.pki.kubeconfig(&file, &self.inner.server, &path)?;
        Ok(path)
    }

    /// A kubeconfig for `name` that authenticates with `token`.
    pub fn kubeconfig_with_token(&self, name: &str, token: &str) -> Result<PathBuf> {
        let path = self.dir().join(format!("{name}.kubeconfig"));
        self.inner
            .pki
            .token_kubeconfig(name, token, &self.inner.server, &path)?;
        Ok(path)
    }

    /// Keeps this lab's logs when it is torn down (as `NODEMEDIC_KEEP_LAB_LOGS=1` does for
    /// every lab); returns where they are.
    pub fn keep_logs(&self) -> PathBuf {
        self.inner.resources.keep_logs.store(true, Ordering::SeqCst);
        self.dir().join("logs")
    }

    /// The API server's audit log: one JSON line per request nodemedic's controller or agents
    /// made, with its verb and resource.
    pub fn audit_log(&self) -> PathBuf {
        self.dir().join("logs").join("audit.log")
    }

    /// The pid of a process the lab runs (e.g. `controller`, `node-1/agent`), if it runs.
    pub fn process_pid(&self, name: &str) -> Option<u32> {
        let procs = self.inner.resources.processes.lock().ok()?;
        procs.by_name.get(name)?.pid()
    }

    pub fn log_path(&self, process: &str) -> PathBuf {
        self.dir()
            .join("logs")
            .join(format!("{}.log", process.replace('/', "_")))
    }
}

impl Inner {
    /// See [`Lab::add_node_process`].
    pub(crate) fn add_node_process(&self, node: &str, name: &str, mut spec: ProcessSpec) -> Result<()> {
        self.index(node)?;
        spec.netns = Some(self.resources.net.netns(node));
        self.add_to_node(node, name, spec)
    }

    /// Whether the node's power is on (false for a node the lab does not know).
    pub(crate) fn powered(&self, node: &str) -> bool {
        self.conditions
            .lock()
            .ok()
            .and_then(|c| c.get(node).copied())
            .unwrap_or_default()
            .powered
    }

    pub(crate) fn add_to_node(&self, node: &str, name: &str, spec: ProcessSpec) -> Result<()> {
        let full = format!("{node}/{name}");
        let powered = self.powered(node);
        let mut procs = self
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        // Again under the lock: a node being removed leaves the table before its processes are
        // stopped under this lock, so none is added behind that.
        self.index(node)?;
        if procs.closed {
            return Ok(());
        }
        if !procs.by_name.contains_key(&full) {
            procs.order.push(full.clone());
        }
        let mut p = Supervised::new(&full, spec, &self.resources.dir);
        if powered {
            p.start()?;
        }
        if let Some(mut old) = procs.by_name.insert(full, p) {
            old.kill();
        }
        Ok(())
    }

    /// Stops a process (`<node>/<name>` for a node's) and forgets it: it is not started again.
    pub(crate) fn remove_process(&self, name: &str) -> Result<()> {
        let mut procs = self
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        if let Some(mut p) = procs.by_name.remove(name) {
            p.kill();
        }
        procs.order.retain(|n| n != name);
        Ok(())
    }

    /// Waits until the API shows the node's Ready condition with `status`.
    pub(crate) async fn wait_ready_status(&self, node: &str, status: &str, timeout: Duration) -> Result<()> {
        let api = Api::<Node>::all(self.client.clone());
        wait::until(&format!("node {node} Ready={status}"), timeout, || {
            let api = api.clone();
            async move {
                let node = api.get(node).await?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"));
                Ok(ready.filter(|c| c.status == status).map(|_| ()))
            }
        })
        .await
    }

    pub(crate) fn index(&self, node: &str) -> Result<usize> {
        self.nodes
            .index(node)
            .ok_or_else(|| Error::UnknownNode(node.to_owned()))
    }

    pub(crate) fn boot_file(&self, node: &str) -> PathBuf {
        boot_file(&self.resources.dir, node)
    }
}

fn boot_file(dir: &Path, node: &str) -> PathBuf {
    dir.join("nodes").join(format!("{node}.boot"))
}

/// Records the moment a node boots (what `btime` in /proc/stat is on a real machine).
pub(crate) fn record_boot(dir: &Path, node: &str) -> Result<()> {
    let path = boot_file(dir, node);
    std::fs::write(&path, jiff::Timestamp::now().to_string()).map_err(io(format!("writing {}", path.display())))
}

/// What starting a node's kubelet takes from its lab.
pub(crate) struct Kubelets<'a> {
    pub resources: &'a Resources,
    pub bins: &'a Binaries,
    pub node_bins: Option<&'a NodeBinaries>,
    pub pki: &'a LabPki,
    pub kubeconfig: &'a Path,
    pub server: &'a str,
    pub lease_seconds: u32,
    /// Imported by real nodes besides the lab's own images.
    pub images: &'a [PathBuf],
}

impl Inner {
    pub(crate) fn kubelets(&self) -> Kubelets<'_> {
        Kubelets {
            resources: &self.resources,
            bins: &self.bins,
            node_bins: self.node_bins.as_ref(),
            pki: &self.pki,
            kubeconfig: &self.kubeconfig,
            server: &self.server,
            lease_seconds: self.config.timings.node_lease_seconds,
            images: &self.config.node_images,
        }
    }
}

impl Kubelets<'_> {
    /// Starts the node's kubelet: kwok for a simulated node, the boot of a real one (its
    /// `<node>/boot` process, which a power-on starts again).
    pub(crate) fn start(&self, spec: &NodeSpec, index: usize) -> Result<()> {
        let (name, resources) = (spec.name.as_str(), self.resources);
        let net = &resources.net;
        record_boot(&resources.dir, name)?;
        if !spec.real {
            let kwok = nodes::kwok(
                self.bins,
                &KwokArgs {
                    node: name,
                    netns: &net.netns(name),
                    kubeconfig: self.kubeconfig,
                    stages: &nodes::stages_file(&resources.dir),
                    ip: net.node_ip(index),
                    pod_cidr: net.pod_cidr(index),
                    lease_seconds: self.lease_seconds,
                },
            );
            return start_process(resources, &format!("{name}/kwok"), kwok);
        }
        let bins = self
            .node_bins
            .ok_or_else(|| Error::Invalid(format!("node {name} is real, but the lab found no real-node binaries")))?;
        let node = RealNode {
            lab: &net.id,
            name,
            pod_cidr: net.pod_cidr(index),
            ip: net.node_ip(index),
            netns: &net.netns(name),
            lab_dir: &resources.dir,
            server: self.server,
            lease_seconds: self.lease_seconds,
            watchdog_device: &crate::watchdog_device::device_path(&resources.dir, name),
        };
        node.prepare(bins, self.pki)?;
        let boot = node.boot(bins, self.images, &resources.dir.join("logs"));
        start_process(resources, &format!("{name}/boot"), boot)
    }
}

pub(crate) fn start_process(resources: &Resources, name: &str, spec: ProcessSpec) -> Result<()> {
    let mut procs = resources
        .processes
        .lock()
        .map_err(|_| Error::Invalid("process table poisoned".into()))?;
    if procs.closed {
        return Ok(());
    }
    let mut p = Supervised::new(name, spec, &resources.dir);
    p.start()?;
    if let Some(mut old) = procs.by_name.insert(name.to_owned(), p) {
        old.kill();
    } else {
        procs.order.push(name.to_owned());
    }
    Ok(())
}

pub(crate) fn process_died(resources: &Resources, name: &str) -> Option<Error> {
    let mut procs = resources.processes.lock().ok()?;
    let p = procs.by_name.get_mut(name)?;
    (!p.running()).then(|| Error::ProcessDied {
        process: name.to_owned(),
        log: p.log.clone(),
        tail: p.log_tail(20),
    })
}

async fn wait_ready(resources: &Resources, client: &Client) -> Result<()> {
    wait::until("kube-apiserver /readyz", Duration::from_secs(90), || async {
        for name in ["etcd", "kube-apiserver"] {
            if let Some(died) = process_died(resources, name) {
                return Err(died);
            }
        }
        Ok(crate::readiness::api_ready(client).await?.then_some(()))
    })
    .await
    .map_err(|e| match e {
        // A process that died says more than the timeout.
        Error::Timeout { .. } => ["etcd", "kube-apiserver"]
            .iter()
            .find_map(|n| process_died(resources, n))
            .unwrap_or(e),
        other => other,
    })
}

/// kwok 0.8 sometimes dies as it starts, of a data race in a library it uses (see
/// `Supervised::died_of_kwok_startup_race`); it keeps no state, so starting it again is all a
/// real kubelet's supervisor would do. Bounded, so a kwok that always dies is still reported.
async fn restart_kwok_after_its_startup_race(inner: Arc<Inner>) {
    const MAX_RESTARTS: usize = 5;
    let mut restarts: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(mut procs) = inner.resources.processes.lock() else {
            return;
        };
        if procs.closed {
            return;
        }
        for (name, p) in procs.by_name.iter_mut() {
            if !name.ends_with("kwok") || !p.died_of_kwok_startup_race() {
                continue;
            }
            let count = restarts.entry(name.clone()).or_default();
            if *count >= MAX_RESTARTS {
                continue;
            }
            *count += 1;
            tracing::warn!(process = %name, restart = *count, "kwok died of its startup race (concurrent map writes); starting it again");
            if let Err(error) = p.start() {
                tracing::warn!(process = %name, %error, "restarting kwok failed");
            }
        }
    }
}

async fn power_cycle_on_expiry(inner: Arc<Inner>, mut expired: mpsc::UnboundedReceiver<(String, u64)>) {
    while let Some((node, power_losses)) = expired.recv().await {
        inner.timeline.record(Event::WatchdogExpired { node: node.clone() });
        tracing::info!(%node, "lab watchdog expired: power-cycling the node");
        let inner = inner.clone();
        tokio::spawn(async move {
            match inner.power_off_on_expiry(&node, power_losses) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(%node, "the node lost its power meanwhile: it stays off");
                    return;
                }
                Err(error) => tracing::warn!(%error, %node, "watchdog power-off failed"),
            }
            if let Err(error) = inner.power_on(&node, "watchdog").await {
                tracing::warn!(%error, %node, "watchdog power-on failed");
            }
        });
    }
}
