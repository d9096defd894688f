//! What the policy depends on outside the KubeDescheduler.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::{Api, Client, ResourceExt, api::ListParams};
use nodemedic_api::descheduler::KubeDescheduler;
use nodemedic_kube::{CallContext, paged};

use super::Settings;
use crate::{
    Result,
    decide::{Environment, policy::PrometheusProvider, render::KUBEVIRT_NODE_SELECTOR},
};

pub(super) async fn environment(client: &Client, settings: &Settings) -> Result<Environment> {
    let namespaces = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .context("listing namespaces for the protected ones")?;
    let mut protected = vec![settings.own_namespace.clone()];
    protected.extend(
        namespaces
            .items
            .iter()
            .map(|n| n.name_any())
            .filter(|n| n.starts_with("openshift-")),
    );
    // Counted a page at a time: every round, at thousands of nodes.
    let mut kubevirt_nodes = 0;
    let labelled = ListParams::default().labels(KUBEVIRT_NODE_SELECTOR);
    let mut pages = std::pin::pin!(paged::metadata_pages(&Api::<Node>::all(client.clone()), &labelled));
    while let Some(page) = pages.next().await {
        kubevirt_nodes += page.context("counting nodes labelled for KubeVirt")?.len();
    }
    Ok(Environment {
        protected_namespaces: protected,
        prometheus: settings
            .prometheus_url
            .clone()
            .map(|url| PrometheusProvider { url, auth_token: None }),
        kubevirt_migration_aware: settings.kubevirt_migration_aware,
        kubevirt_schedulable_nodes: kubevirt_nodes,
    })
}

/// Another KubeDescheduler named cluster, created earlier in another namespace, that is in
/// charge instead of this one.
pub(super) async fn first_in_charge(client: &Client, kd: &KubeDescheduler) -> Result<Option<String>> {
    let all = Api::<KubeDescheduler>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing KubeDeschedulers")?;
    Ok(first(&all.items)
        .filter(|(namespace, _)| Some(namespace) != kd.namespace().as_ref())
        .map(|(namespace, name)| format!("{namespace}/{name}")))
}

/// The KubeDescheduler in charge: named cluster, not being deleted, the oldest (then by namespace).
pub(super) fn first(all: &[KubeDescheduler]) -> Option<(String, String)> {
    all.iter()
        .filter(|k| k.name_any() == nodemedic_api::descheduler::NAME && k.metadata.deletion_timestamp.is_none())
        .min_by_key(|k| (k.metadata.creation_timestamp.clone().map(|t| t.0), k.namespace()))
        .map(|k| (k.namespace().unwrap_or_default(), k.name_any()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use nodemedic_api::descheduler::KubeDeschedulerSpec;

    use super::*;

    fn kd(namespace: &str, name: &str, created: i64, deleting: bool) -> KubeDescheduler {
        let mut kd = KubeDescheduler::new(name, KubeDeschedulerSpec::default());
        kd.metadata.namespace = Some(namespace.into());
        kd.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(created).expect("valid")));
        if deleting {
            kd.metadata.deletion_timestamp = kd.metadata.creation_timestamp.clone();
        }
        kd
    }

    #[test]
    fn the_oldest_cluster_not_being_deleted_is_in_charge() {
        let all = [
            kd("b", "cluster", 20, false),
            kd("a", "cluster", 10, true),
            kd("c", "cluster", 30, false),
            kd("d", "other", 1, false),
        ];
        assert_eq!(first(&all), Some(("b".into(), "cluster".into())));
        assert_eq!(first(&all[3..]), None);
    }
}
