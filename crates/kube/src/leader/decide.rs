//! What a contender for the lease does next: plain functions of what it has seen, no I/O.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

/// The lease's timing, from its duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timing {
    pub duration: Duration,
}

impl Timing {
    pub(crate) fn new(duration: Duration) -> Self {
        Self {
            duration: duration.max(Duration::from_secs(3)),
        }
    }

    /// A leader renews a third of the way into its lease; a standby reads the lease as often.
    pub(crate) fn renew_every(self) -> Duration {
        self.duration / 3
    }
}

/// What this replica last saw of the lease, by its own clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub holder: Option<String>,
    /// The lease's resourceVersion: any write changes it.
    pub version: String,
    /// The duration the lease itself states (a replica started with another `--lease-seconds`).
    pub stated: Option<Duration>,
    /// When this replica first had this version back: no earlier than the write that made it
    /// was sent.
    pub changed_at: Instant,
    /// When this replica sent its last read, which found this version: the lease had not
    /// changed since `changed_at` at least until then.
    pub looked_at: Instant,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Read the lease.
    Look,
    /// Write this replica in as the holder (create the lease if there is none).
    Acquire,
    /// Renew the lease this replica holds.
    Renew,
    /// Stop acting: another replica holds the lease.
    Resign,
    Wait(Duration),
}

/// What a contender knows when it decides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub me: &'a str,
    /// `None` before the first read, and after a read that found no lease.
    pub seen: Option<&'a Seen>,
    /// While leading: when the last renewal that succeeded was sent.
    pub renewed: Option<Instant>,
    /// Whether a read has succeeded since the start.
    pub looked: bool,
    pub now: Instant,
    pub timing: Timing,
}

/// The next step.
pub(crate) fn next(view: View<'_>) -> Next {
    let View {
        me,
        seen,
        renewed,
        looked,
        now,
        timing,
    } = view;
    // A leader that cannot reach the API server keeps trying to renew: it resigns when it reads
    // that another holds the lease (docs/outages.md says why it does not resign by time).
    if let Some(renewed) = renewed {
        if seen.is_some_and(|s| s.holder.as_deref() != Some(me)) {
            return Next::Resign;
        }
        let due = renewed + timing.renew_every();
        return if now >= due { Next::Renew } else { Next::Wait(due - now) };
    }
    let Some(seen) = seen else {
        return if looked { Next::Acquire } else { Next::Look };
    };
    // Ours (this process's earlier run: identities are unique pods) or free: take it now.
    if seen.holder.as_deref().is_none_or(|h| h.is_empty() || h == me) {
        return Next::Acquire;
    }
    let lasts = seen
        .stated
        .map_or(timing.duration, |stated| stated.max(timing.duration));
    let expires = seen.changed_at + lasts;
    if seen.looked_at >= expires {
        return Next::Acquire;
    }
    // Read every renewal period: the last renewal of a leader that died is seen soon after it
    // was made, and the lease is taken a lease duration after that.
    let look_at = (seen.looked_at + timing.renew_every()).min(expires);
    if now >= look_at {
        Next::Look
    } else {
        Next::Wait(look_at - now)
    }
}

