#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("NodeHealthCheck {name}: {why}")]
    InvalidSpec { name: String, why: String },
    #[error("{0} has no name")]
    Unnamed(&'static str),
    #[error("the {0} is unusable: a thread panicked while changing it")]
    Poisoned(&'static str),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            // An API request's failure (named by its CallContext), or another of the support crate's.
            Self::Support(e) => e.kind(),
            Self::InvalidSpec { .. } => "invalid_spec",
            Self::Unnamed(_) => "unnamed",
            Self::Poisoned(_) => "poisoned",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
