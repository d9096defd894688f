//! Names a failed API request after what it was for. A bare `kube::Error` says what the API
//! server answered ("nodes \"w1\" not found", a timeout) but not which of a reconcile's requests
//! it answered, and the operators' logs and events carry only the error.

use crate::{Error, Result};

/// Its methods share anyhow's names: where both traits are in scope, a call on a `kube::Error`
/// result is ambiguous, so a module imports one of them.
pub trait CallContext<T> {
    /// Names the request, e.g. `.context("listing SelfNodeRemediations")`.
    fn context(self, call: &str) -> Result<T>;
    /// Names the request with a message built only when it failed.
    fn with_context(self, call: impl FnOnce() -> String) -> Result<T>;
}

impl<T> CallContext<T> for std::result::Result<T, kube::Error> {
    fn context(self, call: &str) -> Result<T> {
        self.with_context(|| call.to_owned())
    }

    fn with_context(self, call: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Call { call: call(), source })
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use kube::core::Status;

    use super::*;

    fn not_found() -> kube::Error {
        kube::Error::Api(Box::new(
            Status::failure("nodes \"w1\" not found", "NotFound").with_code(404),
        ))
    }

    #[test]
    fn the_message_names_the_call_and_keeps_the_source() {
        let failed: std::result::Result<(), _> = Err(not_found());
        let error = failed.context("reading node w1").expect_err("failed");
        let message = error.to_string();
        assert!(message.starts_with("reading node w1: "), "{message}");
        assert!(message.contains("nodes \"w1\" not found"), "{message}");
        let source = error.source().expect("a source");
        assert_eq!(source.to_string(), not_found().to_string());
        assert_eq!(error.api_status(), Some(404));
        assert!(matches!(error.kube(), Some(kube::Error::Api(s)) if s.code == 404));
    }

    #[test]
    fn the_name_is_built_only_on_failure() {
        let ok: std::result::Result<u8, kube::Error> = Ok(7);
        let value = ok.with_context(|| unreachable!("not built for a success")).expect("ok");
        assert_eq!(value, 7);
        let failed: std::result::Result<u8, _> = Err(not_found());
        let error = failed
            .with_context(|| format!("reading node {}", "w1"))
            .expect_err("failed");
        assert!(matches!(&error, Error::Call { call, .. } if call == "reading node w1"));
    }
}
