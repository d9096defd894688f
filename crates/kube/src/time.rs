//! Wall-clock helpers between jiff timestamps and Kubernetes `Time`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

use crate::{CallContext, Error, Result};

pub fn now() -> Time {
    Time(jiff::Timestamp::now())
}

pub fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// `t + d`, saturating at the end of representable time.
pub fn add(t: &Time, d: Duration) -> Time {
    let span = jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    Time(t.0.checked_add(span).unwrap_or(jiff::Timestamp::MAX))
}

/// How long from `earlier` to `later`; zero when `later` is not after `earlier`.
pub fn since(earlier: &jiff::Timestamp, later: &jiff::Timestamp) -> Duration {
    Duration::try_from(later.duration_since(*earlier)).unwrap_or(Duration::ZERO)
}

/// RFC 3339, as medik8s writes timestamps into annotations.
pub fn rfc3339(t: &jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The API server's own clock, read from the `Date` header of a request it answers itself
/// (`/version`): whole seconds, truncated. A clock that outlives any one controller process, for
/// waits a new leader must continue rather than restart.
pub async fn server_now(client: &kube::Client) -> Result<jiff::Timestamp> {
    let request = http::Request::get("/version")
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| Error::ServerClock(e.to_string()))?;
    let response = client
        .send(request)
        .await
        .context("reading the API server's clock (GET /version)")?;
    let date = response
        .headers()
        .get(http::header::DATE)
        .ok_or_else(|| Error::ServerClock("no Date header".into()))?
        .to_str()
        .map_err(|e| Error::ServerClock(e.to_string()))?;
    parse_http_date(date)
}

/// An HTTP date (`Tue, 24 Nov 2026 02:36:08 GMT`, RFC 9110).
pub(crate) fn parse_http_date(text: &str) -> Result<jiff::Timestamp> {
    jiff::fmt::rfc2822::parse(text)
        .map(|zoned| zoned.timestamp())
        .map_err(|e| Error::ServerClock(format!("{text:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_parse_to_whole_seconds() {
        let t = parse_http_date("Tue, 24 Nov 2026 02:36:08 GMT").expect("parses");
        assert_eq!(t.to_string(), "2026-11-24T02:36:08Z");
        assert!(parse_http_date("yesterday").is_err());
    }
}
