//! `fence-agents-remediation.medik8s.io/v1alpha1`: FenceAgentsRemediation and its template.
//!
//! Field names keep medik8s's lowercase spelling (`sharedparameters`, `retrycount`, ...).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{Condition, Time},
    util::intstr::IntOrString,
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;

/// The Secret a FenceAgentsRemediation reads when it names none and that Secret exists
/// (medik8s's old default).
/// The ClusterLabs agents that do not fence by power, each with why: remediation releases a
/// node's workloads once the agent reports it off, which these cannot report. The controller's
/// image leaves them out and the CRDs refuse them.
pub const NOT_BY_POWER: &[(&str, &str)] = &[
    (
        "fence_sbd",
        "fences through a shared disk that the node's own SBD daemon must watch",
    ),
    ("fence_scsi", "fences storage (SCSI reservations), not the node"),
    ("fence_mpath", "fences storage (multipath reservations), not the node"),
    ("fence_sanlock", "fences through sanlock leases that the node must hold"),
    ("fence_kdump", "waits for the node's crash dump and powers nothing off"),
    (
        "fence_compute",
        "evacuates OpenStack instances, it does not power the node off",
    ),
    (
        "fence_evacuate",
        "evacuates OpenStack instances, it does not power the node off",
    ),
    (
        "fence_brocade",
        "fences a Fibre Channel switch port (storage), not the node's power",
    ),
    (
        "fence_cisco_mds",
        "fences a Fibre Channel switch port (storage), not the node's power",
    ),
    (
        "fence_sanbox2",
        "fences a Fibre Channel switch port (storage), not the node's power",
    ),
    (
        "fence_ifmib",
        "turns off a network switch port, which leaves the node running",
    ),
    ("fence_ack_manual", "waits for a person to say the node is off"),
    (
        "fence_crosslink",
        "is a heuristic for two-node clusters that fences nothing",
    ),
    ("fence_heuristics_ping", "is a heuristic that fences nothing"),
    ("fence_dummy", "is a test agent that fences nothing"),
];

pub const DEFAULT_SHARED_SECRET_NAME: &str = "fence-agents-credentials-shared";

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FenceRemediationStrategy {
    /// Delete the node's pods and VolumeAttachments once it is powered off.
    #[default]
    ResourceDeletion,
    /// Add the node.kubernetes.io/out-of-service taint once it is powered off.
    OutOfServiceTaint,
}

/// Fence a node through its BMC with a ClusterLabs fence agent.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "fence-agents-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "FenceAgentsRemediation",
    plural = "fenceagentsremediations",
    shortname = "far",
    namespaced,
    status = "FenceAgentsRemediationStatus",
    derive = "PartialEq",
    doc = "FenceAgentsRemediation powers a node off (and on) through its BMC, then recovers its workloads.",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agent"),
    printcolumn(
        name = "Succeeded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Succeeded\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Succeeded\")].reason"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct FenceAgentsRemediationSpec {
    /// The fence agent to run, e.g. fence_redfish or fence_ipmilan: one that fences by power
    /// (see [`NOT_BY_POWER`] for those refused).
    #[schemars(regex(pattern = r"^fence_[A-Za-z0-9_]+$"), length(max = 64), transform = crate::schema::power_agent)]
    pub agent: String,

    /// Options for every node, e.g. "--username". Values may use {{.NodeName}}.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = crate::schema::shared_parameters)]
    pub sharedparameters: BTreeMap<String, String>,

    /// Options per node: option name -> node name -> value. They override sharedparameters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = crate::schema::node_parameters)]
    pub nodeparameters: BTreeMap<String, BTreeMap<String, String>>,

    /// Secret (in this namespace) whose keys are options for every node, e.g. "--password".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_secret_name: Option<String>,

    /// Secret per node name, overriding the shared Secret's keys.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_secret_names: BTreeMap<String, String>,

    /// Attempts before giving up.
    #[serde(default = "defaults::retrycount")]
    #[schemars(range(min = 1, max = 100))]
    pub retrycount: i32,

    /// Pause between attempts.
    #[serde(default = "defaults::retryinterval")]
    pub retryinterval: GoDuration,

    /// Each attempt is killed after this long.
    #[serde(default = "defaults::timeout")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s')").message("timeout must be at least 1s"))]
    pub timeout: GoDuration,

    #[serde(default)]
    pub remediation_strategy: FenceRemediationStrategy,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FenceAgentsRemediationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// nodemedic: fence agent runs so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// nodemedic: the last run's outcome (exit code and the agent's own error line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<FenceAttempt>,
    /// nodemedic: the step reached: PoweringOff, ConfirmingOff, RecoveringWorkloads, PoweringOn, Done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FenceAttempt {
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Time>,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "fence-agents-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "FenceAgentsRemediationTemplate",
    plural = "fenceagentsremediationtemplates",
    shortname = "fartemplate",
    namespaced,
    status = "FenceAgentsRemediationTemplateStatus",
    derive = "PartialEq",
    doc = "FenceAgentsRemediationTemplate is what a NodeHealthCheck copies into each FenceAgentsRemediation it creates.",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.template.spec.agent"),
    printcolumn(
        name = "Valid",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"ParametersValid\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct FenceAgentsRemediationTemplateSpec {
    pub template: FenceAgentsRemediationTemplateResource,
    /// How many of the nodes named in the template (count or percentage) get a --action=status
    /// check of their credentials ahead of any failure. 0 or unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::int_or_percent)]
    pub status_validation_sample: Option<IntOrString>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FenceAgentsRemediationTemplateResource {
    pub spec: FenceAgentsRemediationSpec,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FenceAgentsRemediationTemplateStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// Node -> why its status check failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_failed: Option<BTreeMap<String, String>>,
    /// Node -> when its status check passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_passed: Option<BTreeMap<String, Time>>,
}

mod defaults {
    use crate::duration::GoDuration;
    use std::time::Duration;

    pub fn retrycount() -> i32 {
        5
    }
    pub fn retryinterval() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(5))
    }
    pub fn timeout() -> GoDuration {
        GoDuration::from_duration(Duration::from_secs(60))
    }
}
