//! The node plugin of the lab's CSI driver (`lab.nodemedic.io`) for real nodes: what a real
//! kubelet calls to mount a ReadWriteOnce volume into a pod. The lab serves it from the host on
//! a Unix socket in the node's kubelet directory, which the driver's registrar (a node process,
//! testing/lab/node-images/csi-registrar) names to the kubelet's plugin watcher; a publish
//! bind-mounts the volume's directory (one per volume, on the host) at the kubelet's target
//! path inside the node's mount namespace.
//! Attaching stays the lab's attacher's ([`crate::storage`]): the attach-detach controller's
//! VolumeAttachments, and the kubelet waiting for them, are the real ones.

use std::path::{Path, PathBuf};

use tokio::{net::UnixListener, task::JoinHandle};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status, transport::Server};

use crate::{Result, error::io, process::ProcessSpec, storage::DRIVER};

// Generated code: its items are `pub` whatever they are used for, and a server's dispatch is
// one function however many methods the service has.
#[allow(unreachable_pub, clippy::too_many_lines)]
mod proto {
    tonic::include_proto!("csi.v1");
}

use proto::{
    identity_server::{Identity, IdentityServer},
    node_server::{Node, NodeServer},
    *,
};

/// Where the node's kubelet finds the plugin, as paths inside the node.
const ENDPOINT: &str = "/var/lib/kubelet/plugins/lab.nodemedic.io/csi.sock";
const REGISTRATION: &str = "/var/lib/kubelet/plugins_registry/lab.nodemedic.io-reg.sock";

/// Where each volume's data is on the host: one directory per volume handle, whichever node
/// it is published on.
pub(crate) fn volumes_dir(lab_dir: &Path) -> PathBuf {
    lab_dir.join("volumes")
}

/// The node plugin of one real node.
#[derive(Clone)]
struct Plugin {
    node: String,
    volumes: PathBuf,
    /// The node's boot process's pid file (the lab's process records): its mount namespace is
    /// the node's.
    boot_pid_file: PathBuf,
}

/// Serves the plugin for `node` (its kubelet directory on the host is `kubelet_dir`) until the
/// returned task is aborted.
pub(crate) fn serve(lab_dir: &Path, node: &str, kubelet_dir: &Path) -> Result<JoinHandle<()>> {
    let plugin = Plugin {
        node: node.to_owned(),
        volumes: volumes_dir(lab_dir),
        boot_pid_file: lab_dir.join("pids").join(format!("{node}_boot")),
    };
    let endpoint = listen(&on_the_host(kubelet_dir, ENDPOINT))?;
    let server = Server::builder()
        .add_service(IdentityServer::new(plugin.clone()))
        .add_service(NodeServer::new(plugin))
        .serve_with_incoming(endpoint);
    let node = node.to_owned();
    Ok(tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::warn!(%node, %error, "the lab's CSI node plugin stopped");
        }
    }))
}

/// The driver's registrar for the node: the `<node>/csi-registrar` process.
pub(crate) fn registrar(program: &Path, kubelet_dir: &Path) -> ProcessSpec {
    let socket = on_the_host(kubelet_dir, REGISTRATION).display().to_string();
    ProcessSpec::new(
        program,
        [
            format!("--socket={socket}"),
            format!("--driver={DRIVER}"),
            format!("--endpoint={ENDPOINT}"),
        ],
    )
}

/// Where a path under the node's /var/lib/kubelet is on the host.
fn on_the_host(kubelet_dir: &Path, path: &str) -> PathBuf {
    kubelet_dir.join(path.trim_start_matches("/var/lib/kubelet/"))
}

fn listen(path: &Path) -> Result<UnixListenerStream> {
    let dir = path.parent().unwrap_or(path);
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    // A socket file of an earlier run of this lab's server (the node's disk keeps it).
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(io(format!("listening on {}", path.display())))?;
    Ok(UnixListenerStream::new(listener))
}

impl Plugin {
    /// The pid of the node's boot, if the node is on: its mount namespace is where pods' volumes
    /// are mounted.
    fn boot_pid(&self) -> std::result::Result<u32, Status> {
        let recorded = std::fs::read_to_string(&self.boot_pid_file).unwrap_or_default();
        let pid: u32 = recorded
            .lines()
            .next()
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| Status::unavailable(format!("node {} has not booted", self.node)))?;
        // A pid outlives its process in the record: the live one is the node's boot only if it
        // still runs the boot script.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let is_boot = cmdline.split(|b| *b == 0).any(|arg| arg == b"nodemedic-node-boot");
        is_boot
            .then_some(pid)
            .ok_or_else(|| Status::unavailable(format!("node {} is off", self.node)))
    }

    /// Runs a shell script in the node's mount namespace.
    async fn in_node(&self, script: &str, args: &[&str]) -> std::result::Result<(), Status> {
        let pid = self.boot_pid()?.to_string();
        let output = tokio::process::Command::new("nsenter")
            .args(["-t", &pid, "-m", "--", "/bin/sh", "-c", script, "lab-csi"])
            .args(args)
            .output()
            .await
            .map_err(|e| Status::internal(format!("nsenter: {e}")))?;
        if output.status.success() {
            return Ok(());
        }
        Err(Status::internal(format!(
            "on node {}: {}",
            self.node,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn checked(path: &str, what: &str) -> std::result::Result<(), Status> {
    if path.is_empty() || !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return Err(Status::invalid_argument(format!(
            "{what} {path:?} is not an absolute path"
        )));
    }
    Ok(())
}

fn checked_volume(id: &str) -> std::result::Result<(), Status> {
    let plain = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    plain
        .then_some(())
        .ok_or_else(|| Status::invalid_argument(format!("volume id {id:?} is not a lab volume handle")))
}

#[tonic::async_trait]
impl Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {}))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {}))
    }
}

/// Mounts `$2` (the volume's directory) at `$1` (the kubelet's target) once; read-only if `$3`.
const PUBLISH: &str = r#"mkdir -p "$1" || exit 1
mountpoint -q "$1" && exit 0
mount --bind "$2" "$1" || exit 1
[ "$3" = ro ] || exit 0
mount -o remount,bind,ro "$1""#;

/// Unmounts `$1` if mounted, and removes the empty target.
const UNPUBLISH: &str = r#"if mountpoint -q "$1"; then umount "$1" || exit 1; fi
rmdir "$1" 2>/dev/null || true"#;

#[tonic::async_trait]
impl Node for Plugin {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        checked_volume(&request.volume_id)?;
        checked(&request.target_path, "target path")?;
        let source = self.volumes.join(&request.volume_id);
        std::fs::create_dir_all(&source).map_err(|e| Status::internal(format!("{}: {e}", source.display())))?;
        let source = source.display().to_string();
        let mode = if request.readonly { "ro" } else { "rw" };
        self.in_node(PUBLISH, &[&request.target_path, &source, mode]).await?;
        tracing::info!(node = %self.node, volume = %request.volume_id, target = %request.target_path, "published");
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        checked(&request.target_path, "target path")?;
        self.in_node(UNPUBLISH, &[&request.target_path]).await?;
        tracing::info!(node = %self.node, volume = %request.volume_id, "unpublished");
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {}))
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_targets_and_plain_handles_are_accepted() {
        assert!(checked("/var/lib/kubelet/pods/x/volumes/mount", "t").is_ok());
        assert!(checked("relative", "t").is_err());
        assert!(checked("/var/lib/../../etc", "t").is_err());
        assert!(checked_volume("lab-vol-3").is_ok());
        assert!(checked_volume("../etc").is_err());
        assert!(checked_volume("").is_err());
    }
}
