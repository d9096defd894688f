//! What the manager makes sure exists before it remediates: the peer-certificate authority, the
//! SelfNodeRemediationConfig, and the default templates (two, and Poison Pill's).

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ObjectMeta, PostParams},
};
use nodemedic_api::{
    names::{annotations, labels},
    poison_pill::{self, PoisonPillRemediationTemplate, PoisonPillRemediationTemplateSpec},
    self_remediation::{
        AUTOMATIC_TEMPLATE_NAME, CONFIG_NAME, RESOURCE_DELETION_TEMPLATE_NAME, RemediationStrategy,
        SelfNodeRemediationConfig, SelfNodeRemediationConfigSpec, SelfNodeRemediationSpec, SelfNodeRemediationTemplate,
        SelfNodeRemediationTemplateResource, SelfNodeRemediationTemplateSpec,
    },
};
use nodemedic_kube::{
    CallContext,
    defaults::{self, Step},
    events::Events,
    pki::{Authority, Pem},
};

use crate::{
    Error, Result,
    identity::{CA_CONFIGMAP, CA_KEY, CA_SECRET},
};

const CA_DAYS: i64 = 3650;

/// Creates `object` unless it exists; never overwrites what a user changed.
async fn create_once<K>(api: &Api<K>, object: &K) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => {
            let namespace = object.meta().namespace.as_deref().unwrap_or_default();
            let call = format!("creating {} {namespace}/{}", K::kind(&()), object.name_any());
            Err(nodemedic_kube::Error::call(call, e).into())
        }
    }
}

/// The signer's authority, created on first start and kept in a Secret; its certificate is
/// published in a ConfigMap the agents read.
pub(super) async fn certificate_authority(client: &Client, namespace: &str) -> Result<Authority> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let existing = secrets
        .get_opt(CA_SECRET)
        .await
        .with_context(|| format!("reading Secret {namespace}/{CA_SECRET}"))?;
    let pem = match existing {
        Some(secret) => {
            let data = secret.data.unwrap_or_default();
            let field = |k: &str| {
                data.get(k)
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    .ok_or_else(|| {
                        Error::Certificate(format!(
                            "Secret {CA_SECRET} has no {k}; delete it to have a new authority made"
                        ))
                    })
            };
            Pem {
                cert: field("tls.crt")?,
                key: field("tls.key")?,
            }
        }
        None => {
            let authority =
                Authority::new("nodemedic peer signer", CA_DAYS).map_err(|e| Error::Certificate(e.to_string()))?;
            let pem = authority.pem().clone();
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(CA_SECRET.into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(BTreeMap::from([
                    ("tls.crt".to_owned(), ByteString(pem.cert.clone().into_bytes())),
                    ("tls.key".to_owned(), ByteString(pem.key.clone().into_bytes())),
                ])),
                ..Default::default()
            };
            if !create_once(&secrets, &secret).await? {
                // Another replica won the race: use its authority.
                return Box::pin(certificate_authority(client, namespace)).await;
            }
            tracing::info!(secret = CA_SECRET, "created the peer certificate authority");
            pem
        }
    };
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let published = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CA_CONFIGMAP.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(CA_KEY.to_owned(), pem.cert.clone())])),
        ..Default::default()
    };
    configmaps
        .patch(
            CA_CONFIGMAP,
            &kube::api::PatchParams::apply("nodemedic-controller").force(),
            &kube::api::Patch::Apply(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": published.metadata, "data": published.data})),
        )
        .await
        .with_context(|| format!("publishing ConfigMap {namespace}/{CA_CONFIGMAP}"))?;
    Authority::from_pem(&pem).map_err(|e| Error::Certificate(e.to_string()))
}

/// The ConfigMap the chart renders the default SelfNodeRemediationConfig into, and its key.
pub(crate) const DEFAULT_CONFIG_CONFIGMAP: &str = "nodemedic-default-self-remediation-config";
pub(crate) const DEFAULT_CONFIG_KEY: &str = "selfnoderemediationconfig.yaml";

/// The configuration the release asks for: the chart's (its ConfigMap), or medik8s's defaults
/// without one.
pub(crate) fn wanted_config(configmap: Option<&ConfigMap>, namespace: &str) -> Result<SelfNodeRemediationConfig> {
    let spec = match configmap.and_then(|c| c.data.as_ref()?.get(DEFAULT_CONFIG_KEY)) {
        Some(yaml) => serde_saphyr::from_str::<SelfNodeRemediationConfig>(yaml)
            .map_err(|e| Error::InvalidConfig {
                name: CONFIG_NAME.into(),
                why: format!(
                    "ConfigMap {DEFAULT_CONFIG_CONFIGMAP}, key {DEFAULT_CONFIG_KEY}, is not a SelfNodeRemediationConfig: {e}; fix selfNodeRemediationConfig.* in the chart's values"
                ),
            })?
            .spec,
        None => SelfNodeRemediationConfigSpec::default(),
    };
    let mut config = SelfNodeRemediationConfig::new(CONFIG_NAME, spec);
    config.metadata.namespace = Some(namespace.to_owned());
    Ok(config)
}

