//! The lab's provider kinds for Cluster API, fulfilled by the lab itself: `LabMachine` (one
//! host) and `LabMachineTemplate` (what a MachineSet clones) as the infrastructure provider
//! (see [`super::infrastructure`]); `LabCluster` and `LabControlPlane`, which only report the
//! cluster ready: the lab's own control plane is the cluster's, up before any Machine.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "infrastructure.lab.nodemedic.io";
pub const VERSION: &str = "v1alpha1";
/// The finalizer with which the lab holds a LabMachine until its host is powered off and gone.
pub const FINALIZER: &str = "infrastructure.lab.nodemedic.io/host";
/// Cluster API finds the version of a provider kind it is told only the group and kind of
/// through this label on the CRD: the contract version, and the CRD versions that implement it.
const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.lab.nodemedic.io",
    version = "v1alpha1",
    kind = "LabMachine",
    namespaced,
    status = "LabMachineStatus"
)]
pub struct LabMachineSpec {
    /// The lab node to provision on (as Metal3 selects a bare-metal host); any free one, or a
    /// new one, when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The host the lab provisioned, `lab://<node>`; empty until then.
    #[serde(rename = "providerID", default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
}

/// Cluster API's v1beta2 contract: `initialization.provisioned` once the host runs.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct LabMachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Provisioned>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct Provisioned {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.lab.nodemedic.io",
    version = "v1alpha1",
    kind = "LabMachineTemplate",
    namespaced
)]
pub struct LabMachineTemplateSpec {
    pub template: LabMachineTemplateResource,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct LabMachineTemplateResource {
    #[serde(default)]
    pub spec: LabMachineSpec,
}

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.lab.nodemedic.io",
    version = "v1alpha1",
    kind = "LabCluster",
    namespaced,
    status = "LabClusterStatus"
)]
pub struct LabClusterSpec {}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct LabClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Provisioned>,
}

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "infrastructure.lab.nodemedic.io",
    version = "v1alpha1",
    kind = "LabControlPlane",
    namespaced,
    status = "LabControlPlaneStatus"
)]
pub struct LabControlPlaneSpec {}

/// Initialized, and managed outside Cluster API (no control-plane Machines), which is what lets
/// Cluster API drain and delete the Node of a worker Machine it deletes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabControlPlaneStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ControlPlaneInitialized>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_managed_control_plane: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneInitialized {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// Every kind's CRD, labelled with the Cluster API contract it implements.
pub fn crds() -> Vec<CustomResourceDefinition> {
    [
        LabMachine::crd(),
        LabMachineTemplate::crd(),
        LabCluster::crd(),
        LabControlPlane::crd(),
    ]
    .into_iter()
    .map(|mut crd| {
        crd.metadata
            .labels
            .get_or_insert_default()
            .insert(CONTRACT_LABEL.into(), VERSION.into());
        crd
    })
    .collect()
}
