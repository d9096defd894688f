#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    /// Running the agent itself failed (not its configuration): retried.
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            // An API request's failure (named by its CallContext), or another of the support crate's.
            Self::Support(e) => e.kind(),
            Self::Agent(_) => "agent",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
