//! Waiting for a condition with a deadline: tests never sleep and hope.

use std::{future::Future, time::Duration};

use crate::{Error, Result};

/// Polls `check` every 200 ms until it yields `Some`, or fails after `timeout` with what it last
/// saw. `check` returning an error is treated as "not yet" (the API server may be restarting).
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    until_every(what, timeout, Duration::from_millis(200), check).await
}

/// [`until`] polling every `interval`, for checks too heavy to run five times a second.
pub async fn until_every<T, F, Fut>(what: &str, timeout: Duration, interval: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last = Some(error.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
                last,
            });
        }
        tokio::time::sleep(interval).await;
    }
}
