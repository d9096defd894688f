//! Client construction, and the crate's error type.

use std::time::Duration;

use kube::{Client, Config};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot find a Kubernetes configuration (in-cluster, or KUBECONFIG / ~/.kube/config): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("leader election failed: {0}")]
    Leader(#[from] kube_lease_manager::LeaseManagerError),
    #[error("node lease {lease} is held by {holder}")]
    LeaseHeld { lease: String, holder: String },
    #[error("{what} did not settle after {attempts} conflicting updates")]
    Conflict { what: String, attempts: u32 },
    #[error("serving {what} failed: {source}")]
    Serve { what: &'static str, source: std::io::Error },
    #[error("the API server's answer has no usable Date header: {0}")]
    ServerClock(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The configuration this process should use: in-cluster, or KUBECONFIG / ~/.kube/config.
pub async fn infer_config() -> Result<Config> {
    Ok(Config::infer().await?)
}

/// The client controllers use: kube's defaults (retries on 429/503/504 with backoff).
pub fn client(config: Config) -> Result<Client> {
    Ok(Client::try_from(config)?)
}

/// A client whose every request fails fast and deterministically, for reachability probes and
/// evictions, where a retrying client would hide the answer (a 429 from a PodDisruptionBudget,
/// an unreachable API server) inside its backoff.
pub fn fail_fast_client(mut config: Config, timeout: Duration) -> Result<Client> {
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(Client::try_from(config)?)
}

/// A client that does not retry but keeps kube's default timeouts (watches stay open).
pub fn no_retry_client(mut config: Config) -> Result<Client> {
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}
