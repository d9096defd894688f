#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("{0} has no namespace")]
    Unnamespaced(String),
    /// Running the agent itself failed (not its configuration): retried.
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            // Kubernetes API errors arrive inside nodemedic_kube's error, named by its CallContext.
            Self::Support(e) if e.kube().is_some() => "kube",
            Self::Support(_) => "support",
            Self::Unnamespaced(_) => "unnamespaced",
            Self::Agent(_) => "agent",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
