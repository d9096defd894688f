//! Keeps the caBundle of the controller's ValidatingWebhookConfiguration equal to the webhook CA:
//! the chart ships it empty (it cannot know a CA made at run time), and a `helm upgrade` empties
//! it again.

use k8s_openapi::{ByteString, api::admissionregistration::v1::ValidatingWebhookConfiguration};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::{CallContext, Result};

/// The webhooks of `configuration` whose caBundle is not `ca`.
pub(crate) fn stale(configuration: &ValidatingWebhookConfiguration, ca: &[u8]) -> Vec<String> {
    configuration
        .webhooks
        .iter()
        .flatten()
        .filter(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(ca))
        .map(|w| w.name.clone())
        .collect()
}

/// A strategic merge patch setting the caBundle of the named webhooks (merged by name, so the
/// rest of each webhook, and the webhooks not named, stay as they are).
pub(crate) fn patch(webhooks: &[String], ca: &[u8]) -> serde_json::Value {
    let bundle = ByteString(ca.to_vec());
    json!({
        "webhooks": webhooks
            .iter()
            .map(|name| json!({"name": name, "clientConfig": {"caBundle": bundle}}))
            .collect::<Vec<_>>()
    })
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The configuration does not exist (not installed by the chart, or not yet).
    Missing,
    UpToDate,
    Patched(Vec<String>),
}

pub(crate) async fn ensure(client: &Client, name: &str, ca: &[u8]) -> Result<Outcome> {
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let Some(configuration) = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading ValidatingWebhookConfiguration {name}"))?
    else {
        return Ok(Outcome::Missing);
    };
    let stale = stale(&configuration, ca);
    if stale.is_empty() {
        return Ok(Outcome::UpToDate);
    }
    api.patch(name, &PatchParams::default(), &Patch::Strategic(patch(&stale, ca)))
        .await
        .with_context(|| format!("setting the caBundle of ValidatingWebhookConfiguration {name}"))?;
    Ok(Outcome::Patched(stale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhook, WebhookClientConfig};
    use proptest::prelude::*;

    fn configuration(bundles: &[Option<&[u8]>]) -> ValidatingWebhookConfiguration {
        ValidatingWebhookConfiguration {
            webhooks: Some(
                bundles
                    .iter()
                    .enumerate()
                    .map(|(i, b)| ValidatingWebhook {
                        name: format!("w{i}.nodemedic.medik8s.io"),
                        client_config: WebhookClientConfig {
                            ca_bundle: b.map(|b| ByteString(b.to_vec())),
                            ..Default::default()
                        },
                        admission_review_versions: vec!["v1".into()],
                        side_effects: "None".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn empty_and_other_bundles_are_stale() {
        let config = configuration(&[None, Some(b"old"), Some(b"ca")]);
        assert_eq!(
            stale(&config, b"ca"),
            ["w0.nodemedic.medik8s.io", "w1.nodemedic.medik8s.io"]
        );
        assert!(stale(&configuration(&[]), b"ca").is_empty());
    }

    #[test]
    fn the_patch_names_each_webhook_with_the_bundle_in_base64() {
        let patch = patch(&["w0".into()], b"ca");
        assert_eq!(
            patch,
            json!({"webhooks": [{"name": "w0", "clientConfig": {"caBundle": "Y2E="}}]})
        );
    }

    proptest! {
        /// After applying the patch, no webhook is stale.
        #[test]
        fn the_patch_fixes_every_stale_webhook(bundles in proptest::collection::vec(proptest::option::of(prop_oneof![Just(&b"ca"[..]), Just(&b"old"[..])]), 0..6)) {
            let mut config = configuration(&bundles);
            let names = stale(&config, b"ca");
            for webhook in config.webhooks.iter_mut().flatten() {
                if names.contains(&webhook.name) {
                    webhook.client_config.ca_bundle = Some(ByteString(b"ca".to_vec()));
                }
            }
            prop_assert!(stale(&config, b"ca").is_empty());
            prop_assert_eq!(names.len(), bundles.iter().filter(|b| **b != Some(&b"ca"[..])).count());
        }
    }
}
