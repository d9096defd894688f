//! What the soft tainter takes from the rendered policy: the KubeVirt profile's query, node
//! selector and thresholds, so the taints follow exactly the descheduler's classification.

use serde_json::Value;

use super::{policy::DeschedulerPolicy, soft_taints::Thresholds};

#[derive(Clone, Debug, PartialEq)]
pub struct TainterSettings {
    pub query: String,
    /// Label selector `key=value` of the nodes balanced between.
    pub node_selector: Option<(String, String)>,
    pub thresholds: Thresholds,
}

/// The tainter's settings, when the policy has a KubeVirt profile balancing on Prometheus.
pub fn settings(policy: &DeschedulerPolicy) -> Option<TainterSettings> {
    let profile = policy.profiles.iter().find(|p| p.name == "KubeVirtRelieveAndMigrate")?;
    let args = &profile
        .plugin_config
        .iter()
        .find(|c| c.name == "LowNodeUtilization")?
        .args;
    let query = args
        .pointer("/metricsUtilization/prometheus/query")?
        .as_str()?
        .to_owned();
    let percent = |key: &str| args.pointer(&format!("/{key}/MetricResource")).and_then(Value::as_f64);
    let (low, high) = (percent("thresholds")?, percent("targetThresholds")?);
    let thresholds = if args.get("useDeviationThresholds").and_then(Value::as_bool) == Some(true) {
        Thresholds::Deviation {
            below: low,
            above: high,
        }
    } else {
        Thresholds::Fixed { low, high }
    };
    let node_selector = policy.node_selector.as_deref().and_then(|s| {
        let (key, value) = s.split_once('=')?;
        Some((key.to_owned(), value.to_owned()))
    });
    Some(TainterSettings {
        query,
        node_selector,
        thresholds,
    })
}
