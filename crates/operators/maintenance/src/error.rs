#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Support(#[from] nodemedic_kube::Error),
    #[error("encoding a status: {0}")]
    Encode(#[from] serde_json::Error),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            // An API request's failure (named by its CallContext), or another of the support crate's.
            Self::Support(e) => e.kind(),
            Self::Encode(_) => "encode",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use kube::core::Status;
    use nodemedic_kube::CallContext;

    use super::*;

    #[test]
    fn a_named_api_error_says_its_call_and_counts_as_kube() {
        let status = Status::failure("nodes \"w1\" not found", "NotFound").with_code(404);
        let failed: std::result::Result<(), _> = Err(kube::Error::Api(Box::new(status)));
        let error = Error::from(failed.context("reading node w1").expect_err("failed"));
        assert!(error.to_string().starts_with("reading node w1: "), "{error}");
        assert_eq!(error.kind(), "kube");
        let held = Error::from(nodemedic_kube::Error::LeaseHeld {
            lease: "node-w1".into(),
            holder: "someone".into(),
        });
        assert_eq!(held.kind(), "support");
    }
}
