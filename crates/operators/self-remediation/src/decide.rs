//! The manager's phase machine for one SelfNodeRemediation, as a pure function: given what the
//! reconciler observed, the single next step. The reconciler performs it and asks again.

use std::time::Duration;

use nodemedic_api::self_remediation::phases;

/// The strategy once `Automatic` is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    ResourceDeletion,
    OutOfServiceTaint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    New,
    FencingStarted,
    PreRebootCompleted,
    RebootCompleted,
    FencingCompleted,
}

impl Phase {
    pub(crate) fn parse(phase: Option<&str>) -> Phase {
        match phase {
            Some(phases::FENCING_STARTED) => Phase::FencingStarted,
            Some(phases::PRE_REBOOT_COMPLETED) => Phase::PreRebootCompleted,
            Some(phases::REBOOT_COMPLETED) => Phase::RebootCompleted,
            Some(phases::FENCING_COMPLETED) => Phase::FencingCompleted,
            _ => Phase::New,
        }
    }

    pub(crate) fn as_str(self) -> Option<&'static str> {
        match self {
            Phase::New => None,
            Phase::FencingStarted => Some(phases::FENCING_STARTED),
            Phase::PreRebootCompleted => Some(phases::PRE_REBOOT_COMPLETED),
            Phase::RebootCompleted => Some(phases::REBOOT_COMPLETED),
            Phase::FencingCompleted => Some(phases::FENCING_COMPLETED),
        }
    }
}

/// Everything one decision reads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Facts {
    pub deleting: bool,
    pub has_finalizer: bool,
    /// The SelfNodeRemediationConfig exists and is not being deleted (deleting it disables
    /// self remediation, seed 004).
    pub configured: bool,
    /// The status says `Disabled=True`.
    pub disabled_reported: bool,
    /// The health check gave up on this remediation (`nhc-timed-out`).
    pub timed_out: bool,
    pub node_exists: bool,
    pub excluded: bool,
    pub phase: Phase,
    /// Why the node cannot fence itself safely, if it cannot.
    pub cannot_fence: Option<String>,
    /// The node's agent stopped deliberately and closed its watchdog: its silence proves nothing.
    pub target_disarmed: bool,
    pub acceptance_met: bool,
    /// How long ago (on this manager's monotonic clock) it first saw the acceptance quorum.
    pub accepted_for: Option<Duration>,
    pub safe_time: Duration,
    pub no_schedule_taint: bool,
    pub out_of_service_taint: bool,
    pub strategy: Applied,
    /// Pods still bound to the node and not yet gone.
    pub pods_left: usize,
    pub attachments_left: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    // Deletion (the node is healthy again) or a stop by the health check.
    RemoveOutOfServiceTaint,
    RemoveNoScheduleTaint,
    RemoveFinalizer,
    /// Nothing left to do until the object changes.
    Idle,
    /// The health check timed it out: report and stop.
    Stop,
    NodeNotFound,
    Excluded,
    /// No configuration: stop before anything that fences (`Disabled=True`).
    Disabled,
    /// The configuration is back: `Disabled=False`, and on.
    Enabled,
    CannotFence(String),
    // Fencing.
    AddFinalizer,
    AddNoScheduleTaint,
    /// Phase Fencing-Started.
    Start,
    /// Waiting for a majority of the other agents to record acceptance.
    AwaitAcceptance,
    /// Record the quorum in memory: the wait starts now (phase Pre-Reboot-Completed).
    ObserveAcceptance,
    /// Waiting out the safe time.
    Wait(Duration),
    /// Fencing is proven: phase Reboot-Completed.
    MarkRebooted,
    AddOutOfServiceTaint,
    DeletePods,
    DeleteAttachments,
    MarkCompleted,
}

