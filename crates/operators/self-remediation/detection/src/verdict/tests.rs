use super::*;
use proptest::prelude::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).expect("in range")
}

fn ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).expect("in range")
}

fn seen(observer: &str, since: i64, reported: i64) -> Observation {
    Observation {
        observer: observer.into(),
        unreachable_since: t(since),
        reported_at: t(reported),
    }
}

fn probes(answered: Option<i64>, unanswered: Option<i64>) -> HostProbes {
    HostProbes {
        last_answered: answered.map(t),
        last_unanswered_sent: unanswered.map(t),
    }
}

const NOW: i64 = 100;

fn on(observations: &[Observation], lease: Option<i64>, host: HostProbes) -> Verdict {
    verdict(
        "node-1",
        observations,
        4,
        lease.map(t),
        host,
        t(NOW),
        &Policy::default(),
    )
}

fn three_agree() -> [Observation; 3] {
    [seen("node-2", 97, 99), seen("node-3", 98, 99), seen("node-4", 98, 100)]
}

#[test]
fn a_crashed_node_is_unreachable_once_three_peers_agree_and_the_host_is_silent() {
    assert_eq!(
        on(&three_agree(), Some(95), probes(Some(90), None)),
        Verdict::ProbeHost { since: t(98) }
    );
    assert_eq!(
        on(&three_agree(), Some(95), probes(Some(90), Some(99))),
        Verdict::Unreachable {
            since: t(98),
            observers: vec!["node-2".into(), "node-3".into(), "node-4".into()]
        }
    );
}

/// The verdict on node-1 at `now`, three of its four peers having lost it at 97, 98 and 98 s and
/// reported so at `now`, with the default policy.
fn at_now(lease: Option<Timestamp>, host: HostProbes, now: Timestamp) -> Verdict {
    let reported = |observer: &str, since: i64| Observation {
        observer: observer.into(),
        unreachable_since: t(since),
        reported_at: now,
    };
    let agree = [reported("node-2", 97), reported("node-3", 98), reported("node-4", 98)];
    verdict("node-1", &agree, 4, lease, host, now, &Policy::default())
}

fn unanswered_at(sent: Timestamp) -> HostProbes {
    HostProbes {
        last_answered: None,
        last_unanswered_sent: Some(sent),
    }
}

#[test]
fn a_frozen_agent_on_a_live_host_is_refuted_and_its_host_probed_again_while_the_peers_lose_it() {
    let refuted = Verdict::Refuted {
        since: t(98),
        by: Refutation::HostAnswered { at: t(99) },
    };
    assert_eq!(at_now(Some(t(95)), probes(Some(99), None), t(100)), refuted);
    assert_eq!(
        at_now(Some(t(95)), probes(Some(99), Some(99)), t(100)),
        refuted,
        "a probe sent before the answer says nothing after it"
    );
    assert_eq!(
        at_now(Some(t(95)), probes(Some(99), None), t(101)),
        Verdict::ProbeHost { since: t(98) },
        "two seconds after its last answer, the host is probed again"
    );
}

/// ci-20261207T203556Z: the lab's crash killed the agent, and the host answered the
/// controller's probe a moment later, before its link went down. The next probe went unanswered.
#[test]
fn a_host_that_answered_after_the_peers_lost_it_and_then_went_silent_is_unreachable() {
    assert_eq!(
        at_now(Some(t(95)), probes(Some(99), Some(100)), t(100)),
        Verdict::Unreachable {
            since: t(98),
            observers: vec!["node-2".into(), "node-3".into(), "node-4".into()]
        }
    );
}

#[test]
fn a_renewing_kubelet_refutes_whatever_the_peers_say_even_a_clock_skew_early() {
    let now = ms(98_500);
    assert_eq!(
        at_now(Some(ms(97_800)), HostProbes::default(), now),
        Verdict::Refuted {
            since: t(98),
            by: Refutation::LeaseRenewed { at: ms(97_800) }
        }
    );
    assert_eq!(
        at_now(Some(ms(97_700)), HostProbes::default(), now),
        Verdict::ProbeHost { since: t(98) },
        "renewed more than a clock skew before the peers agreed"
    );
    assert!(
        matches!(
            at_now(Some(ms(97_800)), unanswered_at(ms(98_000)), now),
            Verdict::Refuted { .. }
        ),
        "a probe sent within a clock skew of the renewal says nothing after it"
    );
    assert!(
        matches!(
            at_now(Some(ms(97_800)), unanswered_at(ms(98_300)), now),
            Verdict::Unreachable { .. }
        ),
        "the host went silent after the renewal"
    );
}

