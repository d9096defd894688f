//! A real node's configuration files: the kubelet's, containerd's, kube-proxy's and the CNI
//! network's. Each setting that is not a default says why.

use std::path::Path;

use super::{NodeBinaries, PAUSE_IMAGE, RealNode};
use crate::net::POD_NETWORKS;

/// The kernel tunables the kubelet checks (`protectKernelDefaults`), with the values it expects.
/// The kernel is the machine's, shared by every node and the host: each node's boot binds files
/// holding these values over the /proc/sys entries in its own mount namespace, so the kubelet
/// finds what it wants and the host keeps its own (`kernel.panic_on_oops=1` would make any oops
/// reboot the machine).
pub(crate) const KERNEL_TUNABLES: [(&str, u32); 6] = [
    ("vm.overcommit_memory", 1),
    ("vm.panic_on_oom", 0),
    ("kernel.panic", 10),
    ("kernel.panic_on_oops", 1),
    ("kernel.keys.root_maxkeys", 1_000_000),
    ("kernel.keys.root_maxbytes", 25_000_000),
];

pub(super) fn kubelet(node: &RealNode<'_>, client_ca: &Path) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The machine's cgroups are v1 (hybrid), and PID 1 is not systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
# Its own root: kubelets sharing one would collect each other's pod cgroups.
cgroupRoot: {cgroup}
# No CAP_SYS_RESOURCE here: lowering an oom_score_adj fails (containerd restricts its own too).
oomScoreAdj: 0
protectKernelDefaults: true
address: {ip}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
podLogsDir: /var/log/pods
# Else the kubelet creates the default under /usr/libexec on the host.
volumePluginDir: /var/lib/kubelet/volume-plugins
providerID: lab://{name}
nodeLeaseDurationSeconds: {lease}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
failSwapOn: false
serializeImagePulls: false
# The disk and memory are the machine's, shared by every node: evicting for them would evict
# for the whole machine's use, not this node's.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 50
"#,
        cgroup = node.cgroup(),
        ip = node.ip,
        name = node.name,
        lease = node.lease_seconds,
        ca = client_ca.display(),
    )
}

pub(super) fn containerd(node: &RealNode<'_>, bins: &NodeBinaries) -> String {
    let dir = node.dir();
    let runtime = "plugins.'io.containerd.cri.v1.runtime'";
    format!(
        r#"version = 3
# Images and snapshots on the node's disk (a boot keeps them); the state, sockets and runc's
# root on the tmpfs the boot mounts, so a power-off leaves none behind.
root = "{root}"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[{runtime}]
  # No CAP_SYS_RESOURCE on this machine: a sandbox asking for a lower score fails to start.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "/run/containerd/runc"
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = ["{bin}"]
  conf_dir = "{cni}"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.nri.v1.nri']
  disable = true
"#,
        root = dir.join("containerd").display(),
        runc = bins.runc.display(),
        bin = bins.bin.display(),
        cni = dir.join("cni/net.d").display(),
    )
}

pub(super) fn kube_proxy(node: &RealNode<'_>) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: {name}
clusterCIDR: {POD_NETWORKS}
clientConnection:
  kubeconfig: {kubeconfig}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# The conntrack table's size and timeouts are the machine's, shared by every node: zero leaves
# them alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        name = node.name,
        kubeconfig = node.dir().join("kube-proxy.kubeconfig").display(),
    )
}

/// A bridge in the node's namespace, its pods addressed from the node's pod network; the lab
/// routes the other nodes' pod networks to each node (no overlay).
pub(super) fn cni(subnet: &str) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "lab",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{ "subnet": "{subnet}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}],
        "dataDir": "/var/lib/cni/networks"
      }}
    }},
    {{ "type": "portmap", "capabilities": {{ "portMappings": true }} }}
  ]
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cni_network_is_valid_json() {
        let conf: serde_json::Value = serde_json::from_str(&cni("10.64.64.192/26")).expect("json");
        assert_eq!(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.64.64.192/26");
    }
}
