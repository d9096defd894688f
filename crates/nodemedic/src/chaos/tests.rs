use std::time::Duration;

use jiff::Timestamp;
use nodemedic_lab::{
    NodeCondition, PodId,
    timeline::{Entry, Event},
};
use proptest::prelude::*;

use super::{
    plan::{self, Action, Options, PathKind},
    verdict::{self, NodeSnapshot, Params, Snapshot, ViolationKind},
};

fn params() -> Params {
    Params {
        max_unhealthy: 1,
        remediate_after: Duration::from_secs(25),
        fence_grace: Duration::from_secs(20),
        control_plane_one_at_a_time: true,
    }
}

/// A hand-made timeline, one entry per call at the given second.
#[derive(Default)]
struct Script(Vec<Entry>);

impl Script {
    fn at(&mut self, s: i64, event: Event) -> &mut Self {
        self.0.push(Entry { at: t(s), event });
        self
    }
    fn cond(&mut self, s: i64, node: &str, powered: bool, partitioned: bool) -> &mut Self {
        let condition = NodeCondition {
            powered,
            partitioned,
            ..NodeCondition::default()
        };
        self.at(
            s,
            Event::NodeCondition {
                node: node.into(),
                condition,
            },
        )
    }
    fn power_off(&mut self, s: i64, node: &str, cause: &str) -> &mut Self {
        self.at(
            s,
            Event::Power {
                node: node.into(),
                on: false,
                cause: cause.into(),
            },
        )
        .cond(s, node, false, false)
    }
    fn remediation(&mut self, s: i64, node: &str, change: &str) -> &mut Self {
        self.at(
            s,
            Event::Remediation {
                kind: "SelfNodeRemediation".into(),
                name: node.into(),
                node: node.into(),
                change: change.into(),
            },
        )
    }
    fn running(&mut self, s: i64, uid: &str, node: &str) -> &mut Self {
        self.at(
            s,
            Event::PodPhase {
                pod: PodId {
                    namespace: "vm".into(),
                    name: "db-0".into(),
                    uid: uid.into(),
                },
                node: Some(node.into()),
                phase: "Running".into(),
                claims: vec!["data-db-0".into()],
                stateful: true,
            },
        )
    }
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 + s).expect("time")
}

fn kinds(v: &[verdict::Violation]) -> Vec<ViolationKind> {
    v.iter().map(|v| v.kind).collect()
}

#[test]
fn a_partitioned_node_fenced_and_remediated_is_clean() {
    let mut s = Script::default();
    s.running(0, "u1", "a")
        .cond(10, "a", true, true)
        .remediation(26, "a", "created")
        .power_off(30, "a", "watchdog")
        .cond(33, "a", true, true)
        .running(45, "u2", "b")
        .cond(50, "a", true, false)
        .remediation(60, "a", "removed");
    assert_eq!(verdict::judge(&s.0, t(5), t(70), &params()), vec![]);
}

#[test]
fn a_fence_of_a_connected_node_without_a_remediation_is_false() {
    let mut s = Script::default();
    s.cond(1, "a", true, false).power_off(40, "b", "watchdog");
    assert_eq!(
        kinds(&verdict::false_fences(&s.0, t(0), &params())),
        [ViolationKind::FalseFence]
    );
    // The plan's own crash is no fence; a BMC power-off of a healthy node is.
    let mut s = Script::default();
    s.power_off(40, "b", "crash")
        .cond(45, "b", true, false)
        .power_off(80, "b", "bmc");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()).len(), 1);
}

#[test]
fn a_remediation_of_a_healthy_node_excuses_no_fence_but_one_from_an_outage_does() {
    // Healthy all along: a remediation created for it anyway is the fault, not an excuse.
    let mut s = Script::default();
    s.cond(1, "a", true, false)
        .remediation(50, "a", "created")
        .power_off(55, "a", "bmc");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()).len(), 1);
    // Down from 10 s to 14 s, remediated at 20 s, fenced at 60 s (a slow BMC): legitimate.
    let mut s = Script::default();
    s.cond(10, "a", false, false)
        .cond(14, "a", true, false)
        .remediation(20, "a", "created")
        .power_off(60, "a", "bmc");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()), vec![]);
}

#[test]
fn a_minority_fencing_itself_shortly_after_it_reconnects_is_fine() {
    let mut s = Script::default();
    s.cond(0, "a", true, true)
        .cond(8, "a", true, false)
        .power_off(12, "a", "watchdog");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()), vec![]);
    // ... but not long after.
    let mut s = Script::default();
    s.cond(0, "a", true, true)
        .cond(8, "a", true, false)
        .power_off(60, "a", "watchdog");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()).len(), 1);
}

#[test]
fn a_long_outage_without_a_remediation_is_flagged_unless_over_budget() {
    let mut s = Script::default();
    s.cond(0, "a", false, false).cond(40, "a", true, false);
    let v = verdict::unremediated(&s.0, t(0), t(50), &params());
    assert_eq!(kinds(&v), [ViolationKind::Unremediated]);
    // Two nodes down at once is over a budget of one: no remediation expected.
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .cond(1, "b", false, false)
        .cond(40, "a", true, false)
        .cond(40, "b", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(50), &params()), vec![]);
    // A short outage needs none; a remediated one is fine.
    let mut s = Script::default();
    s.cond(0, "a", false, false).cond(10, "a", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(50), &params()), vec![]);
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .remediation(16, "a", "created")
        .cond(40, "a", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(50), &params()), vec![]);
}

/// Two control-plane nodes down within a budget of two; a's remediation is created at 16 s.
fn a_remediated_while_b_waits() -> (Params, Script) {
    let mut budget_of_two = params();
    budget_of_two.max_unhealthy = 2;
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .cond(1, "b", false, false)
        .remediation(16, "a", "created");
    (budget_of_two, s)
}

