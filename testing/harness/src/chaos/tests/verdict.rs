//! The verdict's checks on hand-made timelines.

use nodemedic_lab::timeline::Event;

use super::{Script, kinds, params, t};
use crate::chaos::verdict::{self, CONTROLLER_RESTART, NodeSnapshot, Params, Snapshot, ViolationKind};

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
    // Down from 10 s to 25 s, remediated at 22 s (the check's 9 s after it went down), fenced
    // at 60 s (a slow BMC): legitimate.
    let mut s = Script::default();
    s.cond(10, "a", false, false)
        .remediation(22, "a", "created")
        .cond(25, "a", true, false)
        .power_off(60, "a", "bmc");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()), vec![]);
    // Down from 10 s to 14 s: shorter than any health check of the trial can see, so a
    // remediation at 20 s is of a healthy node, and so is its fence.
    let mut s = Script::default();
    s.cond(10, "a", false, false)
        .cond(14, "a", true, false)
        .remediation(20, "a", "created")
        .power_off(60, "a", "bmc");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()).len(), 1);
    // Down long enough, but remediated 15 s after it was back: the API showed it healthy by then.
    let mut s = Script::default();
    s.cond(10, "a", false, false)
        .cond(30, "a", true, false)
        .remediation(45, "a", "created")
        .power_off(50, "a", "bmc");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()).len(), 1);
}

#[test]
fn a_minority_fencing_itself_shortly_after_it_reconnects_is_fine() {
    // Cut off 8 s, past its shortest lapse (4.45 s); reset 2 s after the heal, before the first
    // round after it (1.5 s, with the tolerance's 1 s) renewed its licence.
    let mut s = Script::default();
    s.cond(0, "a", true, true)
        .cond(8, "a", true, false)
        .power_off(10, "a", "watchdog");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()), vec![]);
    // ... but not once a round has renewed it.
    for at in [11, 60] {
        let mut s = Script::default();
        s.cond(0, "a", true, true)
            .cond(8, "a", true, false)
            .power_off(at, "a", "watchdog");
        assert_eq!(verdict::false_fences(&s.0, t(0), &params()).len(), 1, "{at}");
    }
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

#[test]
fn a_remediation_later_than_its_deadline_is_slow_also_after_a_control_plane_outage() {
    // remediate_after 25 s, the observer's 5 s: created at 31 s from a crash at 0 s is late.
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .remediation(31, "a", "created")
        .cond(60, "a", true, false);
    let v = verdict::unremediated(&s.0, t(0), t(70), &params());
    assert_eq!(kinds(&v), [ViolationKind::SlowRemediation]);
    // The API server stopped from 0 s to 100 s, the node down from 50 s: its deadline counts
    // from the return (100 s) and the 15 s the control plane settles: 140 s, 145 s with the lag.
    let outage = |created: i64| {
        let mut s = Script::default();
        s.fault(0, "stop-apiserver")
            .cond(50, "a", false, false)
            .note(100, verdict::CONTROL_PLANE_BACK)
            .remediation(created, "a", "created")
            .cond(200, "a", true, false);
        verdict::unremediated(&s.0, t(0), t(210), &params())
    };
    assert_eq!(outage(140), vec![], "in time after the outage");
    assert_eq!(
        kinds(&outage(150)),
        [ViolationKind::SlowRemediation],
        "a watch that slept through the return"
    );
}

