//! ReadWriteOnce storage that behaves like a real cluster's.
//!
//! The lab pre-creates CSI PersistentVolumes of a `lab-rwo` StorageClass; kube-controller-manager's
//! attach-detach controller creates VolumeAttachments for them as for any CSI driver, and refuses a
//! second attachment of a ReadWriteOnce volume. This module is the rest of a CSI driver and kubelet:
//! - the **attacher** (external-attacher's job): marks new VolumeAttachments attached and lets
//!   deleted ones go (detach);
//! - the **mount gate** (kubelet's): a pod whose volumes are attached to its node is annotated so
//!   kwok starts it, and never before;
//! - **volumes in use** (kubelet's): a connected node reports the volumes its pods use in
//!   `status.volumesInUse`, so the attach-detach controller will not detach them behind a node
//!   it cannot hear from (it waits, as in a real cluster, unless the node is out of service).
//!
//! On a real node the kubelet is real: it waits for the attachment, mounts through the lab's CSI
//! node plugin ([`crate::real_node::csi`]) and reports its own volumes in use, so the mount gate
//! and the reporting leave real nodes alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::{
            CSIPersistentVolumeSource, Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Pod,
        },
        storage::v1::{CSIDriver, CSIDriverSpec, StorageClass, VolumeAttachment},
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::sync::Notify;

use crate::{
    Result,
    timeline::{Event, NodeCondition, Timeline},
};

pub const DRIVER: &str = "lab.nodemedic.io";
pub const STORAGE_CLASS: &str = "lab-rwo";
pub const ATTACHED_ANNOTATION: &str = "lab.nodemedic.io/volumes-attached";
const FINALIZER: &str = "external-attacher/lab-nodemedic-io";

pub fn volume_handle(index: usize) -> String {
    format!("lab-vol-{index}")
}