/// The next step. Deletion and a health-check stop win over everything: once the object is going
/// or timed out, agents no longer honour it, so no workload may be deleted on its behalf.
pub(crate) fn next(f: &Facts) -> Step {
    if f.deleting || f.timed_out {
        // The taint has no owner: short of the proof this remediation never added it, and
        // another remediation of the node (fence agents after an escalation) may rely on it
        // for the volumes' forced detach.
        if f.out_of_service_taint && f.phase >= Phase::RebootCompleted {
            return Step::RemoveOutOfServiceTaint;
        }
        if f.no_schedule_taint {
            return Step::RemoveNoScheduleTaint;
        }
        if f.has_finalizer && f.deleting {
            return Step::RemoveFinalizer;
        }
        return if f.deleting || f.phase == Phase::FencingCompleted {
            Step::Idle
        } else {
            Step::Stop
        };
    }
    if f.phase == Phase::FencingCompleted {
        return Step::Idle;
    }
    // Past the proof, releasing the node's workloads is all that is left: stopping then would
    // only strand them.
    if !f.configured && f.phase < Phase::RebootCompleted {
        return Step::Disabled;
    }
    if f.disabled_reported && f.configured {
        return Step::Enabled;
    }
    if f.phase == Phase::New {
        if !f.node_exists {
            return Step::NodeNotFound;
        }
        if f.excluded {
            return Step::Excluded;
        }
        if let Some(why) = &f.cannot_fence {
            return Step::CannotFence(why.clone());
        }
    }
    if !f.has_finalizer {
        return Step::AddFinalizer;
    }
    if !f.no_schedule_taint && f.node_exists {
        return Step::AddNoScheduleTaint;
    }
    if f.phase == Phase::New {
        return Step::Start;
    }
    if f.phase < Phase::RebootCompleted {
        if f.target_disarmed {
            return Step::CannotFence(
                "the node's agent stopped deliberately and disarmed its watchdog: waiting would prove nothing".into(),
            );
        }
        let Some(waited) = f.accepted_for else {
            return if f.acceptance_met {
                Step::ObserveAcceptance
            } else {
                Step::AwaitAcceptance
            };
        };
        if waited < f.safe_time {
            return Step::Wait(f.safe_time - waited);
        }
        return Step::MarkRebooted;
    }
    if f.strategy == Applied::OutOfServiceTaint && !f.out_of_service_taint && f.node_exists {
        return Step::AddOutOfServiceTaint;
    }
    if f.pods_left > 0 {
        return Step::DeletePods;
    }
    if f.strategy == Applied::ResourceDeletion && f.attachments_left > 0 {
        return Step::DeleteAttachments;
    }
    Step::MarkCompleted
}

