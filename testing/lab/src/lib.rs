//! The nodemedic lab: a real Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler built from the upstream modules) with nodes simulated
//! by one kwok each, every node in its own network namespace, ReadWriteOnce storage, a watchdog
//! per node, and faults ([`Fault`], [`Lab::inject`]). Used by every lab test, the demo and the benchmarks.
//!
//! ```no_run
//! # async fn demo() -> nodemedic_lab::Result<()> {
//! let lab = nodemedic_lab::Lab::start(nodemedic_lab::LabConfig::seed()).await?;
//! lab.crash("node-1").await?;
//! # Ok(()) }
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "the lab plays the kubelet, machine providers and other controllers, and writes their objects' statuses as they would; nodemedic's one-status-writer rule is for what nodemedic ships"
)]

mod binaries;
mod bmc;
mod cmd;
mod container;
mod control_plane;
mod cpu_share;
mod crds;
pub mod data_witness;
mod error;
mod fault;
mod faults;
mod fleet;
pub mod kubevirt;
mod lab;
mod lock;
pub mod machines;
mod membership;
mod net;
mod nodes;
mod observer;
mod pki;
pub mod pods;
mod process;
pub mod prometheus;
mod readiness;
pub mod real_node;
pub mod seeds;
mod slow_link;
mod starvation;
pub mod storage;
mod sysrq;
pub mod timeline;
pub mod wait;
mod watchdog;
mod watchdog_device;
pub mod witness;
pub mod workloads;

use std::time::Duration;

pub use binaries::{build_dir, machine_layer_dir, rebalancing_dir, tools_dir, version};
pub use bmc::{Bmc, BmcOptions, PowerDelays, cloud};
pub use container::{Bind, ContainerSpec};
pub use error::{Error, Result};
pub use fault::{Fault, NodeId};
pub use fleet::FLEET_LABEL;
pub use lab::{Lab, preflight};
pub use lock::LabKind;
pub use nodes::NodeSpec;
pub use process::ProcessSpec;
pub use sysrq::SYSRQ_TRIGGER;
pub use timeline::{Event, NodeCondition, PodId, Timeline};
pub use watchdog_device::{ModprobeStandIn, SOFTDOG_IDENTITY, WATCHDOG_DEVICE_IDENTITY, WatchdogDeviceStats};

/// Failure-detection timings of the lab's cluster.
#[derive(Clone, Debug)]
pub struct Timings {
    /// kwok's node lease (renewed every quarter of it).
    pub node_lease_seconds: u32,
    /// kube-controller-manager `--node-monitor-grace-period`: silence before Ready=Unknown.
    pub node_monitor_grace: Duration,
    pub node_monitor_period: Duration,
    /// Default toleration of not-ready/unreachable taints (kube-apiserver flags).
    pub toleration_seconds: u32,
    /// How long a powered-on node takes to boot before its processes run again.
    pub boot_delay: Duration,
    /// Timeout of each node's lab watchdog: its emulated device's until programmed.
    pub watchdog_timeout: Duration,
    /// kube-controller-manager `--attach-detach-reconcile-sync-period`: how long the
    /// attach-detach controller can take to notice a VolumeAttachment deleted by someone else.
    /// Kubernetes' one minute everywhere, so the lab never hides that wait from a remediator.
    pub attach_detach_sync: Duration,
}

impl Timings {
    /// Fast failure detection for tests: Ready=Unknown about 5 s after a node goes silent. Each
    /// second of it is a second of every remediation test; a live node misses it only if its
    /// lease renewals (every second) all stall for 5 s, and a health check acts only once the
    /// Unknown has also lasted its rule's duration.
    pub fn fast() -> Self {
        Self {
            node_lease_seconds: 4,
            node_monitor_grace: Duration::from_secs(5),
            node_monitor_period: Duration::from_secs(1),
            toleration_seconds: 300,
            // No safety argument rests on it, but the fence-agents tests watch a remediation
            // succeed before its node is healthy again: at 1 s the node was back (and the health
            // check deleted the remediation) while fence_ipmilan's power-on still ran.
            boot_delay: Duration::from_secs(3),
            // Fed every second (a third of it): a feeder stalled 2 s power-cycles its node. Self
            // remediation's proven wait is (L + 3W)·(1+ρ)/(1−ρ) + δ, so each second here is three
            // in every remediation; fault campaigns (`make chaos`) show no false fence with it.
            watchdog_timeout: Duration::from_secs(3),
            attach_detach_sync: Duration::from_secs(60),
        }
    }

    /// For fleets of thousands of nodes on one machine: leases renewed every 30 s (a real
    /// kubelet's 10 s would be 500 writes a second at 5,000 nodes), Unknown after 60 s of silence.
    pub fn fleet() -> Self {
        Self {
            node_lease_seconds: 120,
            node_monitor_grace: Duration::from_secs(60),
            node_monitor_period: Duration::from_secs(5),
            ..Self::fast()
        }
    }