/// The CSIDriver, the StorageClass and `count` PersistentVolumes.
pub async fn install(client: &Client, count: usize) -> Result<()> {
    let pp = PostParams::default();
    let driver = CSIDriver {
        metadata: ObjectMeta {
            name: Some(DRIVER.into()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(true),
            pod_info_on_mount: Some(false),
            ..Default::default()
        },
    };
    create_if_absent(&Api::<CSIDriver>::all(client.clone()), &driver, &pp).await?;
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(STORAGE_CLASS.into()),
            annotations: Some(
                [(
                    "storageclass.kubernetes.io/is-default-class".to_owned(),
                    "true".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        volume_binding_mode: Some("Immediate".into()),
        reclaim_policy: Some("Retain".into()),
        ..Default::default()
    };
    create_if_absent(&Api::<StorageClass>::all(client.clone()), &class, &pp).await?;
    let pvs = Api::<PersistentVolume>::all(client.clone());
    for i in 0..count {
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(volume_handle(i)),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                capacity: Some([("storage".to_owned(), Quantity("1Gi".into()))].into()),
                storage_class_name: Some(STORAGE_CLASS.into()),
                persistent_volume_reclaim_policy: Some("Retain".into()),
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.into(),
                    volume_handle: volume_handle(i),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        create_if_absent(&pvs, &pv, &pp).await?;
    }
    Ok(())
}

async fn create_if_absent<K>(api: &Api<K>, obj: &K, pp: &PostParams) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(pp, obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Runs the attacher, mount gate and volume reporting until aborted.
pub async fn run(client: Client, nodes: Arc<Mutex<BTreeMap<String, NodeCondition>>>, timeline: Timeline) {
    let changed = Arc::new(Notify::new());
    spawn_trigger::<Pod>(&client, &changed);
    spawn_trigger::<VolumeAttachment>(&client, &changed);
    spawn_trigger::<PersistentVolumeClaim>(&client, &changed);
    let mut seen_attached: BTreeSet<String> = BTreeSet::new();
    loop {
        // Also every few seconds: node connectivity changes are not API events.
        let _ = tokio::time::timeout(Duration::from_secs(2), changed.notified()).await;
        let connected: BTreeSet<String> = nodes
            .lock()
            .map(|n| {
                n.iter()
                    .filter(|(_, c)| c.connected())
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        if let Err(error) = reconcile(&client, &connected, &timeline, &mut seen_attached).await {
            tracing::debug!(%error, "lab storage reconcile failed; retrying");
        }
    }
}

fn spawn_trigger<K>(client: &Client, changed: &Arc<Notify>)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let api = Api::<K>::all(client.clone());
    let changed = changed.clone();
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .backoff(nodemedic_kube::backoff::prompt())
            .boxed();
        while stream.next().await.is_some() {
            changed.notify_one();
        }
    });
}

async fn reconcile(
    client: &Client,
    connected: &BTreeSet<String>,
    timeline: &Timeline,
    seen: &mut BTreeSet<String>,
) -> Result<()> {
    let vas = Api::<VolumeAttachment>::all(client.clone());
    let lp = ListParams::default();
    let attachments: Vec<VolumeAttachment> = vas
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|va| va.spec.attacher == DRIVER)
        .collect();
    attach_and_detach(&vas, &attachments, timeline, seen).await?;

    let pvcs: BTreeMap<(String, String), String> = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter_map(|c| {
            let key = (c.metadata.namespace.clone()?, c.metadata.name.clone()?);
            Some((key, c.spec?.volume_name?))
        })
        .collect();
    let attached: BTreeSet<(String, String)> = attachments
        .iter()
        .filter(|va| va.metadata.deletion_timestamp.is_none() && va.status.as_ref().is_some_and(|s| s.attached))
        .filter_map(|va| {
            Some((
                va.spec.source.persistent_volume_name.clone()?,
                va.spec.node_name.clone(),
            ))
        })
        .collect();

    // Labelled by the lab when it creates a real node's Node (`type=real`).
    let real: BTreeSet<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels("type=real"))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let pods = Api::<Pod>::all(client.clone()).list(&lp).await?.items;
    let mut in_use: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in &pods {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
            continue;
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if real.contains(&node) {
            continue;
        }
        let volumes: Vec<String> = claims(pod)
            .iter()
            .filter_map(|c| pvcs.get(&(ns.to_owned(), c.clone())).cloned())
            .collect();
        if volumes.is_empty() || volumes.len() < claims(pod).len() {
            continue;
        }
        let all_attached = volumes.iter().all(|pv| attached.contains(&(pv.clone(), node.clone())));
        let annotated = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.get(ATTACHED_ANNOTATION).is_some_and(|v| v == "true"));
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if all_attached && !annotated && pod.metadata.deletion_timestamp.is_none() && phase == "Pending" {
            let patch = json!({ "metadata": { "annotations": { ATTACHED_ANNOTATION: "true" } } });
            Api::<Pod>::namespaced(client.clone(), ns)
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        if annotated || phase == "Running" {
            in_use
                .entry(node)
                .or_default()
                .extend(volumes.iter().map(|pv| format!("kubernetes.io/csi/{DRIVER}^{pv}")));
        }
    }
    let simulated: BTreeSet<String> = connected.difference(&real).cloned().collect();
    report_volumes_in_use(client, &simulated, &in_use).await
}

fn claims(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|vs| {
            vs.iter()
                .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

async fn attach_and_detach(
    api: &Api<VolumeAttachment>,
    attachments: &[VolumeAttachment],
    timeline: &Timeline,
    seen: &mut BTreeSet<String>,
) -> Result<()> {
    for va in attachments {
        let Some(name) = va.metadata.name.as_deref() else {
            continue;
        };
        let volume = va.spec.source.persistent_volume_name.clone().unwrap_or_default();
        let finalizers = va.metadata.finalizers.clone().unwrap_or_default();
        let ours = finalizers.iter().position(|f| f == FINALIZER);
        if va.metadata.deletion_timestamp.is_some() {
            if let Some(index) = ours {
                let patch = json!([
                    { "op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER },
                    { "op": "remove", "path": format!("/metadata/finalizers/{index}") }
                ]);
                let patch: json_patch::Patch =
                    serde_json::from_value(patch).map_err(|e| crate::Error::Invalid(e.to_string()))?;
                api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                    .await?;
                seen.remove(name);
                timeline.record(Event::Attachment {
                    volume,
                    node: va.spec.node_name.clone(),
                    state: "detached".into(),
                });
            }
            continue;
        }
        if ours.is_none() {
            let mut all = finalizers.clone();
            all.push(FINALIZER.into());
            let patch = json!({ "metadata": { "finalizers": all, "resourceVersion": va.metadata.resource_version } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        if !va.status.as_ref().is_some_and(|s| s.attached) {
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": { "attached": true } })),
            )
            .await?;
        }
        if seen.insert(name.to_owned()) {
            timeline.record(Event::Attachment {
                volume,
                node: va.spec.node_name.clone(),
                state: "attached".into(),
            });
        }
    }
    Ok(())
}

async fn report_volumes_in_use(
    client: &Client,
    connected: &BTreeSet<String>,
    in_use: &BTreeMap<String, BTreeSet<String>>,
) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone());
    for node in connected {
        let desired: Vec<String> = in_use
            .get(node)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let Some(current) = nodes.get_opt(node).await? else {
            continue;
        };
        let mut reported = current.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
        reported.sort();
        if reported != desired {
            let patch = json!({ "status": { "volumesInUse": desired } });
            nodes
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}
