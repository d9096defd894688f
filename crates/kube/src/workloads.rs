//! A fenced node's workloads: the pods bound to it and the volume attachments naming it, and their
//! release once the node is provably off. Shared by every remediator.

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::{CallContext, Result, paged};

/// Pods bound to the node, except DaemonSet pods (their controller puts them straight back and
/// they belong to the node, not to a workload that could run twice).
pub async fn pods(client: &Client, node: &str) -> Result<Vec<Pod>> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .with_context(|| format!("listing the pods on node {node}"))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| !p.owner_references().iter().any(|o| o.kind == "DaemonSet"))
        .collect())
}

/// The volume attachments naming the node. They cannot be selected by node, so every one is
/// read, a page at a time, and only the node's kept.
pub async fn attachments(client: &Client, node: &str) -> Result<Vec<VolumeAttachment>> {
    let api = Api::<VolumeAttachment>::all(client.clone());
    let mut pages = std::pin::pin!(paged::pages(&api, &ListParams::default()));
    let mut named = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.context("listing VolumeAttachments")?;
        named.extend(page.into_iter().filter(|va| va.spec.node_name == node));
    }
    Ok(named)
}

/// Force-deletes the pods (grace 0: the node that would honour a grace period is off).
pub async fn force_delete_pods(client: &Client, pods: &[Pod]) -> Result<()> {
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for pod in pods {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let api = Api::<Pod>::namespaced(client.clone(), &namespace);
        delete_if_present(&api, &name, &force, || format!("force-deleting pod {namespace}/{name}")).await?;
    }
    Ok(())
}

/// Says on the fenced node's behalf that it mounts none of its old volumes, by clearing
/// `status.volumesInUse`.
///
/// Without the out-of-service taint, the attach-detach controller will not detach a volume its
/// node last reported in use, and deleting the VolumeAttachment does not change its mind until
/// its next resync (a minute by default): the workload's new pod waits on a Multi-Attach error.
/// Callers have proven the node fenced: powered off, or reset and so rebooted since (self
/// remediation's safe time, a fence agent's power cycle). Either way no mount from before the
/// fence exists, and its pods are force-deleted; saying so lets the controller detach at once,
/// as it would once the node's own kubelet reported after its reboot. A kubelet that comes back
/// reports its real mounts again.
///
/// Best effort: without it the release still completes, only later (for example when the
/// ClusterRole lacks `nodes/status`, as before an upgrade re-applies it).
async fn clear_volumes_in_use(client: &Client, node: &str) {
    if let Err(error) = try_clear_volumes_in_use(client, node).await {
        tracing::warn!(%node, %error, "could not clear the node's volumes in use; the attach-detach controller will detach at its next resync");
    }
}

async fn try_clear_volumes_in_use(client: &Client, node: &str) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone());
    let reported = match nodes.get_status(node).await {
        Ok(n) => n.status.and_then(|s| s.volumes_in_use).unwrap_or_default(),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading the status of node {node}")),
    };
    if reported.is_empty() {
        return Ok(());
    }
    let patch = json!({"status": {"volumesInUse": null}});
    #[allow(
        clippy::disallowed_methods,
        reason = "one field of the kubelet's Node status, cleared by name: a merge patch of it alone cannot overwrite another writer's fields, and a resourceVersion lock would only make this best-effort clear lose races with the Node's own status writers (kubelet, node lifecycle and attach-detach controllers)"
    )]
    let cleared = nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    cleared.with_context(|| format!("clearing the volumes in use of node {node}"))?;
    Ok(())
}

/// Releases a fenced node's volumes for other nodes: clears the node's volumes in use (see
/// `clear_volumes_in_use`) and deletes its attachments not already being deleted. Returns how
/// many it deleted.
pub async fn release_attachments(client: &Client, node: &str, attachments: &[VolumeAttachment]) -> Result<usize> {
    clear_volumes_in_use(client, node).await;
    let api = Api::<VolumeAttachment>::all(client.clone());
    let mut deleted = 0;
    for va in attachments.iter().filter(|va| va.metadata.deletion_timestamp.is_none()) {
        let name = va.name_any();
        delete_if_present(&api, &name, &DeleteParams::default(), || {
            format!("deleting VolumeAttachment {name}")
        })
        .await?;
        deleted += 1;
    }
    Ok(deleted)
}

/// Deletes `name`; one already gone is not an error. `call` names the request in the error.
pub(crate) async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
    call: impl FnOnce() -> String,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(call),
    }
}
