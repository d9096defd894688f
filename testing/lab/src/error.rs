use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the lab needs root (it creates network namespaces, bridges and nftables rules): run as root")]
    NotRoot,
    #[error(
        "{binary} not found (looked in {looked}): run `make setup` (scripts/build-controlplane.sh builds it), or point KUBEBUILDER_ASSETS at a directory holding it"
    )]
    MissingBinary { binary: String, looked: String },
    #[error("{what} not found: run `make setup`, which installs it")]
    MissingTool { what: String },
    #[error(
        "a real node needs {what}, which is missing ({looked}): run `bash scripts/setup.sh later` (scripts/build-node.sh and scripts/build-controlplane.sh build it)"
    )]
    MissingNodePart { what: String, looked: String },
    #[error(
        "refusing to start a real node: this machine has {path}, which a privileged pod on a real node could reach ({why}); run real nodes on a machine without it, or only kwok nodes here"
    )]
    UnsafeHost { path: String, why: &'static str },
    #[error("real node {node} did not boot: {detail}")]
    NodeBoot { node: String, detail: String },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A named request of nodemedic's shared Kubernetes helpers (finalizers, machines).
    #[error("{0}")]
    Request(#[from] nodemedic_kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("certificates: {0}")]
    Pki(#[from] nodemedic_kube::pki::PkiError),
    #[error("timed out after {seconds}s waiting for {what}{}", last.as_ref().map(|l| format!(" (last seen: {l})")).unwrap_or_default())]
    Timeout {
        what: String,
        seconds: u64,
        last: Option<String>,
    },
    #[error("{process} exited early; its log {log} ends with:\n{tail}")]
    ProcessDied {
        process: String,
        log: PathBuf,
        tail: String,
    },
    #[error("no node named {0} in this lab")]
    UnknownNode(String),
    #[error("no process named {0} in this lab")]
    UnknownProcess(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
