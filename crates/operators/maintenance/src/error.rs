#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("encoding a status: {0}")]
    Encode(#[from] serde_json::Error),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Support(_) => "support",
            Self::Encode(_) => "encode",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
