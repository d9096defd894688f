//! A small fixed set of fault-campaign trials through the campaign's own runner (the full,
//! randomized campaign is `make chaos`): partitions, flapping, freezes, crashes, API server and
//! etcd restarts, controller and agent restarts mid-remediation, a hung BMC, a full disk; each judged by the
//! witness, the false-fence, remediation and leftover checks.

use nodemedic_harness::chaos::{
    Action, PathKind, Shape, Step, Strategy, TrialPlan,
    plan::validate,
    run::{Runner, TrialResult},
};
use nodemedic_lab::Fault;

use crate::support::logs;

fn steps(list: &[(u64, Action)]) -> Vec<Step> {
    list.iter()
        .map(|(s, action)| Step {
            at_ms: s * 1000,
            action: action.clone(),
        })
        .collect()
}

fn plans() -> Vec<TrialPlan> {
    let snr = Shape {
        nodes: 3,
        path: PathKind::SelfRemediation,
        slow_bmc: false,
        real_nodes: false,
    };
    let far = Shape {
        nodes: 3,
        path: PathKind::FenceRedfish,
        slow_bmc: false,
        real_nodes: false,
    };
    let plan = |index, shape, strategy, list: &[(u64, Action)]| TrialPlan {
        seed: 0,
        index,
        shape,
        strategy,
        steps: steps(list),
        end_ms: list.last().map_or(0, |(s, _)| s * 1000),
        version: nodemedic_harness::chaos::plan::PLAN_VERSION,
    };
    vec![
        // The workload's node cut off; the controller, a peer's agent and the API server restart
        // while its remediation is in flight.
        plan(
            0,
            snr,
            Strategy::OutOfServiceTaint,
            &[
                (0, Action::Fault(Fault::Partition { nodes: vec![0] })),
                (17, Action::RestartController { mid_remediation: true }),
                (
                    20,
                    Action::RestartAgent {
                        node: 1,
                        mid_remediation: true,
                    },
                ),
                (24, Action::Fault(Fault::StopApiserver)),
                (28, Action::Fault(Fault::StartApiserver)),
                (40, Action::Fault(Fault::Heal { node: 0 })),
            ],
        ),
        // A peer flapping, etcd restarting, another peer hanging, the workload's node's disk
        // full: nobody healthy may fence, and the full node is not remediated.
        plan(
            1,
            snr,
            Strategy::ResourceDeletion,
            &[
                (0, Action::Fault(Fault::FillDisk { node: 0 })),
                (0, Action::Fault(Fault::Partition { nodes: vec![1] })),
                (5, Action::Fault(Fault::Heal { node: 1 })),
                (9, Action::Fault(Fault::Partition { nodes: vec![1] })),
                (14, Action::Fault(Fault::Heal { node: 1 })),
                (17, Action::Fault(Fault::RestartEtcd)),
                (20, Action::Fault(Fault::Freeze { node: 2 })),
                (26, Action::Fault(Fault::Thaw { node: 2 })),
                (26, Action::Fault(Fault::FreeDisk { node: 0 })),
            ],
        ),
        // The workload's node crashes with its BMC hung; the controller restarts mid-fencing.
        plan(
            2,
            far,
            Strategy::OutOfServiceTaint,
            &[
                (0, Action::Fault(Fault::Crash { node: 0 })),
                (1, Action::Fault(Fault::HangBmc { node: 0 })),
                (17, Action::RestartController { mid_remediation: true }),
                (24, Action::Fault(Fault::ResumeBmc { node: 0 })),
                (40, Action::Fault(Fault::PowerOn { node: 0 })),
            ],
        ),
    ]
}

fn summary(r: &TrialResult) -> String {
    format!(
        "trial {}: nodes {:?}, workload back {:?}s, all healthy {:?}s\n  {}\n  violations: {:?}\n  error: {:?}",
        r.plan.index,
        r.nodes,
        r.workload_back_seconds,
        r.all_healthy_seconds,
        r.log.join("\n  "),
        r.violations,
        r.error
    )
}

/// Runs the fixed trials on `path`'s labs (one lab per shape, as the campaign's runner keeps it).
async fn trials_find_no_violation(path: PathKind) {
    logs();
    let plans: Vec<TrialPlan> = plans().into_iter().filter(|p| p.shape.path == path).collect();
    assert!(!plans.is_empty(), "no fixed trial on {path:?}");
    for p in &plans {
        assert_eq!(validate(p), Ok(()), "{p:?}");
    }
    let mut runner = Runner::new(&crate::nodemedic_exe(), None, false);
    let mut failed = Vec::new();
    for p in &plans {
        let result = runner.trial(p).await;
        println!("{}", summary(&result));
        if !result.violations.is_empty() || result.error.is_some() {
            failed.push(summary(&result));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// Two tests, one per lab shape, so the suite's lanes can run them side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_chaos_trials_of_self_remediation_find_no_violation() {
    trials_find_no_violation(PathKind::SelfRemediation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_chaos_trials_of_fence_agents_find_no_violation() {
    trials_find_no_violation(PathKind::FenceRedfish).await;
}