#[test]
fn a_host_probe_counts_only_when_sent_a_clock_skew_after_the_agreement() {
    let with = |sent: Timestamp| {
        let host = HostProbes {
            last_answered: None,
            last_unanswered_sent: Some(sent),
        };
        verdict("node-1", &three_agree(), 4, None, host, t(NOW), &Policy::default())
    };
    assert_eq!(with(ms(98_200)), Verdict::ProbeHost { since: t(98) });
    assert!(matches!(with(ms(98_250)), Verdict::Unreachable { .. }));
    assert_eq!(
        with(ms(100_500)),
        Verdict::ProbeHost { since: t(98) },
        "sent in the future"
    );
}

#[test]
fn two_observers_are_not_enough_of_four_and_stale_or_self_reports_do_not_count() {
    let reports = [
        seen("node-2", 97, 99),
        seen("node-3", 98, 99),
        seen("node-4", 90, 96),
        seen("node-1", 98, 99),
    ];
    assert_eq!(
        on(&reports, None, probes(None, Some(99))),
        Verdict::Reachable {
            observers: 2,
            needed: 3
        }
    );
}

#[test]
fn a_two_node_cluster_needs_its_one_peer_and_a_lone_node_can_never_be_observed() {
    let reports = [seen("node-2", 98, 99)];
    let policy = Policy::default();
    let two = verdict("node-1", &reports, 1, None, probes(None, Some(99)), t(NOW), &policy);
    assert!(matches!(two, Verdict::Unreachable { .. }), "{two:?}");
    let alone = verdict("node-1", &reports, 0, None, probes(None, Some(99)), t(NOW), &policy);
    assert_eq!(
        alone,
        Verdict::Reachable {
            observers: 0,
            needed: 0
        }
    );
}

#[test]
fn only_an_observers_latest_report_counts_even_when_it_is_stale_or_inconsistent() {
    let reports = [seen("node-2", 90, 98), seen("node-2", 97, 99), seen("node-2", 97, 100)];
    assert_eq!(
        on(&reports, None, probes(None, Some(99))),
        Verdict::Reachable {
            observers: 1,
            needed: 3
        }
    );
    let mut with_inconsistent_latest = three_agree().to_vec();
    with_inconsistent_latest.push(seen("node-2", 101, 100));
    assert_eq!(
        on(&with_inconsistent_latest, None, probes(None, Some(99))),
        Verdict::Reachable {
            observers: 2,
            needed: 3
        },
        "node-2's latest report starts after it arrived: node-2 does not count, not even by its older report"
    );
}

fn observation() -> impl Strategy<Value = Observation> {
    (0usize..6, NOW - 10..=NOW, NOW - 4..=NOW + 1)
        .prop_map(|(o, since, reported)| seen(&format!("node-{o}"), since, reported))
}

fn host() -> impl Strategy<Value = HostProbes> {
    (
        proptest::option::of(NOW - 12..=NOW),
        proptest::option::of(NOW - 12..=NOW + 1),
    )
        .prop_map(|(answered, unanswered)| probes(answered, unanswered))
}

/// The latest report per observer, as the controller keeps them (the earlier onset on a tie).
fn latest_per_observer(observations: &[Observation]) -> Vec<Observation> {
    let mut latest: BTreeMap<String, Observation> = BTreeMap::new();
    for o in observations {
        let keep = latest.get(&o.observer).is_none_or(|l| {
            o.reported_at > l.reported_at
                || (o.reported_at == l.reported_at && o.unreachable_since < l.unreachable_since)
        });
        if keep {
            latest.insert(o.observer.clone(), o.clone());
        }
    }
    latest.into_values().collect()
}