/// Where the node's workloads may be deleted: only after the proof (what the tests hold the
/// decisions to).
#[cfg(test)]
fn deletes_workloads(step: &Step) -> bool {
    matches!(
        step,
        Step::DeletePods | Step::DeleteAttachments | Step::AddOutOfServiceTaint
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fresh() -> Facts {
        Facts {
            deleting: false,
            has_finalizer: false,
            configured: true,
            disabled_reported: false,
            timed_out: false,
            node_exists: true,
            excluded: false,
            phase: Phase::New,
            cannot_fence: None,
            target_disarmed: false,
            acceptance_met: false,
            accepted_for: None,
            safe_time: Duration::from_secs(10),
            no_schedule_taint: false,
            out_of_service_taint: false,
            strategy: Applied::OutOfServiceTaint,
            pods_left: 1,
            attachments_left: 1,
        }
    }

    #[test]
    fn a_remediation_walks_the_phases_in_order() {
        let mut f = fresh();
        assert_eq!(next(&f), Step::AddFinalizer);
        f.has_finalizer = true;
        assert_eq!(next(&f), Step::AddNoScheduleTaint);
        f.no_schedule_taint = true;
        assert_eq!(next(&f), Step::Start);
        f.phase = Phase::FencingStarted;
        assert_eq!(next(&f), Step::AwaitAcceptance);
        f.acceptance_met = true;
        assert_eq!(next(&f), Step::ObserveAcceptance);
        f.accepted_for = Some(Duration::from_secs(4));
        f.phase = Phase::PreRebootCompleted;
        assert_eq!(next(&f), Step::Wait(Duration::from_secs(6)));
        f.accepted_for = Some(Duration::from_secs(10));
        assert_eq!(next(&f), Step::MarkRebooted);
        f.phase = Phase::RebootCompleted;
        assert_eq!(next(&f), Step::AddOutOfServiceTaint);
        f.out_of_service_taint = true;
        assert_eq!(next(&f), Step::DeletePods);
        f.pods_left = 0;
        assert_eq!(
            next(&f),
            Step::MarkCompleted,
            "the out-of-service path leaves attachments to the detach controller"
        );
        f.phase = Phase::FencingCompleted;
        assert_eq!(next(&f), Step::Idle);
        f.deleting = true;
        assert_eq!(next(&f), Step::RemoveOutOfServiceTaint);
        f.out_of_service_taint = false;
        assert_eq!(next(&f), Step::RemoveNoScheduleTaint);
        f.no_schedule_taint = false;
        assert_eq!(next(&f), Step::RemoveFinalizer);
        f.has_finalizer = false;
        assert_eq!(next(&f), Step::Idle);
    }

    /// Escalation: a self remediation that could not fence is timed out while fence agents
    /// fence the node and taint it out of service; that taint is not the stopped one's to take.
    #[test]
    fn a_stopped_remediation_short_of_the_proof_leaves_the_out_of_service_taint_alone() {
        let mut f = Facts {
            timed_out: true,
            has_finalizer: true,
            out_of_service_taint: true,
            cannot_fence: Some("no watchdog".into()),
            ..fresh()
        };
        assert_eq!(next(&f), Step::Stop);
        f.deleting = true;
        assert_eq!(next(&f), Step::RemoveFinalizer);
        f.phase = Phase::RebootCompleted;
        assert_eq!(next(&f), Step::RemoveOutOfServiceTaint);
    }

    #[test]
    fn resource_deletion_deletes_attachments_too() {
        let f = Facts {
            has_finalizer: true,
            no_schedule_taint: true,
            phase: Phase::RebootCompleted,
            strategy: Applied::ResourceDeletion,
            pods_left: 0,
            ..fresh()
        };
        assert_eq!(next(&f), Step::DeleteAttachments);
    }

    #[test]
    fn a_node_that_cannot_fence_is_reported_before_anything_is_touched() {
        let f = Facts {
            cannot_fence: Some("no agent".into()),
            ..fresh()
        };
        assert_eq!(next(&f), Step::CannotFence("no agent".into()));
        let f = Facts {
            node_exists: false,
            ..fresh()
        };
        assert_eq!(next(&f), Step::NodeNotFound);
        let f = Facts {
            excluded: true,
            ..fresh()
        };
        assert_eq!(next(&f), Step::Excluded);
    }

    #[test]
    fn a_deleted_configuration_stops_a_remediation_short_of_its_proof_and_its_return_clears_the_condition() {
        let waiting = Facts {
            has_finalizer: true,
            no_schedule_taint: true,
            phase: Phase::PreRebootCompleted,
            acceptance_met: true,
            accepted_for: Some(Duration::from_secs(60)),
            configured: false,
            ..fresh()
        };
        assert_eq!(next(&waiting), Step::Disabled);
        assert_eq!(
            next(&Facts {
                configured: false,
                ..fresh()
            }),
            Step::Disabled
        );
        let proven = Facts {
            phase: Phase::RebootCompleted,
            ..waiting.clone()
        };
        assert_eq!(next(&proven), Step::AddOutOfServiceTaint, "the release goes on");
        let going = Facts {
            deleting: true,
            ..waiting.clone()
        };
        assert_eq!(next(&going), Step::RemoveNoScheduleTaint, "clean-up goes on");
        let back = Facts {
            configured: true,
            disabled_reported: true,
            ..waiting
        };
        assert_eq!(next(&back), Step::Enabled);
    }

    #[test]
    fn a_node_whose_agent_disarmed_mid_wait_is_never_marked_rebooted() {
        let waiting = Facts {
            has_finalizer: true,
            no_schedule_taint: true,
            phase: Phase::FencingStarted,
            acceptance_met: true,
            accepted_for: Some(Duration::from_secs(60)),
            ..fresh()
        };
        assert_eq!(next(&waiting), Step::MarkRebooted);
        let disarmed = Facts {
            target_disarmed: true,
            ..waiting
        };
        assert!(matches!(next(&disarmed), Step::CannotFence(_)));
    }

    #[test]
    fn a_manager_that_restarts_mid_wait_waits_again_from_the_start() {
        let f = Facts {
            has_finalizer: true,
            no_schedule_taint: true,
            phase: Phase::PreRebootCompleted,
            acceptance_met: true,
            accepted_for: None,
            ..fresh()
        };
        assert_eq!(next(&f), Step::ObserveAcceptance);
    }

    fn any_facts() -> impl Strategy<Value = Facts> {
        (
            (
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            ),
            (
                0..5u8,
                any::<bool>(),
                any::<bool>(),
                proptest::option::of(0..30u64),
                any::<bool>(),
            ),
            (any::<bool>(), any::<bool>(), any::<bool>(), 0..3usize, 0..3usize),
            (any::<bool>(), any::<bool>()),
        )
            .prop_map(
                |(
                    (deleting, fin, timed_out, exists, excluded),
                    (phase, cannot, met, waited, disarmed),
                    (ns, oos, rd, pods, vas),
                    (configured, disabled_reported),
                )| Facts {
                    deleting,
                    has_finalizer: fin,
                    configured,
                    disabled_reported,
                    timed_out,
                    node_exists: exists,
                    excluded,
                    phase: [
                        Phase::New,
                        Phase::FencingStarted,
                        Phase::PreRebootCompleted,
                        Phase::RebootCompleted,
                        Phase::FencingCompleted,
                    ][phase as usize],
                    cannot_fence: cannot.then(|| "x".to_owned()),
                    target_disarmed: disarmed,
                    acceptance_met: met,
                    accepted_for: waited.map(Duration::from_secs),
                    safe_time: Duration::from_secs(10),
                    no_schedule_taint: ns,
                    out_of_service_taint: oos,
                    strategy: if rd {
                        Applied::ResourceDeletion
                    } else {
                        Applied::OutOfServiceTaint
                    },
                    pods_left: pods,
                    attachments_left: vas,
                },
            )
    }

    proptest! {
        /// Workloads are touched only once fencing is proven: past the wait, for an object that is
        /// neither going nor timed out.
        #[test]
        fn workloads_are_deleted_only_after_the_proof(f in any_facts()) {
            let step = next(&f);
            if deletes_workloads(&step) {
                prop_assert!(!f.deleting && !f.timed_out);
                prop_assert!(f.phase >= Phase::RebootCompleted);
                prop_assert!(f.has_finalizer && (f.no_schedule_taint || !f.node_exists));
            }
            if step == Step::MarkRebooted {
                prop_assert!(f.accepted_for.is_some_and(|w| w >= f.safe_time));
                prop_assert!(!f.target_disarmed, "a disarmed node's silence proves nothing");
            }
        }

        /// Without a configuration nothing that fences starts or goes on: a remediation short of
        /// the proof only reports it, and clean-up still happens.
        #[test]
        fn without_a_configuration_nothing_is_fenced(f in any_facts()) {
            let step = next(&f);
            if !f.configured && !f.deleting && !f.timed_out && f.phase < Phase::RebootCompleted {
                prop_assert_eq!(&step, &Step::Disabled);
            }
            if step == Step::Enabled {
                prop_assert!(f.configured);
            }
        }

        /// A going object never gets a new taint or finalizer, and its finalizer goes last.
        #[test]
        fn deletion_only_removes(f in any_facts()) {
            let step = next(&f);
            if f.deleting {
                prop_assert!(matches!(step, Step::RemoveOutOfServiceTaint | Step::RemoveNoScheduleTaint | Step::RemoveFinalizer | Step::Idle));
                if step == Step::RemoveFinalizer {
                    prop_assert!(!f.no_schedule_taint);
                    prop_assert!(!f.out_of_service_taint || f.phase < Phase::RebootCompleted);
                }
            }
        }
    }
}
