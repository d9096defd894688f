#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("{0} has no namespace")]
    Unnamespaced(String),
    #[error("cannot write the descheduler policy as YAML: {0}")]
    Render(String),
    #[error("Prometheus at {url}: {why}")]
    Prometheus { url: String, why: String },
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Support(e) if e.kube().is_some() => "kube",
            Self::Support(_) => "support",
            Self::Unnamespaced(_) => "unnamespaced",
            Self::Render(_) => "render",
            Self::Prometheus { .. } => "prometheus",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
