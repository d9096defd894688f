//! The false-fence rule: how each fault counts (hand-made timelines through the check) and its
//! properties (over the rule's plain data, and over timelines).

use std::time::Duration;

use jiff::Timestamp;
use nodemedic_lab::{
    NodeCondition,
    timeline::{Entry, Event},
};
use proptest::prelude::*;

use super::{Script, agents, params, t};
use crate::chaos::verdict::{
    AGENT_RESTART, AgentTimings, Params,
    fences::{self, TOLERANCE},
    reach::{NodeHistory, Span},
};

impl Script {
    fn condition(&mut self, s: i64, node: &str, condition: NodeCondition) -> &mut Self {
        self.at(
            s,
            Event::NodeCondition {
                node: node.into(),
                condition,
            },
        )
    }
    fn frozen(&mut self, s: i64, node: &str, frozen: bool) -> &mut Self {
        self.condition(
            s,
            node,
            NodeCondition {
                frozen,
                ..NodeCondition::running()
            },
        )
    }
    fn api_isolated(&mut self, s: i64, node: &str) -> &mut Self {
        self.condition(
            s,
            node,
            NodeCondition {
                api_isolated: true,
                ..NodeCondition::running()
            },
        )
    }
    /// `nodes` partitioned together, as the lab records it: the fault, then each condition.
    fn partition(&mut self, s: i64, nodes: &[&str]) -> &mut Self {
        self.fault(s, &format!("partition {}", nodes.join(",")));
        for n in nodes {
            self.cond(s, n, true, true);
        }
        self
    }
    /// Powered on again, as the lab records it.
    fn power_on(&mut self, s: i64, node: &str) -> &mut Self {
        self.at(
            s,
            Event::Power {
                node: node.into(),
                on: true,
                cause: "power-on".into(),
            },
        )
        .cond(s, node, true, false)
    }
    fn agent_restart(&mut self, s: i64, node: &str) -> &mut Self {
        self.at(
            s,
            Event::Fault {
                node: Some(node.into()),
                fault: AGENT_RESTART.into(),
            },
        )
    }
}

fn false_fences(s: &Script, params: &Params) -> usize {
    crate::chaos::verdict::false_fences(&s.0, t(0), params).len()
}