/// Two control-plane nodes down within a budget of two; a's remediation is created at 16 s.
fn a_remediated_while_b_waits() -> (Params, Script) {
    let mut budget_of_two = params();
    // Five nodes: two may be unhealthy.
    budget_of_two.nodes = 5;
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
fn a_software_reboot_is_a_fence() {
    // Of a healthy node: false, as a watchdog reset would be.
    let mut s = Script::default();
    s.cond(1, "a", true, false)
        .at(40, Event::SoftwareReboot { node: "b".into() })
        .power_off(40, "b", "software-reboot");
    assert_eq!(
        kinds(&verdict::false_fences(&s.0, t(0), &params())),
        [ViolationKind::FalseFence]
    );
    // Of a node cut off and remediated: what self remediation without a watchdog does.
    let mut s = Script::default();
    s.cond(0, "b", true, true)
        .remediation(16, "b", "created")
        .at(25, Event::SoftwareReboot { node: "b".into() })
        .power_off(25, "b", "software-reboot");
    assert_eq!(verdict::false_fences(&s.0, t(0), &params()), vec![]);
}

#[test]
fn a_removed_node_is_neither_unremediated_nor_falsely_fenced() {
    // c leaves at 10 and is back at 70: 60 s without power, no remediation, no fence.
    let mut s = Script::default();
    s.removed(10, "c").added(70, "c");
    assert_eq!(verdict::judge(&s.0, t(0), t(100), &params()), vec![]);
    // Still gone at the end.
    let mut s = Script::default();
    s.removed(10, "c");
    assert_eq!(verdict::judge(&s.0, t(0), t(100), &params()), vec![]);
    // Its removal is no outage that would excuse a fence once it is back.
    let mut s = Script::default();
    s.removed(10, "c").added(70, "c").power_off(80, "c", "watchdog");
    assert_eq!(
        kinds(&verdict::false_fences(&s.0, t(0), &params())),
        [ViolationKind::FalseFence]
    );
}

#[test]
fn a_node_that_rejoined_sees_its_pods_deleted() {
    // db-0 runs on c after c rejoined; deleted there while c is connected, it is gone, so the
    // replacement on a is no second writer (the lab records no condition for a joining node).
    let mut s = Script::default();
    s.removed(10, "c")
        .added(20, "c")
        .running(30, "u1", "c")
        .gone(40, "u1", "c")
        .running(45, "u2", "a");
    assert_eq!(verdict::two_writers(&s.0, t(0)), vec![]);
}

#[test]
fn a_fence_while_the_control_plane_is_down_is_false() {
    for (stop, start) in [("stop-apiserver", "start-apiserver"), ("stop-etcd", "start-etcd")] {
        let mut s = Script::default();
        s.fault(0, stop)
            .power_off(150, "a", "watchdog")
            .cond(153, "a", true, false)
            .fault(200, start);
        assert_eq!(
            kinds(&verdict::judge(&s.0, t(0), t(300), &params())),
            [ViolationKind::FalseFence],
            "{stop}"
        );
    }
}

#[test]
fn a_healthy_node_remediated_once_the_control_plane_is_back_is_flagged() {
    let mut s = Script::default();
    s.fault(0, "stop-etcd")
        .fault(200, "start-etcd")
        .remediation(230, "a", "created")
        .remediation(235, "a", "removed");
    assert_eq!(
        kinds(&verdict::judge(&s.0, t(0), t(300), &params())),
        [ViolationKind::HealthyRemediated]
    );
    // A node down (or just back) is fair game.
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .cond(20, "a", true, false)
        .remediation(22, "a", "created");
    assert_eq!(verdict::healthy_remediated(&s.0, t(0), &params()), vec![]);
}

#[test]
fn no_remediation_is_expected_while_the_control_plane_is_down() {
    // a is down from 0; the API server is stopped at 5, started at 200 and answers at 210: the
    // 205 s without it and the 15 s settling do not count, so its deadline is 245.
    let outage = |s: &mut Script| {
        s.fault(5, "stop-apiserver").fault(200, "start-apiserver").back(210);
    };
    let mut s = Script::default();
    s.cond(0, "a", false, false);
    outage(&mut s);
    s.cond(240, "a", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(300), &params()), vec![]);
    let mut s = Script::default();
    s.cond(0, "a", false, false);
    outage(&mut s);
    s.cond(250, "a", true, false);
    assert_eq!(
        kinds(&verdict::unremediated(&s.0, t(0), t(300), &params())),
        [ViolationKind::Unremediated]
    );
    // A node that goes down while etcd is stopped is owed a remediation only once it is back.
    let mut s = Script::default();
    s.fault(0, "stop-etcd")
        .cond(100, "a", false, false)
        .fault(200, "start-etcd")
        .back(200)
        .cond(235, "a", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(300), &params()), vec![]);
    // Back while the API server is still down: nothing was owed.
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .fault(10, "stop-apiserver")
        .cond(60, "a", true, false)
        .fault(100, "start-apiserver")
        .back(101);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(120), &params()), vec![]);
    // A short stop only moves the deadline on by itself and the settling: a crash at 0 with
    // the API server gone from 17 to 21 is owed one by 44.
    let mut s = Script::default();
    s.cond(0, "a", false, false)
        .fault(17, "stop-apiserver")
        .fault(20, "start-apiserver")
        .back(21)
        .cond(50, "a", true, false);
    assert_eq!(
        kinds(&verdict::unremediated(&s.0, t(0), t(60), &params())),
        [ViolationKind::Unremediated]
    );
}

