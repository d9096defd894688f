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

#[test]
fn a_frozen_agent_on_a_live_host_stays_refuted_by_the_host_even_after_a_lost_probe() {
    let refuted = Verdict::Refuted {
        since: t(98),
        by: Refutation::HostAnswered { at: t(99) },
    };
    assert_eq!(on(&three_agree(), Some(95), probes(Some(99), None)), refuted);
    assert_eq!(on(&three_agree(), Some(95), probes(Some(99), Some(100))), refuted);
}

#[test]
fn a_renewing_kubelet_refutes_whatever_the_peers_say_even_a_clock_skew_early() {
    let at = |lease: Timestamp| {
        verdict(
            "node-1",
            &three_agree(),
            4,
            Some(lease),
            probes(None, Some(99)),
            t(NOW),
            &Policy::default(),
        )
    };
    assert_eq!(
        at(ms(97_800)),
        Verdict::Refuted {
            since: t(98),
            by: Refutation::LeaseRenewed { at: ms(97_800) }
        }
    );
    assert!(matches!(at(ms(97_700)), Verdict::Unreachable { .. }));
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
            prop_assert!(lease.is_none_or(|l| t(l) < since - skew));
            prop_assert!(host.last_answered.is_none_or(|a| a < since - skew));
            let sent = host.last_unanswered_sent.expect("an unanswered probe");
            prop_assert!(sent >= since + skew && sent <= t(NOW));
        }
    }

    /// A kubelet that renewed, or a host that answered, after every observer lost the node keeps
    /// it from being unreachable, whatever probe went unanswered later.
    #[test]
    fn life_after_every_report_refutes(
        observations in proptest::collection::vec(observation(), 0..10),
        others in 0usize..6,
        unanswered in proptest::option::of(NOW - 12..=NOW),
    ) {
        let latest_onset = observations.iter().map(|o| o.unreachable_since).max().unwrap_or(t(0));
        let policy = Policy::default();
        let host = HostProbes { last_answered: None, last_unanswered_sent: unanswered.map(t) };
        let by_lease = verdict("node-1", &observations, others, Some(latest_onset), host, t(NOW), &policy);
        prop_assert!(!matches!(by_lease, Verdict::Unreachable { .. }), "{:?}", by_lease);
        let answered = HostProbes { last_answered: Some(latest_onset), ..host };
        let by_host = verdict("node-1", &observations, others, None, answered, t(NOW), &policy);
        prop_assert!(!matches!(by_host, Verdict::Unreachable { .. }), "{:?}", by_host);
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
