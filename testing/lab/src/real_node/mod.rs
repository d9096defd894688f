//! Real nodes: a kubelet, kube-proxy and containerd (with runc and the CNI plugins) in the node's
//! network namespace, a mount namespace of their own and a cgroup subtree of their own, running
//! real pods from images imported into the node's containerd. A real node shares a lab with
//! kwok nodes, and every fault means the same on it: power is its cgroup ([`cgroup`]), freezing
//! is the freezer's, its links are the same veth.
//!
//! What this machine makes different from a production node, and what each setting below is for,
//! is in docs/real-nodes.md.

pub(crate) mod cgroup;
mod config;
pub(crate) mod csi;
pub(crate) mod network_policies;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams},
};

use crate::{Error, Result, binaries, error::io, net::Network, pki::LabPki, process::ProcessSpec};

const BOOT: &str = include_str!("boot.sh");

/// The image every pod's sandbox runs, built by scripts/build-node.sh (nothing can be pulled).
pub const PAUSE_IMAGE: &str = "lab.nodemedic.io/pause:1";
/// The stateful workload's image: appends synced records to its volume (see
/// testing/lab/node-images/writer).
pub const WRITER_IMAGE: &str = "lab.nodemedic.io/writer:1";

/// Devices and files of the host that a privileged pod of a real node would reach: containerd
/// gives a privileged container every device node and an unmasked /proc.
const UNSAFE_ON_THE_HOST: [(&str, &str); 2] = [
    ("/dev/watchdog", "arming it would reboot the machine"),
    ("/proc/sysrq-trigger", "writing b to it reboots the machine"),
];

/// Refuses a host where a real node's privileged pod could reboot the machine.
pub(crate) fn refuse_unsafe_host() -> Result<()> {
    refuse_unsafe(Path::new("/"))
}

fn refuse_unsafe(root: &Path) -> Result<()> {
    for (path, why) in UNSAFE_ON_THE_HOST {
        if root.join(path.trim_start_matches('/')).exists() {
            return Err(Error::UnsafeHost { path: path.into(), why });
        }
    }
    let dev = root.join("dev");
    let numbered = std::fs::read_dir(&dev)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| {
            name.strip_prefix("watchdog")
                .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))
        });
    match numbered {
        Some(name) => Err(Error::UnsafeHost {
            path: format!("/dev/{name}"),
            why: "arming it would reboot the machine",
        }),
        None => Ok(()),
    }
}

/// The machine's directories each real node has its own of (bound over the host's in its mount
/// namespace), and where in the node's lab directory: what the kubelet, containerd and the CNI
/// plugins hard-code, and the hostPaths pods use (nodemedic's agent's among them). The node's own
/// `/lib/modules` is empty: an agent pod's modprobe finds no module to load into the machine's
/// kernel (the lab's device is at its /dev/watchdog, so it never tries).
const MACHINE_DIRECTORIES: [(&str, &str); 6] = [
    ("/var/lib/kubelet", "kubelet"),
    ("/var/lib/cni", "cni-state"),
    ("/var/log/pods", "pod-logs"),
    ("/var/log/containers", "container-logs"),
    ("/var/lib/nodemedic", "nodemedic"),
    ("/lib/modules", "modules"),
];

/// What a program on a node keys by the kernel's boot_id, so that a boot makes it stale. A
/// machine's boot gives its kernel a new boot_id; the lab's real nodes share the host's kernel,
/// whose boot_id never changes, so the lab's boot removes these instead. nodemedic's agent keys
/// its licence record so: a later agent process of the same boot inherits a lapsed licence and
/// fences at once, which on a lab node would reset every boot again.
const BOOT_KEYED: [&str; 1] = ["/var/lib/nodemedic/licence.json"];

