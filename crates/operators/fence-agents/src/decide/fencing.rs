//! The order of a fence: power off, prove it is off, release the workloads, and only then power
//! on. A node that is released while it could still run, or powered on before its workloads are
//! released, could run a workload twice; this machine makes both impossible.

use nodemedic_api::fence_agents::FenceRemediationStrategy;

use super::parameters::{Action, Unusable};

/// Where a FenceAgentsRemediation is; persisted in `status.step` so a new leader resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    PoweringOff,
    ConfirmingOff,
    RecoveringWorkloads,
    PoweringOn,
    Done,
    Failed,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::PoweringOff => "PoweringOff",
            Step::ConfirmingOff => "ConfirmingOff",
            Step::RecoveringWorkloads => "RecoveringWorkloads",
            Step::PoweringOn => "PoweringOn",
            Step::Done => "Done",
            Step::Failed => "Failed",
        }
    }

    /// Absent or unknown: the start.
    pub fn parse(s: Option<&str>) -> Step {
        match s {
            Some("ConfirmingOff") => Step::ConfirmingOff,
            Some("RecoveringWorkloads") => Step::RecoveringWorkloads,
            Some("PoweringOn") => Step::PoweringOn,
            Some("Done") => Step::Done,
            Some("Failed") => Step::Failed,
            _ => Step::PoweringOff,
        }
    }

    /// A CR with no `status.step` (one medik8s made, before a switch to nodemedic): where its
    /// conditions say it is, so a finished or fenced remediation is not fenced again.
    pub(crate) fn from_conditions(succeeded: Option<&str>, action_succeeded: Option<&str>) -> Step {
        match (succeeded, action_succeeded) {
            (Some("True"), _) => Step::Done,
            (Some("False"), _) => Step::Failed,
            (_, Some("True")) => Step::RecoveringWorkloads,
            _ => Step::PoweringOff,
        }
    }

    pub fn finished(self) -> bool {
        matches!(self, Step::Done | Step::Failed)
    }

    /// The agent action this step runs, and the exit code that means it worked.
    pub(crate) fn agent_action(self) -> Option<(&'static str, i32)> {
        match self {
            Step::PoweringOff => Some(("off", 0)),
            // The agents' status exit code: 0 on, 2 off.
            Step::ConfirmingOff => Some(("status", 2)),
            Step::PoweringOn => Some(("on", 0)),
            _ => None,
        }
    }
}

/// How the last run of a step's agent action ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    Succeeded,
    /// Every attempt failed; the last one killed at the timeout or not.
    Failed {
        timed_out: bool,
        message: String,
    },
}

/// The fence agent runner's state for this remediation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Run {
    Idle,
    Running(Step),
    Finished(Step, RunOutcome),
}

/// What the reconciler sees, reduced to what the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub deleting: bool,
    pub timed_out_by_health_check: bool,
    pub node_exists: bool,
    pub has_finalizer: bool,
    pub has_remediation_taint: bool,
    pub has_out_of_service_taint: bool,
    /// The merged, checked parameters' action, or why they are unusable.
    pub parameters: Result<Action, Unusable>,
    pub strategy: FenceRemediationStrategy,
    pub step: Step,
    pub run: Run,
    /// Pods bound to the node (DaemonSet pods aside).
    pub pods_left: usize,
    /// VolumeAttachments naming the node.
    pub attachments_left: usize,
}

/// Why a remediation ended in failure; the names are medik8s's condition reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    NodeNotFound,
    InterruptedByHealthCheck,
    AgentFailed,
    AgentTimedOut,
    InvalidParameters,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::NodeNotFound => "RemediationFinishedNodeNotFound",
            FailureReason::InterruptedByHealthCheck => "RemediationInterruptedByNHC",
            FailureReason::AgentFailed => "FenceAgentFailed",
            FailureReason::AgentTimedOut => "FenceAgentTimedOut",
            FailureReason::InvalidParameters => "InvalidParameters",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The CR is going away: stop the agent, remove both taints and the finalizer.
    Cleanup,
    /// Finished: nothing more to do until the CR is deleted.
    Idle,
    /// A Secret the spec names is missing: nothing is done to the node until it exists (the
    /// health check's step timeout still applies).
    WaitForSecret(String),
    AddFinalizer,
    AddRemediationTaint,
    /// Start the step's agent action (with its retries).
    Run(Step),
    /// The agent is still running.
    AwaitRun,
    /// Move on; `Step::Done` marks success.
    Advance(Step),
    AddOutOfServiceTaint,
    /// Delete the node's pods (force, the node is provably off) and, for ResourceDeletion, its
    /// VolumeAttachments.
    DeleteWorkloads,
    Fail {
        reason: FailureReason,
        message: String,
    },
}

