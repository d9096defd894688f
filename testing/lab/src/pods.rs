//! The lab as the kubelet of chosen pods. kwok plays every pod's status, but runs nothing; a pod
//! whose image the lab has a binary for (the upstream descheduler) runs for real, as the process
//! `<node>/<pod>` in the network namespace of the node it was scheduled to: with its container's
//! arguments, its ConfigMap volumes written under the lab directory (the mount path in the
//! arguments points there), and its ServiceAccount's in-cluster identity (a bound token and the
//! lab's CA under `/var/run/secrets/kubernetes.io/serviceaccount`, in the process's own mount
//! namespace, and `KUBERNETES_SERVICE_HOST`/`PORT`). The process stops when the pod stops
//! running; it goes down and comes back with its node.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, Pod, ServiceAccount},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};

use crate::{Error, Lab, Result, control_plane::API_PORT, error::io, lab::Inner, process::ProcessSpec};

/// Which pods run, and the executable for their image.
#[derive(Clone, Debug)]
pub struct PodRunner {
    /// Label selector of the pods to run (`key=value`).
    pub selector: String,
    /// The executable standing for the image's command.
    pub executable: PathBuf,
}

/// `sh -c` script: `$1` the directory with the identity's files, then the program and its
/// arguments. `ip netns exec` already gave the process its own mount namespace (a slave of the
/// host's): the tmpfs over /run stays in it.
const IN_CLUSTER: &str = r#"identity=$1
shift
token=$(cat "$identity/token") && ca=$(cat "$identity/ca.crt") && namespace=$(cat "$identity/namespace") || exit 125
mount -t tmpfs -o mode=0755 nodemedic-pod-run /run || { echo "nodemedic lab: cannot mount /run for the pod's identity" >&2; exit 125; }
account=/run/secrets/kubernetes.io/serviceaccount
mkdir -p "$account"
printf '%s' "$token" >"$account/token"
printf '%s\n' "$ca" >"$account/ca.crt"
printf '%s' "$namespace" >"$account/namespace"
# A pod's working directory is its own: what the program writes there (a self-signed serving
# certificate) stays in the lab.
cd "$identity" || exit 125
exec "$@""#;

const RESYNC: Duration = Duration::from_secs(1);
const TOKEN_SECONDS: i64 = 3600;

impl Lab {
    /// Runs, from now on, every pod `runner.selector` selects (see the module's description).
    pub fn run_pods(&mut self, runner: PodRunner) {
        self.tasks.push(tokio::spawn(run(self.inner.clone(), runner)));
    }
}

async fn run(inner: Arc<Inner>, runner: PodRunner) {
    let mut running: BTreeMap<String, String> = BTreeMap::new();
    loop {
        if let Err(error) = sync(&inner, &runner, &mut running).await {
            tracing::warn!(%error, selector = %runner.selector, "lab pod runner: sync failed; retrying");
        }
        tokio::time::sleep(RESYNC).await;
    }
}

/// `running`: pod UID -> the lab process running it.
async fn sync(inner: &Inner, runner: &PodRunner, running: &mut BTreeMap<String, String>) -> Result<()> {
    let pods = Api::<Pod>::all(inner.client.clone())
        .list(&ListParams::default().labels(&runner.selector))
        .await?
        .items;
    let wanted: BTreeSet<String> = pods
        .iter()
        .filter(|pod| {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            node.is_some_and(|n| inner.index(n).is_ok())
                && pod.metadata.deletion_timestamp.is_none()
                && phase == Some("Running")
        })
        .filter_map(|pod| pod.uid())
        .collect();
    // Stopped first, so a replacement on the same node never meets its predecessor's port.
    let gone: Vec<String> = running.keys().filter(|uid| !wanted.contains(*uid)).cloned().collect();
    for uid in gone {
        if let Some(name) = running.remove(&uid) {
            tracing::info!(process = %name, "lab pod runner: the pod stopped running; stopping it");
            inner.remove_process(&name)?;
        }
    }
    // A container that exits is restarted by its kubelet: so is a process here.
    // (A powered-off node's processes are down with it, and start again at its power-on.)
    running.retain(|_, name| {
        let node = name.split('/').next().unwrap_or_default();
        let died = inner
            .powered(node)
            .then(|| crate::lab::process_died(&inner.resources, name))
            .flatten();
        if let Some(error) = &died {
            tracing::warn!(process = %name, %error, "lab pod runner: the process exited; restarting it");
        }
        died.is_none()
    });
    for pod in pods.iter().filter(|p| p.uid().is_some_and(|uid| wanted.contains(&uid))) {
        let (Some(uid), Some(node)) = (pod.uid(), pod.spec.as_ref().and_then(|s| s.node_name.clone())) else {
            continue;
        };
        if running.contains_key(&uid) {
            continue;
        }
        let spec = process(inner, runner, pod).await?;
        inner.add_node_process(&node, &pod.name_any(), spec)?;
        tracing::info!(pod = %pod.name_any(), %node, "lab pod runner: started");
        running.insert(uid, format!("{node}/{}", pod.name_any()));
    }
    Ok(())
}

async fn process(inner: &Inner, runner: &PodRunner, pod: &Pod) -> Result<ProcessSpec> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let dir = inner.resources.dir.join("pods").join(format!("{namespace}_{name}"));
    let write = |path: &Path, text: &str| -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
    };
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| Error::Invalid(format!("pod {namespace}/{name} has no spec")))?;
    let container = spec
        .containers
        .first()
        .ok_or_else(|| Error::Invalid(format!("pod {namespace}/{name} has no container")))?;

    // Its ConfigMap volumes, each where the arguments will find it.
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let Some(config_map) = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.config_map.as_ref())
        else {
            continue;
        };
        let data = Api::<ConfigMap>::namespaced(inner.client.clone(), &namespace)
            .get(&config_map.name)
            .await?
            .data
            .unwrap_or_default();
        let volume = dir.join("volumes").join(&mount.name);
        for (key, value) in &data {
            write(&volume.join(key), value)?;
        }
        mounts.push((mount.mount_path.clone(), volume));
    }
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            mounts.iter().fold(arg.clone(), |arg, (path, volume)| {
                arg.replace(path.as_str(), &volume.display().to_string())
            })
        })
        .collect();

    // Its identity: a token bound to this pod, as the kubelet projects it.
    let account = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(TOKEN_SECONDS),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.clone()),
                uid: pod.uid(),
            }),
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(inner.client.clone(), &namespace)
        .create_token_request(&account, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| Error::Invalid(format!("no token for {namespace}/{account}")))?;
    let identity = dir.join("identity");
    write(&identity.join("token"), &token)?;
    let ca = std::fs::read_to_string(inner.pki.path("ca.crt")).map_err(io("reading the lab CA"))?;
    write(&identity.join("ca.crt"), &ca)?;
    write(&identity.join("namespace"), &namespace)?;

    let spec = ProcessSpec::new(
        "/bin/sh",
        [
            "-c".to_owned(),
            IN_CLUSTER.to_owned(),
            "nodemedic-lab-pod".to_owned(),
            identity.display().to_string(),
        ]
        .into_iter()
        .chain([runner.executable.display().to_string()])
        .chain(args),
    )
    .env("KUBERNETES_SERVICE_HOST", inner.resources.net.host_ip().to_string())
    .env("KUBERNETES_SERVICE_PORT", API_PORT.to_string());
    Ok(spec)
}