/// Removes what [`BOOT_KEYED`] names on the real node (`lab_dir`: the lab's directory), as its
/// new boot_id would make it stale.
pub(crate) fn forget_the_last_boot(lab_dir: &Path, node: &str) -> Result<()> {
    let node_dir = lab_dir.join("nodes").join(node);
    for path in BOOT_KEYED.iter().filter_map(|p| on_the_host(&node_dir, p)) {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::Invalid(format!("removing {}: {e}", path.display())));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where a path of a real node's machine is on the host (`node_dir` is the node's lab
/// directory), if it is under one of the node's own directories.
fn on_the_host(node_dir: &Path, path: &str) -> Option<PathBuf> {
    MACHINE_DIRECTORIES.iter().find_map(|(machine, own)| {
        let rest = path.strip_prefix(machine)?;
        (rest.is_empty() || rest.starts_with('/')).then(|| node_dir.join(own).join(rest.trim_start_matches('/')))
    })
}

impl crate::Lab {
    /// Where `path` of the real node's machine (a hostPath its pods write, e.g. under
    /// /var/lib/nodemedic) is on the host, to read what the node wrote, also while it is off.
    pub fn node_host_path(&self, node: &str, path: &str) -> Result<PathBuf> {
        self.inner.index(node)?;
        if !self.inner.nodes.is_real(node) {
            return Err(Error::Invalid(format!(
                "node {node} is not real: it has no machine directories"
            )));
        }
        let dir = self.dir().join("nodes").join(node);
        on_the_host(&dir, path).ok_or_else(|| {
            Error::Invalid(format!(
                "{path} is not under a real node's own directories ({})",
                MACHINE_DIRECTORIES.map(|(machine, _)| machine).join(", ")
            ))
        })
    }

    /// Every process of the real node (its pods' too), by its cgroup: none while it is off.
    pub fn node_processes(&self, node: &str) -> Result<Vec<i32>> {
        self.inner.index(node)?;
        Ok(cgroup::pids(&cgroup::path(self.id(), node)))
    }
}

/// The executables and images a real node runs.
#[derive(Clone, Debug)]
pub(crate) struct NodeBinaries {
    kubelet: PathBuf,
    kube_proxy: PathBuf,
    /// containerd, its shim, ctr and the CNI plugins (the CNI bin dir too).
    bin: PathBuf,
    runc: PathBuf,
    images: Vec<PathBuf>,
    /// kube-network-policies, when the lab enforces NetworkPolicies.
    network_policies: Option<PathBuf>,
}

/// Where scripts/build-node.sh puts containerd, the CNI plugins and the node images.
pub fn node_dir() -> PathBuf {
    binaries::cache_dir().join("bin").join(format!(
        "node-containerd-v{}-cni-v{}",
        binaries::version("CONTAINERD_VERSION"),
        binaries::version("CNI_PLUGINS_VERSION")
    ))
}

impl NodeBinaries {
    /// The lab CSI driver's registrar.
    pub(crate) fn csi_registrar(&self) -> PathBuf {
        self.bin.join("csi-registrar")
    }

    /// Finds everything (kube-network-policies too when `network_policies`), or says what is
    /// missing and how to build it.
    pub(crate) fn locate(network_policies: bool) -> Result<Self> {
        Self::locate_in(node_dir(), &binaries::build_dir(), network_policies)
    }

    fn locate_in(bin: PathBuf, control_plane: &Path, network_policies: bool) -> Result<Self> {
        let missing = |what: &str, looked: &Path| Error::MissingNodePart {
            what: what.into(),
            looked: looked.display().to_string(),
        };
        let executable = |dir: &Path, name: &str| {
            let path = dir.join(name);
            binaries::is_executable(&path)
                .then_some(path)
                .ok_or_else(|| missing(name, dir))
        };
        for part in [
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "bridge",
            "host-local",
            "loopback",
            "portmap",
            "csi-registrar",
        ] {
            executable(&bin, part)?;
        }
        let images = ["pause.oci.tar", "writer.oci.tar"].map(|archive| bin.join(archive));
        if let Some(absent) = images.iter().find(|p| !p.is_file()) {
            return Err(missing("the pause and writer images", absent));
        }
        let runc = binaries::tool("runc").map_err(|_| missing("runc (Debian's package)", Path::new("/usr/sbin")))?;
        let network_policies = network_policies
            .then(|| {
                let path = network_policies::executable(&bin);
                binaries::is_executable(&path)
                    .then_some(path)
                    .ok_or_else(|| missing("kube-network-policies", &bin))
            })
            .transpose()?;
        Ok(Self {
            kubelet: executable(control_plane, "kubelet")?,
            kube_proxy: executable(control_plane, "kube-proxy")?,
            bin,
            runc,
            images: images.to_vec(),
            network_policies,
        })
    }
}

/// One real node's place in its lab.
#[derive(Clone, Debug)]
pub(crate) struct RealNode<'a> {
    pub lab: &'a str,
    pub name: &'a str,
    /// Its pods' addresses (a /26 of the lab's pod networks).
    pub pod_cidr: String,
    pub ip: Ipv4Addr,
    pub netns: &'a str,
    /// The lab's directory (the node's files are under nodes/<name>/).
    pub lab_dir: &'a Path,
    pub server: &'a str,
    pub lease_seconds: u32,
    /// The node's emulated watchdog device (served by the lab), its /dev/watchdog.
    pub watchdog_device: &'a Path,
}

