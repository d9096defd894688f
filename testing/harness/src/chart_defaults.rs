//! nodemedic installed with the chart's default values, read from the rendered chart (never
//! restated here): its default-check and configuration ConfigMaps applied, and the controller
//! creating the health check and the SelfNodeRemediationConfig from them, as in a cluster. Shared
//! by the out-of-the-box benchmark, the defaults' lab tests and the fault campaign.

use std::{path::Path, process::Command, time::Duration};

use kube::Api;
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig};
use nodemedic_lab::{Error, Lab, Result, tools_dir, wait};

use crate::scenario::{self, NS};

/// The chart's ConfigMaps of defaults, as `helm template` renders them with `values` (`--set`
/// arguments).
pub fn rendered(values: &[String]) -> Result<Vec<String>> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/nodemedic");
    let out = Command::new(tools_dir().join("helm"))
        .args(["template", "nodemedic"])
        .arg(&chart)
        .arg(format!("--namespace={NS}"))
        .args(["--show-only", "templates/default-health-check.yaml"])
        .args(["--show-only", "templates/selfnoderemediationconfig.yaml"])
        .args(values)
        .output()
        .map_err(|e| Error::Command {
            command: "helm template".into(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: "helm template".into(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split("\n---\n")
        .filter(|doc| doc.contains("kind: ConfigMap"))
        .map(str::to_owned)
        .collect())
}

/// nodemedic with the chart's defaults (`values` on top): the ConfigMaps, the controller (every
/// operator, metrics on `metrics_port`), and, once the controller has created the configuration,
/// an agent on every node. Returns the configuration the agents run with.
pub async fn install(lab: &Lab, exe: &Path, values: &[String], metrics_port: u16) -> Result<SelfNodeRemediationConfig> {
    scenario::create_namespace(&lab.client(), NS).await?;
    for configmap in rendered(values)? {
        lab.apply_yaml(&configmap)?;
    }
    scenario::start_controller(lab, exe, "controller", metrics_port, &[], "info,kube=warn")?;
    let api = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS);
    let config = wait::until(
        "the SelfNodeRemediationConfig the controller creates from the chart's defaults",
        Duration::from_secs(120),
        || {
            let api = api.clone();
            async move { Ok(api.get_opt(CONFIG_NAME).await?) }
        },
    )
    .await?;
    scenario::start_agents(lab, exe, &config)?;
    Ok(config)
}
