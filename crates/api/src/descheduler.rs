//! `operator.openshift.io/v1` KubeDescheduler: the OpenShift Kube Descheduler Operator's API.
//! nodemedic renders its profiles into a policy for the upstream descheduler and runs it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{duration::GoDuration, schema};

/// The only name the operator acts on (a singleton, as OpenShift's).
pub const NAME: &str = "cluster";

/// Rebalance the cluster: which descheduling profiles run, how often, and whether they evict.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "operator.openshift.io",
    version = "v1",
    kind = "KubeDescheduler",
    plural = "kubedeschedulers",
    singular = "kubedescheduler",
    namespaced,
    status = "KubeDeschedulerStatus",
    derive = "PartialEq",
    doc = "KubeDescheduler configures the descheduler: its profiles, interval and mode. Name it 'cluster'.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "Interval",
        type_ = "integer",
        json_path = ".spec.deschedulingIntervalSeconds"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].reason",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name == 'cluster'")
        .message("kubedescheduler is a singleton, .metadata.name must be 'cluster'")
)]
#[serde(rename_all = "camelCase")]
pub struct KubeDeschedulerSpec {
    /// Managed (or Force): nodemedic runs the descheduler; Unmanaged: it leaves what it made as
    /// it is; Removed: it removes the descheduler and its soft taints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(Managed|Unmanaged|Force|Removed)$"))]
    pub management_state: Option<String>,

    /// The descheduler's verbosity: Normal (-v=2), Debug (4), Trace (6), TraceAll (8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,

    /// The operator's own verbosity (nodemedic's log filter decides; kept for compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_log_level: Option<LogLevel>,

    /// Not used by nodemedic; accepted so OpenShift manifests apply unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub unsupported_config_overrides: Option<serde_json::Value>,

    /// Not used by nodemedic; accepted so OpenShift manifests apply unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub observed_config: Option<serde_json::Value>,

    /// The descheduling profiles to run, each at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 11), transform = schema::descheduler_profiles)]
    pub profiles: Vec<Profile>,

    /// Seconds between descheduling runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub descheduling_interval_seconds: Option<i32>,

    /// How many pods one run may evict, in total and per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_limits: Option<EvictionLimits>,

    /// Tuning of the profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_customizations: Option<ProfileCustomizations>,

    /// Automatic evicts; Predictive (the default) only reports what it would evict.
    #[serde(default)]
    pub mode: Mode,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Automatic,
    #[default]
    Predictive,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogLevel {
    #[default]
    Normal,
    Debug,
    Trace,
    TraceAll,
    #[serde(rename = "")]
    Unset,
}

/// The descheduling profiles, OpenShift's names.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Profile {
    AffinityAndTaints,
    TopologyAndDuplicates,
    LifecycleAndUtilization,
    /// Deprecated: LongLifecycle.
    DevPreviewLongLifecycle,
    LongLifecycle,
    SoftTopologyAndDuplicates,
    EvictPodsWithLocalStorage,
    EvictPodsWithPVC,
    CompactAndScale,
    /// Deprecated: KubeVirtRelieveAndMigrate.
    DevKubeVirtRelieveAndMigrate,
    KubeVirtRelieveAndMigrate,
}

impl Profile {
    pub const ALL: [Profile; 11] = [
        Profile::AffinityAndTaints,
        Profile::TopologyAndDuplicates,
        Profile::LifecycleAndUtilization,
        Profile::DevPreviewLongLifecycle,
        Profile::LongLifecycle,
        Profile::SoftTopologyAndDuplicates,
        Profile::EvictPodsWithLocalStorage,
        Profile::EvictPodsWithPVC,
        Profile::CompactAndScale,
        Profile::DevKubeVirtRelieveAndMigrate,
        Profile::KubeVirtRelieveAndMigrate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Profile::AffinityAndTaints => "AffinityAndTaints",
            Profile::TopologyAndDuplicates => "TopologyAndDuplicates",
            Profile::LifecycleAndUtilization => "LifecycleAndUtilization",
            Profile::DevPreviewLongLifecycle => "DevPreviewLongLifecycle",
            Profile::LongLifecycle => "LongLifecycle",
            Profile::SoftTopologyAndDuplicates => "SoftTopologyAndDuplicates",
            Profile::EvictPodsWithLocalStorage => "EvictPodsWithLocalStorage",
            Profile::EvictPodsWithPVC => "EvictPodsWithPVC",
            Profile::CompactAndScale => "CompactAndScale",
            Profile::DevKubeVirtRelieveAndMigrate => "DevKubeVirtRelieveAndMigrate",
            Profile::KubeVirtRelieveAndMigrate => "KubeVirtRelieveAndMigrate",
        }
    }

    pub fn is_kubevirt(self) -> bool {
        matches!(
            self,
            Profile::KubeVirtRelieveAndMigrate | Profile::DevKubeVirtRelieveAndMigrate
        )
    }
}

