//! The agents' namespace and Pod Security admission. The agent must be privileged on the node's
//! network (it opens the watchdog, and its peers and the detector reach it at the node's
//! address), which the `baseline` and `restricted` levels refuse: a cluster enforcing either by
//! default would leave the DaemonSet without a pod, and every node without its fencing. With
//! `--label-namespace` (the chart's `podSecurity.labelNamespace`) the manager labels its own
//! namespace `privileged` when nobody has chosen a level for it; a level someone chose is left
//! alone and reported.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use nodemedic_kube::{CallContext, events::Events};

use crate::Result;

pub(crate) const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
const AUDIT: &str = "pod-security.kubernetes.io/audit";
const WARN: &str = "pod-security.kubernetes.io/warn";
pub(crate) const PRIVILEGED: &str = "privileged";

/// What to do about the namespace's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// No level chosen: label these (the levels nobody chose, all privileged).
    Label(BTreeMap<String, String>),
    /// Already privileged.
    Admits,
    /// Someone chose a stricter level: the agents' pods are refused until it changes.
    Refuses { level: String },
}

pub(crate) fn plan(labels: &BTreeMap<String, String>) -> Plan {
    match labels.get(ENFORCE).map(String::as_str) {
        Some(PRIVILEGED) => Plan::Admits,
        Some(level) => Plan::Refuses {
            level: level.to_owned(),
        },
        None => Plan::Label(
            [ENFORCE, AUDIT, WARN]
                .into_iter()
                .filter(|key| !labels.contains_key(*key))
                .map(|key| (key.to_owned(), PRIVILEGED.to_owned()))
                .collect(),
        ),
    }
}

/// Labels `namespace` as [`plan`] says; what it cannot do (no permission) is logged and told in
/// an event, never fatal: the agents may well be admitted anyway.
pub(super) async fn label(client: &Client, namespace: &str, events: &Events) -> Result<()> {
    let api = Api::<Namespace>::all(client.clone());
    let object = api
        .get(namespace)
        .await
        .with_context(|| format!("reading namespace {namespace}"))?;
    let on = nodemedic_kube::events::reference(&object);
    let labels = object.metadata.labels.clone().unwrap_or_default();
    match plan(&labels) {
        Plan::Admits => tracing::debug!(%namespace, "the namespace admits privileged pods"),
        Plan::Refuses { level } => {
            let why = format!(
                "namespace {namespace} enforces the Pod Security level {level:?}, which refuses the privileged agents: no node has self remediation until it admits them (kubectl label namespace {namespace} {ENFORCE}={PRIVILEGED} --overwrite)"
            );
            tracing::warn!(%namespace, %level, "{why}");
            events.warning(&on, "AgentsRefusedByPodSecurity", why).await;
        }
        Plan::Label(wanted) => {
            let patch = serde_json::json!({"metadata": {"labels": wanted}});
            match api
                .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    let note = format!(
                        "labelled namespace {namespace} {ENFORCE}={PRIVILEGED}: the self-remediation agents are privileged pods on the node's network (podSecurity.labelNamespace=false leaves it to you)"
                    );
                    tracing::info!(%namespace, "{note}");
                    events.normal(&on, "NamespaceLabelled", note).await;
                }
                Err(error) => {
                    let why = format!(
                        "could not label namespace {namespace} for privileged pods ({error}); if the cluster enforces a Pod Security level by default, label it yourself: kubectl label namespace {namespace} {ENFORCE}={PRIVILEGED}"
                    );
                    tracing::warn!(%namespace, "{why}");
                    events.warning(&on, "NamespaceNotLabelled", why).await;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn an_unlabelled_namespace_is_labelled_privileged_and_a_chosen_level_is_left_alone() {
        assert_eq!(
            plan(&labels(&[])),
            Plan::Label(labels(&[
                (ENFORCE, PRIVILEGED),
                (AUDIT, PRIVILEGED),
                (WARN, PRIVILEGED)
            ]))
        );
        // Levels someone chose for audit or warn stay theirs.
        assert_eq!(
            plan(&labels(&[(WARN, "restricted")])),
            Plan::Label(labels(&[(ENFORCE, PRIVILEGED), (AUDIT, PRIVILEGED)]))
        );
        assert_eq!(plan(&labels(&[(ENFORCE, PRIVILEGED)])), Plan::Admits);
        assert_eq!(
            plan(&labels(&[(ENFORCE, "baseline")])),
            Plan::Refuses {
                level: "baseline".into()
            }
        );
    }
}