impl RealNode<'_> {
    /// The node's disk: what survives its power-off (its kubelet's and containerd's state, its
    /// pods' hostPaths).
    pub(crate) fn dir(&self) -> PathBuf {
        self.lab_dir.join("nodes").join(self.name)
    }

    pub(crate) fn cgroup(&self) -> String {
        cgroup::path(self.lab, self.name)
    }

    /// Writes the node's configuration and credentials (once, at lab start).
    pub(crate) fn prepare(&self, bins: &NodeBinaries, pki: &LabPki) -> Result<()> {
        let dir = self.dir();
        for sub in ["sysctl", "cni/net.d", "imported"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io(format!("creating {}", dir.join(sub).display())))?;
        }
        let kubelet_user = format!("{}-kubelet", self.name);
        pki.issue_client(&kubelet_user, &format!("system:node:{}", self.name), &["system:nodes"])?;
        pki.kubeconfig(&kubelet_user, self.server, &dir.join("kubelet.kubeconfig"))?;
        let proxy_user = format!("{}-kube-proxy", self.name);
        pki.issue_client(&proxy_user, "system:kube-proxy", &[])?;
        pki.kubeconfig(&proxy_user, self.server, &dir.join("kube-proxy.kubeconfig"))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))
        };
        write("kubelet.yaml", config::kubelet(self, &pki.path("ca.crt")))?;
        write("containerd.toml", config::containerd(self, bins))?;
        write("kube-proxy.yaml", config::kube_proxy(self))?;
        write("cni/net.d/10-lab.conflist", config::cni(&self.pod_cidr))?;
        for (entry, value) in config::KERNEL_TUNABLES {
            write(&format!("sysctl/{entry}"), format!("{value}\n"))?;
        }
        if bins.network_policies.is_some() {
            network_policies::credentials(self, pki)?;
        }
        Ok(())
    }

    /// The node's boot: its `<node>/boot` process, started at every power-on.
    pub(crate) fn boot(&self, bins: &NodeBinaries, more_images: &[PathBuf], logs: &Path) -> ProcessSpec {
        let dir = self.dir();
        let binds = MACHINE_DIRECTORIES
            .map(|(machine, own)| format!("{}={machine}", dir.join(own).display()))
            .join(" ");
        let sysctls = config::KERNEL_TUNABLES
            .iter()
            .map(|(entry, _)| {
                format!(
                    "{}={}",
                    dir.join("sysctl").join(entry).display(),
                    entry.replace('.', "/")
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        let kubelet_args = [
            format!("--config={}", dir.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", dir.join("kubelet.kubeconfig").display()),
            "--root-dir=/var/lib/kubelet".into(),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip),
            "--v=1".into(),
        ]
        .join(" ");
        let paths = |images: &[PathBuf]| {
            images
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let netns = format!("--net=/run/netns/{}", self.netns);
        ProcessSpec::new(
            "nsenter",
            [
                netns.as_str(),
                "--",
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "--",
                "/bin/sh",
                "-c",
                BOOT,
                "nodemedic-node-boot",
            ],
        )
        .env("NODE", self.name)
        .env("NODE_DIR", dir.display().to_string())
        .env("NODE_BIN", bins.bin.display().to_string())
        .env("CGROUP", self.cgroup())
        .joining_its_own_cgroup()
        .env(
            "CGROUP_LOCK",
            self.lab_dir.join("nodes").join("cgroup.lock").display().to_string(),
        )
        .env("WATCHDOG_DEVICE", self.watchdog_device.display().to_string())
        .env("LOGS", logs.display().to_string())
        .env("BINDS", binds)
        .env("SYSCTLS", sysctls)
        .env("BOOT_IMAGES", paths(&bins.images))
        .env("IMAGES", paths(more_images))
        .env("CONTAINERD_CONFIG", dir.join("containerd.toml").display().to_string())
        .env("KUBE_PROXY_CONFIG", dir.join("kube-proxy.yaml").display().to_string())
        .env("KUBELET_ARGS", kubelet_args)
        .env(
            "NETWORK_POLICIES",
            bins.network_policies
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        )
        .env("NETWORK_POLICIES_ARGS", network_policies::args(self))
        .env(
            "PATH",
            format!(
                "{}:/usr/sbin:/usr/bin:/sbin:/bin",
                path_of(&[&bins.kubelet, &bins.kube_proxy, &bins.runc])
            ),
        )
    }
}

/// Routes pods between real nodes: every `joining` node's pod network from the host and every
/// other real node, and every other real node's into the joining ones (`all` holds both).
pub(crate) fn route_pods(net: &Network, all: &[(String, usize)], joining: &[(String, usize)]) -> Result<()> {
    let is_joining = |node: &str| joining.iter().any(|(name, _)| name == node);
    for (node, index) in all {
        if is_joining(node) {
            net.forward_pods(node, *index)?;
        }
        let from: Vec<&str> = all
            .iter()
            .map(|(other, _)| other.as_str())
            .filter(|other| other != node && (is_joining(node) || is_joining(other)))
            .collect();
        net.route_pods_from(*index, &from)?;
    }
    Ok(())
}

/// The `kubernetes` Service's endpoint, which real pods reach the API server through. The lab's
/// API server runs without its endpoint reconciler (there is one API server, and it is stopped
/// and started on purpose), so the lab publishes it.
pub(crate) async fn publish_api_endpoint(client: &Client, ip: Ipv4Addr, port: u16) -> Result<()> {
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            name: Some("kubernetes".into()),
            labels: Some(
                [
                    ("kubernetes.io/service-name", "kubernetes"),
                    ("endpointslice.kubernetes.io/managed-by", "lab.nodemedic.io"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![EndpointPort {
            name: Some("https".into()),
            port: Some(i32::from(port)),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    };
    Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .patch(
            "kubernetes",
            &PatchParams::apply("nodemedic-lab").force(),
            &Patch::Apply(&slice),
        )
        .await?;
    Ok(())
}

/// The stamp a node's boot leaves once it imported `archive` (as it is now).
fn import_stamp(node_dir: &Path, archive: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(archive).ok()?;
    let name = archive.file_name()?.to_string_lossy().into_owned();
    Some(
        node_dir
            .join("imported")
            .join(format!("{name}.{}-{}", meta.size(), meta.mtime())),
    )
}

impl crate::Lab {
    /// Waits until every real node has imported every image of `LabConfig::node_images` (a node
    /// imports them while its kubelet registers, so it is Ready before they are in).
    pub async fn wait_node_images(&self, timeout: std::time::Duration) -> Result<()> {
        let nodes: Vec<String> = self
            .nodes()
            .into_iter()
            .filter(|n| self.inner.nodes.is_real(n))
            .collect();
        let images = self.inner.config.node_images.clone();
        crate::wait::until("every real node's images imported", timeout, || {
            let missing: Vec<String> = nodes
                .iter()
                .flat_map(|node| {
                    let dir = self.dir().join("nodes").join(node);
                    images
                        .iter()
                        .filter(move |archive| !import_stamp(&dir, archive).is_some_and(|stamp| stamp.exists()))
                        .map(move |archive| format!("{node}: {}", archive.display()))
                })
                .collect();
            async move { Ok(missing.is_empty().then_some(())) }
        })
        .await
    }
}

/// The directories of these executables, for PATH.
fn path_of(executables: &[&Path]) -> String {
    let mut dirs: Vec<String> = Vec::new();
    for dir in executables.iter().filter_map(|e| e.parent()) {
        let dir = dir.display().to_string();
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_path_is_found_under_the_node_s_own_directory_only() {
        let dir = Path::new("/labs/x/nodes/node-1");
        assert_eq!(
            on_the_host(dir, "/var/lib/nodemedic/writer/records"),
            Some(dir.join("nodemedic/writer/records"))
        );
        assert_eq!(on_the_host(dir, "/var/lib/kubelet"), Some(dir.join("kubelet/")));
        assert_eq!(on_the_host(dir, "/var/lib/nodemedic-other"), None);
        assert_eq!(on_the_host(dir, "/etc/passwd"), None);
    }

    #[test]
    fn a_missing_part_is_named_with_the_script_that_builds_it() {
        let empty = tempfile::tempdir().expect("tempdir");
        let missing = NodeBinaries::locate_in(empty.path().to_owned(), empty.path(), false).expect_err("nothing built");
        let said = missing.to_string();
        assert!(
            said.contains("containerd") && said.contains("scripts/setup.sh later"),
            "{said}"
        );
    }

    /// Needs root (a mount namespace, a cgroup), as every lab does.
    #[test]
    fn a_boot_that_cannot_make_the_node_s_directories_stops_and_says_which() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let not_a_directory = scratch.path().join("file");
        std::fs::write(&not_a_directory, "").expect("file");
        let lab = format!("unit-{}", std::process::id());
        let live = crate::lock::LiveLabDir::new(&lab);
        let output = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "slave", "--", "/bin/sh", "-c", BOOT, "boot"])
            .env("NODE", "node-x")
            .env("NODE_DIR", scratch.path())
            .env("CGROUP_LOCK", scratch.path().join("cgroup.lock"))
            .env("WATCHDOG_DEVICE", &not_a_directory)
            .env("CGROUP", cgroup::path(&lab, "node-x"))
            .env(
                "BINDS",
                format!("{}=/var/lib/kubelet", not_a_directory.join("kubelet").display()),
            )
            .env("SYSCTLS", "")
            .output()
            .expect("runs");
        let refused = String::from_utf8_lossy(&output.stderr);
        let shares = |path: String| {
            std::fs::read_to_string(format!("/sys/fs/cgroup/cpu{path}/cpu.shares")).map(|s| s.trim().to_owned())
        };
        let weights = (
            shares(cgroup::lab_path(&lab)),
            shares(cgroup::path(&lab, "node-x")),
            shares(format!("{}/system", cgroup::path(&lab, "node-x"))),
        );
        cgroup::remove(&cgroup::lab_path(&lab)).expect("the empty cgroup goes");
        drop(live);
        // The levels above the node weigh eight busy threads; the nodes share them evenly; the
        // node's own processes run beside its pods, not at its level.
        assert_eq!(
            (
                weights.0.expect("the lab's weight"),
                weights.1.expect("the node's weight"),
                weights.2.expect("the node's own processes' weight")
            ),
            ("8192".to_owned(), "1024".to_owned(), "1024".to_owned())
        );
        assert_eq!(output.status.code(), Some(125), "{refused}");
        assert!(
            refused.contains("node node-x cannot boot") && refused.contains("file/kubelet"),
            "{refused}"
        );
    }

    #[test]
    fn a_host_with_a_watchdog_or_sysrq_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("dev")).expect("dev");
        std::fs::create_dir_all(root.path().join("proc")).expect("proc");
        refuse_unsafe(root.path()).expect("nothing to reach");
        std::fs::write(root.path().join("dev/watchdog1"), "").expect("device");
        let refused = refuse_unsafe(root.path()).expect_err("a numbered watchdog");
        assert!(refused.to_string().contains("/dev/watchdog1"), "{refused}");
        std::fs::remove_file(root.path().join("dev/watchdog1")).expect("rm");
        std::fs::write(root.path().join("proc/sysrq-trigger"), "").expect("trigger");
        let refused = refuse_unsafe(root.path()).expect_err("sysrq");
        assert!(refused.to_string().contains("/proc/sysrq-trigger"), "{refused}");
        assert!(refused.to_string().contains("only kwok nodes"), "{refused}");
    }
}