pub(crate) fn next(f: &Facts) -> Decision {
    if f.deleting {
        return let_go(f);
    }
    if f.step.finished() {
        return Decision::Idle;
    }
    // Once the power is confirmed off the fence has happened: finish releasing and powering on
    // even if the health check gave up meanwhile, rather than strand the node powered off.
    if f.timed_out_by_health_check && !matches!(f.step, Step::RecoveringWorkloads | Step::PoweringOn) {
        return fail(
            FailureReason::InterruptedByHealthCheck,
            "the NodeHealthCheck timed this remediation out".into(),
        );
    }
    if !f.node_exists {
        return fail(FailureReason::NodeNotFound, "the node does not exist".into());
    }
    if !f.has_finalizer {
        return Decision::AddFinalizer;
    }
    let action = match &f.parameters {
        Ok(action) => *action,
        // Only before anything was done to the node: a Secret deleted later (rotated by delete and
        // create) must not hold a powered-off node, or its workloads, for ever.
        Err(Unusable::SecretMissing(why)) if f.step == Step::PoweringOff && !f.has_remediation_taint => {
            return Decision::WaitForSecret(why.clone());
        }
        Err(Unusable::SecretMissing(why) | Unusable::Invalid(why)) => {
            return fail(FailureReason::InvalidParameters, why.clone());
        }
    };
    if !f.has_remediation_taint {
        return Decision::AddRemediationTaint;
    }
    match f.step {
        Step::PoweringOff | Step::ConfirmingOff | Step::PoweringOn => agent_step(f, action),
        Step::RecoveringWorkloads => recover(f, action),
        Step::Done | Step::Failed => Decision::Idle,
    }
}

/// A deleted remediation: undone and let go, except that a power-on under way is let finish.
/// Cancelling it could leave the released node powered off, and a slow BMC's `on` can return
/// after the node it brought back looked healthy and the health check deleted this CR; its
/// success is recorded before the CR goes.
fn let_go(f: &Facts) -> Decision {
    match (&f.step, &f.run) {
        (Step::PoweringOn, Run::Running(Step::PoweringOn)) => Decision::AwaitRun,
        (Step::PoweringOn, Run::Finished(Step::PoweringOn, RunOutcome::Succeeded)) => Decision::Advance(Step::Done),
        _ => Decision::Cleanup,
    }
}

fn fail(reason: FailureReason, message: String) -> Decision {
    Decision::Fail { reason, message }
}

fn agent_step(f: &Facts, action: Action) -> Decision {
    match &f.run {
        Run::Running(step) if *step == f.step => Decision::AwaitRun,
        Run::Finished(step, outcome) if *step == f.step => match outcome {
            RunOutcome::Succeeded => Decision::Advance(after(f.step, action)),
            RunOutcome::Failed { timed_out, message } => fail(
                if *timed_out {
                    FailureReason::AgentTimedOut
                } else {
                    FailureReason::AgentFailed
                },
                message.clone(),
            ),
        },
        // Idle, or a stale run of an earlier step (a result recorded before the step advanced).
        _ => Decision::Run(f.step),
    }
}

fn after(step: Step, action: Action) -> Step {
    match (step, action) {
        (Step::PoweringOff, _) => Step::ConfirmingOff,
        (Step::ConfirmingOff, _) => Step::RecoveringWorkloads,
        (Step::RecoveringWorkloads, Action::Reboot) => Step::PoweringOn,
        (Step::RecoveringWorkloads, Action::Off) => Step::Done,
        (Step::PoweringOn, _) => Step::Done,
        (other, _) => other,
    }
}

fn recover(f: &Facts, action: Action) -> Decision {
    let out_of_service = f.strategy == FenceRemediationStrategy::OutOfServiceTaint;
    if out_of_service && !f.has_out_of_service_taint {
        return Decision::AddOutOfServiceTaint;
    }
    // With the out-of-service taint Kubernetes detaches the volumes itself once the pods are gone.
    let attachments = if out_of_service { 0 } else { f.attachments_left };
    if f.pods_left > 0 || attachments > 0 {
        return Decision::DeleteWorkloads;
    }
    Decision::Advance(after(Step::RecoveringWorkloads, action))
}

