//! Where the control-plane binaries are: `KUBEBUILDER_ASSETS` first (the envtest convention),
//! then the cache `scripts/build-controlplane.sh` fills, keyed by the pinned versions.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

const VERSIONS: &str = include_str!("../../../scripts/versions.env");

/// A pinned version from scripts/versions.env.
pub fn version(name: &str) -> &'static str {
    VERSIONS
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(key, _)| key.trim() == name)
        .map(|(_, value)| value.trim())
        .unwrap_or("unknown")
}

pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("NODEMEDIC_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/nodemedic")
        })
}

pub fn build_dir() -> PathBuf {
    cache_dir().join("bin").join(format!(
        "k8s-v{}-etcd-v{}-kwok-v{}",
        version("KUBERNETES_VERSION"),
        version("ETCD_VERSION"),
        version("KWOK_VERSION")
    ))
}

/// Helm and the Prometheus operator's CRDs, as `scripts/build-tools.sh` fills them.
pub fn tools_dir() -> PathBuf {
    cache_dir().join("bin").join(format!(
        "tools-helm-v{}-prometheus-operator-v{}",
        version("HELM_VERSION"),
        version("PROMETHEUS_OPERATOR_VERSION")
    ))
}

/// Cluster API's manager and CRDs and the OpenShift Machine API CRDs, as
/// `scripts/build-machine-layer.sh` fills them.
pub fn machine_layer_dir() -> PathBuf {
    cache_dir().join("bin").join(format!(
        "machine-layer-capi-v{}-openshift-api-{}",
        version("CLUSTER_API_VERSION"),
        version("OPENSHIFT_API_VERSION")
    ))
}

/// The upstream descheduler, Prometheus and promtool, as `scripts/build-descheduler.sh` fills them.
pub fn rebalancing_dir() -> PathBuf {
    cache_dir().join("bin").join(format!(
        "rebalancing-descheduler-v{}-prometheus-{}",
        version("DESCHEDULER_VERSION"),
        version("PROMETHEUS_DEBIAN_VERSION")
    ))
}

#[derive(Clone, Debug)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubectl: PathBuf,
    pub kwok: PathBuf,
}

fn find(name: &str) -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("KUBEBUILDER_ASSETS")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    dirs.push(build_dir());
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| Error::MissingBinary {
            binary: name.into(),
            looked: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Binaries {
    pub fn locate() -> Result<Self> {
        Ok(Self {
            etcd: find("etcd")?,
            kube_apiserver: find("kube-apiserver")?,
            kube_controller_manager: find("kube-controller-manager")?,
            kube_scheduler: find("kube-scheduler")?,
            kubectl: find("kubectl")?,
            kwok: find("kwok")?,
        })
    }
}

/// A tool the lab shells out to (`ip`, `nft`), with the same clear error when it is missing.
pub(crate) fn tool(name: &str) -> Result<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| Error::MissingTool { what: name.into() })
}