#[test]
fn a_control_plane_node_waiting_its_turn_is_not_unremediated() {
    let (mut budget_of_two, mut s) = a_remediated_while_b_waits();
    s.cond(40, "a", true, false)
        .cond(40, "b", true, false)
        .remediation(45, "a", "removed");
    assert_eq!(verdict::unremediated(&s.0, t(0), t(50), &budget_of_two), vec![]);
    budget_of_two.control_plane_one_at_a_time = false;
    let v = verdict::unremediated(&s.0, t(0), t(50), &budget_of_two);
    assert_eq!(kinds(&v), [ViolationKind::Unremediated]);
}

#[test]
fn a_control_plane_node_whose_turn_came_and_went_is_unremediated() {
    let (budget_of_two, mut s) = a_remediated_while_b_waits();
    s.remediation(30, "a", "removed");
    // b's turn came at 30: still nothing at 50 is within its 25 s, at 60 it is not.
    assert_eq!(verdict::unremediated(&s.0, t(0), t(50), &budget_of_two), vec![]);
    let v = verdict::unremediated(&s.0, t(0), t(60), &budget_of_two);
    assert_eq!(kinds(&v), [ViolationKind::Unremediated]);
}

#[test]
fn two_writers_are_reported_from_the_witness() {
    let mut s = Script::default();
    s.running(1, "u1", "a").cond(2, "a", true, true).running(30, "u2", "b");
    assert_eq!(kinds(&verdict::two_writers(&s.0, t(0))), [ViolationKind::TwoWriters]);
    // The partitioned node, down 38 s without a remediation, is also reported.
    assert_eq!(
        kinds(&verdict::judge(&s.0, t(0), t(40), &params())),
        [ViolationKind::TwoWriters, ViolationKind::Unremediated]
    );
    assert_eq!(verdict::two_writers(&s.0, t(35)), vec![]);
}

#[test]
fn leftovers_name_our_taints_cordons_remediations_and_leases() {
    let clean = Snapshot {
        nodes: vec![NodeSnapshot {
            name: "a".into(),
            taints: vec!["node.kubernetes.io/not-ready".into()],
            unschedulable: false,
        }],
        ..Snapshot::default()
    };
    assert_eq!(verdict::leftovers(&clean), vec![]);
    let dirty = Snapshot {
        nodes: vec![NodeSnapshot {
            name: "a".into(),
            taints: vec![
                "remediation.medik8s.io/self-node-remediation".into(),
                "node.kubernetes.io/out-of-service".into(),
            ],
            unschedulable: true,
        }],
        remediations: vec!["SelfNodeRemediation/a".into()],
        leases: vec!["node-a (NodeHealthCheck-x)".into()],
    };
    assert_eq!(verdict::leftovers(&dirty).len(), 5);
}

#[test]
fn remediation_in_flight_and_last_running() {
    let mut s = Script::default();
    s.remediation(5, "a", "created").running(7, "u1", "b");
    assert!(verdict::remediation_in_flight(&s.0, t(0)));
    s.remediation(9, "a", "removed");
    assert!(!verdict::remediation_in_flight(&s.0, t(0)));
    assert_eq!(verdict::last_running(&s.0, t(0), "vm/db-0"), Some(t(7)));
    assert_eq!(verdict::last_running(&s.0, t(8), "vm/db-0"), None);
}

#[test]
fn a_broken_plan_is_refused() {
    let mut p = plan::plan(1, 0);
    p.steps.retain(|s| {
        !matches!(
            s.action,
            Action::Heal { .. } | Action::PowerOn { .. } | Action::Thaw { .. }
        )
    });
    p.steps.push(plan::Step {
        at_ms: u64::MAX,
        action: Action::Crash { node: 0 },
    });
    assert!(plan::validate(&p).is_err());
}

proptest! {
    #[test]
    fn the_same_seed_draws_the_same_plan(seed in any::<u64>(), index in 0usize..500) {
        prop_assert_eq!(plan::plan(seed, index), plan::plan(seed, index));
    }

    #[test]
    fn plans_are_sound(seed in any::<u64>(), index in 0usize..500, five in any::<bool>()) {
        for options in [Options::default(), Options { nodes: Some(if five { 5 } else { 3 }) }] {
            let p = plan::plan_with(seed, index, options);
            prop_assert!(matches!(p.shape.nodes, 3 | 5));
            prop_assert!(!p.steps.is_empty());
            prop_assert!(p.shape.path == PathKind::FenceRedfish || !p.shape.slow_bmc);
            for step in &p.steps {
                let slots = match &step.action {
                    Action::Partition { nodes } => nodes.clone(),
                    Action::Crash { node } | Action::PowerOn { node } | Action::Freeze { node } | Action::Thaw { node }
                    | Action::IsolateFromApi { node } | Action::Heal { node } | Action::HangBmc { node }
                    | Action::ResumeBmc { node } | Action::RestartAgent { node, .. } => vec![*node],
                    _ => Vec::new(),
                };
                prop_assert!(slots.iter().all(|s| *s < p.shape.nodes), "{:?}", step);
            }
            // Only existing nodes, every fault healed by the end, and the rest of validate's rules.
            prop_assert_eq!(plan::validate(&p), Ok(()), "{:?}", p);
        }
    }

    #[test]
    fn a_block_of_trials_shares_one_shape(seed in any::<u64>(), block in 0usize..50) {
        let first = plan::plan(seed, block * plan::BLOCK).shape;
        for i in 1..plan::BLOCK {
            prop_assert_eq!(plan::plan(seed, block * plan::BLOCK + i).shape, first);
        }
    }
}
