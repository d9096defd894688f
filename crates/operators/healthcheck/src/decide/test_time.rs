//! Times for the decisions' tests.

use jiff::Timestamp;

/// A time `s` seconds after the epoch.
pub(super) fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).expect("valid")
}
