//! `remediation.medik8s.io/v1alpha1` NodeHealthCheck.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::ObjectReference,
    apimachinery::pkg::{
        apis::meta::v1::{Condition, LabelSelector, Time},
        util::intstr::IntOrString,
    },
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    duration::{GoDuration, SignedGoDuration},
    schema,
};

/// Which nodes to watch, when they count as unhealthy, and how to remediate them.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "remediation.medik8s.io",
    version = "v1alpha1",
    kind = "NodeHealthCheck",
    plural = "nodehealthchecks",
    shortname = "nhc",
    status = "NodeHealthCheckStatus",
    derive = "PartialEq",
    doc = "NodeHealthCheck selects nodes, decides when they are unhealthy, and creates remediation objects from a template for them.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Observed", type_ = "integer", json_path = ".status.observedNodes"),
    printcolumn(name = "Healthy", type_ = "integer", json_path = ".status.healthyNodes"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = Rule::new("!(has(self.minHealthy) && has(self.maxUnhealthy))")
        .message("set either minHealthy or maxUnhealthy, not both")
        .field_path(".minHealthy"),
    validation = Rule::new("has(self.remediationTemplate) != has(self.escalatingRemediations)")
        .message("set exactly one of remediationTemplate or escalatingRemediations")
        .field_path(".remediationTemplate"),
    validation = Rule::new("!has(self.maxUnhealthy) || ((!has(self.remediationTemplate) || self.remediationTemplate.kind != 'MachineDeletionRemediationTemplate') && (!has(self.escalatingRemediations) || self.escalatingRemediations.all(e, e.remediationTemplate.kind != 'MachineDeletionRemediationTemplate')))")
        .message("maxUnhealthy cannot be used with MachineDeletionRemediationTemplate (deleted machines break the count): use minHealthy")
        .field_path(".maxUnhealthy"),
)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealthCheckSpec {
    /// Label selector of the nodes this check watches. It must not be empty.
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)")
        .message("selector must select nodes with matchLabels or matchExpressions; an empty selector would match every node"))]
    pub selector: LabelSelector,

    /// A node is unhealthy when any of these conditions has held for its duration.
    #[serde(default = "default_unhealthy_conditions")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type", "status"]), length(max = 32))]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,

    /// Remediate only while at least this many (or this percentage, rounded up) of the selected
    /// nodes are healthy. When neither this nor maxUnhealthy is set, 51% applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::int_or_percent)]
    pub min_healthy: Option<IntOrString>,

    /// Remediate only while at most this many (or this percentage, rounded up) of the selected
    /// nodes are unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::int_or_percent)]
    pub max_unhealthy: Option<IntOrString>,

    /// When set, too many unhealthy nodes start a storm: no new remediation until the budget is
    /// met again and this cooldown has passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_cooldown_duration: Option<GoDuration>,

    /// The template the remediation object is created from. Exclusive with escalatingRemediations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::template_reference)]
    pub remediation_template: Option<ObjectReference>,

    /// Templates tried in ascending order, each for its timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["order"]), length(min = 1, max = 10))]
    pub escalating_remediations: Option<Vec<EscalatingRemediation>>,

    /// While any entry is present, no new remediation starts; running ones continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_requests: Option<Vec<String>>,

    /// How long a node must stay healthy before its remediation is removed. Negative: never
    /// automatically (annotate the node manually-confirmed-healthy instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_delay: Option<SignedGoDuration>,
}

fn default_unhealthy_conditions() -> Vec<UnhealthyCondition> {
    ["False", "Unknown"]
        .into_iter()
        .map(|status| UnhealthyCondition {
            type_: "Ready".into(),
            status: status.into(),
            duration: GoDuration::from_duration(std::time::Duration::from_secs(300)),
        })
        .collect()
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct UnhealthyCondition {
    /// Node condition type, e.g. Ready.
    #[serde(rename = "type")]
    #[schemars(length(min = 1))]
    pub type_: String,
    /// Condition status that counts as unhealthy: True, False or Unknown.
    #[schemars(length(min = 1))]
    pub status: String,
    /// How long the condition must hold, measured from its lastTransitionTime.
    pub duration: GoDuration,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EscalatingRemediation {
    #[schemars(transform = schema::template_reference_required)]
    pub remediation_template: ObjectReference,
    /// Position in the chain; unique, lowest first.
    #[schemars(range(min = 0))]
    pub order: i32,
    /// How long this step may run before the next one starts. At least 1m.
    #[x_kube(validation = Rule::new("duration(self) >= duration('60s')")
        .message("escalatingRemediations[].timeout must be at least 1m so the remediator can act"))]
    pub timeout: GoDuration,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealthCheckStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_nodes: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_nodes: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub unhealthy_nodes: Option<Vec<UnhealthyNode>>,
    /// Deprecated by medik8s; always empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_remediations: Option<BTreeMap<String, Time>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodeHealthCheckPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealthCheckPhase {
    Disabled,
    Paused,
    Remediating,
    Enabled,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyNode {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remediations: Vec<Remediation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions_healthy_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_delayed: Option<bool>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Remediation {
    pub resource: ObjectReference,
    pub started: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_name: Option<String>,
}