/// The configuration, created with the release's defaults when absent (medik8s creates its own)
/// and moved to a later release's defaults while nobody has edited it. Without the chart's
/// ConfigMap (`selfNodeRemediationConfig.create=false`, or plain manifests without it) medik8s's
/// defaults are created when absent and nothing is moved. A ConfigMap or a configuration the API
/// server refuses is reported (log and a Warning event on the ConfigMap) and changes nothing:
/// self remediation runs on with the configuration there is.
pub(super) async fn config(client: &Client, namespace: &str, events: &Events) -> Result<()> {
    let configmap = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(DEFAULT_CONFIG_CONFIGMAP)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{DEFAULT_CONFIG_CONFIGMAP}"))?;
    let refused = |why: String| async {
        tracing::warn!(%why, "the default SelfNodeRemediationConfig was not applied");
        if let Some(configmap) = &configmap {
            let on = nodemedic_kube::events::reference(configmap);
            events.warning(&on, "DefaultConfigurationInvalid", why).await;
        }
    };
    let wanted = match wanted_config(configmap.as_ref(), namespace) {
        Ok(wanted) => wanted,
        Err(error) => {
            refused(error.to_string()).await;
            return Ok(());
        }
    };
    let applied = defaults::apply(
        &Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), namespace),
        defaults::Wanted {
            object: &wanted,
            stated: serde_json::to_value(&wanted.spec).unwrap_or_default(),
            may_update: configmap.is_some(),
        },
        |live, wanted| live.spec = wanted.spec.clone(),
    )
    .await;
    let step = match applied {
        Ok(step) => step,
        Err(nodemedic_kube::Error::Call {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 422 => {
            refused(format!(
                "SelfNodeRemediationConfig {CONFIG_NAME} is invalid: {}; fix selfNodeRemediationConfig.spec in the chart's values",
                status.message
            ))
            .await;
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    match step {
        Step::Create => tracing::info!(
            name = CONFIG_NAME,
            "created the SelfNodeRemediationConfig with this release's defaults"
        ),
        Step::Update => tracing::info!(
            name = CONFIG_NAME,
            "the SelfNodeRemediationConfig moved to this release's defaults (nobody had edited it)"
        ),
        Step::Unchanged => {}
        Step::KeepEdited | Step::KeepUnrecorded => tracing::info!(
            name = CONFIG_NAME,
            "the SelfNodeRemediationConfig was edited (or written by another version) and is left as it is; delete it and restart the controller to take this release's defaults"
        ),
    }
    Ok(())
}

/// The default templates the health check and users pick from.
pub(super) async fn templates(client: &Client, namespace: &str) -> Result<()> {
    let api = Api::<SelfNodeRemediationTemplate>::namespaced(client.clone(), namespace);
    for (name, strategy) in [
        (AUTOMATIC_TEMPLATE_NAME, RemediationStrategy::Automatic),
        (RESOURCE_DELETION_TEMPLATE_NAME, RemediationStrategy::ResourceDeletion),
    ] {
        let mut template = SelfNodeRemediationTemplate::new(
            name,
            SelfNodeRemediationTemplateSpec {
                template: SelfNodeRemediationTemplateResource {
                    spec: SelfNodeRemediationSpec {
                        remediation_strategy: strategy,
                    },
                },
            },
        );
        template.metadata.namespace = Some(namespace.to_owned());
        template.metadata.annotations = Some(BTreeMap::from([(
            annotations::MULTIPLE_TEMPLATES_SUPPORT.to_owned(),
            "true".to_owned(),
        )]));
        if strategy == RemediationStrategy::Automatic {
            template.metadata.labels = Some(BTreeMap::from([(
                labels::DEFAULT_TEMPLATE.to_owned(),
                "true".to_owned(),
            )]));
        }
        if create_once(&api, &template).await? {
            tracing::info!(%name, "created a default SelfNodeRemediationTemplate");
        }
    }
    // Poison Pill's default, for health checks written for it (seed 001's among them).
    let api = Api::<PoisonPillRemediationTemplate>::namespaced(client.clone(), namespace);
    let mut template = PoisonPillRemediationTemplate::new(
        poison_pill::DEFAULT_TEMPLATE_NAME,
        PoisonPillRemediationTemplateSpec::default(),
    );
    template.metadata.namespace = Some(namespace.to_owned());
    // Not fatal: `helm upgrade` installs no new CRD, and self remediation runs without it.
    match create_once(&api, &template).await {
        Ok(true) => tracing::info!(
            name = poison_pill::DEFAULT_TEMPLATE_NAME,
            "created the default PoisonPillRemediationTemplate"
        ),
        Ok(false) => {}
        Err(error) => tracing::warn!(
            %error,
            "the default PoisonPillRemediationTemplate was not created; apply charts/nodemedic/crds/ (helm upgrade does not install new CRDs) and restart the controller"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configmap(yaml: &str) -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([(DEFAULT_CONFIG_KEY.to_owned(), yaml.to_owned())])),
            ..Default::default()
        }
    }

    #[test]
    fn the_chart_s_configuration_is_wanted_and_medik8s_s_without_it() {
        let yaml = "apiVersion: self-node-remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediationConfig\nmetadata:\n  name: self-node-remediation-config\nspec:\n  watchdogTimeout: 2s\n  apiCheckInterval: 4s\n  peerDetection: {}\n";
        let wanted = wanted_config(Some(&configmap(yaml)), "ns").expect("usable");
        assert_eq!(wanted.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(wanted.spec.api_check_interval.to_string(), "4s");
        assert!(wanted.spec.peer_detection.is_some());
        assert_eq!(wanted.spec.watchdog_file_path, "/dev/watchdog", "the rest is medik8s's");
        let medik8s = wanted_config(None, "ns").expect("the defaults");
        assert_eq!(medik8s.spec, SelfNodeRemediationConfigSpec::default());
    }

    #[test]
    fn an_unusable_configuration_says_which_values_to_fix() {
        let error = wanted_config(Some(&configmap("spec: [1")), "ns").expect_err("unusable");
        assert!(error.to_string().contains("selfNodeRemediationConfig"), "{error}");
    }
}
