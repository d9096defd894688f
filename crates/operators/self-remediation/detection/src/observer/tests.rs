use super::*;
use proptest::prelude::*;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).expect("in range")
}

fn report(subject: &str, since: Option<Timestamp>) -> Report {
    Report {
        subject: subject.into(),
        since,
    }
}

const CADENCE: Cadence = Cadence {
    refresh: Duration::from_secs(1),
    evidence_ttl: Duration::from_millis(1500),
    probe_interval: Duration::from_millis(400),
};

#[test]
fn gossip_alone_makes_a_probe_not_a_report() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Suspect);
    assert_eq!(o.probes_due(t(0), &CADENCE), vec!["node-2".to_owned()]);
    assert_eq!(o.reports_due(t(0), &CADENCE), vec![]);
    o.probed("node-2", false, t(100));
    assert_eq!(o.probes_due(t(200), &CADENCE), Vec::<String>::new(), "probed just now");
    o.probed("node-2", false, t(600));
    o.detector_says("node-2", DetectorState::Down);
    assert_eq!(o.reports_due(t(700), &CADENCE), vec![report("node-2", Some(t(100)))]);
    assert_eq!(o.reports_due(t(800), &CADENCE), vec![], "nothing new");
    o.probed("node-2", false, t(1_500));
    assert_eq!(o.reports_due(t(1_700), &CADENCE).len(), 1, "refreshed");
}

#[test]
fn attentive_while_a_member_is_distrusted_or_a_report_stands() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Alive);
    assert!(!o.attentive(), "everyone alive, nothing reported");
    o.detector_says("node-2", DetectorState::Down);
    assert!(o.attentive());
    o.probed("node-2", false, t(0));
    assert_eq!(o.reports_due(t(100), &CADENCE).len(), 1);
    o.detector_says("node-2", DetectorState::Alive);
    assert!(o.attentive(), "the report still stands: its withdrawal is due");
    assert_eq!(o.reports_due(t(200), &CADENCE), vec![report("node-2", None)]);
    assert!(!o.attentive());
}

#[test]
fn a_probe_still_out_is_not_sent_again_within_the_interval() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Suspect);
    assert_eq!(o.probes_due(t(0), &CADENCE), vec!["node-2".to_owned()]);
    o.probe_sent("node-2", t(0));
    for ms in [100, 200, 300] {
        assert_eq!(
            o.probes_due(t(ms), &CADENCE),
            Vec::<String>::new(),
            "in flight at {ms} ms"
        );
    }
    assert_eq!(
        o.probes_due(t(400), &CADENCE),
        vec!["node-2".to_owned()],
        "one interval later"
    );
    assert_eq!(o.reports_due(t(400), &CADENCE), vec![], "a probe sent is no evidence");
}

#[test]
fn a_report_needs_a_recent_failure_of_its_own() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Down);
    o.probed("node-2", false, t(0));
    assert_eq!(o.reports_due(t(100), &CADENCE).len(), 1);
    assert_eq!(
        o.reports_due(t(2_000), &CADENCE),
        vec![report("node-2", None)],
        "no probe for 2 s: the old failure is not evidence any more"
    );
    assert_eq!(o.probes_due(t(2_000), &CADENCE), vec!["node-2".to_owned()]);
}

#[test]
fn an_old_failure_does_not_make_a_report_when_the_detector_distrusts_the_member_again() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Suspect);
    o.probed("node-2", false, t(0));
    o.detector_says("node-2", DetectorState::Alive);
    o.detector_says("node-2", DetectorState::Suspect);
    assert_eq!(
        o.reports_due(t(100), &CADENCE),
        vec![],
        "the run of failures ended when it was alive"
    );
}

