//! A lab's nodes: the Node object, and for a simulated node the kwok process that is its
//! kubelet (a real node's kubelet is in [`crate::real_node`]).

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use k8s_openapi::{
    api::core::v1::{Node, NodeStatus, NodeSystemInfo},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::api::ObjectMeta;
use nodemedic_api::names::labels;

use crate::{binaries::Binaries, process::ProcessSpec};

pub(crate) const KWOK_STAGES: &str = include_str!("../kwok/stages.yaml");
/// On a Node whose disk the lab filled: its kwok reports DiskPressure (see the stages).
pub(crate) const DISK_FULL_ANNOTATION: &str = "lab.nodemedic.io/disk-full";

/// Where the lab writes [`KWOK_STAGES`] at start, for every node's kwok.
pub(crate) fn stages_file(dir: &Path) -> PathBuf {
    dir.join("kwok-stages.yaml")
}

/// One node of a lab.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// A real kubelet, containerd and pods instead of kwok (see [`crate::real_node`]).
    pub real: bool,
}

impl NodeSpec {
    pub fn worker(name: &str) -> Self {
        let mut spec = Self {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            real: false,
        };
        spec.labels.insert(labels::ROLE_WORKER.into(), String::new());
        spec
    }

    /// The seed topology's node: control-plane and worker at once, with all three role labels
    /// (the seed manifests select on each of them).
    pub fn control_plane_worker(name: &str) -> Self {
        let mut spec = Self::worker(name);
        spec.labels.insert(labels::ROLE_MASTER.into(), String::new());
        spec.labels.insert(labels::ROLE_CONTROL_PLANE.into(), String::new());
        spec
    }

    /// A node with no role label at all, as on plain Kubernetes.
    pub fn plain(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            real: false,
        }
    }

    /// The same node, real: a kubelet and containerd that run its pods.
    pub fn real(mut self) -> Self {
        self.real = true;
        self
    }
}

/// The node's machine, as a cloud provider names it in `spec.providerID`: what the lab's machine
/// layer matches Machines to nodes by.
pub(crate) fn provider_id(node: &str) -> String {
    format!("{PROVIDER_ID_SCHEME}{node}")
}

pub(crate) const PROVIDER_ID_SCHEME: &str = "lab://";

/// The Node a lab creates before the node's kubelet starts. A real kubelet registers into it
/// (keeping its role labels, which a kubelet may not set on itself) and reports its own status.
pub(crate) fn node_object(spec: &NodeSpec, kubernetes_version: &str) -> Node {
    let mut node_labels = spec.labels.clone();
    for (k, v) in [
        (labels::HOSTNAME, spec.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("type", if spec.real { "real" } else { "kwok" }),
    ] {
        node_labels.insert(k.into(), v.into());
    }
    let kwok = [("node.alpha.kubernetes.io/ttl", "0"), ("kwok.x-k8s.io/node", "fake")];
    // The attach-detach controller manages this node's volumes (a real kubelet says so itself).
    let attach = [("volumes.kubernetes.io/controller-managed-attach-detach", "true")];
    let annotations = attach
        .into_iter()
        .chain(kwok.into_iter().filter(|_| !spec.real))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let resources: BTreeMap<String, Quantity> = [("cpu", "32"), ("memory", "256Gi"), ("pods", "110")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(node_labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(provider_id(&spec.name)),
            ..Default::default()
        }),
        status: (!spec.real).then(|| NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            node_info: Some(NodeSystemInfo {
                kubelet_version: format!("v{kubernetes_version}"),
                operating_system: "linux".into(),
                architecture: "amd64".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

pub(crate) struct KwokArgs<'a> {
    pub node: &'a str,
    pub netns: &'a str,
    pub kubeconfig: &'a Path,
    pub stages: &'a Path,
    pub ip: Ipv4Addr,
    pub pod_cidr: String,
    pub lease_seconds: u32,
}

pub(crate) fn kwok(bins: &Binaries, a: &KwokArgs<'_>) -> ProcessSpec {
    let mut spec = ProcessSpec::new(
        &bins.kwok,
        [
            format!("--kubeconfig={}", a.kubeconfig.display()),
            format!("--config={}", a.stages.display()),
            format!("--manage-single-node={}", a.node),
            format!("--node-ip={}", a.ip),
            format!("--node-name={}", a.node),
            format!("--cidr={}", a.pod_cidr),
            format!("--node-lease-duration-seconds={}", a.lease_seconds),
        ],
    );
    spec.netns = Some(a.netns.to_owned());
    spec
}
