use crate::watchdog::WatchdogError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error(transparent)]
    Watchdog(#[from] WatchdogError),
    #[error("peer certificate: {0}")]
    Certificate(String),
    #[error("peer detection settings: {0}")]
    InvalidDetector(String),
    #[error("{what} cannot listen on {address}: {source} (choose another address or port with its flag)")]
    Listen {
        what: &'static str,
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("peer server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the agent's state lock was poisoned by a panic")]
    Poisoned,
    #[error("SelfNodeRemediationConfig {name}: {why}")]
    InvalidConfig { name: String, why: String },
    #[error("{0} has no name")]
    Unnamed(&'static str),
    #[error("SelfNodeRemediation {0} names no node yet: its Machine's node is not recorded")]
    Unresolved(String),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            // An API request's failure (named by its CallContext), or another of the support crate's.
            Self::Support(e) => e.kind(),
            Self::Watchdog(_) => "watchdog",
            Self::Certificate(_) => "certificate",
            Self::Transport(_) => "transport",
            Self::Listen { .. } => "listen",
            Self::Poisoned => "poisoned",
            Self::InvalidConfig { .. } | Self::InvalidDetector(_) => "invalid_config",
            Self::Unnamed(_) => "unnamed",
            Self::Unresolved(_) => "unresolved",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
