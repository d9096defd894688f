#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("cannot write the descheduler policy as YAML: {0}")]
    Render(String),
    #[error("Prometheus at {url}: {why}")]
    Prometheus { url: String, why: String },
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            // An API request's failure (named by its CallContext), or another of the support crate's.
            Self::Support(e) => e.kind(),
            Self::Render(_) => "render",
            Self::Prometheus { .. } => "prometheus",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
