//! How long a remediation's safe time has provably run, on clocks that outlive one controller
//! process.
//!
//! The manager that observes the acceptance quorum measures the wait on its own monotonic
//! clock. It also records the start on the API server's clock (the `Date` of an answer given
//! after the acceptance read), with the membership epoch the quorum was counted in, so a new
//! leader continues the wait instead of starting it again. Either measure alone is a lower bound
//! of the real time passed; the larger is used. A wait counts only while the membership has no
//! configuration newer than the one it was counted in.

use std::time::Duration;

use jiff::Timestamp;

/// How far any API server's clock may be from true time. API servers keep NTP time (usually
/// within milliseconds); a second leaves room for a lagging replica.
pub(crate) const SERVER_CLOCK_SKEW: Duration = Duration::from_secs(1);
/// `Date` headers have whole seconds.
pub(crate) const SERVER_CLOCK_GRANULARITY: Duration = Duration::from_secs(1);

/// A wait as the remediation's status records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedWait {
    /// The API server's `Date` on an answer given after the acceptance read.
    pub started: Timestamp,
    /// The newest membership epoch when the quorum was counted.
    pub epoch: u64,
}

/// A wait this manager process observed itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalWait {
    /// On this process's monotonic clock.
    pub elapsed: Duration,
    pub epoch: u64,
}

/// Real time passed since `started` on the server clock is more than the two `Date`s apart,
/// less one granule (the start was truncated) and twice the skew (two readings, maybe from two
/// API servers).
pub(crate) fn server_elapsed(started: Timestamp, now: Timestamp) -> Duration {
    let apart = Duration::try_from(now.duration_since(started)).unwrap_or(Duration::ZERO);
    apart.saturating_sub(SERVER_CLOCK_GRANULARITY + SERVER_CLOCK_SKEW * 2)
}

/// How long the wait has provably run, or None when it must (re)start: nothing recorded, or a
/// membership change since it began.
pub fn waited(
    local: Option<LocalWait>,
    recorded: Option<RecordedWait>,
    server_now: Option<Timestamp>,
    epoch_now: u64,
) -> Option<Duration> {
    let local = local.filter(|l| l.epoch == epoch_now).map(|l| l.elapsed);
    let server = recorded
        .filter(|r| r.epoch == epoch_now)
        .zip(server_now)
        .map(|(r, now)| server_elapsed(r.started, now));
    match (local, server) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    #[test]
    fn a_new_leader_continues_the_recorded_wait_less_the_clock_uncertainty() {
        let recorded = RecordedWait {
            started: at(100),
            epoch: 3,
        };
        assert_eq!(
            waited(None, Some(recorded), Some(at(110)), 3),
            Some(Duration::from_secs(7))
        );
        assert_eq!(waited(None, Some(recorded), Some(at(101)), 3), Some(Duration::ZERO));
        assert_eq!(
            waited(None, Some(recorded), None, 3),
            None,
            "no server clock: start afresh"
        );
    }

    #[test]
    fn the_longer_provable_measure_wins() {
        let recorded = RecordedWait {
            started: at(100),
            epoch: 3,
        };
        let local = LocalWait {
            elapsed: Duration::from_secs(9),
            epoch: 3,
        };
        assert_eq!(
            waited(Some(local), Some(recorded), Some(at(110)), 3),
            Some(Duration::from_secs(9))
        );
        assert_eq!(
            waited(Some(local), Some(recorded), Some(at(120)), 3),
            Some(Duration::from_secs(17))
        );
    }

    #[test]
    fn a_membership_change_voids_every_wait() {
        let recorded = RecordedWait {
            started: at(100),
            epoch: 3,
        };
        let local = LocalWait {
            elapsed: Duration::from_secs(60),
            epoch: 3,
        };
        assert_eq!(waited(Some(local), Some(recorded), Some(at(200)), 4), None);
    }
}