#[test]
fn a_blip_excuses_no_reset_however_soon_after() {
    // Cut off 1 s, reset 20 s later: what the old grace excused.
    let mut s = Script::default();
    s.partition(0, &["a"])
        .cond(1, "a", true, false)
        .power_off(20, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
    // Cut off 1 s and reset 3 s into it: sooner than the 4.45 s shortest lapse (less the
    // tolerance) allows.
    let mut s = Script::default();
    s.partition(0, &["a"])
        .cond(1, "a", true, false)
        .power_off(3, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
    // Cut off 3 s, reset 3 s after the heal: a round after it (1.5 s) renewed the licence.
    let mut s = Script::default();
    s.partition(0, &["a"])
        .cond(3, "a", true, false)
        .power_off(6, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
}

#[test]
fn a_partitioned_minority_is_reset_once_its_licence_can_have_run_out() {
    for (at, false_fence) in [(3, 1), (4, 0), (30, 0)] {
        let mut s = Script::default();
        s.partition(0, &["a"]).power_off(at, "a", "watchdog");
        assert_eq!(false_fences(&s, &params()), false_fence, "reset at {at}");
    }
    // Two of five partitioned together: both a minority, and nobody else.
    let mut five = params();
    five.nodes = 5;
    let mut s = Script::default();
    s.partition(0, &["a", "b"])
        .power_off(10, "a", "watchdog")
        .power_off(10, "c", "watchdog");
    let v = crate::chaos::verdict::false_fences(&s.0, t(0), &five);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].node.as_deref(), Some("c"));
}

#[test]
fn a_majority_partitioned_from_the_api_keeps_its_licence_from_votes() {
    // Two of three cut off together: they still count each other's votes.
    let mut s = Script::default();
    s.partition(0, &["a", "b"]).power_off(30, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
}

#[test]
fn a_node_isolated_from_the_api_only_keeps_its_licence_from_votes() {
    let mut s = Script::default();
    s.api_isolated(0, "a").power_off(30, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
    // Its remediation (it is unhealthy to the health check) is the reason it fences.
    let mut s = Script::default();
    s.api_isolated(0, "a")
        .remediation(12, "a", "created")
        .power_off(13, "a", "software-reboot");
    assert_eq!(false_fences(&s, &params()), 0);
}

#[test]
fn the_api_away_cuts_off_only_a_node_without_a_majority() {
    // Every node up: nobody is cut off, however long (the existing check of the outage).
    // Two of three crashed: the survivor has neither.
    let mut s = Script::default();
    s.cond(0, "a", true, false)
        .fault(0, "stop-etcd")
        .power_off(1, "b", "crash")
        .power_off(1, "c", "crash")
        .power_off(7, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 0);
    // The same with the API answering again at 3: a renews from it.
    let mut s = Script::default();
    s.cond(0, "a", true, false)
        .fault(0, "stop-etcd")
        .power_off(1, "b", "crash")
        .power_off(1, "c", "crash")
        .back(3)
        .power_off(10, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
    // An etcd restart counts the same until the API answers.
    let mut s = Script::default();
    s.cond(0, "a", true, false)
        .fault(0, "restart-etcd")
        .power_off(0, "b", "crash")
        .power_off(0, "c", "crash")
        .power_off(7, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 0);
}

#[test]
fn a_node_booted_while_the_api_is_away_has_no_licence_to_wait_out() {
    // Booted at 10 with etcd stopped: it cannot count votes before it has read the membership,
    // so its watchdog (3 s) resets it from 13 on (12 with the tolerance).
    for (at, false_fence) in [(11, 1), (12, 0)] {
        let mut s = Script::default();
        s.fault(0, "stop-etcd")
            .power_off(5, "a", "crash")
            .power_on(10, "a")
            .power_off(at, "a", "watchdog");
        assert_eq!(false_fences(&s, &params()), false_fence, "reset at {at}");
    }
    // Booted with the API there, it is licensed.
    let mut s = Script::default();
    s.power_off(5, "a", "crash")
        .power_on(10, "a")
        .power_off(14, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
}

#[test]
fn an_agent_restarted_while_the_api_is_away_lives_on_its_predecessors_licence() {
    let mut s = Script::default();
    s.cond(0, "a", true, false)
        .fault(1, "stop-apiserver")
        .agent_restart(10, "a")
        .power_off(15, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 0);
    // Restarted with the API there: it reads the membership at once.
    let mut s = Script::default();
    s.cond(0, "a", true, false)
        .agent_restart(10, "a")
        .fault(11, "stop-apiserver")
        .power_off(20, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
}

#[test]
fn a_frozen_node_is_reset_by_its_watchdog_while_frozen() {
    // Frozen at 0: fed last after -1 s (every second), reset from 2 s on (1 s with the tolerance).
    let mut s = Script::default();
    s.frozen(0, "a", true).power_off(2, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 0);
    // Thawed at 1 with its licence: it fed again at once.
    let mut s = Script::default();
    s.frozen(0, "a", true)
        .frozen(1, "a", false)
        .power_off(5, "a", "watchdog");
    assert_eq!(false_fences(&s, &params()), 1);
}

#[test]
fn a_node_leaving_counts_as_a_silent_member_until_the_change_settles() {
    // Four nodes, etcd stopped; d leaves and b crashes at 1: a and c are two of four until the
    // configuration without d commits (10 s), two of three after.
    let mut four = params();
    four.nodes = 4;
    let script = |at| {
        let mut s = Script::default();
        s.fault(0, "stop-etcd")
            .cond(0, "a", true, false)
            .cond(0, "c", true, false)
            .removed(1, "d")
            .power_off(1, "b", "crash")
            .note(12, "settled")
            .power_off(at, "a", "watchdog");
        s
    };
    assert_eq!(false_fences(&script(6), &four), 0);
    assert_eq!(false_fences(&script(30), &four), 1);
}

#[test]
fn a_remediation_excuses_fences_while_in_flight_and_its_escalation_too() {
    let outage = |s: &mut Script| {
        s.partition(0, &["a"])
            .remediation(10, "a", "created")
            .cond(20, "a", true, false);
    };
    // Back at 20, fenced at 40 on reading its remediation (created 10 s into the outage).
    let mut s = Script::default();
    outage(&mut s);
    s.power_off(40, "a", "software-reboot");
    assert_eq!(false_fences(&s, &params()), 0);
    // Removed at 30: fences until 50 (fence_grace) are still its doing, later ones are not.
    for (at, false_fence) in [(45, 0), (55, 1)] {
        let mut s = Script::default();
        outage(&mut s);
        s.remediation(30, "a", "removed").power_off(at, "a", "bmc");
        assert_eq!(false_fences(&s, &params()), false_fence, "fenced at {at}");
    }
    // An escalation created after the node was back, while the first was in flight.
    let mut s = Script::default();
    outage(&mut s);
    s.at(
        45,
        Event::Remediation {
            kind: "FenceAgentsRemediation".into(),
            name: "a".into(),
            node: "a".into(),
            change: "created".into(),
            created_at: None,
        },
    )
    .remediation(46, "a", "removed")
    .power_off(60, "a", "bmc");
    assert_eq!(false_fences(&s, &params()), 0);
}

#[test]
fn a_remediation_the_lab_saw_late_excuses_the_fence_it_caused_before() {
    // Crashed at 0 and unseen from then; the remediation created at 12 fenced it through its BMC
    // at 13, and the lab's watch, relisting after an API outage, saw the object only at 16.
    let script = |created_at: Option<i64>| {
        let mut s = Script::default();
        s.power_off(0, "a", "crash").power_off(13, "a", "bmc").at(
            16,
            Event::Remediation {
                kind: "FenceAgentsRemediation".into(),
                name: "a".into(),
                node: "a".into(),
                change: "created".into(),
                created_at: created_at.map(t),
            },
        );
        s
    };
    assert_eq!(false_fences(&script(Some(12)), &params()), 0);
    assert_eq!(
        false_fences(&script(None), &params()),
        1,
        "seen only after the fence, with no creation time"
    );
}

#[test]
fn a_partition_that_ends_as_the_watchdog_resets_the_node_is_one_outage_with_the_reset() {
    // Cut off 5 s, connected again 1 s, reset by its watchdog (its licence ran out in the
    // partition) and back 4 s later: 9 s unseen, as long as a health check needs. The
    // remediation created then is the outage's, and so is the fence of the node reading it.
    let outage = |reconnected: i64| {
        let mut s = Script::default();
        s.partition(0, &["a"])
            .cond(5, "a", true, false)
            .power_off(5 + reconnected, "a", "watchdog")
            .power_on(9 + reconnected, "a")
            .remediation(10 + reconnected, "a", "created")
            .power_off(10 + reconnected, "a", "software-reboot");
        s
    };
    assert_eq!(false_fences(&outage(1), &params()), 0);
    // Connected 2 s, a lease renewal and the tolerance: the node controller saw it back, and
    // neither outage alone lasted the 9 s (the watchdog's reset is still the licence's lapse).
    assert_eq!(false_fences(&outage(2), &params()), 1);
}

#[test]
fn without_agents_only_a_remediation_excuses_a_reset() {
    let mut none = params();
    none.agents = None;
    let mut s = Script::default();
    s.partition(0, &["a"]).power_off(30, "a", "watchdog");
    assert_eq!(false_fences(&s, &none), 1);
}

#[test]
fn the_chart_defaults_shortest_lapse_is_shorter_than_their_licence() {
    // L 8 s, rounds every 4 s, W 2 s fed every 0.67 s: cut off right after a renewal sent 4 s
    // earlier, the licence ends 4 s into the cut-off and the watchdog fires 1.3 s later.
    let ms = Duration::from_millis;
    let chart = AgentTimings::new(
        &nodemedic_self_remediation::protocol::LicenceSettings {
            api_check_interval: ms(4000),
            api_server_timeout: ms(1500),
            max_api_error_threshold: 1,
            peer_dial_timeout: ms(1000),
            peer_request_timeout: ms(1500),
        },
        Duration::from_secs(2),
    );
    assert_eq!(chart.licence, Duration::from_secs(8));
    assert_eq!(chart.shortest_lapse().as_millis(), 5283);
    assert_eq!(agents().shortest_lapse(), ms(4450));
}

/// Milliseconds into a generated timeline.
fn ms(at: u64) -> Timestamp {
    Timestamp::from_millisecond(1_000_000_000_000 + at as i64).expect("time")
}

fn span(from: u64, to: Option<u64>) -> Span {
    Span {
        from: ms(from),
        to: to.map(ms),
    }
}

fn timings() -> impl Strategy<Value = AgentTimings> {
    (1_000u64..20_000, 1_000u64..15_000, 1_000u64..60_000, 100u64..1_000).prop_map(|(l, r, w, f)| AgentTimings {
        licence: Duration::from_millis(l),
        round: Duration::from_millis(r),
        watchdog: Duration::from_millis(w),
        feed_interval: Duration::from_millis(f),
    })
}

fn spans(max: usize) -> impl Strategy<Value = Vec<Span>> {
    prop::collection::vec((0u64..120_000, 0u64..60_000, any::<bool>()), 0..max).prop_map(|v| {
        v.into_iter()
            .map(|(from, len, open)| span(from, (!open).then_some(from + len)))
            .collect()
    })
}

fn history() -> impl Strategy<Value = NodeHistory> {
    (prop::collection::vec(0u64..120_000, 0..3), spans(6), spans(2)).prop_map(|(boots, dark, frozen)| NodeHistory {
        boots: boots.into_iter().map(ms).collect(),
        dark,
        frozen,
        disconnected: Vec::new(),
    })
}

/// The timeline of a three-node lab whose node `a` is partitioned over `cut` (ms, healed at
/// the end unless None) and reset by its watchdog at `reset`.
fn partitioned(cut: (u64, Option<u64>), reset: u64) -> Vec<Entry> {
    let mut entries = vec![
        Entry {
            at: ms(cut.0),
            revision: None,
            event: Event::Fault {
                node: None,
                fault: "partition a".into(),
            },
        },
        condition(cut.0, true, true),
    ];
    if let Some(healed) = cut.1 {
        entries.push(condition(healed, true, false));
    }
    entries.push(Entry {
        at: ms(reset),
        revision: None,
        event: Event::Power {
            node: "a".into(),
            on: false,
            cause: "watchdog".into(),
        },
    });
    entries.push(condition(reset, false, false));
    entries.sort_by_key(|e| e.at);
    entries
}

fn condition(at: u64, powered: bool, partitioned: bool) -> Entry {
    Entry {
        at: ms(at),
        revision: None,
        event: Event::NodeCondition {
            node: "a".into(),
            condition: NodeCondition {
                powered,
                partitioned,
                ..NodeCondition::default()
            },
        },
    }
}

proptest! {
    /// Cut-offs each shorter than the shortest lapse, with a round's renewal between them,
    /// never excuse a reset, whenever it comes.
    #[test]
    fn a_fence_with_no_long_enough_cut_off_is_never_excused(
        timings in timings(),
        cuts in prop::collection::vec((0u64..=1_000, 0u64..=1_000), 1..5),
        at in 0u64..400_000,
    ) {
        // A cut-off can excuse a reset from its shortest lapse into it until a round after it.
        let bound = timings.shortest_lapse().as_millis() as u64;
        let slack = (timings.round + TOLERANCE * 2).as_millis() as u64;
        prop_assume!(bound > slack + 1);
        let short = bound - slack - 1;
        let gap = (timings.round + TOLERANCE).as_millis() as u64 + 1;
        let mut dark = Vec::new();
        let mut t = 0;
        for (length, pause) in cuts {
            let to = t + short * length / 1_000;
            dark.push(span(t, Some(to)));
            t = to + gap + pause * 10;
        }
        let history = NodeHistory { dark, ..NodeHistory::default() };
        prop_assert_eq!(fences::lapse(&history, ms(at), &timings), None);
    }

    /// Longer cut-offs (earlier, later, or never healed) keep every excused reset excused.
    #[test]
    fn extending_a_cut_off_never_turns_an_excused_fence_into_a_false_one(
        timings in timings(),
        history in history(),
        at in 0u64..200_000,
        which in any::<prop::sample::Index>(),
        earlier in 0u64..30_000,
        later in prop::option::of(0u64..30_000),
    ) {
        prop_assume!(!history.dark.is_empty());
        let excused = fences::lapse(&history, ms(at), &timings);
        let mut longer = history.clone();
        let i = which.index(longer.dark.len());
        let s = &mut longer.dark[i];
        s.from -= jiff::SignedDuration::from_millis(earlier as i64);
        s.to = match later {
            None => None,
            Some(more) => s.to.map(|to| to + jiff::SignedDuration::from_millis(more as i64)),
        };
        if excused.is_some() {
            prop_assert!(fences::lapse(&longer, ms(at), &timings).is_some());
        }
    }

    /// Through the timeline: a partition shorter than the shortest lapse less a round and the
    /// tolerance at either end (4.45 − 1.5 − 2 s) excuses no reset, whenever it comes.
    #[test]
    fn a_blip_shorter_than_the_shortest_lapse_less_a_round_never_excuses(length in 0u64..950, reset in 0u64..60_000) {
        let v = crate::chaos::verdict::false_fences(&partitioned((1_000, Some(1_000 + length)), 1_000 + reset), ms(0), &params());
        prop_assert_eq!(v.len(), 1);
    }

    /// ... and any cut-off excuses a reset from its shortest lapse on (less the tolerance),
    /// while it lasts and for a round (and the tolerance) after; none later.
    #[test]
    fn a_long_enough_cut_off_excuses_the_reset(length in 0u64..60_000, reset in 3_450u64..62_500) {
        prop_assume!(reset <= length + 2_500);
        let v = crate::chaos::verdict::false_fences(&partitioned((1_000, Some(1_000 + length)), 1_000 + reset), ms(0), &params());
        prop_assert_eq!(v, vec![]);
        let late = 1_000 + length + 2_501 + reset % 30_000;
        let v = crate::chaos::verdict::false_fences(&partitioned((1_000, Some(1_000 + length)), late), ms(0), &params());
        prop_assert_eq!(v.len(), 1);
    }

    /// A minority partitioned (one or two of five), with the API server stopped or not: no node
    /// of the majority is ever cut off.
    #[test]
    fn the_majority_is_never_cut_off_by_a_minority_partition(
        minority in prop::sample::subsequence(vec!["a", "b", "c", "d", "e"], 1..=2),
        stopped in any::<bool>(),
        reset in 0u64..120_000,
    ) {
        let mut five = params();
        five.nodes = 5;
        let mut entries = Vec::new();
        let at = |s: u64, event| Entry {
            at: ms(s),
            revision: None,
            event,
        };
        for n in ["a", "b", "c", "d", "e"] {
            entries.push(at(0, Event::NodeCondition { node: n.into(), condition: NodeCondition::running() }));
        }
        if stopped {
            entries.push(at(0, Event::Fault { node: None, fault: "stop-apiserver".into() }));
        }
        entries.push(at(1, Event::Fault { node: None, fault: format!("partition {}", minority.join(",")) }));
        for n in &minority {
            entries.push(at(1, Event::NodeCondition {
                node: (*n).into(),
                condition: NodeCondition { partitioned: true, ..NodeCondition::running() },
            }));
        }
        let majority: Vec<&str> = ["a", "b", "c", "d", "e"].into_iter().filter(|n| !minority.contains(n)).collect();
        for n in &majority {
            entries.push(at(1 + reset, Event::Power { node: (*n).into(), on: false, cause: "watchdog".into() }));
        }
        let v = crate::chaos::verdict::false_fences(&entries, ms(0), &five);
        prop_assert_eq!(v.len(), majority.len());
    }
}

#[test]
fn every_fence_is_judged_with_its_excuse_for_the_trials_log() {
    let mut s = Script::default();
    s.partition(0, &["a"])
        .power_off(6, "a", "watchdog")
        .cond(9, "a", true, false)
        .power_off(40, "a", "watchdog");
    let judged = crate::chaos::verdict::fences::judge_fences(&s.0, t(0), &params());
    assert_eq!(judged.len(), 2);
    assert_eq!(judged[0].excuse, Some(fences::Excuse::CutOff(t(0))));
    assert!(
        judged[0]
            .line(t(0))
            .contains("cut off from the API server and a majority of its peers (or frozen) since 6.0s before"),
        "{}",
        judged[0].line(t(0))
    );
    assert_eq!(judged[1].excuse, None);
    assert!(
        judged[1].detail.contains("no remediation of it"),
        "{}",
        judged[1].detail
    );
}
