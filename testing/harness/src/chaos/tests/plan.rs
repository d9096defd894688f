//! Plans: drawn deterministically, sound, and with the episodes the campaign is for.

use nodemedic_lab::{Fault, Timings};
use proptest::prelude::*;

use crate::chaos::plan::{
    self, AFTERMATH_MS, Action, LONG_OUTAGE_MS, Options, PathKind, Shape, Step, Strategy, TrialPlan,
    summary::{
        self, CHURN_DURING_CRASH, CONTROLLER_RESTART_LOOP, CRASH_AFTER_LONG_OUTAGE, EXTRA_NODE, FULL_DISK,
        LONG_APISERVER_OUTAGE, LONG_ETCD_OUTAGE, NODE_REJOINS, ROLLING_UPGRADE, SLOW_APISERVER, SLOW_ETCD,
        SLOW_NETWORK, STARVED_AGENT_CPU, STARVED_AGENT_MEMORY,
    },
};

const SNR3: Shape = Shape {
    nodes: 3,
    path: PathKind::SelfRemediation,
    slow_bmc: false,
    real_nodes: false,
};
const SNR5: Shape = Shape { nodes: 5, ..SNR3 };
const FAR3: Shape = Shape {
    path: PathKind::FenceRedfish,
    ..SNR3
};

/// Steps at seconds.
type Steps<'a> = &'a [(u64, Action)];

/// A plan of these steps, ending with its last.
fn hand_made(shape: Shape, steps: Steps<'_>) -> TrialPlan {
    let steps: Vec<Step> = steps
        .iter()
        .map(|(s, action)| Step {
            at_ms: s * 1000,
            action: action.clone(),
        })
        .collect();
    TrialPlan {
        seed: 0,
        index: 0,
        shape,
        strategy: Strategy::OutOfServiceTaint,
        end_ms: steps.last().map_or(0, |s| s.at_ms),
        steps,
        version: plan::PLAN_VERSION,
    }
}

fn check(shape: Shape, steps: Steps<'_>) -> Result<(), String> {
    plan::validate(&hand_made(shape, steps))
}

fn is_node_fault(action: &Action) -> bool {
    matches!(
        action,
        Action::Fault(Fault::Crash { .. })
            | Action::Fault(Fault::Freeze { .. })
            | Action::Fault(Fault::Partition { .. })
            | Action::Fault(Fault::IsolateFromApi { .. })
    )
}

/// Every plan of seeds `0..seeds`, 50 trials each.
fn campaigns(seeds: u64) -> Vec<TrialPlan> {
    (0..seeds)
        .flat_map(|seed| (0..50).map(move |i| plan::plan(seed, i)))
        .collect()
}

