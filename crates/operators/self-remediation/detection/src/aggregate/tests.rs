use super::*;
use proptest::prelude::*;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).expect("in range")
}

fn unreachable(subject: &str, since: Timestamp) -> Report {
    Report {
        subject: subject.into(),
        since: Some(since),
    }
}

fn withdrawn(subject: &str) -> Report {
    Report {
        subject: subject.into(),
        since: None,
    }
}

fn members(n: usize) -> BTreeMap<String, MemberFacts> {
    (0..n).map(|i| (format!("node-{i}"), MemberFacts::default())).collect()
}

#[test]
fn the_latest_report_of_each_observer_stands_until_withdrawn() {
    let mut reports = Reports::default();
    reports.receive("node-1", &[unreachable("node-0", t(0))], t(100));
    reports.receive("node-1", &[unreachable("node-0", t(50))], t(200));
    reports.receive(
        "node-2",
        &[unreachable("node-0", t(10)), unreachable("node-2", t(10))],
        t(200),
    );
    assert_eq!(reports.len(), 2, "one per observer, none about oneself");
    assert_eq!(reports.about("node-0")[0].unreachable_since, t(50));
    reports.receive("node-1", &[withdrawn("node-0")], t(300));
    reports.receive("node-3", &[withdrawn("node-0")], t(300));
    assert_eq!(reports.about("node-0").len(), 1);
    reports.receive("node-2", &[withdrawn("node-0")], t(300));
    assert!(reports.is_empty());
}

#[test]
fn expiry_and_a_departure_free_the_reports() {
    let mut reports = Reports::default();
    reports.receive(
        "node-1",
        &[unreachable("node-0", t(0)), unreachable("node-2", t(0))],
        t(0),
    );
    reports.receive("node-2", &[unreachable("node-0", t(0))], t(2_000));
    reports.expire(t(3_500), Duration::from_secs(3));
    assert_eq!(reports.len(), 1, "node-1's reports are 3.5 s old");
    reports.receive("node-1", &[unreachable("node-2", t(3_500))], t(3_500));
    reports.forget("node-2");
    assert_eq!(reports.about("node-0"), vec![]);
    assert_eq!(reports.about("node-2"), vec![]);
    assert!(reports.is_empty());
}

#[test]
fn only_reported_members_get_a_verdict_and_only_members_observe() {
    let mut reports = Reports::default();
    for observer in ["node-1", "node-2", "stranger"] {
        reports.receive(observer, &[unreachable("node-0", t(0))], t(100));
    }
    reports.receive("node-1", &[unreachable("gone", t(0))], t(100));
    let verdicts = verdicts(&reports, &members(4), t(200), &Policy::default());
    assert_eq!(
        verdicts,
        vec![(
            "node-0".to_owned(),
            Verdict::Reachable {
                observers: 2,
                needed: 3
            }
        )]
    );
}

#[test]
fn enough_observers_and_an_unanswered_host_probe_make_a_node_unreachable() {
    let mut reports = Reports::default();
    for observer in ["node-1", "node-2", "node-3"] {
        reports.receive(observer, &[unreachable("node-0", t(0))], t(100));
    }
    let mut facts = members(5);
    let host = HostProbes {
        last_answered: None,
        last_unanswered_sent: Some(t(400)),
    };
    facts.insert(
        "node-0".into(),
        MemberFacts {
            lease_renewed: None,
            host,
        },
    );
    let verdicts = verdicts(&reports, &facts, t(800), &Policy::default());
    assert!(
        matches!(&verdicts[..], [(name, Verdict::Unreachable { since, .. })] if name == "node-0" && *since == t(0)),
        "{verdicts:?}"
    );
}

#[derive(Clone, Debug)]
enum Step {
    Receive {
        observer: usize,
        subject: usize,
        since: Option<i64>,
    },
    Forget(usize),
    Expire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..5, 0usize..5, proptest::option::of(0i64..5_000)).prop_map(|(observer, subject, since)| {
            Step::Receive {
                observer,
                subject,
                since,
            }
        }),
        (0usize..5).prop_map(Step::Forget),
        Just(Step::Expire),
    ]
}

proptest! {
    /// The aggregate holds what replaying the messages by hand gives (each observer's latest
    /// report, minus withdrawals, departures and expired ones), and its verdicts are the
    /// verdicts on exactly those reports.
    #[test]
    fn the_aggregate_is_the_replayed_reports_and_their_verdicts(steps in proptest::collection::vec(step(), 0..60)) {
        let ttl = Duration::from_secs(3);
        let mut reports = Reports::default();
        let mut replay: BTreeMap<(String, String), (Timestamp, Timestamp)> = BTreeMap::new();
        let mut facts = members(5);
        for (i, s) in steps.iter().enumerate() {
            let now = t(i as i64 * 400);
            match s {
                Step::Receive { observer, subject, since } => {
                    let (observer, subject) = (format!("node-{observer}"), format!("node-{subject}"));
                    let report = Report { subject: subject.clone(), since: since.map(t) };
                    reports.receive(&observer, &[report], now);
                    if observer != subject {
                        match since {
                            Some(since) => { replay.insert((subject, observer), (t(*since), now)); }
                            None => { replay.remove(&(subject, observer)); }
                        }
                    }
                }
                Step::Forget(member) => {
                    let member = format!("node-{member}");
                    reports.forget(&member);
                    replay.retain(|(subject, observer), _| *subject != member && *observer != member);
                    facts.remove(&member);
                }
                Step::Expire => {
                    reports.expire(now, ttl);
                    replay.retain(|_, (_, at)| now.duration_since(*at) <= jiff::SignedDuration::from_secs(3));
                }
            }
            prop_assert_eq!(reports.len(), replay.len());
            let policy = Policy::default();
            for (subject, verdict) in verdicts(&reports, &facts, now, &policy) {
                let by_hand: Vec<Observation> = replay
                    .iter()
                    .filter(|((s, o), _)| *s == subject && facts.contains_key(o))
                    .map(|((_, o), (since, at))| Observation { observer: o.clone(), unreachable_since: *since, reported_at: *at })
                    .collect();
                let facts_of = facts[&subject];
                let expected = crate::verdict(&subject, &by_hand, facts.len() - 1, facts_of.lease_renewed, facts_of.host, now, &policy);
                prop_assert_eq!(verdict, expected);
            }
        }
    }
}
