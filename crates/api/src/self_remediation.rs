//! `self-node-remediation.medik8s.io/v1alpha1`: SelfNodeRemediation, its template, and the
//! operator-wide SelfNodeRemediationConfig.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;

/// The one SelfNodeRemediationConfig the operator reads, in its own namespace.
pub const CONFIG_NAME: &str = "self-node-remediation-config";
pub const AUTOMATIC_TEMPLATE_NAME: &str = "self-node-remediation-automatic-strategy-template";
pub const RESOURCE_DELETION_TEMPLATE_NAME: &str = "self-node-remediation-resource-deletion-template";

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RemediationStrategy {
    /// OutOfServiceTaint where the cluster supports it (Kubernetes >= 1.28), else ResourceDeletion.
    #[default]
    Automatic,
    /// Force-delete the node's pods and delete its VolumeAttachments.
    ResourceDeletion,
    /// Add the node.kubernetes.io/out-of-service taint (and force-delete the pods).
    OutOfServiceTaint,
}

/// Asks the node's own agent to fence it, and the manager to recover its workloads once that is
/// proven.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "self-node-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "SelfNodeRemediation",
    plural = "selfnoderemediations",
    shortname = "snr",
    shortname = "snremediation",
    namespaced,
    status = "SelfNodeRemediationStatus",
    derive = "PartialEq",
    doc = "SelfNodeRemediation fences a node through its own agent and watchdog, then recovers its workloads.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Strategy", type_ = "string", json_path = ".spec.remediationStrategy"),
    printcolumn(
        name = "Assumed-Rebooted",
        type_ = "date",
        json_path = ".status.timeAssumedRebooted",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SelfNodeRemediationSpec {
    #[serde(default)]
    pub remediation_strategy: RemediationStrategy,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SelfNodeRemediationStatus {
    /// Fencing-Started, Pre-Reboot-Completed, Reboot-Completed or Fencing-Completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When the workloads may be recovered: fencing is proven by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_assumed_rebooted: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// nodemedic: agents (by node) that recorded they refuse to vote for this node any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_by: Option<Vec<String>>,
    /// nodemedic: the strategy actually applied (Automatic resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_strategy: Option<RemediationStrategy>,
    /// nodemedic: when the safe-time wait began, on the API server's clock, so a new leader
    /// continues it instead of starting again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_started_at: Option<Time>,
    /// nodemedic: the membership epoch the acceptance quorum was counted in; a membership change
    /// during the wait makes it start again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership_epoch: Option<i64>,
}

/// The phases medik8s SNR reports, in order.
pub mod phases {
    pub const FENCING_STARTED: &str = "Fencing-Started";
    pub const PRE_REBOOT_COMPLETED: &str = "Pre-Reboot-Completed";
    pub const REBOOT_COMPLETED: &str = "Reboot-Completed";
    pub const FENCING_COMPLETED: &str = "Fencing-Completed";
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "self-node-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "SelfNodeRemediationTemplate",
    plural = "selfnoderemediationtemplates",
    shortname = "snrt",
    shortname = "snremediationtemplate",
    shortname = "snrtemplate",
    namespaced,
    status = "TemplateStatus",
    derive = "PartialEq",
    doc = "SelfNodeRemediationTemplate is what a NodeHealthCheck copies into each SelfNodeRemediation it creates.",
    printcolumn(
        name = "Strategy",
        type_ = "string",
        json_path = ".spec.template.spec.remediationStrategy"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct SelfNodeRemediationTemplateSpec {
    pub template: SelfNodeRemediationTemplateResource,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SelfNodeRemediationTemplateResource {
    pub spec: SelfNodeRemediationSpec,
}

/// Status a template kind may carry (nodemedic writes conditions here).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

/// Operator-wide settings for self remediation; a change re-creates the agent DaemonSet.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "self-node-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "SelfNodeRemediationConfig",
    plural = "selfnoderemediationconfigs",
    shortname = "snrc",
    shortname = "snrconfig",
    namespaced,
    status = "SelfNodeRemediationConfigStatus",
    derive = "PartialEq",
    doc = "SelfNodeRemediationConfig holds the agents' timings, watchdog and peer settings.",
    printcolumn(name = "Watchdog", type_ = "string", json_path = ".spec.watchdogFilePath"),
    printcolumn(name = "Safe-Time", type_ = "integer", json_path = ".status.minimumSafeTimeSeconds"),
    printcolumn(name = "Agents", type_ = "integer", json_path = ".status.registeredAgents"),
    printcolumn(name = "Epoch", type_ = "integer", json_path = ".status.membershipEpoch", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name == 'self-node-remediation-config'")
        .message("the SelfNodeRemediationConfig must be named self-node-remediation-config; nodemedic reads only that one")
)]
#[serde(rename_all = "camelCase")]
pub struct SelfNodeRemediationConfigSpec {
    /// The watchdog device the agents open: an absolute path such as /dev/watchdog, without ..
    /// components (anything else is refused). When it cannot be opened an agent falls back to a
    /// softdog device (loading the softdog module when there is none), then (with
    /// isSoftwareRebootEnabled) to a software reboot driven by its own timer, and otherwise
    /// reports that its node cannot be self-remediated.
    #[serde(default = "defaults::watchdog_file_path")]
    #[schemars(length(min = 1))]
    #[x_kube(validation = crate::schema::watchdog_file_path_rule())]
    pub watchdog_file_path: String,

    /// nodemedic: the timeout the agents program into their watchdog device (WDIOC_SETTIMEOUT),
    /// e.g. 10s. Unset: the driver's own (softdog's is 60s). Each agent publishes the timeout the
    /// driver applied, and the safe time is computed from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('1h')").message("watchdogTimeout must be between 1s and 1h"))]
    pub watchdog_timeout: Option<GoDuration>,

    /// Wait at least this long before recovering workloads. Values below the provable minimum
    /// are not used; the minimum is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub safe_time_to_assume_node_rebooted_seconds: Option<i32>,

    /// The timeout of an agent's read of its peer list (registrations and membership).
    #[serde(default = "defaults::five_seconds")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10ms')").message("peerApiServerTimeout must be at least 10ms"))]
    pub peer_api_server_timeout: GoDuration,

    /// How often an agent reads the remediations (its licence check).
    #[serde(default = "defaults::fifteen_seconds")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s')").message("apiCheckInterval must be at least 1s"))]
    pub api_check_interval: GoDuration,

    /// How often an agent reads its peer list again. A membership change (a node joining or
    /// leaving) is read at once as well. No view of the peers ever expires: an agent that reaches
    /// a majority of its peers keeps running through an API outage of any length.
    #[serde(default = "defaults::fifteen_minutes")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s')").message("peerUpdateInterval must be at least 10s"))]
    pub peer_update_interval: GoDuration,

    /// The timeout of an agent's licence check.
    #[serde(default = "defaults::five_seconds")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10ms')").message("apiServerTimeout must be at least 10ms"))]
    pub api_server_timeout: GoDuration,

    /// The timeout of a connection to a peer.
    #[serde(default = "defaults::five_seconds")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10ms')").message("peerDialTimeout must be at least 10ms"))]
    pub peer_dial_timeout: GoDuration,

    /// The timeout of a vote asked of a peer.
    #[serde(default = "defaults::seven_seconds")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10ms')").message("peerRequestTimeout must be at least 10ms"))]
    pub peer_request_timeout: GoDuration,

    /// How many failed API checks in a row an agent rides out before it must hold a majority of
    /// its peers' votes (with one peer round more) or fence. Unlike medik8s, which asks its peers
    /// only from this many failures on, nodemedic asks them from the first failure: the time to
    /// self-fence when isolated is the same, and a slow peer round has more chances.
    #[serde(default = "defaults::max_api_error_threshold")]
    #[schemars(range(min = 1))]
    pub max_api_error_threshold: i32,

    /// Reboot through sysrq: at once when a node must fence, and as the watchdog of a node
    /// without a watchdog device (only as sure as the agent process keeps running).
    #[serde(default = "defaults::yes")]
    pub is_software_reboot_enabled: bool,

    /// Probed by an agent when its API check starts failing, as a diagnostic for the log and
    /// the metric nodemedic_agent_endpoint_checks. medik8s uses it in control-plane nodes'
    /// isolation decision; nodemedic does not, because reaching an endpoint proves nothing about
    /// remediations (a TCP connection, where medik8s pings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_health_check_url: Option<String>,

    /// Port of the agents' peer protocol. The agents run on the node's network, so it is a port
    /// of every node: nodemedic's default (9447) lies outside Kubernetes' NodePort range
    /// (30000-32767), where medik8s's (30001) would share its port with a NodePort Service of that
    /// number; a port in that range is accepted, with a warning in the status.
    #[serde(default = "defaults::host_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: i32,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::tolerations)]
    pub custom_ds_tolerations: Option<Vec<Toleration>>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::node_selector_requirements)]
    pub custom_ds_node_selector_requirements: Option<Vec<NodeSelectorRequirement>>,

    /// Agents a node needs besides itself before self remediation may act on it.
    #[serde(default = "defaults::min_peers_for_remediation")]
    #[schemars(range(min = 0))]
    pub min_peers_for_remediation: i32,

    /// nodemedic: the agents' peer failure detector (docs/peer-detection.md), which lets the
    /// controller set a node's PeersReachable condition within seconds of the node going silent.
    /// Unset: no detector runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_detection: Option<PeerDetection>,
}

/// How the agents probe each other: every `probePeriod` each agent probes one other member; a
/// probe not answered within `probeRtt` is retried through `numIndirectProbes` other members; a
/// member nobody reached is suspected, and declared unreachable unless it refutes the suspicion
/// within `suspectToDownAfter`. The defaults detect a silent node in about two seconds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("duration(self.probeRtt) + duration(self.probeRtt) <= duration(self.probePeriod)")
    .message("probeRtt must be at most half of probePeriod: the indirect probes need the rest of the period"))]