    /// Whether a node stays Ready and its watchdog fed through seconds in which another lab
    /// has the CPU: Unknown only after 40 s of silence, a watchdog that waits 30 s or more.
    pub fn tolerate_a_busy_machine(&self) -> bool {
        self.node_monitor_grace >= Duration::from_secs(40) && self.watchdog_timeout >= Duration::from_secs(30)
    }

    /// Kubernetes' own defaults (kubelet lease 40 s, node-monitor grace 50 s), for the demo's
    /// default-timings variant.
    pub fn kubernetes_defaults() -> Self {
        Self {
            node_lease_seconds: 40,
            node_monitor_grace: Duration::from_secs(50),
            node_monitor_period: Duration::from_secs(5),
            toleration_seconds: 300,
            boot_delay: Duration::from_secs(10),
            watchdog_timeout: Duration::from_secs(60),
            attach_detach_sync: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug)]
pub struct LabConfig {
    pub nodes: Vec<NodeSpec>,
    pub timings: Timings,
    /// Pre-created ReadWriteOnce CSI PersistentVolumes.
    pub persistent_volumes: usize,
    /// Run the lab's attacher, mount gate and volume reporting.
    pub storage: bool,
    /// A Redfish and an IPMI BMC per node on the management bridge, whose power off and on
    /// are the node's (see [`Lab::bmc`]).
    pub bmcs: Option<BmcOptions>,
    /// Fleet nodes (`fleet-00001`...) managed by one kwok on the host, for scale measurements.
    pub fleet: usize,
    /// No other lab runs beside this one, whatever its timings: benchmarks measure the machine.
    pub alone: bool,
    /// OCI archives every real node's containerd imports at boot, besides the lab's own pause
    /// and writer images (nothing can be pulled): e.g. nodemedic's, for `helm install`.
    pub node_images: Vec<std::path::PathBuf>,
    /// The Pod Security level (`baseline`, `restricted`) the API server enforces in namespaces
    /// that have no level of their own, as a hardened cluster's admission configuration does.
    pub pod_security: Option<&'static str>,
    /// Real nodes enforce NetworkPolicies: kube-network-policies (kubernetes-sigs' reference
    /// implementation, built by scripts/build-node.sh) runs beside each one's kube-proxy. The
    /// bridge CNI plugin alone enforces none. See docs/real-nodes.md for what it costs.
    pub network_policies: bool,
}

impl LabConfig {
    pub fn new(nodes: Vec<NodeSpec>) -> Self {
        Self {
            nodes,
            timings: Timings::fast(),
            persistent_volumes: 8,
            storage: true,
            bmcs: None,
            fleet: 0,
            alone: false,
            node_images: Vec::new(),
            pod_security: None,
            network_policies: false,
        }
    }

    /// `count` fleet nodes and nothing else: no namespaced nodes, no storage.
    pub fn fleet(count: usize) -> Self {
        Self {
            nodes: Vec::new(),
            timings: Timings::fleet(),
            persistent_volumes: 0,
            storage: false,
            bmcs: None,
            fleet: count,
            alone: false,
            node_images: Vec::new(),
            pod_security: None,
            network_policies: false,
        }
    }

    /// The seed topology: three nodes, each control-plane and worker.
    pub fn seed() -> Self {
        Self::new(
            (1..=3)
                .map(|i| NodeSpec::control_plane_worker(&format!("node-{i}")))
                .collect(),
        )
    }

    /// `count` worker nodes.
    pub fn workers(count: usize) -> Self {
        Self::new((1..=count).map(|i| NodeSpec::worker(&format!("node-{i}"))).collect())
    }

    /// The kinds of lab this one counts as, whose locks it holds (see [`LabKind`]).
    pub fn kinds(&self) -> &'static [LabKind] {
        if self.alone {
            // In this order wherever both are taken, so two labs never wait on each other.
            &[LabKind::ShortTimingsAlone, LabKind::TolerantAlone]
        } else if self.fleet > 0 {
            // One kwok renewing thousands of leases keeps a core busy on its own.
            &[LabKind::ShortTimingsAlone]
        } else if self.timings.tolerate_a_busy_machine() {
            &[LabKind::Tolerant]
        } else {
            &[LabKind::ShortTimings]
        }
    }

    /// Keeps every other lab off the machine while this one runs.
    pub fn alone(mut self) -> Self {
        self.alone = true;
        self
    }

    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    pub fn with_bmcs(mut self, bmcs: BmcOptions) -> Self {
        self.bmcs = Some(bmcs);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleets_and_benchmarks_keep_short_timings_labs_off_the_machine() {
        assert_eq!(LabConfig::seed().kinds(), [LabKind::ShortTimings]);
        assert_eq!(LabConfig::fleet(100).kinds(), [LabKind::ShortTimingsAlone]);
        let defaults = LabConfig::seed().with_timings(Timings::kubernetes_defaults());
        assert_eq!(defaults.kinds(), [LabKind::Tolerant]);
        // A benchmark holds every lock, in the one order every lab takes them.
        assert_eq!(
            defaults.alone().kinds(),
            [LabKind::ShortTimingsAlone, LabKind::TolerantAlone]
        );
    }
}
