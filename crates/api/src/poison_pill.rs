//! `medik8s.io/v1alpha1`: the Poison Pill kinds, self node remediation's names before medik8s
//! renamed it. nodemedic serves them so that manifests written for Poison Pill (seed 001's
//! `nhc-worker-default` among them) keep working; the self-remediation manager carries out each
//! PoisonPillRemediation as a SelfNodeRemediation of the same name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::self_remediation::{RemediationStrategy, TemplateStatus};

/// The default template the manager creates, the name Poison Pill gave it.
pub const DEFAULT_TEMPLATE_NAME: &str = "poison-pill-default-template";
/// The one PoisonPillConfig the manager reads, in its own namespace.
pub const CONFIG_NAME: &str = "poison-pill-config";

/// Poison Pill's strategies. nodemedic never deletes a node: `NodeDeletion` (Poison Pill's
/// default) releases the node's workloads as nodemedic's `Automatic` does, and the node stays.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PoisonPillStrategy {
    #[default]
    NodeDeletion,
    ResourceDeletion,
}

impl PoisonPillStrategy {
    /// The self-remediation strategy that carries it out.
    pub fn self_remediation(self) -> RemediationStrategy {
        match self {
            Self::NodeDeletion => RemediationStrategy::Automatic,
            Self::ResourceDeletion => RemediationStrategy::ResourceDeletion,
        }
    }
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "medik8s.io",
    version = "v1alpha1",
    kind = "PoisonPillRemediation",
    plural = "poisonpillremediations",
    shortname = "ppr",
    namespaced,
    status = "PoisonPillRemediationStatus",
    derive = "PartialEq",
    doc = "Deprecated: Poison Pill was renamed Self Node Remediation; use SelfNodeRemediation. nodemedic carries out each PoisonPillRemediation as the SelfNodeRemediation of the same name and copies its progress here.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Strategy", type_ = "string", json_path = ".spec.remediationStrategy"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PoisonPillRemediationSpec {
    /// NodeDeletion (Poison Pill's default; nodemedic keeps the node and releases its workloads
    /// as SelfNodeRemediation's Automatic strategy does) or ResourceDeletion.
    #[serde(default)]
    pub remediation_strategy: PoisonPillStrategy,
}

/// Copied from the SelfNodeRemediation that carries the remediation out.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoisonPillRemediationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_assumed_rebooted: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "medik8s.io",
    version = "v1alpha1",
    kind = "PoisonPillRemediationTemplate",
    plural = "poisonpillremediationtemplates",
    shortname = "pprt",
    namespaced,
    status = "TemplateStatus",
    derive = "PartialEq",
    doc = "Deprecated: Poison Pill was renamed Self Node Remediation; use SelfNodeRemediationTemplate. What a NodeHealthCheck copies into each PoisonPillRemediation it creates.",
    printcolumn(
        name = "Strategy",
        type_ = "string",
        json_path = ".spec.template.spec.remediationStrategy"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct PoisonPillRemediationTemplateSpec {
    pub template: PoisonPillRemediationTemplateResource,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PoisonPillRemediationTemplateResource {
    #[serde(default)]
    pub spec: PoisonPillRemediationSpec,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "medik8s.io",
    version = "v1alpha1",
    kind = "PoisonPillConfig",
    plural = "poisonpillconfigs",
    shortname = "ppc",
    shortname = "ppconfig",
    namespaced,
    status = "TemplateStatus",
    derive = "PartialEq",
    doc = "Deprecated: Poison Pill was renamed Self Node Remediation; use SelfNodeRemediationConfig. Its fields are applied to the SelfNodeRemediationConfig, which the agents read.",
    validation = Rule::new("self.metadata.name == 'poison-pill-config'")
        .message("the PoisonPillConfig must be named poison-pill-config; nodemedic reads only that one")
)]
#[serde(rename_all = "camelCase")]
pub struct PoisonPillConfigSpec {
    /// The watchdog device the agents open, an absolute path such as /dev/watchdog
    /// (SelfNodeRemediationConfig's watchdogFilePath).
    #[serde(default = "defaults::watchdog_file_path")]
    #[schemars(length(min = 1))]
    #[x_kube(validation = crate::schema::watchdog_file_path_rule())]
    pub watchdog_file_path: String,
    /// Wait at least this long before recovering workloads; values below the provable minimum
    /// are not used (SelfNodeRemediationConfig's field of the same name).
    #[serde(default = "defaults::safe_time")]
    #[schemars(range(min = 0))]
    pub safe_time_to_assume_node_rebooted_seconds: i32,
    /// Reboot through sysrq when the watchdog cannot be used (SelfNodeRemediationConfig's field
    /// of the same name).
    #[serde(default = "defaults::yes")]
    pub is_software_reboot_enabled: bool,
}

impl Default for PoisonPillConfigSpec {
    /// Poison Pill's defaults, the same the CRD schema applies.
    fn default() -> Self {
        Self {
            watchdog_file_path: defaults::watchdog_file_path(),
            safe_time_to_assume_node_rebooted_seconds: defaults::safe_time(),
            is_software_reboot_enabled: defaults::yes(),
        }
    }
}

mod defaults {
    pub fn watchdog_file_path() -> String {
        "/dev/watchdog".into()
    }
    pub fn safe_time() -> i32 {
        180
    }
    pub fn yes() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn every_kind_is_described_as_deprecated_and_names_its_successor() {
        for crd in [
            PoisonPillRemediation::crd(),
            PoisonPillRemediationTemplate::crd(),
            PoisonPillConfig::crd(),
        ] {
            let description = crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| s.description.clone())
                .unwrap_or_default();
            assert!(description.starts_with("Deprecated:"), "{description}");
            assert!(description.contains("SelfNodeRemediation"), "{description}");
        }
    }

    #[test]
    fn node_deletion_is_carried_out_without_deleting_the_node() {
        assert_eq!(
            PoisonPillStrategy::NodeDeletion.self_remediation(),
            RemediationStrategy::Automatic
        );
        assert_eq!(
            PoisonPillStrategy::ResourceDeletion.self_remediation(),
            RemediationStrategy::ResourceDeletion
        );
        assert_eq!(
            serde_json::from_str::<PoisonPillRemediationSpec>("{}").ok(),
            Some(PoisonPillRemediationSpec {
                remediation_strategy: PoisonPillStrategy::NodeDeletion
            })
        );
    }
}
