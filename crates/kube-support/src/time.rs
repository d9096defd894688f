//! Wall-clock helpers between jiff timestamps and Kubernetes `Time`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

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
