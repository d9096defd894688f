//! Cluster API's core controllers against the lab's own API server, managing the lab itself as a
//! self-hosted Cluster `lab`: its kubeconfig Secret points back at the lab's API server, and the
//! lab's provider kinds report the cluster's infrastructure and control plane ready (see
//! [`super::kinds`]). MachineSets, Machines and MachineHealthChecks then work as on any cluster,
//! with the lab provisioning hosts (see [`super::infrastructure`]).

use std::{net::Ipv4Addr, path::Path, time::Duration};

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    api::{DynamicObject, ObjectMeta, Patch, PatchParams},
};
use serde_json::{Value, json};

use super::kinds::{GROUP, LabCluster, LabControlPlane};
use crate::{Error, Result, binaries, error::io, process::ProcessSpec, wait};

pub const API_GROUP: &str = "cluster.x-k8s.io";
pub const API_VERSION: &str = "v1beta2";
/// The self-hosted Cluster's name: the lab's Machines, MachineSets and MachineHealthChecks name
/// it in `spec.clusterName`.
pub const CLUSTER: &str = "lab";
const CLUSTER_LABEL: &str = "cluster.x-k8s.io/cluster-name";
const MANAGER: &str = "nodemedic-lab";

pub fn api(client: &Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &nodemedic_kube::machines::api_resource(API_GROUP, API_VERSION, kind),
    )
}

/// The manager, as its release runs it but outside a pod: no leader election (one replica), its
/// webhook server on a free port with the lab's certificate (it cannot be turned off; no
/// webhook configuration points at it), no metrics, and without the per-object rate limit that
/// lets a MachineHealthCheck look at its Machines only every 15 s.
pub fn manager(kubeconfig: &Path, certificates: &Path, webhook_port: u16, health_port: u16) -> Result<ProcessSpec> {
    let program = binaries::machine_layer_dir().join("cluster-api-manager");
    if !program.is_file() {
        return Err(Error::MissingTool {
            what: format!("{} (scripts/build-machine-layer.sh builds it)", program.display()),
        });
    }
    Ok(ProcessSpec::new(
        program,
        [
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", certificates.display()),
            format!("--health-addr=127.0.0.1:{health_port}"),
            "--diagnostics-address=0".to_owned(),
            "--feature-gates=ReconcilerRateLimiting=false".to_owned(),
            "--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields".to_owned(),
            "--v=2".to_owned(),
        ],
    ))
}

/// The webhook server's certificate where the manager looks for it (`tls.crt`, `tls.key`).
pub fn certificates(pki: &crate::pki::LabPki, dir: &Path) -> Result<()> {
    let (crt, key) = pki.issue_server("cluster-api-webhook", Ipv4Addr::LOCALHOST)?;
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    for (from, to) in [(crt, "tls.crt"), (key, "tls.key")] {
        std::fs::copy(&from, dir.join(to)).map_err(io(format!("copying {}", from.display())))?;
    }
    Ok(())
}

/// The Cluster and what it stands on, in the order Cluster API wants them: the kubeconfig
/// Secret first (a Cluster whose Secret is missing is retried only after 30 s), then the
/// provider objects with their status, then the Cluster.
pub async fn create_cluster(client: &Client, namespace: &str, kubeconfig: &Path) -> Result<()> {
    let params = PatchParams::apply(MANAGER).force();
    let text = std::fs::read_to_string(kubeconfig).map_err(io(format!("reading {}", kubeconfig.display())))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{CLUSTER}-kubeconfig")),
            namespace: Some(namespace.to_owned()),
            // Cluster API's manager caches only Secrets with this label.
            labels: Some([(CLUSTER_LABEL.to_owned(), CLUSTER.to_owned())].into()),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        string_data: Some([("value".to_owned(), text)].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(&format!("{CLUSTER}-kubeconfig"), &params, &Patch::Apply(&secret))
        .await?;

    let ready = |body: Value| Patch::Merge(body);
    let infra = Api::<LabCluster>::namespaced(client.clone(), namespace);
    infra
        .patch(
            CLUSTER,
            &params,
            &Patch::Apply(&LabCluster::new(CLUSTER, Default::default())),
        )
        .await?;
    infra
        .patch_status(
            CLUSTER,
            &PatchParams::default(),
            &ready(json!({"status": {"initialization": {"provisioned": true}}})),
        )
        .await?;
    let control_plane = Api::<LabControlPlane>::namespaced(client.clone(), namespace);
    control_plane
        .patch(
            CLUSTER,
            &params,
            &Patch::Apply(&LabControlPlane::new(CLUSTER, Default::default())),
        )
        .await?;
    control_plane
        .patch_status(
            CLUSTER,
            &PatchParams::default(),
            &ready(json!({"status": {"initialization": {"controlPlaneInitialized": true},
                                     "externalManagedControlPlane": true}})),
        )
        .await?;

    let cluster = json!({
        "apiVersion": format!("{API_GROUP}/{API_VERSION}"), "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": namespace},
        "spec": {
            "infrastructureRef": {"apiGroup": GROUP, "kind": "LabCluster", "name": CLUSTER},
            "controlPlaneRef": {"apiGroup": GROUP, "kind": "LabControlPlane", "name": CLUSTER},
        },
    });
    api(client, namespace, "Cluster")
        .patch(CLUSTER, &params, &Patch::Apply(&cluster))
        .await?;
    Ok(())
}

/// Waits until Cluster API reaches the cluster (its remote connection probe succeeds) and sees
/// it initialized: from then on Machines get their nodes and health checks look at them.
pub async fn wait_cluster_ready(client: &Client, namespace: &str, timeout: Duration) -> Result<()> {
    let clusters = api(client, namespace, "Cluster");
    wait::until(
        "Cluster API to reach the lab's cluster (RemoteConnectionProbe, InfrastructureReady, ControlPlaneInitialized)",
        timeout,
        || {
            let clusters = clusters.clone();
            async move {
                let cluster = clusters.get(CLUSTER).await?;
                let conditions = cluster.data.pointer("/status/conditions").cloned().unwrap_or_default();
                let is_true = |kind: &str| {
                    conditions.as_array().into_iter().flatten().any(|c| {
                        c.get("type").and_then(Value::as_str) == Some(kind)
                            && c.get("status").and_then(Value::as_str) == Some("True")
                    })
                };
                let ready = [
                    "RemoteConnectionProbe",
                    "InfrastructureReady",
                    "ControlPlaneInitialized",
                ]
                .iter()
                .all(|c| is_true(c));
                Ok(ready.then_some(()))
            }
        },
    )
    .await
}