/// Pairs of profiles that cannot run together (OpenShift's rules): they would fight over the
/// same pods, or balance the cluster in opposite directions.
pub const CONFLICTING_PROFILES: [(Profile, Profile); 16] = {
    use Profile::*;
    [
        (DevPreviewLongLifecycle, LifecycleAndUtilization),
        (LongLifecycle, LifecycleAndUtilization),
        (DevPreviewLongLifecycle, DevKubeVirtRelieveAndMigrate),
        (LongLifecycle, DevKubeVirtRelieveAndMigrate),
        (LifecycleAndUtilization, DevKubeVirtRelieveAndMigrate),
        (KubeVirtRelieveAndMigrate, DevKubeVirtRelieveAndMigrate),
        (DevPreviewLongLifecycle, KubeVirtRelieveAndMigrate),
        (LongLifecycle, KubeVirtRelieveAndMigrate),
        (LifecycleAndUtilization, KubeVirtRelieveAndMigrate),
        (SoftTopologyAndDuplicates, TopologyAndDuplicates),
        (CompactAndScale, LifecycleAndUtilization),
        (CompactAndScale, LongLifecycle),
        (CompactAndScale, DevPreviewLongLifecycle),
        (CompactAndScale, DevKubeVirtRelieveAndMigrate),
        (CompactAndScale, KubeVirtRelieveAndMigrate),
        (CompactAndScale, TopologyAndDuplicates),
    ]
};

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct EvictionLimits {
    /// Pods one descheduling run may evict in total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub total: Option<i32>,
    /// Pods one descheduling run may evict from one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub node: Option<i32>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!(has(self.thresholdPriority) && has(self.thresholdPriorityClassName) && self.thresholdPriorityClassName != '')")
        .message("set either thresholdPriority or thresholdPriorityClassName, not both")
        .field_path(".thresholdPriority"),
    validation = Rule::new("!has(self.devLowNodeUtilizationThresholds) || self.devLowNodeUtilizationThresholds == '' || !has(self.devDeviationThresholds) || self.devDeviationThresholds == ''")
        .message("set either devLowNodeUtilizationThresholds (fixed thresholds) or devDeviationThresholds (around the average), not both")
        .field_path(".devDeviationThresholds"),
)]
#[serde(rename_all = "camelCase")]
pub struct ProfileCustomizations {
    /// How old a pod may get before PodLifeTime evicts it (LifecycleAndUtilization; default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_lifetime: Option<GoDuration>,
    /// Pods at or above this priority are never evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_priority: Option<i32>,
    /// Pods at or above this PriorityClass's priority are never evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_priority_class_name: Option<String>,
    /// Namespaces to deschedule (included) or to leave alone (excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Namespaces>,
    /// Fixed LowNodeUtilization thresholds: Low 10%/30%, Medium 20%/50% (default), High 40%/70%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_low_node_utilization_thresholds: Option<LowThresholds>,
    /// Deprecated and ignored: the soft tainter runs whenever a KubeVirt profile does.
    #[serde(default)]
    pub dev_enable_soft_tainter: bool,
    /// Evictions answered "evacuation triggered" (KubeVirt live migration) count as in progress.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dev_enable_evictions_in_background: bool,
    /// CompactAndScale thresholds: Minimal 10%, Modest 20% (default), Moderate 30%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_high_node_utilization_thresholds: Option<HighThresholds>,
    /// Measure nodes by actual utilization from Prometheus: PrometheusCPUUsage,
    /// PrometheusCPUPSIPressure, PrometheusCPUPSIPressureByUtilization, PrometheusMemoryPSIPressure,
    /// PrometheusIOPSIPressure, PrometheusCPUCombined, PrometheusCPUMemoryCombinedProfile, or
    /// `query:<PromQL>` (one sample per node in [0, 1], labelled instance=<node>).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == '' || self.startsWith('query:') || self in ['PrometheusCPUUsage', 'PrometheusCPUPSIPressure', 'PrometheusCPUPSIPressureByUtilization', 'PrometheusMemoryPSIPressure', 'PrometheusIOPSIPressure', 'PrometheusCPUCombined', 'PrometheusCPUMemoryCombinedProfile']")
        .message("devActualUtilizationProfile must be one of PrometheusCPUUsage, PrometheusCPUPSIPressure, PrometheusCPUPSIPressureByUtilization, PrometheusMemoryPSIPressure, PrometheusIOPSIPressure, PrometheusCPUCombined, PrometheusCPUMemoryCombinedProfile, or query:<PromQL>"))]
    #[schemars(length(max = 4096))]
    pub dev_actual_utilization_profile: Option<String>,
    /// Thresholds around the nodes' average utilization (low / high, percentage points): Low 10/10,
    /// Medium 20/20, High 30/30, AsymmetricLow 0/10, AsymmetricMedium 0/20, AsymmetricHigh 0/30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_deviation_thresholds: Option<DeviationThresholds>,
    /// KubeVirt migration cooldown (OpenShift's KubevirtMigrationAware plugin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_migration_cooldown: Option<GoDuration>,
    /// KubeVirt maximum migration cooldown (OpenShift's KubevirtMigrationAware plugin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_max_migration_cooldown: Option<GoDuration>,
    /// KubeVirt migration history window (OpenShift's KubevirtMigrationAware plugin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_migration_history_window: Option<GoDuration>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.included) || size(self.included) == 0 || !has(self.excluded) || size(self.excluded) == 0")
    .message("set either namespaces.included or namespaces.excluded, not both"))]
