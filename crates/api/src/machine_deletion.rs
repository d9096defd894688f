//! `machine-deletion-remediation.medik8s.io/v1alpha1`: MachineDeletionRemediation and its
//! template. The spec is empty, as medik8s's: what to delete follows from the node.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Annotations the remediation records on itself, medik8s's names.
pub mod annotations {
    /// `<namespace>/<name>` of the Machine it deleted (read back once the Machine is gone).
    pub const MACHINE_NAME_NAMESPACE: &str = "machine-deletion-remediation.medik8s.io/machineNameNamespace";
    /// `<Kind>/<name>` of the Machine's controller owner, whose replicas it waits for.
    pub const MACHINE_OWNER: &str = "machine-deletion-remediation.medik8s.io/machineOwner";
    /// nodemedic: the node the deleted Machine had, whose leftover pods and VolumeAttachments it
    /// releases once the Machine is gone.
    pub const NODE: &str = "machine-deletion-remediation.nodemedic.io/node";
    /// nodemedic: the deleted Machine's apiVersion (without it, medik8s's OpenShift Machine).
    pub const MACHINE_API_VERSION: &str = "machine-deletion-remediation.nodemedic.io/machine-api-version";
    /// nodemedic: the owner's apiVersion, to read its replicas.
    pub const OWNER_API_VERSION: &str = "machine-deletion-remediation.nodemedic.io/owner-api-version";
}

/// nodemedic's finalizer: a remediation the Machine's deletion garbage-collects still releases
/// the workloads its node left behind.
pub const FINALIZER: &str = "machine-deletion-remediation.nodemedic.io/release-workloads";

/// Remediate a node by deleting its Machine, so the Machine's owner provisions a new one.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "machine-deletion-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "MachineDeletionRemediation",
    plural = "machinedeletionremediations",
    shortname = "mdr",
    namespaced,
    status = "MachineDeletionRemediationStatus",
    derive = "PartialEq",
    doc = "MachineDeletionRemediation deletes the Machine of an unhealthy node and waits for its replacement.",
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
pub struct MachineDeletionRemediationSpec {}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeletionRemediationStatus {
    /// Processing, Succeeded and PermanentNodeDeletionExpected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "machine-deletion-remediation.medik8s.io",
    version = "v1alpha1",
    kind = "MachineDeletionRemediationTemplate",
    plural = "machinedeletionremediationtemplates",
    shortname = "mdrt",
    namespaced,
    derive = "PartialEq",
    doc = "MachineDeletionRemediationTemplate is what a NodeHealthCheck or MachineHealthCheck copies into each MachineDeletionRemediation it creates."
)]
pub struct MachineDeletionRemediationTemplateSpec {
    pub template: MachineDeletionRemediationTemplateResource,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineDeletionRemediationTemplateResource {
    pub spec: MachineDeletionRemediationSpec,
}
