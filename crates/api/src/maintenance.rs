//! `nodemaintenance.medik8s.io/v1beta1` NodeMaintenance.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;

/// Cordon and drain a node; delete the object to give the node back.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "nodemaintenance.medik8s.io",
    version = "v1beta1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    shortname = "nm",
    status = "NodeMaintenanceStatus",
    derive = "PartialEq",
    doc = "NodeMaintenance cordons and drains a node for planned work; deleting it gives the node back.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Progress", type_ = "integer", json_path = ".status.drainProgress"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// The node to put into maintenance.
    #[schemars(length(min = 1))]
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message("nodeName is immutable: delete this NodeMaintenance and create a new one for the other node"))]
    pub node_name: String,

    /// Why the node is in maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// nodemedic: fail the maintenance (listing the pods that block it) when the drain has not
    /// finished after this long. Unset: keep trying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<GoDuration>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaintenancePhase {
    Running,
    Succeeded,
    Failed,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MaintenancePhase>,
    /// Percentage of the pods to evict that are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_progress: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods_refs: Option<Vec<PodReference>>,
    /// Pods on the node when maintenance started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totalpods: Option<i32>,
    /// Pods selected for eviction when maintenance started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_pods: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_on_lease_count: Option<i32>,
    /// nodemedic: pods the drain cannot evict right now, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_pods: Option<Vec<BlockedPod>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodReference {
    pub namespace: String,
    pub name: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockedPod {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}