pub struct Namespaces {
    /// Only these namespaces are descheduled (never a protected one: kube-system, hypershift,
    /// openshift, openshift-*).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(n, !(n in ['kube-system', 'hypershift', 'openshift']) && !n.startsWith('openshift-'))")
        .message("namespaces.included must not name a protected namespace (kube-system, hypershift, openshift, openshift-*): they are never descheduled"))]
    #[schemars(length(max = 1024), inner(length(max = 63)))]
    pub included: Vec<String>,
    /// These namespaces are never descheduled (in addition to the protected ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024), inner(length(max = 63)))]
    pub excluded: Vec<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LowThresholds {
    Low,
    Medium,
    High,
    #[serde(rename = "")]
    Unset,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HighThresholds {
    Minimal,
    Modest,
    Moderate,
    #[serde(rename = "")]
    Unset,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviationThresholds {
    Low,
    Medium,
    High,
    AsymmetricLow,
    AsymmetricMedium,
    AsymmetricHigh,
    #[serde(rename = "")]
    Unset,
}

/// OpenShift's OperatorStatus, plus what nodemedic reports about its descheduler.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeDeschedulerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Available, Progressing, Degraded, and OpenShift's TargetConfigControllerDegraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<OperatorCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Ready replicas of the descheduler Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_available_revision: Option<i32>,
    /// The generations of the objects the operator made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generations: Option<Vec<GenerationStatus>>,
    /// nodemedic: nodes carrying a soft taint, and which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_tainted_nodes: Option<Vec<SoftTaintedNode>>,
}

/// OpenShift's OperatorCondition (a metav1.Condition without observedGeneration).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OperatorCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GenerationStatus {
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub last_generation: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SoftTaintedNode {
    pub node: String,
    /// The soft taint keys the node carries.
    pub taints: Vec<String>,
    /// The utilization the tainter last saw, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<i32>,
}
