//! The next step of a NodeMaintenance. Order matters: nothing is drained before the node lease is
//! ours (so the health check cannot remediate a node mid-drain, nor maintenance start on a node
//! being remediated) and before the node is cordoned (so evicted pods do not land on it again).

use super::quorum::Verdict;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lease {
    Ours,
    Free,
    HeldBy(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    NotStarted,
    Running,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub deleting: bool,
    pub phase: Phase,
    pub node_exists: bool,
    /// Another live NodeMaintenance for the same node that started, or was created, first.
    pub earlier_for_node: Option<String>,
    /// Another live, not failed NodeMaintenance covers the node: giving it back is not ours to do.
    pub other_active_for_node: bool,
    pub quorum: Verdict,
    pub has_finalizer: bool,
    pub lease: Lease,
    /// Consecutive failures to take or renew the lease once the drain began.
    pub lease_errors: u32,
    pub labelled: bool,
    pub tainted: bool,
    pub cordoned: bool,
    /// Pods the drain still has to see gone.
    pub pending: usize,
    pub drain_timed_out: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Drop the finalizer; first, when `give_back`, uncordon, remove taints and label, release
    /// the lease.
    Cleanup {
        give_back: bool,
    },
    Idle,
    /// Phase Failed with this message; first, when `give_back`, give the node back.
    Fail {
        message: String,
        give_back: bool,
    },
    AddFinalizer,
    /// Record phase Running and the pods selected for the drain.
    Start,
    AcquireLease,
    /// The health check holds the node's lease: wait (and say so).
    WaitForLease(String),
    Label,
    Taint,
    Cordon,
    /// Evict (or delete) what is left, then look again.
    Drain,
    Succeed,
    /// Drained: keep the lease, label, taints and cordon until the NodeMaintenance is deleted.
    Hold,
}

/// medik8s gives up after more than three lease failures.
pub(crate) const MAX_LEASE_ERRORS: u32 = 3;

pub(crate) fn next(f: &Facts) -> Step {
    // Only a started maintenance that got the lease has touched the node (the label, taints and
    // cordon come after the lease); a duplicate, a refused one, or one still waiting for the
    // health check's lease must not undo what others did.
    let touched_node = matches!(f.phase, Phase::Running | Phase::Succeeded) && !matches!(f.lease, Lease::HeldBy(_));
    if f.deleting {
        return Step::Cleanup {
            give_back: touched_node && !f.other_active_for_node,
        };
    }
    if f.phase == Phase::Failed {
        return Step::Idle;
    }
    let fail = |message: String| Step::Fail {
        message,
        give_back: touched_node,
    };
    if !f.node_exists {
        return fail(if touched_node {
            "the node was deleted during maintenance; this NodeMaintenance goes with it".into()
        } else {
            "the node does not exist: check spec.nodeName (it is immutable: create a new NodeMaintenance)".into()
        });
    }
    if f.phase == Phase::NotStarted {
        if let Some(other) = &f.earlier_for_node {
            return fail(format!(
                "NodeMaintenance {other} already covers this node: delete one of them"
            ));
        }
        if let Verdict::Refused { healthy_after, members } = f.quorum {
            return fail(super::quorum::refusal(healthy_after, members));
        }
    }
    if !f.has_finalizer {
        return Step::AddFinalizer;
    }
    if f.phase == Phase::NotStarted {
        return Step::Start;
    }
    if f.lease_errors > MAX_LEASE_ERRORS {
        return fail(format!(
            "the node lease could not be taken or renewed {} times in a row",
            f.lease_errors
        ));
    }
    match &f.lease {
        Lease::Ours => {}
        Lease::Free => return Step::AcquireLease,
        Lease::HeldBy(holder) => return Step::WaitForLease(holder.clone()),
    }
    if !f.labelled {
        return Step::Label;
    }
    if !f.tainted {
        return Step::Taint;
    }
    if !f.cordoned {
        return Step::Cordon;
    }
    if f.phase == Phase::Succeeded {
        return Step::Hold;
    }
    if f.pending == 0 {
        return Step::Succeed;
    }
    if f.drain_timed_out {
        return fail(format!(
            "the drain timed out with {} pods left (see blockingPods)",
            f.pending
        ));
    }
    Step::Drain
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn facts() -> Facts {
        Facts {
            deleting: false,
            phase: Phase::NotStarted,
            node_exists: true,
            earlier_for_node: None,
            other_active_for_node: false,
            quorum: Verdict::NotAMember,
            has_finalizer: false,
            lease: Lease::Free,
            lease_errors: 0,
            labelled: false,
            tainted: false,
            cordoned: false,
            pending: 2,
            drain_timed_out: false,
        }
    }

    fn drive(mut f: Facts) -> Vec<Step> {
        let mut seen = Vec::new();
        for _ in 0..30 {
            let step = next(&f);
            seen.push(step.clone());
            match step {
                Step::Cleanup { .. } | Step::Idle | Step::Hold | Step::WaitForLease(_) => break,
                Step::Fail { .. } => f.phase = Phase::Failed,
                Step::AddFinalizer => f.has_finalizer = true,
                Step::Start => f.phase = Phase::Running,
                Step::AcquireLease => f.lease = Lease::Ours,
                Step::Label => f.labelled = true,
                Step::Taint => f.tainted = true,
                Step::Cordon => f.cordoned = true,
                Step::Drain => f.pending -= 1,
                Step::Succeed => f.phase = Phase::Succeeded,
            }
        }
        seen
    }

    #[test]
    fn lease_label_taint_cordon_then_drain() {
        let seen = drive(facts());
        let at = |s: &Step| seen.iter().position(|x| x == s).expect("step taken");
        assert!(at(&Step::AcquireLease) < at(&Step::Label));
        assert!(at(&Step::Taint) < at(&Step::Cordon));
        assert!(at(&Step::Cordon) < at(&Step::Drain));
        assert_eq!(seen.iter().rev().nth(1), Some(&Step::Succeed));
        assert_eq!(seen.last(), Some(&Step::Hold));
    }

    #[test]
    fn a_held_lease_waits_and_a_refused_quorum_fails_before_anything() {
        let held = drive(Facts {
            lease: Lease::HeldBy("node-healthcheck".into()),
            ..facts()
        });
        assert_eq!(held.last(), Some(&Step::WaitForLease("node-healthcheck".into())));
        assert!(!held.contains(&Step::Drain));
        let refused = drive(Facts {
            quorum: Verdict::Refused {
                healthy_after: 1,
                members: 3,
            },
            ..facts()
        });
        assert!(matches!(refused[0], Step::Fail { give_back: false, .. }));
    }

    #[test]
    fn only_a_started_maintenance_gives_the_node_back() {
        let duplicate = Facts {
            earlier_for_node: Some("first".into()),
            has_finalizer: true,
            ..facts()
        };
        assert!(matches!(next(&duplicate), Step::Fail { give_back: false, .. }));
        let deleted_duplicate = Facts {
            deleting: true,
            phase: Phase::Failed,
            other_active_for_node: true,
            ..facts()
        };
        assert_eq!(next(&deleted_duplicate), Step::Cleanup { give_back: false });
        let running = Facts {
            deleting: true,
            phase: Phase::Running,
            ..facts()
        };
        assert_eq!(next(&running), Step::Cleanup { give_back: true });
        // Deleted while the health check still holds the lease: nothing of ours to undo.
        let waiting = Facts {
            lease: Lease::HeldBy("NodeHealthCheck-x".into()),
            ..running
        };
        assert_eq!(next(&waiting), Step::Cleanup { give_back: false });
        let node_gone = Facts {
            node_exists: false,
            phase: Phase::Succeeded,
            ..facts()
        };
        assert!(matches!(next(&node_gone), Step::Fail { give_back: true, .. }));
    }

    #[test]
    fn a_drained_node_is_held_and_its_lease_kept() {
        let held = Facts {
            phase: Phase::Succeeded,
            has_finalizer: true,
            lease: Lease::Ours,
            labelled: true,
            tainted: true,
            cordoned: true,
            ..facts()
        };
        assert_eq!(next(&held), Step::Hold);
        assert_eq!(
            next(&Facts {
                lease: Lease::Free,
                ..held.clone()
            }),
            Step::AcquireLease
        );
        assert_eq!(
            next(&Facts {
                cordoned: false,
                ..held
            }),
            Step::Cordon
        );
    }

    proptest! {
        /// Nothing is drained without the lease, the taints and the cordon.
        #[test]
        fn no_drain_unprotected(
            deleting in any::<bool>(), exists in any::<bool>(), fin in any::<bool>(),
            lease in prop_oneof![Just(Lease::Ours), Just(Lease::Free), Just(Lease::HeldBy("x".into()))],
            labelled in any::<bool>(), tainted in any::<bool>(), cordoned in any::<bool>(),
            pending in 0usize..3, timed_out in any::<bool>(), errors in 0u32..6, started in any::<bool>(),
        ) {
            let f = Facts {
                deleting, node_exists: exists, has_finalizer: fin, lease: lease.clone(), labelled, tainted, cordoned,
                pending, drain_timed_out: timed_out, lease_errors: errors,
                phase: if started { Phase::Running } else { Phase::NotStarted },
                ..facts()
            };
            match next(&f) {
                Step::Drain => prop_assert!(lease == Lease::Ours && labelled && tainted && cordoned && fin && !deleting),
                Step::Fail { give_back: true, .. } | Step::Cleanup { give_back: true } => prop_assert!(started),
                _ => {}
            }
        }
    }
}
