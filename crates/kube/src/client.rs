//! Client construction, and the crate's error type.

use std::time::Duration;

use kube::{Client, Config};

use crate::CallContext;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot find a Kubernetes configuration (in-cluster, or KUBECONFIG / ~/.kube/config): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// A request that failed, named (see [`crate::context::CallContext`]): a log line says which
    /// of a reconcile's many requests it was.
    #[error("{call}: {source}")]
    Call {
        call: String,
        #[source]
        source: kube::Error,
    },
    #[error("node lease {lease} is held by {holder}")]
    LeaseHeld { lease: String, holder: String },
    #[error("{what} did not settle after {attempts} conflicting updates")]
    Conflict { what: String, attempts: u32 },
    #[error("serving {what} failed: {source}")]
    Serve { what: &'static str, source: std::io::Error },
    #[error("admission webhook: {0}")]
    Webhook(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the API server's answer has no usable Date header: {0}")]
    ServerClock(String),
    #[error("{what} took longer than {after:?}")]
    Timeout { what: String, after: std::time::Duration },
    #[error("{0} has no namespace")]
    Unnamespaced(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The API of a namespaced object's kind in the object's own namespace.
pub fn namespaced_api<K>(client: &Client, object: &K) -> Result<kube::Api<K>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    let namespace = object
        .meta()
        .namespace
        .clone()
        .ok_or_else(|| Error::Unnamespaced(object.meta().name.clone().unwrap_or_default()))?;
    Ok(kube::Api::namespaced(client.clone(), &namespace))
}

impl Error {
    /// A failed request named after what it was for; [`crate::CallContext`] on a whole result.
    pub fn call(call: impl Into<String>, source: kube::Error) -> Self {
        Self::Call {
            call: call.into(),
            source,
        }
    }

    /// The API request's own error, named or not.
    pub fn kube(&self) -> Option<&kube::Error> {
        match self {
            Self::Kube(source) | Self::Call { source, .. } => Some(source),
            _ => None,
        }
    }

    /// A short label for metrics: `kube` for an API request's failure, `support` for most others.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unnamespaced(_) => "unnamespaced",
            _ if self.kube().is_some() => "kube",
            _ => "support",
        }
    }

    /// Whether the API server refused a write as conflicting (409): typically one locked to a
    /// resourceVersion the object no longer has, computed from an outdated read.
    pub fn is_conflict(&self) -> bool {
        self.api_status() == Some(409)
    }

    /// The status code of the API server's answer, when it answered with an error.
    pub fn api_status(&self) -> Option<u16> {
        match self.kube()? {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }
}

/// The configuration this process should use: in-cluster, or KUBECONFIG / ~/.kube/config.
pub async fn infer_config() -> Result<Config> {
    Ok(Config::infer().await?)
}

/// The client controllers use: kube's defaults (retries on 429/503/504 with backoff).
pub fn client(config: Config) -> Result<Client> {
    Client::try_from(config).context("building the Kubernetes client")
}

/// A client whose every request fails fast and deterministically, for reachability probes and
/// evictions, where a retrying client would hide the answer (a 429 from a PodDisruptionBudget,
/// an unreachable API server) inside its backoff.
pub fn fail_fast_client(mut config: Config, timeout: Duration) -> Result<Client> {
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Client::try_from(config).context("building the Kubernetes client")
}

/// A client that does not retry but keeps kube's default timeouts (watches stay open).
pub fn no_retry_client(mut config: Config) -> Result<Client> {
    config.default_retry = false;
    Client::try_from(config).context("building the Kubernetes client")
}
