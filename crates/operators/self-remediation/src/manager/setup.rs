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

/// The configuration, created with the defaults when absent (medik8s does the same).
pub(super) async fn config(client: &Client, namespace: &str) -> Result<()> {
    let api = Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), namespace);
    let mut config = SelfNodeRemediationConfig::new(CONFIG_NAME, SelfNodeRemediationConfigSpec::default());
    config.metadata.namespace = Some(namespace.to_owned());
    if create_once(&api, &config).await? {
        tracing::info!(name = CONFIG_NAME, "created the default SelfNodeRemediationConfig");
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
