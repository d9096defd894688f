//! How every watch and controller waits after an error: never longer than two seconds, so each
//! comes back within a couple of seconds of the API server's return, however long it was gone.
//!
//! kube-runtime's default (client-go's reflector: 0.8 s doubling to 30 s) leaves a watch asleep
//! for up to 30 s after a long outage, and each failure while the server starts (a refused
//! connection, a 403 while its RBAC catches up) can cost another 30 s: a remediation the agents
//! had accepted waited more than 30 s for the manager's watch to wake (issue 60).
//!
//! Prompt without hammering: the wait doubles from 250 ms to 1 s and each wait gets up to as much
//! again at random (backon's jitter), so at the cap a watch retries every 1 to 2 s, and many
//! processes (a fleet's agents) spread evenly over that second instead of arriving together.
//! Against a server that is down a retry is a refused connection, which costs it nothing; against
//! one that is starting it is a request that API Priority and Fairness queues or refuses with a
//! 429. A success resets the wait (kube-runtime's `StreamBackoff` does on every event).

use std::time::Duration;

use kube::runtime::{
    Controller,
    watcher::{self, ExponentialBackoff},
};

/// The first wait after an error.
pub const FIRST: Duration = Duration::from_millis(250);
/// The longest wait before jitter; with it, a wait is at most twice this.
pub const CAP: Duration = Duration::from_secs(1);

/// A fresh prompt backoff: for `WatchStreamExt::backoff` and [`Controller::trigger_backoff`].
pub fn prompt() -> ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(FIRST)
        .with_max_delay(CAP)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// A controller on `api` whose watches (its own and those added by `owns` and `watches`) back
/// off promptly. Every controller is built here: `Controller::new` would bring kube-runtime's
/// 30 s backoff back (clippy's disallowed-methods refuses it elsewhere).
pub fn controller<K>(api: kube::Api<K>, config: watcher::Config) -> Controller<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    #[allow(
        clippy::disallowed_methods,
        reason = "the one place a controller is built, with the prompt backoff"
    )]
    let controller = Controller::new(api, config);
    controller.trigger_backoff(prompt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_from_a_quarter_second_and_never_pass_two_seconds() {
        for _ in 0..50 {
            let waits: Vec<Duration> = prompt().take(40).collect();
            assert!(waits[0] >= FIRST && waits[0] < FIRST * 2, "first wait {:?}", waits[0]);
            assert!(
                waits.iter().all(|w| *w < CAP * 2),
                "a wait over {:?}: {waits:?}",
                CAP * 2
            );
            assert!(
                waits[10..].iter().all(|w| *w >= CAP),
                "the cap reached after a few: {waits:?}"
            );
        }
    }

    #[test]
    fn waits_at_the_cap_spread_over_a_second() {
        let waits: Vec<Duration> = prompt().skip(5).take(2_000).collect();
        let (low, high) = (waits.iter().min().copied(), waits.iter().max().copied());
        let (Some(low), Some(high)) = (low, high) else {
            panic!("no waits");
        };
        assert!(
            high - low > Duration::from_millis(800),
            "jitter spreads retries: {low:?}..{high:?}"
        );
    }

    #[test]
    fn a_reset_starts_again_from_the_first_wait() {
        use kube::runtime::utils::Backoff;
        let mut backoff = prompt();
        let _: Vec<Duration> = backoff.by_ref().take(10).collect();
        backoff.reset();
        let next = backoff.next();
        assert!(next.is_some_and(|w| w < FIRST * 2), "after a reset: {next:?}");
    }
}
