//! The default health check, as medik8s's operator creates `nhc-worker-default` on install: the
//! chart renders the check into a ConfigMap in nodemedic's namespace, and the controller creates
//! it when no check of that name exists. A later release moves it to its own defaults only while
//! nobody has edited it, so a user's edits stay; a user who does not want it sets
//! `defaultHealthCheck.enabled=false` (no ConfigMap, no check).

use k8s_openapi::{
    api::core::v1::{ConfigMap, Node, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement},
};
use kube::{Api, Client, ResourceExt, api::ListParams};
use nodemedic_api::{healthcheck::NodeHealthCheck, names::labels};
use nodemedic_kube::{
    CallContext,
    defaults::{self, Step},
    events::Events,
};

use crate::Result;

/// The ConfigMap the chart renders the default check into, in nodemedic's namespace.
pub(crate) const CONFIGMAP: &str = "nodemedic-default-health-check";
/// Its key holding the NodeHealthCheck as YAML.
pub(crate) const KEY: &str = "nodehealthcheck.yaml";

/// The ConfigMap's key that, set to [`WORKERS`], has the controller choose the selector.
pub(crate) const SELECTOR_KEY: &str = "selector";
pub(crate) const WORKERS: &str = "workers";

/// The nodes users mean by workers, as their cluster labels them: those labelled
/// `node-role.kubernetes.io/worker` where any node is (OpenShift, compact clusters whose
/// control-plane nodes also work), else every node that is not a control-plane node (kubeadm,
/// k3s, managed clusters, which label only their control-plane nodes, if any).
pub(crate) fn workers_selector(some_node_labelled_worker: bool) -> LabelSelector {
    let requirement = |key: &str, operator: &str| LabelSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: None,
    };
    let expressions = if some_node_labelled_worker {
        vec![requirement(labels::ROLE_WORKER, "Exists")]
    } else {
        vec![
            requirement(labels::ROLE_CONTROL_PLANE, "DoesNotExist"),
            requirement(labels::ROLE_MASTER, "DoesNotExist"),
        ]
    };
    LabelSelector {
        match_expressions: Some(expressions),
        match_labels: None,
    }
}

/// What the ConfigMap asks for.
#[derive(Debug, PartialEq)]
pub enum Wanted {
    Check(Box<NodeHealthCheck>),
    /// The ConfigMap exists but holds no usable check: the message says what to fix.
    Unusable(String),
}

/// Reads the ConfigMap's data (pure: no I/O).
pub fn wanted(configmap: &ConfigMap) -> Wanted {
    let Some(yaml) = configmap.data.as_ref().and_then(|d| d.get(KEY)) else {
        return Wanted::Unusable(format!(
            "ConfigMap {CONFIGMAP} has no key {KEY}; render it with the chart (defaultHealthCheck.*)"
        ));
    };
    match serde_saphyr::from_str::<NodeHealthCheck>(yaml) {
        Ok(check) if check.metadata.name.as_deref().is_some_and(|n| !n.is_empty()) => {
            let mut check = check;
            // The object to create, not a copy of one that existed somewhere.
            check.metadata.resource_version = None;
            check.metadata.uid = None;
            check.status = None;
            Wanted::Check(Box::new(check))
        }
        Ok(_) => Wanted::Unusable(format!(
            "the NodeHealthCheck in ConfigMap {CONFIGMAP} has no metadata.name"
        )),
        Err(e) => Wanted::Unusable(format!(
            "ConfigMap {CONFIGMAP}, key {KEY}, is not a NodeHealthCheck: {e}; fix defaultHealthCheck.* in the chart's values"
        )),
    }
}