#[x_kube(validation = Rule::new("duration(self.suspectToDownAfter) >= duration(self.probePeriod)")
    .message("suspectToDownAfter must be at least probePeriod: a suspected node needs a period to refute the suspicion"))]
pub struct PeerDetection {
    /// How often each agent probes one other member.
    #[serde(default = "defaults::probe_period")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('100ms') && duration(self) <= duration('60s')")
        .message("probePeriod must be between 100ms and 60s"))]
    pub probe_period: GoDuration,

    /// How long a direct probe may take before indirect probes are sent.
    #[serde(default = "defaults::probe_rtt")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10ms')").message("probeRtt must be at least 10ms"))]
    pub probe_rtt: GoDuration,

    /// How many other members probe an unanswering member on the prober's behalf.
    #[serde(default = "defaults::num_indirect_probes")]
    #[schemars(range(min = 1, max = 10))]
    pub num_indirect_probes: i32,

    /// How long a suspected member has to refute the suspicion before it is declared
    /// unreachable.
    #[serde(default = "defaults::suspect_to_down_after")]
    pub suspect_to_down_after: GoDuration,
}

impl Default for PeerDetection {
    /// The CRD schema's defaults.
    fn default() -> Self {
        Self {
            probe_period: defaults::probe_period(),
            probe_rtt: defaults::probe_rtt(),
            num_indirect_probes: defaults::num_indirect_probes(),
            suspect_to_down_after: defaults::suspect_to_down_after(),
        }
    }
}