#[test]
fn a_broken_plan_is_refused() {
    let mut p = plan::plan(1, 0);
    p.steps.retain(|s| {
        !matches!(
            s.action,
            Action::Fault(Fault::Heal { .. })
                | Action::Fault(Fault::PowerOn { .. })
                | Action::Fault(Fault::Thaw { .. })
        )
    });
    p.steps.push(plan::Step {
        at_ms: u64::MAX,
        action: Action::Fault(Fault::Crash { node: 0 }),
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
        for options in [Options::default(), Options {
            nodes: Some(if five { 5 } else { 3 }),
            ..Options::default()
        }] {
            let p = plan::plan_with(seed, index, options);
            prop_assert!(matches!(p.shape.nodes, 3 | 5));
            prop_assert!(!p.steps.is_empty());
            prop_assert!(p.shape.path == PathKind::FenceRedfish || !p.shape.slow_bmc);
            prop_assert!(p.steps.last().is_none_or(|s| s.at_ms <= p.end_ms));
            for step in &p.steps {
                if let Action::AddNode { node } | Action::RemoveNode { node } = step.action {
                    prop_assert!(p.shape.churns() && (1..=p.shape.nodes).contains(&node), "{:?}", step);
                }
                let slots = match &step.action {
                    Action::Fault(Fault::Partition { nodes }) => nodes.clone(),
                    Action::Fault(Fault::Crash { node }) | Action::Fault(Fault::PowerOn { node }) | Action::Fault(Fault::Freeze { node }) | Action::Fault(Fault::Thaw { node })
                    | Action::Fault(Fault::IsolateFromApi { node }) | Action::Fault(Fault::Heal { node }) | Action::Fault(Fault::HangBmc { node })
                    | Action::Fault(Fault::ResumeBmc { node }) | Action::RestartAgent { node, .. } => vec![*node],
                    _ => Vec::new(),
                };
                prop_assert!(slots.iter().all(|s| *s < p.shape.nodes), "{:?}", step);
            }
            // Only existing nodes, every fault healed by the end, and the rest of validate's rules.
            prop_assert_eq!(plan::validate(&p), Ok(()), "{:?}", p);
            // What the runner counts on: slot 0 runs the workload when a node of the lab's own
            // leaves, so that node is never the workload's.
            let first_fault = p.steps.iter().find(|s| is_node_fault(&s.action)).map(|s| s.at_ms);
            for step in &p.steps {
                if let Action::RemoveNode { node } = step.action
                    && node < p.shape.nodes
                {
                    prop_assert!(first_fault.is_none_or(|f| step.at_ms < f), "{:?}", p);
                }
            }
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

#[test]
fn membership_changes_are_checked() {
    use Action::{AddNode, RemoveNode};
    // A swap in five nodes with the workload's node crashing meanwhile.
    let swap = [
        (0, AddNode { node: 5 }),
        (5, RemoveNode { node: 3 }),
        (8, Action::Fault(Fault::Crash { node: 0 })),
        (30, AddNode { node: 3 }),
        (35, RemoveNode { node: 5 }),
        (45, Action::Fault(Fault::PowerOn { node: 0 })),
    ];
    assert_eq!(check(SNR5, &swap), Ok(()));
    let refused: &[(&str, Shape, Steps<'_>)] = &[
        (
            "with BMCs",
            FAR3,
            &[(0, RemoveNode { node: 1 }), (30, AddNode { node: 1 })],
        ),
        (
            "the workload's node",
            SNR3,
            &[(0, RemoveNode { node: 0 }), (30, AddNode { node: 0 })],
        ),
        (
            "a majority",
            SNR5,
            &[
                (0, RemoveNode { node: 1 }),
                (1, RemoveNode { node: 2 }),
                (2, RemoveNode { node: 3 }),
                (30, AddNode { node: 1 }),
                (31, AddNode { node: 2 }),
                (32, AddNode { node: 3 }),
            ],
        ),
        (
            "one gone and one crashed of three",
            SNR3,
            &[
                (0, RemoveNode { node: 2 }),
                (5, Action::Fault(Fault::Crash { node: 0 })),
                (30, AddNode { node: 2 }),
                (40, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
        ("not back at the end", SNR3, &[(0, RemoveNode { node: 2 })]),
        ("the extra node left in", SNR3, &[(0, AddNode { node: 3 })]),
        (
            "no such slot",
            SNR3,
            &[(0, AddNode { node: 4 }), (5, RemoveNode { node: 4 })],
        ),
        (
            "added twice",
            SNR3,
            &[(0, AddNode { node: 3 }), (5, AddNode { node: 3 })],
        ),
        (
            "a faulted node",
            SNR5,
            &[
                (0, Action::Fault(Fault::Freeze { node: 2 })),
                (1, RemoveNode { node: 2 }),
                (30, AddNode { node: 2 }),
            ],
        ),
        (
            "a fault of a node that left",
            SNR5,
            &[
                (0, RemoveNode { node: 2 }),
                (5, Action::Fault(Fault::Crash { node: 2 })),
                (10, Action::Fault(Fault::PowerOn { node: 2 })),
                (30, AddNode { node: 2 }),
            ],
        ),
        (
            "while the API server is down",
            SNR3,
            &[
                (0, Action::Fault(Fault::StopApiserver)),
                (1, RemoveNode { node: 2 }),
                (5, Action::Fault(Fault::StartApiserver)),
                (30, AddNode { node: 2 }),
            ],
        ),
    ];
    for (why, shape, steps) in refused {
        assert!(check(*shape, steps).is_err(), "{why}");
    }
}

#[test]
fn control_plane_outages_are_checked() {
    use Action::{RestartAgent, RestartController};
    assert_eq!(
        check(
            SNR3,
            &[
                (0, Action::Fault(Fault::StopEtcd)),
                (120, Action::Fault(Fault::StartEtcd))
            ]
        ),
        Ok(())
    );
    // A short one during a node fault is a disturbance the plans draw.
    let short = [
        (0, Action::Fault(Fault::Crash { node: 0 })),
        (15, Action::Fault(Fault::StopApiserver)),
        (20, Action::Fault(Fault::StartApiserver)),
        (40, Action::Fault(Fault::PowerOn { node: 0 })),
    ];
    assert_eq!(check(SNR3, &short), Ok(()));
    let agent = RestartAgent {
        node: 1,
        mid_remediation: false,
    };
    let refused: &[(&str, Steps<'_>)] = &[
        (
            "a long one during a crash",
            &[
                (0, Action::Fault(Fault::Crash { node: 0 })),
                (1, Action::Fault(Fault::StopApiserver)),
                (100, Action::Fault(Fault::StartApiserver)),
                (110, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
        (
            "a crash while etcd is down",
            &[
                (0, Action::Fault(Fault::StopEtcd)),
                (10, Action::Fault(Fault::Crash { node: 1 })),
                (20, Action::Fault(Fault::PowerOn { node: 1 })),
                (100, Action::Fault(Fault::StartEtcd)),
            ],
        ),
        (
            "etcd restarted while stopped",
            &[
                (0, Action::Fault(Fault::StopEtcd)),
                (5, Action::Fault(Fault::RestartEtcd)),
                (100, Action::Fault(Fault::StartEtcd)),
            ],
        ),
        (
            "the controller restarted without etcd",
            &[
                (0, Action::Fault(Fault::StopEtcd)),
                (5, RestartController { mid_remediation: false }),
                (100, Action::Fault(Fault::StartEtcd)),
            ],
        ),
        (
            "an agent restarted without the API server",
            &[
                (0, Action::Fault(Fault::StopApiserver)),
                (5, agent),
                (100, Action::Fault(Fault::StartApiserver)),
            ],
        ),
        (
            "started what was not stopped",
            &[
                (0, Action::Fault(Fault::StopEtcd)),
                (100, Action::Fault(Fault::StartApiserver)),
            ],
        ),
        (
            "both at once",
            &[
                (0, Action::Fault(Fault::StopApiserver)),
                (1, Action::Fault(Fault::StopEtcd)),
                (100, Action::Fault(Fault::StartEtcd)),
                (101, Action::Fault(Fault::StartApiserver)),
            ],
        ),
        ("left stopped", &[(0, Action::Fault(Fault::StopEtcd))]),
    ];
    for (why, steps) in refused {
        assert!(check(SNR3, steps).is_err(), "{why}");
    }
}

#[test]
fn slow_networks_are_checked() {
    let slow = |delay_ms: u64, loss_permille: u32| {
        Action::Fault(Fault::SlowLinks {
            delay_ms,
            jitter_ms: delay_ms / 2,
            loss_permille,
            nodes: Vec::new(),
        })
    };
    assert_eq!(
        check(
            SNR3,
            &[
                (0, slow(80, 20)),
                (45, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() }))
            ]
        ),
        Ok(())
    );
    let refused: &[(&str, Steps<'_>)] = &[
        ("left slow", &[(0, slow(80, 20))]),
        (
            "restored without being slowed",
            &[(0, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() }))],
        ),
        (
            "slower than the lab's timings allow",
            &[
                (0, slow(400, 0)),
                (45, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() })),
            ],
        ),
        (
            "lossier than the lab's timings allow",
            &[
                (0, slow(80, 100)),
                (45, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() })),
            ],
        ),
        (
            "during a crash",
            &[
                (0, Action::Fault(Fault::Crash { node: 0 })),
                (1, slow(80, 20)),
                (30, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() })),
                (40, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
        (
            "slowed twice",
            &[
                (0, slow(80, 0)),
                (1, slow(80, 0)),
                (45, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() })),
            ],
        ),
    ];
    for (why, steps) in refused {
        assert!(check(SNR3, steps).is_err(), "{why}");
    }
}

/// A slow network holds with every node healthy and is watched for a while after the links
/// are restored, so a suspicion it caused that led to a remediation is judged in its trial.
#[test]
fn slow_networks_are_watched_after() {
    let mut seen = 0;
    for p in campaigns(10) {
        for (i, step) in p.steps.iter().enumerate() {
            if !matches!(step.action, Action::Fault(Fault::SlowLinks { .. })) {
                continue;
            }
            seen += 1;
            let restore = &p.steps[i + 1];
            assert_eq!(
                restore.action,
                Action::Fault(Fault::RestoreLinks { nodes: Vec::new() }),
                "{p:?}"
            );
            assert!(p.end_ms >= restore.at_ms + plan::SLOW_AFTERMATH_MS, "{p:?}");
        }
    }
    assert!(seen > 20, "{seen} slow networks in 500 trials");
}

#[test]
fn controller_restart_loops_are_checked() {
    use Action::RestartControllerLoop as Loop;
    let within = [
        (0, Action::Fault(Fault::Crash { node: 0 })),
        (
            15,
            Loop {
                restarts: 3,
                every_ms: 6_000,
            },
        ),
        (40, Action::Fault(Fault::PowerOn { node: 0 })),
    ];
    assert_eq!(check(FAR3, &within), Ok(()));
    let refused: &[(&str, Steps<'_>)] = &[
        (
            "not during a crash",
            &[(
                0,
                Loop {
                    restarts: 3,
                    every_ms: 6_000,
                },
            )],
        ),
        (
            "the crash healed before its last restart",
            &[
                (0, Action::Fault(Fault::Crash { node: 0 })),
                (
                    15,
                    Loop {
                        restarts: 8,
                        every_ms: 8_000,
                    },
                ),
                (40, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
        (
            "too many",
            &[
                (0, Action::Fault(Fault::Crash { node: 0 })),
                (
                    15,
                    Loop {
                        restarts: 9,
                        every_ms: 5_000,
                    },
                ),
                (90, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
        (
            "too fast",
            &[
                (0, Action::Fault(Fault::Crash { node: 0 })),
                (
                    15,
                    Loop {
                        restarts: 3,
                        every_ms: 1_000,
                    },
                ),
                (40, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
    ];
    for (why, steps) in refused {
        assert!(check(SNR3, steps).is_err(), "{why}");
    }
}

/// The campaigns the membership, peer-detection, defaults, safety-net and outage work asked for:
/// `make chaos SEED=273 TRIALS=50` has long API server and etcd outages (and crashes right after
/// them), nodes leaving and joining (also during a crash), controller restart loops, slow lossy
/// networks, full disks, starved agents, a slow control plane and rolling upgrades, several of
/// each. (Seed 1, 2, 49, then 180, until the slow network, the starvations, the upgrades and
/// then the crashes after outages joined the draw, each of which changed every seed's plans.)
#[test]
fn fifty_trials_of_seed_two_hundred_and_seventy_three_have_several_of_each_episode() {
    let plans: Vec<TrialPlan> = (0..50).map(|i| plan::plan(273, i)).collect();
    let counts = summary::counts(&plans);
    for episode in [
        LONG_APISERVER_OUTAGE,
        LONG_ETCD_OUTAGE,
        CRASH_AFTER_LONG_OUTAGE,
        NODE_REJOINS,
        EXTRA_NODE,
        CHURN_DURING_CRASH,
        CONTROLLER_RESTART_LOOP,
        SLOW_NETWORK,
        FULL_DISK,
        STARVED_AGENT_CPU,
        STARVED_AGENT_MEMORY,
        SLOW_ETCD,
        SLOW_APISERVER,
        ROLLING_UPGRADE,
    ] {
        let n = counts.episodes.get(episode).copied().unwrap_or(0);
        assert!(n >= 3, "{episode}: {n} in 50 trials of seed 273 ({counts})");
    }
}

#[test]
fn every_kind_of_fault_occurs_often_enough() {
    let seeds = 100;
    let counts = summary::counts(&campaigns(seeds));
    let per_campaign = |n: usize| n as f64 / seeds as f64;
    for (episode, n) in &counts.episodes {
        assert!(
            (3.0..=12.0).contains(&per_campaign(*n)),
            "{episode}: {:.1} per 50 trials",
            per_campaign(*n)
        );
    }
    assert_eq!(counts.episodes.len(), 14, "{counts}");
    // The faults there were before stay in the mix.
    for action in [
        "crash",
        "freeze",
        "partition",
        "isolate-from-api",
        "stop-apiserver",
        "restart-etcd",
        "restart-controller",
        "restart-agent",
        "hang-bmc",
        "slow-links",
        "fill-disk",
    ] {
        let n = counts.actions.get(action).copied().unwrap_or(0);
        assert!(per_campaign(n) >= 1.0, "{action}: {:.1} per 50 trials", per_campaign(n));
    }
}

#[test]
fn long_outages_outlast_every_bound_agents_once_had_and_are_watched_after() {
    // The agents' old view bound was 30 s (peerUpdateInterval in the lab's config); L + W at
    // the lab's timings is 4 s (2 x (1 s + 0.5 s) + 0.5 s + 0.5 s, scenario::FAST_CONFIG) plus
    // the 5 s watchdog.
    let l_plus_w = 4_000 + Timings::fast().watchdog_timeout.as_millis() as u64;
    assert!(LONG_OUTAGE_MS.0 > 30_000 && LONG_OUTAGE_MS.0 >= 10 * l_plus_w);
    let mut seen = 0;
    for p in campaigns(20) {
        for (i, stop) in p.steps.iter().enumerate() {
            if !matches!(
                stop.action,
                Action::Fault(Fault::StopApiserver) | Action::Fault(Fault::StopEtcd)
            ) {
                continue;
            }
            let start = &p.steps[i + 1];
            let lasted = start.at_ms - stop.at_ms;
            if lasted < LONG_OUTAGE_MS.0 {
                continue;
            }
            seen += 1;
            assert!(lasted <= LONG_OUTAGE_MS.1, "{p:?}");
            // Nothing else happens during it (validate: no node fault holds), and it is watched
            // for a while after.
            assert!(
                matches!(
                    start.action,
                    Action::Fault(Fault::StartApiserver) | Action::Fault(Fault::StartEtcd)
                ),
                "{p:?}"
            );
            assert!(p.end_ms >= start.at_ms + AFTERMATH_MS, "{p:?}");
        }
    }
    assert!(seen > 50, "{seen} long outages in 1,000 trials");
}

proptest! {
    #[test]
    fn real_node_plans_are_sound_and_play_only_what_real_nodes_play(seed in any::<u64>(), index in 0usize..500) {
        let options = Options { real_nodes: true, ..Options::default() };
        let p = plan::plan_with(seed, index, options);
        prop_assert!(p.shape.real_nodes && p.shape.nodes == 3 && !p.shape.churns());
        let path = if (index / plan::BLOCK).is_multiple_of(2) { PathKind::SelfRemediation } else { PathKind::FenceRedfish };
        prop_assert_eq!(p.shape.path, path);
        prop_assert_eq!(plan::validate(&p), Ok(()), "{:?}", p);
        for step in &p.steps {
            let kwok_only = matches!(
                step.action,
                Action::AddNode { .. } | Action::RemoveNode { .. } | Action::Fault(Fault::FillDisk { .. }) | Action::Fault(Fault::StopEtcd)
            );
            prop_assert!(!kwok_only, "{:?}", step);
        }
        let kinds = summary::counts([&p]).to_string();
        prop_assert!(!kinds.contains(LONG_APISERVER_OUTAGE) && !kinds.contains(LONG_ETCD_OUTAGE), "{}", kinds);
    }
}

/// The plans a committed campaign ran (seed 13, 15 trials, before the plan version existed).
const COMMITTED_REPORT: &str = include_str!("../../../../../bench/results/chaos-20261129T032813Z.json");

#[test]
fn version_one_replays_what_a_committed_campaign_ran() {
    let report: serde_json::Value = serde_json::from_str(COMMITTED_REPORT).expect("a report");
    let seed = report["seed"].as_u64().expect("its seed");
    let options = Options {
        nodes: report["nodes"].as_u64().map(|n| n as usize),
        version: 1,
        real_nodes: false,
    };
    let trials = report["trials"].as_array().expect("its trials");
    assert!(trials.len() >= 15, "{} trials", trials.len());
    for trial in trials {
        let ran = &trial["plan"];
        let index = ran["index"].as_u64().expect("an index") as usize;
        let drawn = serde_json::to_value(plan::plan_with(seed, index, options)).expect("serializes");
        assert_eq!(&drawn, ran, "trial {index} of seed {seed}");
    }
}

#[test]
fn only_version_two_fills_disks_and_the_full_node_is_never_one_that_must_be_remediated() {
    let drawn = |version: u32| {
        (0..500)
            .map(move |i| {
                plan::plan_with(
                    7,
                    i,
                    Options {
                        version,
                        ..Options::default()
                    },
                )
            })
            .filter(|p| {
                p.steps
                    .iter()
                    .any(|s| matches!(s.action, Action::Fault(Fault::FillDisk { .. })))
            })
            .collect::<Vec<_>>()
    };
    assert!(drawn(1).is_empty());
    let full = drawn(2);
    assert!(full.len() > 20, "{} of 500 trials fill a disk", full.len());
    for p in &full {
        assert_eq!(plan::validate(p), Ok(()), "{p:?}");
        assert!(summary::episodes(p).contains(&FULL_DISK));
    }
}

#[test]
fn only_version_three_starves_agents_and_the_control_plane_and_every_such_plan_is_sound() {
    let starving = |version: u32| {
        (0..500)
            .map(move |i| {
                plan::plan_with(
                    11,
                    i,
                    Options {
                        version,
                        ..Options::default()
                    },
                )
            })
            .filter(|p| !starvation(p).is_empty())
            .collect::<Vec<_>>()
    };
    assert!(starving(2).is_empty());
    let plans = starving(3);
    let mut seen = std::collections::BTreeSet::new();
    for p in &plans {
        assert_eq!(plan::validate(p), Ok(()), "{p:?}");
        seen.extend(starvation(p));
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        [STARVED_AGENT_CPU, STARVED_AGENT_MEMORY, SLOW_APISERVER, SLOW_ETCD],
        "every starvation is drawn in {} plans",
        plans.len()
    );
}

fn starvation(p: &TrialPlan) -> Vec<&'static str> {
    summary::episodes(p)
        .into_iter()
        .filter(|e| [SLOW_APISERVER, SLOW_ETCD, STARVED_AGENT_CPU, STARVED_AGENT_MEMORY].contains(e))
        .collect()
}

#[test]
fn starvation_is_checked() {
    let starve = |node| Action::Fault(Fault::StarveAgent { node, percent: 2 });
    let feed = |node| Action::Fault(Fault::FeedAgent { node });
    let crash_meanwhile = [
        (0, starve(0)),
        (3, Action::Fault(Fault::Crash { node: 1 })),
        (40, feed(0)),
        (45, Action::Fault(Fault::PowerOn { node: 1 })),
        (50, Action::Fault(Fault::SlowEtcd { percent: 10 })),
        (90, Action::Fault(Fault::UnthrottleEtcd)),
    ];
    assert_eq!(check(SNR3, &crash_meanwhile), Ok(()));
    let refused: &[(&str, Steps<'_>)] = &[
        ("left starved", &[(0, starve(0))]),
        ("fed without being starved", &[(0, feed(1))]),
        ("starved twice", &[(0, starve(1)), (5, starve(1)), (40, feed(1))]),
        (
            "a crashed node's agent starved",
            &[
                (0, Action::Fault(Fault::Crash { node: 1 })),
                (1, starve(1)),
                (40, feed(1)),
                (45, Action::Fault(Fault::PowerOn { node: 1 })),
            ],
        ),
        (
            "the control plane left slow",
            &[(0, Action::Fault(Fault::SlowApiserver { percent: 20 }))],
        ),
    ];
    for (why, steps) in refused {
        assert!(check(SNR3, steps).is_err(), "{why}");
    }
}

#[test]
fn full_disks_are_checked() {
    let fill = |node| Action::Fault(Fault::FillDisk { node });
    let free = |node| Action::Fault(Fault::FreeDisk { node });
    let crash_meanwhile = [
        (0, fill(0)),
        (3, Action::Fault(Fault::Crash { node: 1 })),
        (40, free(0)),
        (45, Action::Fault(Fault::PowerOn { node: 1 })),
    ];
    assert_eq!(check(SNR3, &crash_meanwhile), Ok(()));
    let refused: &[(&str, Steps<'_>)] = &[
        ("left full", &[(0, fill(0))]),
        ("freed without being full", &[(0, free(1))]),
        ("filled twice", &[(0, fill(1)), (5, fill(1)), (40, free(1))]),
        (
            "filled while the API server is down",
            &[
                (0, Action::Fault(Fault::StopApiserver)),
                (1, fill(1)),
                (5, Action::Fault(Fault::StartApiserver)),
                (40, free(1)),
            ],
        ),
    ];
    for (why, steps) in refused {
        assert!(check(SNR3, steps).is_err(), "{why}");
    }
}

/// Version 4's rolling upgrades: announced, then every node down once in turn, one at a time,
/// each longer than the health check waits, then withdrawn; sound, and only in version 4.
#[test]
fn only_version_four_upgrades_and_each_upgrade_reboots_every_node_once_in_turn() {
    let upgrading = |version: u32| {
        (0..300)
            .map(move |i| {
                plan::plan_with(
                    13,
                    i,
                    Options {
                        version,
                        ..Options::default()
                    },
                )
            })
            .filter(|p| p.steps.iter().any(|s| matches!(s.action, Action::Upgrade { .. })))
            .collect::<Vec<_>>()
    };
    assert!(upgrading(3).is_empty());
    let plans = upgrading(4);
    assert!(plans.len() >= 10, "{} plans with an upgrade", plans.len());
    for p in &plans {
        assert_eq!(plan::validate(p), Ok(()), "{p:?}");
        let begin = p
            .steps
            .iter()
            .position(|s| s.action == Action::Upgrade { announced: true });
        let end = p
            .steps
            .iter()
            .position(|s| s.action == Action::Upgrade { announced: false });
        let (Some(begin), Some(end)) = (begin, end) else {
            panic!("announced and withdrawn: {p:?}")
        };
        let mut crashed = Vec::new();
        let mut down_since = None;
        for step in &p.steps[begin..end] {
            match step.action {
                Action::Fault(Fault::Crash { node }) => {
                    assert!(down_since.is_none(), "one node at a time: {p:?}");
                    down_since = Some(step.at_ms);
                    crashed.push(node);
                }
                Action::Fault(Fault::PowerOn { .. }) => {
                    let since = down_since.take().expect("powered on after its crash");
                    assert!(step.at_ms - since >= 30_000, "down longer than the health check waits");
                }
                _ => {}
            }
        }
        crashed.sort_unstable();
        assert_eq!(
            crashed,
            (0..p.shape.nodes).collect::<Vec<_>>(),
            "every node once: {p:?}"
        );
    }
}
