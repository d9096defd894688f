//! The CustomResourceDefinitions generated from the types, as installed and as committed under
//! `deploy/crds/`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{
    descheduler::KubeDescheduler,
    fence_agents::{FenceAgentsRemediation, FenceAgentsRemediationTemplate},
    healthcheck::NodeHealthCheck,
    machine_deletion::{MachineDeletionRemediation, MachineDeletionRemediationTemplate},
    maintenance::NodeMaintenance,
    poison_pill::{PoisonPillConfig, PoisonPillRemediation, PoisonPillRemediationTemplate},
    self_remediation::{SelfNodeRemediation, SelfNodeRemediationConfig, SelfNodeRemediationTemplate},
};

#[derive(Debug, thiserror::Error)]
#[error("cannot render CRD {name} as YAML: {source}")]
pub struct RenderError {
    name: String,
    source: serde_saphyr::ser::Error,
}

/// Every CRD nodemedic serves, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        NodeHealthCheck::crd(),
        SelfNodeRemediation::crd(),
        SelfNodeRemediationTemplate::crd(),
        SelfNodeRemediationConfig::crd(),
        FenceAgentsRemediation::crd(),
        FenceAgentsRemediationTemplate::crd(),
        NodeMaintenance::crd(),
        MachineDeletionRemediation::crd(),
        MachineDeletionRemediationTemplate::crd(),
        KubeDescheduler::crd(),
        PoisonPillRemediation::crd(),
        PoisonPillRemediationTemplate::crd(),
        PoisonPillConfig::crd(),
    ]
}

/// One YAML document, the file name it is committed under (`<plural>.<group>.yaml`).
pub fn rendered() -> Result<Vec<(String, String)>, RenderError> {
    all()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| RenderError {
                name: name.clone(),
                source,
            })?;
            Ok((format!("{name}.yaml"), yaml))
        })
        .collect()
}

/// All CRDs as one multi-document YAML stream.
pub fn rendered_stream() -> Result<String, RenderError> {
    Ok(rendered()?
        .into_iter()
        .map(|(_, yaml)| format!("---\n{yaml}"))
        .collect())
}