#[test]
fn the_budget_counts_from_the_controllers_last_restart() {
    // Restarted at 15, 21, 27 and 33: the deadline is 58, so back at 50 is within it...
    let restarts = |s: &mut Script| {
        for at in [15, 21, 27, 33] {
            s.fault(at, CONTROLLER_RESTART);
        }
    };
    let mut s = Script::default();
    s.cond(0, "a", false, false);
    restarts(&mut s);
    s.cond(50, "a", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(60), &params()), vec![]);
    // ... at 70 it is not, and without the restarts neither is 50.
    let mut s = Script::default();
    s.cond(0, "a", false, false);
    restarts(&mut s);
    s.cond(70, "a", true, false);
    assert_eq!(
        kinds(&verdict::unremediated(&s.0, t(0), t(80), &params())),
        [ViolationKind::Unremediated]
    );
    let mut s = Script::default();
    s.cond(0, "a", false, false).cond(50, "a", true, false);
    assert_eq!(
        kinds(&verdict::unremediated(&s.0, t(0), t(60), &params())),
        [ViolationKind::Unremediated]
    );
}

#[test]
fn the_budget_follows_nodes_joining_and_leaving() {
    // Of three nodes one leaves: with two, minHealthy 51 % allows none unhealthy.
    let mut s = Script::default();
    s.removed(1, "c").cond(10, "a", false, false).cond(50, "a", true, false);
    assert_eq!(verdict::unremediated(&s.0, t(0), t(60), &params()), vec![]);
    // An extra node joins as well: three again, one may be unhealthy, and a is owed one.
    let mut s = Script::default();
    s.removed(1, "c")
        .added(2, "x")
        .cond(10, "a", false, false)
        .cond(50, "a", true, false);
    assert_eq!(
        kinds(&verdict::unremediated(&s.0, t(0), t(60), &params())),
        [ViolationKind::Unremediated]
    );
}

#[test]
fn a_first_remediation_during_an_announced_upgrade_is_flagged_and_an_escalation_is_not() {
    use crate::chaos::verdict::{UPGRADE_ANNOUNCED, UPGRADE_WITHDRAWN};
    let mut s = Script::default();
    s.remediation(0, "b", "created")
        .note(10, UPGRADE_ANNOUNCED)
        // Decided before the annotation could be seen.
        .remediation(11, "c", "created")
        .cond(20, "a", false, false)
        .remediation(50, "a", "created")
        // b's escalation: its first remediation is still in flight.
        .at(
            55,
            Event::Remediation {
                kind: "FenceAgentsRemediation".into(),
                name: "b".into(),
                node: "b".into(),
                change: "created".into(),
                created_at: None,
            },
        )
        .note(90, UPGRADE_WITHDRAWN)
        .remediation(95, "a", "created");
    let v = verdict::remediated_during_upgrade(&s.0, t(0));
    assert_eq!(kinds(&v), [ViolationKind::RemediatedDuringUpgrade]);
    assert_eq!(v[0].node.as_deref(), Some("a"));
    assert_eq!(v[0].at, Some(t(50)));
}

#[test]
fn a_node_rebooted_during_an_upgrade_is_owed_no_remediation_until_it_is_withdrawn() {
    use crate::chaos::verdict::{UPGRADE_ANNOUNCED, UPGRADE_WITHDRAWN};
    let mut s = Script::default();
    s.note(0, UPGRADE_ANNOUNCED)
        .cond(2, "a", false, false)
        .cond(40, "a", true, false)
        .cond(42, "b", false, false)
        .note(50, UPGRADE_WITHDRAWN);
    // a came back during the upgrade; b is still down at 70, 20 s after the upgrade: owed nothing yet.
    assert_eq!(verdict::unremediated(&s.0, t(0), t(70), &params()), vec![]);
    // At 90 b has been down 40 s since the upgrade ended: owed a remediation.
    let v = verdict::unremediated(&s.0, t(0), t(90), &params());
    assert_eq!(kinds(&v), [ViolationKind::Unremediated]);
    assert_eq!(v[0].node.as_deref(), Some("b"));
}
