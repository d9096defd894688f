use super::*;
use proptest::prelude::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).expect("in range")
}

fn seen(observer: &str, since: i64, reported: i64) -> Observation {
    Observation {
        observer: observer.into(),
        unreachable_since: t(since),
        reported_at: t(reported),
    }
}

const NOW: i64 = 100;

fn on(observations: &[Observation], lease: Option<i64>, host: HostProbe) -> Verdict {
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

#[test]
fn a_crashed_node_is_unreachable_once_three_peers_agree_and_the_host_is_silent() {
    let reports = [seen("node-2", 97, 99), seen("node-3", 98, 99), seen("node-4", 98, 100)];
    assert_eq!(
        on(&reports, Some(95), HostProbe::NotProbed),
        Verdict::ProbeHost { since: t(98) }
    );
    assert_eq!(
        on(&reports, Some(95), HostProbe::Unanswered { sent: t(99) }),
        Verdict::Unreachable {
            since: t(98),
            observers: vec!["node-2".into(), "node-3".into(), "node-4".into()]
        }
    );
}

#[test]
fn a_frozen_agent_on_a_live_host_is_refuted_by_the_host_before_the_lease_renews() {
    let reports = [seen("node-2", 97, 99), seen("node-3", 98, 99), seen("node-4", 98, 100)];
    assert_eq!(
        on(&reports, Some(95), HostProbe::Answered { at: t(99) }),
        Verdict::Refuted {
            since: t(98),
            by: Refutation::HostAnswered { at: t(99) }
        }
    );
}

#[test]
fn a_renewing_kubelet_refutes_whatever_the_peers_say() {
    let reports = [seen("node-2", 97, 99), seen("node-3", 98, 99), seen("node-4", 98, 100)];
    assert_eq!(
        on(&reports, Some(98), HostProbe::Unanswered { sent: t(99) }),
        Verdict::Refuted {
            since: t(98),
            by: Refutation::LeaseRenewed { at: t(98) }
        }
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
        on(&reports, None, HostProbe::Unanswered { sent: t(99) }),
        Verdict::Reachable {
            observers: 2,
            needed: 3
        }
    );
}

#[test]
fn a_two_node_cluster_needs_its_one_peer_and_a_lone_node_can_never_be_observed() {
    let reports = [seen("node-2", 98, 99)];
    let two = verdict(
        "node-1",
        &reports,
        1,
        None,
        HostProbe::Unanswered { sent: t(99) },
        t(NOW),
        &Policy::default(),
    );
    assert!(matches!(two, Verdict::Unreachable { .. }), "{two:?}");
    let alone = verdict(
        "node-1",
        &[],
        0,
        None,
        HostProbe::Unanswered { sent: t(99) },
        t(NOW),
        &Policy::default(),
    );
    assert!(matches!(alone, Verdict::Reachable { .. }), "{alone:?}");
}

#[test]
fn an_observers_latest_report_counts_once() {
    let reports = [seen("node-2", 90, 98), seen("node-2", 97, 99), seen("node-2", 97, 100)];
    assert_eq!(
        on(&reports, None, HostProbe::Unanswered { sent: t(99) }),
        Verdict::Reachable {
            observers: 1,
            needed: 3
        }
    );
}

fn observation() -> impl Strategy<Value = Observation> {
    (0usize..6, 0i64..=NOW, 0i64..=NOW + 5).prop_map(|(o, since, reported)| seen(&format!("node-{o}"), since, reported))
}

fn host() -> impl Strategy<Value = HostProbe> {
    prop_oneof![
        Just(HostProbe::NotProbed),
        (0i64..=NOW).prop_map(|s| HostProbe::Answered { at: t(s) }),
        (0i64..=NOW).prop_map(|s| HostProbe::Unanswered { sent: t(s) }),
    ]
}

proptest! {
    /// Unreachable only with every kind of evidence: enough distinct, fresh observers other
    /// than the node, each unreachable since no later than `since`; no lease renewal from
    /// `since` on; an unanswered host probe sent from `since` on.
    #[test]
    fn unreachable_only_with_all_three_kinds_of_evidence(
        observations in proptest::collection::vec(observation(), 0..10),
        others in 0usize..6,
        lease in proptest::option::of(0i64..=NOW),
        host in host(),
    ) {
        let policy = Policy::default();
        let v = verdict("node-1", &observations, others, lease.map(t), host, t(NOW), &policy);
        if let Verdict::Unreachable { since, observers } = v {
            prop_assert!(others > 0);
            prop_assert_eq!(observers.len(), policy.observers_needed.min(others));
            let mut distinct = observers.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), observers.len());
            for observer in &observers {
                prop_assert_ne!(observer.as_str(), "node-1");
                let report = observations
                    .iter()
                    .filter(|o| &o.observer == observer && o.reported_at <= t(NOW) && o.unreachable_since <= o.reported_at)
                    .max_by_key(|o| o.reported_at)
                    .expect("a report of its own");
                prop_assert!(report.unreachable_since <= since);
                prop_assert!(t(NOW).duration_since(report.reported_at) <= jiff::SignedDuration::from_secs(3));
            }
            prop_assert!(lease.is_none_or(|l| t(l) < since));
            let probed_after = matches!(host, HostProbe::Unanswered { sent } if sent >= since);
            prop_assert!(probed_after, "host probe {:?}", host);
        }
    }

    /// A kubelet that renewed after every observer lost the node, or a host that answered after
    /// them, keeps the node from being unreachable.
    #[test]
    fn life_after_every_report_refutes(
        observations in proptest::collection::vec(observation(), 0..10),
        others in 0usize..6,
        host in host(),
    ) {
        let latest_onset = observations.iter().map(|o| o.unreachable_since).max().unwrap_or(t(0));
        let by_lease = verdict("node-1", &observations, others, Some(latest_onset), host, t(NOW), &Policy::default());
        prop_assert!(!matches!(by_lease, Verdict::Unreachable { .. }), "{:?}", by_lease);
        let by_host = verdict("node-1", &observations, others, None, HostProbe::Answered { at: latest_onset }, t(NOW), &Policy::default());
        prop_assert!(!matches!(by_host, Verdict::Unreachable { .. }), "{:?}", by_host);
    }
}
