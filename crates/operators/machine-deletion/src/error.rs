#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("{0} has no namespace")]
    Unnamespaced(String),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Support(e) if e.kube().is_some() => "kube",
            Self::Support(_) => "support",
            Self::Unnamespaced(_) => "unnamespaced",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