/// Folds a read (sent at `sent`, answered at `answered`) into what was seen: the change time
/// moves only when the lease changed, and then to the answer's time, which is no earlier than
/// the write that changed it.
pub(crate) fn observe(before: Option<&Seen>, lease: &Lease, sent: Instant, answered: Instant) -> Seen {
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    let changed_at = match before {
        Some(seen) if seen.version == version => seen.changed_at,
        _ => answered,
    };
    let spec = lease.spec.as_ref();
    Seen {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        version,
        stated: spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs),
        changed_at,
        looked_at: sent,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const ME: &str = "controller-a";
    const OTHER: &str = "controller-b";

    fn timing() -> Timing {
        Timing::new(Duration::from_secs(15))
    }

    fn seen(holder: Option<&str>, changed_at: Instant, looked_at: Instant) -> Seen {
        Seen {
            holder: holder.map(str::to_owned),
            version: "1".into(),
            stated: Some(Duration::from_secs(15)),
            changed_at,
            looked_at,
        }
    }

    fn view<'a>(me: &'a str, seen: Option<&'a Seen>, renewed: Option<Instant>, now: Instant) -> View<'a> {
        View {
            me,
            seen,
            renewed,
            looked: true,
            now,
            timing: timing(),
        }
    }

    #[test]
    fn a_new_replica_looks_first_and_takes_a_lease_nobody_holds() {
        let t0 = Instant::now();
        let first = View {
            looked: false,
            ..view(ME, None, None, t0)
        };
        assert_eq!(next(first), Next::Look);
        assert_eq!(next(view(ME, None, None, t0)), Next::Acquire, "no lease yet");
        assert_eq!(next(view(ME, Some(&seen(None, t0, t0)), None, t0)), Next::Acquire);
        assert_eq!(
            next(view(ME, Some(&seen(Some(ME), t0, t0)), None, t0)),
            Next::Acquire,
            "its own earlier run held it"
        );
    }

    #[test]
    fn a_standby_reads_every_renewal_period_and_takes_over_after_a_lease_without_a_change() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let held = seen(Some(OTHER), t0, t0);
        assert_eq!(
            next(view(ME, Some(&held), None, at(1))),
            Next::Wait(Duration::from_secs(4))
        );
        assert_eq!(next(view(ME, Some(&held), None, at(5))), Next::Look);
        let unchanged = seen(Some(OTHER), t0, at(10));
        assert_eq!(
            next(view(ME, Some(&unchanged), None, at(12))),
            Next::Wait(Duration::from_secs(3))
        );
        assert_eq!(
            next(view(ME, Some(&unchanged), None, at(15))),
            Next::Look,
            "read once more"
        );
        let expired = seen(Some(OTHER), t0, at(15));
        assert_eq!(next(view(ME, Some(&expired), None, at(15))), Next::Acquire);
    }

    #[test]
    fn a_standby_waits_the_longer_of_its_own_duration_and_the_lease_s() {
        let t0 = Instant::now();
        let mut longer = seen(Some(OTHER), t0, t0 + Duration::from_secs(20));
        longer.stated = Some(Duration::from_secs(30));
        assert_eq!(
            next(view(ME, Some(&longer), None, t0 + Duration::from_secs(20))),
            Next::Wait(Duration::from_secs(5))
        );
    }

    #[test]
    fn a_standby_back_from_an_outage_takes_an_unrenewed_lease_at_once() {
        let t0 = Instant::now();
        let before = seen(Some(OTHER), t0, t0);
        let back = t0 + Duration::from_secs(600);
        assert_eq!(next(view(ME, Some(&before), None, back)), Next::Look);
        assert_eq!(
            next(view(ME, Some(&seen(Some(OTHER), t0, back)), None, back)),
            Next::Acquire
        );
    }

    #[test]
    fn a_leader_renews_a_third_in_and_keeps_trying_through_an_outage() {
        let t0 = Instant::now();
        let mine = seen(Some(ME), t0, t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(
            next(view(ME, Some(&mine), Some(t0), at(1))),
            Next::Wait(Duration::from_secs(4))
        );
        assert_eq!(next(view(ME, Some(&mine), Some(t0), at(5))), Next::Renew);
        assert_eq!(
            next(view(ME, Some(&mine), Some(t0), at(600))),
            Next::Renew,
            "after an outage"
        );
    }

    #[test]
    fn a_leader_that_reads_another_holder_resigns_at_once() {
        let t0 = Instant::now();
        assert_eq!(
            next(view(ME, Some(&seen(Some(OTHER), t0, t0)), Some(t0), t0)),
            Next::Resign
        );
    }

    #[test]
    fn a_read_starts_the_clock_at_its_answer_and_a_same_version_keeps_it() {
        let t0 = Instant::now();
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                resource_version: Some("7".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let first = observe(None, &lease, t0, t0 + Duration::from_secs(3));
        assert_eq!((first.changed_at, first.looked_at), (t0 + Duration::from_secs(3), t0));
        let later = observe(
            Some(&first),
            &lease,
            t0 + Duration::from_secs(9),
            t0 + Duration::from_secs(10),
        );
        assert_eq!(later.changed_at, t0 + Duration::from_secs(3));
        assert_eq!(later.looked_at, t0 + Duration::from_secs(9));
    }

    proptest! {
        /// A standby takes the lease only after a whole lease (the longer of its own duration and
        /// the lease's) without a change it saw, however late or often it looks.
        #[test]
        fn a_standby_takes_a_lease_only_after_a_whole_lease_unchanged(
            seconds in 3u64..600,
            stated in proptest::option::of(3u64..600),
            looked_after_ms in 0u64..2_000_000,
            now_after_ms in 0u64..2_000_000,
        ) {
            let timing = Timing::new(Duration::from_secs(seconds));
            let changed_at = Instant::now();
            let looked_at = changed_at + Duration::from_millis(looked_after_ms);
            let now = looked_at + Duration::from_millis(now_after_ms);
            let saw = Seen { stated: stated.map(Duration::from_secs), ..seen(Some(OTHER), changed_at, looked_at) };
            let step = next(View { timing, ..view(ME, Some(&saw), None, now) });
            let lasts = saw.stated.map_or(timing.duration, |s| s.max(timing.duration));
            prop_assert!(step != Next::Acquire || looked_at >= changed_at + lasts, "{step:?}");
        }
    }
}