/// Creates the default check when the ConfigMap asks for one and no check of its name exists,
/// and moves a check it created to the ConfigMap's spec (a new release's defaults) unless
/// someone edited it since ([`nodemedic_kube::defaults`]). An unusable ConfigMap or a check the
/// API server refuses as invalid is reported (log and a Warning event on the ConfigMap) and
/// changes nothing; other failures are returned.
pub async fn apply(client: &Client, namespace: &str, events: &Events) -> Result<()> {
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let Some(configmap) = configmaps
        .get_opt(CONFIGMAP)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{CONFIGMAP}"))?
    else {
        tracing::info!(%namespace, "no default health check asked for (ConfigMap {CONFIGMAP} absent)");
        return Ok(());
    };
    let on = nodemedic_kube::events::reference(&configmap);
    let check = match wanted(&configmap) {
        Wanted::Check(check) => check,
        Wanted::Unusable(why) => {
            tracing::warn!(%namespace, %why, "default health check not created");
            events.warning(&on, "DefaultHealthCheckInvalid", why).await;
            return Ok(());
        }
    };
    // The record keeps the spec as the chart states it (the selector `workers` unresolved), so
    // a node labelled a worker later does not read as a new release's defaults.
    let mut stated = serde_json::to_value(&check.spec).unwrap_or_default();
    let mut check = check;
    if configmap
        .data
        .as_ref()
        .and_then(|d| d.get(SELECTOR_KEY))
        .map(String::as_str)
        == Some(WORKERS)
    {
        stated["selector"] = serde_json::Value::from(WORKERS);
        let labelled = Api::<Node>::all(client.clone())
            .list_metadata(&ListParams::default().labels(labels::ROLE_WORKER).limit(1))
            .await
            .context("looking for nodes labelled node-role.kubernetes.io/worker")?;
        check.spec.selector = workers_selector(!labelled.items.is_empty());
    }
    let name = check.name_any();
    let applied = defaults::apply(
        &Api::<NodeHealthCheck>::all(client.clone()),
        defaults::Wanted {
            object: check.as_ref(),
            stated,
            may_update: true,
        },
        |live, wanted| live.spec = wanted.spec.clone(),
    )
    .await;
    match applied {
        Ok(step) => report(step, &name, events, &on).await,
        // Refused as invalid: retrying cannot help, the values must change.
        Err(nodemedic_kube::Error::Call {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 422 => {
            let why = format!(
                "NodeHealthCheck {name} is invalid: {}; fix defaultHealthCheck.* in the chart's values",
                status.message
            );
            tracing::warn!(%why, "default health check not created");
            events.warning(&on, "DefaultHealthCheckInvalid", why).await;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// The log line and event of each step.
async fn report(step: Step, name: &str, events: &Events, on: &ObjectReference) {
    match step {
        Step::Create => {
            tracing::info!(%name, "created the default NodeHealthCheck");
            events
                .normal(
                    on,
                    "DefaultHealthCheckCreated",
                    format!("created NodeHealthCheck {name}; an edit of it is never overwritten"),
                )
                .await;
        }
        Step::Update => {
            tracing::info!(%name, "the default NodeHealthCheck moved to this release's defaults (nobody had edited it)");
            events
                .normal(
                    on,
                    "DefaultHealthCheckUpdated",
                    format!("NodeHealthCheck {name} set to this release's defaults; nobody had edited it"),
                )
                .await;
        }
        Step::Unchanged => tracing::info!(%name, "the default NodeHealthCheck is at this release's defaults"),
        Step::KeepEdited | Step::KeepUnrecorded => {
            let why = if step == Step::KeepEdited {
                "was edited"
            } else {
                "was not written by this version of nodemedic"
            };
            tracing::info!(%name, "the default NodeHealthCheck {why}; left as it is");
            events
                .normal(
                    on,
                    "DefaultHealthCheckKept",
                    format!(
                        "NodeHealthCheck {name} {why} and is left as it is; to take this release's defaults, delete it and restart the controller"
                    ),
                )
                .await;
        }
    }
}

/// [`apply`] until it is done: a failed read or create (the API server restarting, a
/// webhook not ready yet) is tried again every `every`, without holding up the health check.
pub async fn create_until_done(client: Client, namespace: String, events: Events, every: std::time::Duration) {
    while let Err(error) = apply(&client, &namespace, &events).await {
        tracing::warn!(%error, "the default health check: trying again in {every:?}");
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn configmap(yaml: Option<&str>) -> ConfigMap {
        ConfigMap {
            data: yaml.map(|y| BTreeMap::from([(KEY.to_owned(), y.to_owned())])),
            ..Default::default()
        }
    }

    fn check_yaml(metadata: &str) -> String {
        let spec = "spec:\n  minHealthy: 51%\n  selector:\n    matchExpressions:\n      - key: node-role.kubernetes.io/worker\n        operator: Exists\n  remediationTemplate:\n    apiVersion: self-node-remediation.medik8s.io/v1alpha1\n    kind: SelfNodeRemediationTemplate\n    name: self-node-remediation-automatic-strategy-template\n    namespace: workload-availability\n  unhealthyConditions:\n    - type: Ready\n      status: \"False\"\n      duration: 300s\n";
        format!("apiVersion: remediation.medik8s.io/v1alpha1\nkind: NodeHealthCheck\nmetadata:\n{metadata}{spec}")
    }

    #[test]
    fn the_rendered_check_is_created_as_it_is_written() {
        let yaml = check_yaml("  name: nhc-worker-default\n  resourceVersion: \"7\"\n");
        let Wanted::Check(check) = wanted(&configmap(Some(&yaml))) else {
            panic!("a check")
        };
        assert_eq!(check.metadata.name.as_deref(), Some("nhc-worker-default"));
        assert_eq!(check.metadata.resource_version, None);
    }

    #[test]
    fn workers_are_the_labelled_ones_or_else_every_node_but_the_control_plane() {
        let keys = |s: LabelSelector| -> Vec<(String, String)> {
            s.match_expressions
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.key, r.operator))
                .collect()
        };
        assert_eq!(
            keys(workers_selector(true)),
            [(labels::ROLE_WORKER.to_owned(), "Exists".to_owned())]
        );
        assert_eq!(
            keys(workers_selector(false)),
            [
                (labels::ROLE_CONTROL_PLANE.to_owned(), "DoesNotExist".to_owned()),
                (labels::ROLE_MASTER.to_owned(), "DoesNotExist".to_owned())
            ]
        );
    }

    #[test]
    fn a_missing_key_or_bad_yaml_says_what_to_fix() {
        let Wanted::Unusable(why) = wanted(&configmap(None)) else {
            panic!("unusable")
        };
        assert!(why.contains(KEY), "{why}");
        let Wanted::Unusable(why) = wanted(&configmap(Some("spec: [1"))) else {
            panic!("unusable")
        };
        assert!(why.contains("defaultHealthCheck"), "{why}");
        let Wanted::Unusable(why) = wanted(&configmap(Some(&check_yaml("  labels: {a: b}\n")))) else {
            panic!("unusable")
        };
        assert!(why.contains("metadata.name"), "{why}");
    }
}