impl Default for SelfNodeRemediationConfigSpec {
    /// The seed table's defaults, the same the CRD schema applies.
    fn default() -> Self {
        Self {
            watchdog_file_path: defaults::watchdog_file_path(),
            watchdog_timeout: None,
            safe_time_to_assume_node_rebooted_seconds: None,
            peer_api_server_timeout: defaults::five_seconds(),
            api_check_interval: defaults::fifteen_seconds(),
            peer_update_interval: defaults::fifteen_minutes(),
            api_server_timeout: defaults::five_seconds(),
            peer_dial_timeout: defaults::five_seconds(),
            peer_request_timeout: defaults::seven_seconds(),
            max_api_error_threshold: defaults::max_api_error_threshold(),
            is_software_reboot_enabled: defaults::yes(),
            endpoint_health_check_url: None,
            host_port: defaults::host_port(),
            custom_ds_tolerations: None,
            custom_ds_node_selector_requirements: None,
            min_peers_for_remediation: defaults::min_peers_for_remediation(),
            peer_detection: None,
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SelfNodeRemediationConfigStatus {
    /// nodemedic: the provable minimum safe time for the registered agents right now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_safe_time_seconds: Option<i64>,
    /// nodemedic: agents registered, by node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_agents: Option<i32>,
    /// nodemedic: the committed membership epoch (who votes in the licence protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership_epoch: Option<i64>,
    /// nodemedic: the members of the committed configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
    /// nodemedic: the members of a proposed configuration still waiting for acknowledgements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposed_members: Option<Vec<String>>,
    /// nodemedic: each registered node's fencing means (hardware-watchdog, softdog,
    /// software-reboot, none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_means: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

mod defaults {
    use crate::duration::GoDuration;
    use std::time::Duration;

    pub fn watchdog_file_path() -> String {
        "/dev/watchdog".into()
    }
    pub fn five_seconds() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(5))
    }
    pub fn seven_seconds() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(7))
    }
    pub fn fifteen_seconds() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(15))
    }
    pub fn fifteen_minutes() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(900))
    }
    pub fn max_api_error_threshold() -> i32 {
        3
    }
    pub fn yes() -> bool {
        true
    }
    pub fn host_port() -> i32 {
        9447
    }
    pub fn min_peers_for_remediation() -> i32 {
        1
    }
    pub fn probe_period() -> GoDuration {
        GoDuration::from_duration(Duration::from_millis(400))
    }
    pub fn probe_rtt() -> GoDuration {
        GoDuration::from_duration(Duration::from_millis(200))
    }
    pub fn num_indirect_probes() -> i32 {
        3
    }
    pub fn suspect_to_down_after() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(1))
    }
}
