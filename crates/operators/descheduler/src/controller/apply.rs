//! Carrying the decision out: server-side apply of the descheduler's objects, stopping or
//! removing them, and the KubeDescheduler's status.

use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Node, ServiceAccount},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use nodemedic_api::descheduler::KubeDescheduler;
use nodemedic_kube::{CallContext, paged, taints};
use serde_json::json;

use super::{Context, objects};
use crate::{
    Error, Result,
    decide::{self, policy::DeschedulerPolicy, soft_taints, status::Outcome},
};

const MANAGER: &str = "nodemedic-descheduler";

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Applies the descheduler's objects; returns the Deployment's ready replicas.
pub(super) async fn descheduler(
    ctx: &Context,
    kd: &KubeDescheduler,
    namespace: &str,
    policy: &DeschedulerPolicy,
    args: Vec<String>,
) -> Result<i32> {
    let yaml = serde_saphyr::to_string(policy).map_err(|e| Error::Render(e.to_string()))?;
    let hash = objects::policy_hash(&yaml, &args);
    let client = &ctx.client;
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .patch(
            objects::DESCHEDULER,
            &apply_params(),
            &Patch::Apply(objects::service_account(kd)),
        )
        .await
        .context("applying the descheduler's ServiceAccount")?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            &objects::cluster_role_binding_name(namespace),
            &apply_params(),
            &Patch::Apply(objects::cluster_role_binding(namespace)),
        )
        .await
        .context("applying the descheduler's ClusterRoleBinding")?;
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(
            objects::POLICY_CONFIGMAP,
            &apply_params(),
            &Patch::Apply(objects::policy_config_map(kd, &yaml)),
        )
        .await
        .context("applying the descheduler policy ConfigMap")?;
    let deployment = objects::deployment(kd, &ctx.settings.image, args, &hash, 1);
    let applied = Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(objects::DESCHEDULER, &apply_params(), &Patch::Apply(deployment))
        .await
        .context("applying the descheduler Deployment")?;
    Ok(applied.status.and_then(|s| s.ready_replicas).unwrap_or(0))
}

/// Scales the descheduler to zero (a spec that cannot run must not keep an old policy running).
pub(super) async fn stop_descheduler(ctx: &Context, namespace: &str) -> Result<()> {
    let api = Api::<Deployment>::namespaced(ctx.client.clone(), namespace);
    if api
        .get_opt(objects::DESCHEDULER)
        .await
        .context("reading the descheduler Deployment")?
        .is_some()
    {
        api.patch(
            objects::DESCHEDULER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .context("stopping the descheduler")?;
    }
    Ok(())
}

/// Removes the binding and every soft taint; with `namespaced`, the descheduler's objects too
/// (a deleted KubeDescheduler's are garbage-collected through their owner reference).
pub(super) async fn remove_everything(ctx: &Context, namespace: &str, namespaced: bool) -> Result<()> {
    let client = &ctx.client;
    let gone = |r: kube::Result<_>| match r {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map(|_| ()),
    };
    gone(
        Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&objects::cluster_role_binding_name(namespace), &DeleteParams::default())
            .await
            .map(|_| ()),
    )
    .context("deleting the descheduler's ClusterRoleBinding")?;
    if namespaced {
        gone(
            Api::<Deployment>::namespaced(client.clone(), namespace)
                .delete(objects::DESCHEDULER, &DeleteParams::foreground())
                .await
                .map(|_| ()),
        )
        .context("deleting the descheduler Deployment")?;
        gone(
            Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .delete(objects::POLICY_CONFIGMAP, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .context("deleting the descheduler policy")?;
        gone(
            Api::<ServiceAccount>::namespaced(client.clone(), namespace)
                .delete(objects::DESCHEDULER, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .context("deleting the descheduler's ServiceAccount")?;
    }
    remove_soft_taints(ctx).await
}

/// Takes every soft taint off every node (read a page at a time: see nodemedic_kube::paged).
pub(super) async fn remove_soft_taints(ctx: &Context) -> Result<()> {
    let nodes = Api::<Node>::all(ctx.tainter.clone());
    let mut pages = std::pin::pin!(paged::pages(&nodes, &ListParams::default()));
    while let Some(page) = pages.next().await {
        for node in &page.context("listing nodes")? {
            let carried: Vec<&str> = soft_taints::KEYS
                .into_iter()
                .filter(|key| {
                    node.spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|t| t.iter().any(|t| t.key == *key))
                })
                .collect();
            if carried.is_empty() {
                continue;
            }
            let name = node.name_any();
            taints::update(&nodes, &name, |current| {
                Some(
                    current
                        .iter()
                        .filter(|t| !soft_taints::KEYS.contains(&t.key.as_str()))
                        .cloned()
                        .collect(),
                )
            })
            .await?;
            for key in carried {
                ctx.metrics.taint_removed(key);
            }
            tracing::info!(node = %name, "soft taints removed");
        }
    }
    Ok(())
}

/// The controller's part of the status: the conditions, the observed generation and the ready
/// replicas (cleared when nothing runs). The tainter owns softTaintedNodes; the write, locked to
/// the version read, never carries it back over a newer report.
pub(super) async fn status(
    api: &Api<KubeDescheduler>,
    kd: &KubeDescheduler,
    outcome: &Outcome,
) -> nodemedic_kube::Result<bool> {
    let ready = match outcome {
        Outcome::Running { ready_replicas, .. } => Some(*ready_replicas),
        _ => None,
    };
    nodemedic_kube::status::write(api, kd, |status, now| {
        let mut conditions = status.conditions.take().unwrap_or_default();
        let mut changed = decide::status::merge(&mut conditions, decide::status::conditions(outcome), now);
        status.conditions = Some(conditions);
        changed |= status.ready_replicas != ready || status.observed_generation != kd.metadata.generation;
        status.ready_replicas = ready;
        status.observed_generation = kd.metadata.generation;
        changed
    })
    .await
}