#[test]
fn a_reached_member_a_cleared_one_or_a_forgotten_one_is_withdrawn() {
    let mut o = Observer::default();
    o.detector_says("node-2", DetectorState::Down);
    o.probed("node-2", false, t(0));
    assert_eq!(o.reports_due(t(10), &CADENCE).len(), 1);
    o.probed("node-2", true, t(20));
    assert_eq!(o.reports_due(t(30), &CADENCE)[0].since, None);
    o.probed("node-2", false, t(40));
    assert_eq!(
        o.reports_due(t(50), &CADENCE)[0].since,
        Some(t(40)),
        "a new run of failures"
    );
    o.detector_says("node-2", DetectorState::Alive);
    assert_eq!(o.reports_due(t(60), &CADENCE)[0].since, None);
    o.detector_says("node-2", DetectorState::Down);
    o.probed("node-2", false, t(70));
    assert_eq!(o.reports_due(t(80), &CADENCE)[0].since, Some(t(70)));
    o.forget("node-2");
    assert_eq!(o.reports_due(t(90), &CADENCE), vec![report("node-2", None)]);
    assert_eq!(o.reports_due(t(100), &CADENCE), vec![]);
}

#[test]
fn a_designated_observer_confirms_only_its_share_and_takes_over_when_observers_go() {
    let members: Vec<String> = (0..20).map(|i| format!("node-{i}")).collect();
    let observers_of = |down: &[&str]| -> Vec<String> {
        members
            .iter()
            .filter(|me| !down.contains(&me.as_str()))
            .filter(|me| {
                let mut o = Observer::designated(me, 3);
                for m in members.iter().filter(|m| m != me) {
                    let state = if down.contains(&m.as_str()) {
                        DetectorState::Down
                    } else {
                        DetectorState::Alive
                    };
                    o.detector_says(m, state);
                }
                o.probes_due(t(0), &CADENCE).contains(&"node-0".to_owned())
            })
            .cloned()
            .collect()
    };
    let first = observers_of(&["node-0"]);
    assert_eq!(first.len(), 3, "{first:?}");
    // Two of them go down with node-0: two others take over, the third stays.
    let gone: Vec<&str> = ["node-0", first[0].as_str(), first[1].as_str()].to_vec();
    let second = observers_of(&gone);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(second.contains(&first[2]), "{first:?} then {second:?}");
}

#[derive(Clone, Debug)]
enum Step {
    Detector(usize, DetectorState),
    Probe(usize, bool),
    Forget(usize),
    Wait,
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
        Just(Step::Wait),
    ]
}

proptest! {
    /// The controller's copy (the reports applied in order) says "unreachable since s" only
    /// while the detector distrusts the member, the agent's own latest probe of it failed, at
    /// most `evidence_ttl` ago, and its run of failures began at s.
    #[test]
    fn the_controllers_copy_matches_the_agents_own_evidence(steps in proptest::collection::vec(step(), 0..80)) {
        let mut o = Observer::default();
        let mut copy: BTreeMap<String, Timestamp> = BTreeMap::new();
        // Per member: start of the run of own failures, last own probe, detector state.
        let mut own: BTreeMap<String, (Option<Timestamp>, Option<Timestamp>, DetectorState)> = BTreeMap::new();
        let ttl = jiff::SignedDuration::try_from(CADENCE.evidence_ttl).expect("small");
        for (i, s) in steps.iter().enumerate() {
            let now = t(i as i64 * 300);
            match s {
                Step::Detector(m, state) => {
                    let name = format!("node-{m}");
                    o.detector_says(&name, *state);
                    let e = own.entry(name).or_insert((None, None, DetectorState::Alive));
                    e.2 = *state;
                    if *state == DetectorState::Alive {
                        e.0 = None;
                    }
                }
                Step::Probe(m, reached) => {
                    let name = format!("node-{m}");
                    o.probed(&name, *reached, now);
                    let e = own.entry(name).or_insert((None, None, DetectorState::Alive));
                    e.0 = if *reached { None } else { e.0.or(Some(now)) };
                    e.1 = Some(now);
                }
                Step::Forget(m) => {
                    let name = format!("node-{m}");
                    o.forget(&name);
                    own.remove(&name);
                }
                Step::Wait => {}
            }
            for r in o.reports_due(now, &CADENCE) {
                match r.since {
                    Some(since) => { copy.insert(r.subject, since); }
                    None => { copy.remove(&r.subject); }
                }
            }
            for (name, since) in &copy {
                let (failing, last_probe, state) = own.get(name).copied().unwrap_or((None, None, DetectorState::Alive));
                prop_assert_eq!(failing, Some(*since), "{}", name);
                prop_assert_ne!(state, DetectorState::Alive);
                let probed = last_probe.expect("probed");
                prop_assert!(now.duration_since(probed) <= ttl);
            }
        }
    }
}