proptest! {
    /// Unreachable only with every kind of evidence: enough distinct, fresh observers other than
    /// the node, each unreachable since no later than `since`; no lease renewal and no host
    /// answer from a clock skew before `since` on; an unanswered host probe sent from a clock
    /// skew after `since` on, and not in the future.
    #[test]
    fn unreachable_only_with_all_three_kinds_of_evidence(
        observations in proptest::collection::vec(observation(), 0..10),
        others in 0usize..6,
        lease in proptest::option::of(NOW - 12..=NOW),
        host in host(),
    ) {
        let policy = Policy::default();
        let skew = jiff::SignedDuration::from_millis(250);
        let v = verdict("node-1", &observations, others, lease.map(t), host, t(NOW), &policy);
        if let Verdict::Unreachable { since, observers } = v {
            prop_assert!(others > 0);
            prop_assert_eq!(observers.len(), policy.observers_needed.min(others));
            let latest = latest_per_observer(&observations);
            let mut distinct = observers.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), observers.len());
            for observer in &observers {
                prop_assert_ne!(observer.as_str(), "node-1");
                let report = latest.iter().find(|o| &o.observer == observer).expect("a report of its own");
                prop_assert!(report.unreachable_since <= since);
                prop_assert!(report.reported_at <= t(NOW));
                prop_assert!(t(NOW).duration_since(report.reported_at) <= jiff::SignedDuration::from_secs(3));
            }
            // Silent after the agreement and after every sign of life.
            let sent = host.last_unanswered_sent.expect("an unanswered probe");
            prop_assert!(sent >= since + skew && sent <= t(NOW));
            prop_assert!(lease.is_none_or(|l| t(l) + skew <= sent));
            prop_assert!(host.last_answered.is_none_or(|a| a + skew <= sent));
        }
    }

    /// A kubelet that renewed, or a host that answered, after every observer lost the node keeps
    /// it from being unreachable until a probe sent after that sign of life goes unanswered.
    #[test]
    fn life_after_every_report_refutes_until_the_host_goes_silent_after_it(
        observations in proptest::collection::vec(observation(), 0..10),
        others in 0usize..6,
        unanswered in proptest::option::of(NOW - 12..=NOW),
    ) {
        let latest_onset = observations.iter().map(|o| o.unreachable_since).max().unwrap_or(t(0));
        let policy = Policy::default();
        let skew = jiff::SignedDuration::from_millis(250);
        let silent_after_life = unanswered.is_some_and(|u| t(u) >= latest_onset + skew);
        let host = HostProbes { last_answered: None, last_unanswered_sent: unanswered.map(t) };
        let by_lease = verdict("node-1", &observations, others, Some(latest_onset), host, t(NOW), &policy);
        prop_assert!(silent_after_life || !matches!(by_lease, Verdict::Unreachable { .. }), "{:?}", by_lease);
        let answered = HostProbes { last_answered: Some(latest_onset), ..host };
        let by_host = verdict("node-1", &observations, others, None, answered, t(NOW), &policy);
        prop_assert!(silent_after_life || !matches!(by_host, Verdict::Unreachable { .. }), "{:?}", by_host);
    }

    /// A sign of life less than `reprobe_after` ago, with no probe unanswered since, refutes;
    /// an older one asks for a probe, never for the condition to change.
    #[test]
    fn a_recent_sign_of_life_refutes_and_an_older_one_asks_for_a_probe(
        life_ms in 0i64..5_000,
        by_host in any::<bool>(),
    ) {
        let life = ms(98_000 + life_ms);
        let now = ms(103_000);
        let v = if by_host {
            at_now(None, HostProbes { last_answered: Some(life), last_unanswered_sent: None }, now)
        } else {
            at_now(Some(life), HostProbes::default(), now)
        };
        if now.duration_since(life) < jiff::SignedDuration::from_secs(2) {
            prop_assert!(matches!(v, Verdict::Refuted { .. }), "{:?}", v);
        } else {
            prop_assert_eq!(v, Verdict::ProbeHost { since: t(98) });
        }
    }
}

/// The generators above reach the verdict that matters: without this the properties could pass
/// by never producing it.
#[test]
fn the_generators_produce_unreachable_verdicts() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (
        proptest::collection::vec(observation(), 0..10),
        0usize..6,
        proptest::option::of(NOW - 12..=NOW),
        host(),
    );
    let unreachable = (0..2000)
        .filter(|_| {
            let (observations, others, lease, host) = strategy.new_tree(&mut runner).expect("a case").current();
            matches!(
                verdict(
                    "node-1",
                    &observations,
                    others,
                    lease.map(t),
                    host,
                    t(NOW),
                    &Policy::default()
                ),
                Verdict::Unreachable { .. }
            )
        })
        .count();
    assert!(unreachable >= 20, "only {unreachable} of 2000 cases were Unreachable");
}
