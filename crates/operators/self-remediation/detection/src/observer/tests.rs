use super::*;
use proptest::prelude::*;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).expect("in range")
}

const REFRESH: Duration = Duration::from_secs(1);

#[test]
fn gossip_alone_makes_a_probe_not_a_report() {
    let mut o = Observer::default();
    assert!(o.detector_says("node-2", DetectorState::Suspect));
    assert_eq!(o.reports_due(t(0), REFRESH), vec![]);
    o.probed("node-2", false, t(100));
    o.probed("node-2", false, t(600));
    assert!(
        !o.detector_says("node-2", DetectorState::Down),
        "it already failed on its own"
    );
    assert_eq!(
        o.reports_due(t(700), REFRESH),
        vec![Report {
            subject: "node-2".into(),
            since: Some(t(100))
        }]
    );
    assert_eq!(o.reports_due(t(800), REFRESH), vec![], "nothing new");
    assert_eq!(o.reports_due(t(1_700), REFRESH).len(), 1, "refreshed");
}

#[test]
fn a_reached_member_or_a_detector_that_clears_it_withdraws_the_report() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Down);
    o.probed("node-2", false, t(0));
    assert_eq!(o.reports_due(t(10), REFRESH).len(), 1);
    o.probed("node-2", true, t(20));
    assert_eq!(
        o.reports_due(t(30), REFRESH),
        vec![Report {
            subject: "node-2".into(),
            since: None
        }]
    );
    o.probed("node-2", false, t(40));
    assert_eq!(
        o.reports_due(t(50), REFRESH)[0].since,
        Some(t(40)),
        "a new run of failures"
    );
    o.detector_says("node-2", DetectorState::Alive);
    assert_eq!(o.reports_due(t(60), REFRESH)[0].since, None);
}

#[derive(Clone, Debug)]
enum Step {
    Detector(usize, DetectorState),
    Probe(usize, bool),
    Forget(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let state = prop_oneof![
        Just(DetectorState::Alive),
        Just(DetectorState::Suspect),
        Just(DetectorState::Down)
    ];
    prop_oneof![
        (0usize..3, state).prop_map(|(m, s)| Step::Detector(m, s)),
        (0usize..3, any::<bool>()).prop_map(|(m, r)| Step::Probe(m, r)),
        (0usize..3).prop_map(Step::Forget),
    ]
}

proptest! {
    /// The controller's copy (the reports applied in order) says "unreachable since s" only
    /// while the agent's own latest probe failed, its run of failures began at s, and the
    /// detector does not call the member alive.
    #[test]
    fn the_controllers_copy_matches_the_agents_own_evidence(steps in proptest::collection::vec(step(), 0..60)) {
        let mut o = Observer::default();
        let mut copy: BTreeMap<String, Timestamp> = BTreeMap::new();
        let mut own: BTreeMap<String, (Option<Timestamp>, DetectorState)> = BTreeMap::new();
        for (i, s) in steps.iter().enumerate() {
            let now = t(i as i64 * 100);
            match s {
                Step::Detector(m, state) => {
                    let name = format!("node-{m}");
                    o.detector_says(&name, *state);
                    own.entry(name).or_insert((None, DetectorState::Alive)).1 = *state;
                }
                Step::Probe(m, reached) => {
                    let name = format!("node-{m}");
                    o.probed(&name, *reached, now);
                    let e = own.entry(name).or_insert((None, DetectorState::Alive));
                    e.0 = if *reached { None } else { e.0.or(Some(now)) };
                }
                Step::Forget(m) => {
                    let name = format!("node-{m}");
                    o.forget(&name);
                    own.remove(&name);
                    copy.remove(&name);
                }
            }
            for r in o.reports_due(now, REFRESH) {
                match r.since {
                    Some(since) => { copy.insert(r.subject, since); }
                    None => { copy.remove(&r.subject); }
                }
            }
            for (name, since) in &copy {
                let (failing, state) = own.get(name).copied().unwrap_or((None, DetectorState::Alive));
                prop_assert_eq!(failing, Some(*since));
                prop_assert_ne!(state, DetectorState::Alive);
            }
        }
    }
}