/// The medik8s condition triple (Processing, FenceAgentActionSucceeded, Succeeded) for a step,
/// as "True"/"False"/"Unknown"; `None` leaves a condition as it is.
pub(crate) fn conditions(step: Step) -> [Option<&'static str>; 3] {
    match step {
        Step::PoweringOff | Step::ConfirmingOff => [Some("True"), Some("Unknown"), Some("Unknown")],
        Step::RecoveringWorkloads | Step::PoweringOn => [Some("True"), Some("True"), Some("Unknown")],
        Step::Done => [Some("False"), Some("True"), Some("True")],
        // FenceAgentActionSucceeded keeps what it was: a failure after the power was confirmed
        // off does not undo the fence (the reconciler sets it False for earlier failures).
        Step::Failed => [Some("False"), None, Some("False")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn facts() -> Facts {
        Facts {
            deleting: false,
            timed_out_by_health_check: false,
            node_exists: true,
            has_finalizer: true,
            has_remediation_taint: true,
            has_out_of_service_taint: false,
            parameters: Ok(Action::Reboot),
            strategy: FenceRemediationStrategy::ResourceDeletion,
            step: Step::PoweringOff,
            run: Run::Idle,
            pods_left: 1,
            attachments_left: 1,
        }
    }

    /// Drives a remediation to its end, the world answering each decision as a cluster would;
    /// returns the decisions in order.
    fn drive(mut f: Facts, agent_ok: impl Fn(Step) -> bool) -> Vec<Decision> {
        let mut seen = Vec::new();
        for _ in 0..40 {
            let d = next(&f);
            seen.push(d.clone());
            match d {
                // The world creates the Secret.
                Decision::WaitForSecret(_) => f.parameters = Ok(Action::Reboot),
                Decision::Idle | Decision::Cleanup => break,
                Decision::AddFinalizer => f.has_finalizer = true,
                Decision::AddRemediationTaint => f.has_remediation_taint = true,
                Decision::AddOutOfServiceTaint => f.has_out_of_service_taint = true,
                Decision::Run(step) => f.run = Run::Running(step),
                Decision::AwaitRun => {
                    let Run::Running(step) = f.run.clone() else {
                        panic!("awaiting nothing")
                    };
                    let outcome = if agent_ok(step) {
                        RunOutcome::Succeeded
                    } else {
                        RunOutcome::Failed {
                            timed_out: false,
                            message: "no".into(),
                        }
                    };
                    f.run = Run::Finished(step, outcome);
                }
                Decision::Advance(step) => f.step = step,
                Decision::DeleteWorkloads => {
                    f.pods_left = 0;
                    if f.strategy == FenceRemediationStrategy::ResourceDeletion {
                        f.attachments_left = 0;
                    }
                }
                Decision::Fail { .. } => f.step = Step::Failed,
            }
        }
        seen
    }

    fn position(seen: &[Decision], wanted: &Decision) -> Option<usize> {
        seen.iter().position(|d| d == wanted)
    }

    #[test]
    fn reboot_is_off_confirm_release_on() {
        let seen = drive(facts(), |_| true);
        let off = position(&seen, &Decision::Run(Step::PoweringOff));
        let confirm = position(&seen, &Decision::Run(Step::ConfirmingOff));
        let release = position(&seen, &Decision::DeleteWorkloads);
        let on = position(&seen, &Decision::Run(Step::PoweringOn));
        assert!(off < confirm && confirm < release && release < on, "{seen:?}");
        assert_eq!(seen.iter().rev().nth(1), Some(&Decision::Advance(Step::Done)));
    }

    #[test]
    fn off_never_powers_on() {
        let seen = drive(
            Facts {
                parameters: Ok(Action::Off),
                ..facts()
            },
            |_| true,
        );
        assert_eq!(position(&seen, &Decision::Run(Step::PoweringOn)), None);
        assert!(seen.contains(&Decision::Advance(Step::Done)));
    }

    #[test]
    fn still_on_after_off_fails_without_touching_workloads() {
        let seen = drive(facts(), |step| step != Step::ConfirmingOff);
        assert!(!seen.contains(&Decision::DeleteWorkloads));
        assert!(matches!(
            seen.iter().rev().nth(1),
            Some(Decision::Fail {
                reason: FailureReason::AgentFailed,
                ..
            })
        ));
    }

    #[test]
    fn a_missing_secret_waits_with_nothing_done_to_the_node_and_goes_on_once_it_exists() {
        let waiting = Facts {
            has_remediation_taint: false,
            parameters: Err(Unusable::SecretMissing("Secret far-creds does not exist".into())),
            ..facts()
        };
        assert_eq!(
            next(&waiting),
            Decision::WaitForSecret("Secret far-creds does not exist".into())
        );
        let created = Facts {
            parameters: Ok(Action::Reboot),
            ..waiting.clone()
        };
        assert_eq!(next(&created), Decision::AddRemediationTaint);
        let deleted_after_the_fence = Facts {
            has_remediation_taint: true,
            step: Step::ConfirmingOff,
            ..waiting
        };
        assert!(
            matches!(next(&deleted_after_the_fence), Decision::Fail { .. }),
            "a Secret gone mid-remediation fails it rather than hold the node"
        );
    }

    #[test]
    fn bad_parameters_fail_before_any_taint_or_run() {
        let seen = drive(
            Facts {
                has_finalizer: false,
                has_remediation_taint: false,
                parameters: Err(Unusable::Invalid("fence_redfish has no option --hostname".into())),
                ..facts()
            },
            |_| true,
        );
        assert_eq!(seen[0], Decision::AddFinalizer);
        assert!(matches!(
            seen[1],
            Decision::Fail {
                reason: FailureReason::InvalidParameters,
                ..
            }
        ));
    }

    #[test]
    fn out_of_service_taints_before_deleting() {
        let seen = drive(
            Facts {
                strategy: FenceRemediationStrategy::OutOfServiceTaint,
                ..facts()
            },
            |_| true,
        );
        let taint = position(&seen, &Decision::AddOutOfServiceTaint);
        let delete = position(&seen, &Decision::DeleteWorkloads);
        assert!(taint.is_some() && taint < delete, "{seen:?}");
    }

    #[test]
    fn a_power_on_under_way_at_the_deletion_is_let_finish_and_recorded() {
        let powered_on = Facts {
            deleting: true,
            step: Step::PoweringOn,
            run: Run::Finished(Step::PoweringOn, RunOutcome::Succeeded),
            ..facts()
        };
        assert_eq!(next(&powered_on), Decision::Advance(Step::Done));
        let done = Facts {
            step: Step::Done,
            ..powered_on.clone()
        };
        assert_eq!(next(&done), Decision::Cleanup);
        let powering_on = Facts {
            run: Run::Running(Step::PoweringOn),
            ..powered_on.clone()
        };
        assert_eq!(next(&powering_on), Decision::AwaitRun, "the power-on is let finish");
        let failed = Facts {
            run: Run::Finished(
                Step::PoweringOn,
                RunOutcome::Failed {
                    timed_out: true,
                    message: "no answer".into(),
                },
            ),
            ..powered_on.clone()
        };
        assert_eq!(next(&failed), Decision::Cleanup);
        let powering_off = Facts {
            step: Step::PoweringOff,
            run: Run::Running(Step::PoweringOff),
            ..powered_on
        };
        assert_eq!(
            next(&powering_off),
            Decision::Cleanup,
            "a fence not yet done is stopped"
        );
    }

    #[test]
    fn a_health_check_timeout_after_the_fence_still_powers_the_node_on() {
        let f = Facts {
            timed_out_by_health_check: true,
            step: Step::PoweringOn,
            ..facts()
        };
        assert_eq!(next(&f), Decision::Run(Step::PoweringOn));
        let before = Facts {
            timed_out_by_health_check: true,
            ..facts()
        };
        assert!(matches!(
            next(&before),
            Decision::Fail {
                reason: FailureReason::InterruptedByHealthCheck,
                ..
            }
        ));
    }

    #[test]
    fn a_stale_result_reruns_the_current_step() {
        let f = Facts {
            step: Step::PoweringOn,
            run: Run::Finished(Step::ConfirmingOff, RunOutcome::Succeeded),
            ..facts()
        };
        assert_eq!(next(&f), Decision::Run(Step::PoweringOn));
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::PoweringOff),
            Just(Step::ConfirmingOff),
            Just(Step::RecoveringWorkloads),
            Just(Step::PoweringOn),
            Just(Step::Done),
            Just(Step::Failed),
        ]
    }

    fn arb_run() -> impl Strategy<Value = Run> {
        prop_oneof![
            Just(Run::Idle),
            arb_step().prop_map(Run::Running),
            (arb_step(), any::<bool>(), any::<bool>()).prop_map(|(s, ok, timed_out)| Run::Finished(
                s,
                if ok {
                    RunOutcome::Succeeded
                } else {
                    RunOutcome::Failed {
                        timed_out,
                        message: String::new(),
                    }
                }
            )),
        ]
    }

    fn arb_facts() -> impl Strategy<Value = Facts> {
        (
            (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
            (
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            ),
            arb_step(),
            arb_run(),
            (0usize..3, 0usize..3),
        )
            .prop_map(
                |((deleting, timed_out, exists, finalizer), (taint, oos, ok, off, oos_strategy), step, run, (p, a))| {
                    Facts {
                        deleting,
                        timed_out_by_health_check: timed_out,
                        node_exists: exists,
                        has_finalizer: finalizer,
                        has_remediation_taint: taint,
                        has_out_of_service_taint: oos,
                        parameters: if ok {
                            Ok(if off { Action::Off } else { Action::Reboot })
                        } else {
                            Err(Unusable::Invalid("bad".into()))
                        },
                        strategy: if oos_strategy {
                            FenceRemediationStrategy::OutOfServiceTaint
                        } else {
                            FenceRemediationStrategy::ResourceDeletion
                        },
                        step,
                        run,
                        pods_left: p,
                        attachments_left: a,
                    }
                },
            )
    }

    proptest! {
        /// Workloads are touched only once the node was proven off, power comes back only once
        /// they are released, and nothing runs without the finalizer and the taint that let a
        /// deletion clean up.
        #[test]
        fn safety(f in arb_facts()) {
            match next(&f) {
                Decision::DeleteWorkloads | Decision::AddOutOfServiceTaint => {
                    prop_assert_eq!(f.step, Step::RecoveringWorkloads);
                }
                Decision::Run(step) => {
                    prop_assert!(f.has_finalizer && f.has_remediation_taint && f.parameters.is_ok());
                    prop_assert!(!f.deleting);
                    // After the fence only the power-on may still run once the health check gave up.
                    prop_assert!(!f.timed_out_by_health_check || step == Step::PoweringOn);
                    prop_assert_eq!(step, f.step);
                }
                Decision::Advance(Step::PoweringOn) => {
                    prop_assert_eq!(f.pods_left, 0);
                    if f.strategy == FenceRemediationStrategy::ResourceDeletion {
                        prop_assert_eq!(f.attachments_left, 0);
                    } else {
                        prop_assert!(f.has_out_of_service_taint);
                    }
                }
                Decision::Advance(Step::RecoveringWorkloads) => {
                    prop_assert_eq!(f.step, Step::ConfirmingOff);
                    prop_assert_eq!(&f.run, &Run::Finished(Step::ConfirmingOff, RunOutcome::Succeeded));
                }
                _ => {}
            }
        }

        /// A deleted remediation is let go at once, or once its power-on under way returns and
        /// a success is recorded; nothing new is done to the node once it is deleted.
        #[test]
        fn a_deletion_is_let_go(f in arb_facts().prop_filter("deleting", |f| f.deleting)) {
            match next(&f) {
                Decision::Cleanup => {}
                Decision::AwaitRun => {
                    prop_assert_eq!(f.step, Step::PoweringOn);
                    prop_assert_eq!(&f.run, &Run::Running(Step::PoweringOn));
                }
                Decision::Advance(Step::Done) => {
                    prop_assert_eq!(f.step, Step::PoweringOn);
                    prop_assert_eq!(&f.run, &Run::Finished(Step::PoweringOn, RunOutcome::Succeeded));
                    prop_assert_eq!(next(&Facts { step: Step::Done, ..f }), Decision::Cleanup);
                }
                other => prop_assert!(false, "{:?} for a deleted remediation", other),
            }
        }

        /// Every remediation ends, in success when the agent works and in failure when it never does.
        #[test]
        fn terminates(f in arb_facts().prop_filter("live", |f| !f.deleting), works in any::<bool>()) {
            let seen = drive(Facts { run: Run::Idle, ..f }, |_| works);
            prop_assert!(matches!(seen.last(), Some(Decision::Idle)), "{:?}", seen);
        }
    }
}
