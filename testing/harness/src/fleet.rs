//! A fleet lab with nodemedic's controller over it: one kwok process simulating every node, the
//! whole controller (every operator on) and one NodeHealthCheck over the fleet. What the scale
//! bench measures and the controller's memory test checks.

use std::{collections::BTreeSet, path::Path, time::Duration};

use kube::Api;
use nodemedic_api::{healthcheck::NodeHealthCheck, self_remediation::SelfNodeRemediation};
use nodemedic_lab::{Lab, Result, wait};
use serde_json::json;

use crate::{
    bench::decision,
    scenario::{self, NS},
};

/// The health check's unhealthy duration (the seed manifests').
pub const DURATION_SECONDS: f64 = 10.0;
/// The lab's name for the controller process.
pub const CONTROLLER: &str = "controller";
/// The controller's user in the API server's audit log.
pub const CONTROLLER_USER: &str = "system:serviceaccount:workload-availability:nodemedic-controller";
/// The health check over the fleet.
pub const HEALTH_CHECK: &str = "fleet";

/// Agents only where a node says so; no fleet node does, so the agent DaemonSet has no pods
/// (thousands of simulated pods would measure kwok, not nodemedic).
const NO_AGENTS_CONFIG: &str = r#"{"spec": {"customDsNodeSelectorRequirements": [
    {"key": "lab.nodemedic.io/agent", "operator": "Exists"}]}}"#;

/// Installs nodemedic's configuration (no agents) and starts the controller from `exe`'s build,
/// its metrics on `metrics_port`, then the health check over the fleet.
pub async fn start_controller(lab: &Lab, exe: &Path, metrics_port: u16) -> Result<()> {
    scenario::create_namespace(&lab.client(), NS).await?;
    scenario::configure_with(lab, NO_AGENTS_CONFIG).await?;
    scenario::start_controller(lab, exe, CONTROLLER, metrics_port, &[], "info,kube=warn")?;
    lab.apply_yaml(&health_check().to_string())?;
    Ok(())
}

fn health_check() -> serde_json::Value {
    json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": HEALTH_CHECK},
        "spec": {
            "selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
            "minHealthy": "51%",
            "remediationTemplate": {
                "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
                "namespace": NS, "name": "self-node-remediation-automatic-strategy-template"
            },
            "unhealthyConditions": [
                {"type": "Ready", "status": "False", "duration": "10s"},
                {"type": "Ready", "status": "Unknown", "duration": "10s"}
            ]
        }
    })
}

/// The `percent` % of the fleet's nodes a failure round silences, spread over the fleet.
pub fn failing(lab: &Lab, percent: usize) -> Vec<String> {
    lab.fleet_nodes()
        .into_iter()
        .step_by(100 / percent.clamp(1, 100))
        .collect()
}

/// Waits until each of `nodes`, silenced at `since`, has its remediation.
pub async fn remediated(lab: &Lab, nodes: &BTreeSet<String>, since: jiff::Timestamp) -> Result<()> {
    // Silence shows after the node monitor grace (60 s), then the 10 s duration.
    let timeout = Duration::from_secs(300 + nodes.len() as u64 / 5);
    wait::until_every(
        &format!("a remediation for each of {} silenced nodes", nodes.len()),
        timeout,
        Duration::from_secs(1),
        || {
            let entries = lab.timeline().entries();
            let decisions = decision::latencies(&entries, nodes, since, DURATION_SECONDS);
            async move { Ok(decisions.missing.is_empty().then_some(())) }
        },
    )
    .await?;
    Ok(())
}

/// Every fleet node healthy in the health check's eyes and no remediation left.
pub async fn all_healthy(lab: &Lab, nodes: usize) -> Result<()> {
    let checks = Api::<NodeHealthCheck>::all(lab.client());
    let remediations = Api::<SelfNodeRemediation>::namespaced(lab.client(), NS);
    let timeout = Duration::from_secs(300 + nodes as u64 / 10);
    wait::until_every(
        &format!("all {nodes} nodes healthy, no remediation left"),
        timeout,
        Duration::from_secs(2),
        || {
            let (checks, remediations) = (checks.clone(), remediations.clone());
            async move {
                let status = checks.get(HEALTH_CHECK).await?.status.unwrap_or_default();
                let healthy = status.healthy_nodes == Some(nodes as i32);
                let left = remediations.list_metadata(&Default::default()).await?.items.len();
                Ok((healthy && left == 0).then_some(()))
            }
        },
    )
    .await?;
    Ok(())
}
