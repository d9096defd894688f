//! The upstream descheduler's `descheduler/v1alpha2` DeschedulerPolicy, as much of it as the
//! profiles use. Field names and shapes are the descheduler's; absent values are left out so the
//! descheduler applies its own defaults.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeschedulerPolicy {
    pub api_version: &'static str,
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_no_of_pods_to_evict_per_node: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_no_of_pods_to_evict_total: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics_providers: Vec<MetricsProvider>,
    pub profiles: Vec<PolicyProfile>,
}

impl DeschedulerPolicy {
    pub fn new() -> Self {
        Self {
            api_version: "descheduler/v1alpha2",
            kind: "DeschedulerPolicy",
            ..Self::default()
        }
    }
}

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MetricsProvider {
    pub source: &'static str,
    pub prometheus: PrometheusProvider,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusProvider {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<AuthToken>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthToken {
    pub secret_reference: SecretReference,
}

/// A Secret whose `prometheusAuthToken` key holds the bearer token.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SecretReference {
    pub namespace: String,
    pub name: String,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyProfile {
    pub name: String,
    pub plugin_config: Vec<PluginConfig>,
    pub plugins: Plugins,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct PluginConfig {
    pub name: &'static str,
    pub args: Value,
}

/// Which plugins run at each extension point; empty points are left out.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Plugins {
    #[serde(skip_serializing_if = "ExtensionPoint::is_empty")]
    pub deschedule: ExtensionPoint,
    #[serde(skip_serializing_if = "ExtensionPoint::is_empty")]
    pub balance: ExtensionPoint,
    #[serde(skip_serializing_if = "ExtensionPoint::is_empty")]
    pub filter: ExtensionPoint,
    #[serde(skip_serializing_if = "ExtensionPoint::is_empty")]
    pub preevictionfilter: ExtensionPoint,
}

#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct ExtensionPoint {
    pub enabled: Vec<&'static str>,
}

impl ExtensionPoint {
    pub(crate) fn of(plugins: &[&'static str]) -> Self {
        Self {
            enabled: plugins.to_vec(),
        }
    }

    fn is_empty(&self) -> bool {
        self.enabled.is_empty()
    }
}

/// Percentages per resource (`cpu`, `memory`, `pods`, or `MetricResource` for Prometheus).
pub type Thresholds = BTreeMap<&'static str, u32>;
