//! Every decision of a Machine Deletion Remediation, over plain data: whether it may start, what
//! to delete, when its workloads may be released, and when the Machine's owner has replaced it.

use jiff::Timestamp;

/// The Machine's controller owner, whose replicas a replacement restores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// `<Kind>/<name>`, medik8s's `machineOwner` annotation.
    pub fn recorded(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// The Machine to delete, found before anything is deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// `<namespace>/<name>`.
    pub id: String,
    pub provider_id: Option<String>,
    pub owner: Option<Owner>,
    pub node: Option<String>,
}

/// What finding the Machine gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The remediation names a node (a health check's) that does not exist.
    NodeNotFound(String),
    /// Neither an owner reference nor the node's annotations lead to an existing Machine.
    MachineNotFound(String),
    Found(Machine),
}

/// The deleted Machine, as the remediation's annotations record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub machine: String,
    pub owner: String,
    pub node: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    Present,
    Deleting,
    Gone,
}

/// One of the owner's Machines, for the replacement count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedMachine {
    pub created: Option<Timestamp>,
    pub deleting: bool,
    /// Whether its node (status.nodeRef) exists, and whether it is Ready.
    pub node_exists: bool,
    pub node_ready: bool,
}

/// After the deletion: the deleted Machine, what it left behind, and its owner's replacement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub recorded: Recorded,
    pub machine: Presence,
    /// Pods and VolumeAttachments bound to the recorded node from before the remediation.
    pub leftovers: usize,
    /// The owner's desired replicas; None when the owner is gone.
    pub replicas: Option<i64>,
    pub owned: Vec<OwnedMachine>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub deleting: bool,
    /// nodemedic's finalizer, added with the deletion so the workloads are released even when
    /// the Machine's deletion garbage-collects the remediation it owns.
    pub has_finalizer: bool,
    pub timed_out_by_health_check: bool,
    /// Succeeded is True or False already.
    pub finished: bool,
    pub created: Option<Timestamp>,
    pub progress: Option<Progress>,
    /// Only read before the deletion (no progress recorded).
    pub target: Option<Target>,
    /// Another remediation that deleted a Machine of the same owner and is not done with it:
    /// one Machine of an owner is deleted at a time (seed 003).
    pub turn_taken_by: Option<String>,
}

/// medik8s's reasons for a remediation that cannot start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CannotStart {
    NodeNotFound,
    MachineNotFound,
    NoControllerOwner,
}

impl CannotStart {
    pub fn reason(self) -> &'static str {
        match self {
            Self::NodeNotFound => "RemediationCannotStartNodeNotFound",
            Self::MachineNotFound => "RemediationCannotStartMachineNotFound",
            Self::NoControllerOwner => "RemediationCannotStartNoControllerOwner",
        }
    }
}

/// Whether the replacement node will have a new name: PermanentNodeDeletionExpected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permanence {
    /// Cloud providers name the new instance's node anew: the old node is gone for good.
    NewName,
    /// Bare metal re-provisions the same host under the same node name.
    SameName,
    Unknown,
}

impl Permanence {
    pub(crate) fn of(provider_id: Option<&str>) -> Self {
        match provider_id.filter(|p| !p.is_empty()) {
            None => Self::Unknown,
            Some(p) if p.starts_with("baremetal") => Self::SameName,
            Some(_) => Self::NewName,
        }
    }

    /// The condition's status and reason (medik8s's).
    pub(crate) fn condition(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::NewName => (
                "True",
                "MachineDeletionOnCloudProviderCausesNewNodeName",
                "the Machine's provider names new nodes anew: the replacement will have a new node name",
            ),
            Self::SameName => (
                "False",
                "MachineDeletionOnBareMetalProviderKeepsNodeName",
                "bare metal provider: the replacement keeps the node's name",
            ),
            Self::Unknown => (
                "Unknown",
                "MachineDeletionOnUndefinedProvider",
                "the Machine has no providerID: whether the node's name survives is unknown",
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Idle,
    /// The health check timed the remediation out: stop (RemediationStoppedByNHC).
    Stop,
    CannotStart {
        why: CannotStart,
        message: String,
    },
    /// Another remediation is replacing a Machine of the same owner: wait for it.
    AwaitTurn {
        behind: String,
    },
    /// Record the Machine, its owner and node, then delete the Machine.
    DeleteMachine {
        machine: Box<Machine>,
        owner: Box<Owner>,
    },
    /// The recorded Machine still exists and is not being deleted (a deletion that did not
    /// land): delete it again.
    DeleteAgain,
    /// Its finalizers (drain, infrastructure deletion) are running.
    AwaitMachineGone,
    /// The Machine and its infrastructure are gone, so nothing of the old node runs: delete its
    /// pods and VolumeAttachments so the workloads start elsewhere now.
    ReleaseWorkloads,
    AwaitReplacement {
        have: usize,
        want: i64,
    },
    /// MachineDeleted: Succeeded True.
    Succeed {
        message: String,
    },
    RemoveFinalizer,
}

pub(crate) fn next(f: &Facts) -> Step {
    if f.deleting {
        return while_deleted(f);
    }
    if f.finished {
        return Step::Idle;
    }
    if f.timed_out_by_health_check {
        return Step::Stop;
    }
    let Some(progress) = &f.progress else {
        let step = before_deletion(f.target.as_ref());
        return match (&step, &f.turn_taken_by) {
            (Step::DeleteMachine { .. }, Some(other)) => Step::AwaitTurn { behind: other.clone() },
            _ => step,
        };
    };
    match progress.machine {
        Presence::Present => return Step::DeleteAgain,
        Presence::Deleting => return Step::AwaitMachineGone,
        Presence::Gone => {}
    }
    if progress.leftovers > 0 {
        return Step::ReleaseWorkloads;
    }
    let Some(want) = progress.replicas else {
        return Step::Succeed {
            message: format!(
                "Machine {} deleted; its owner {} is gone, so no replacement is awaited",
                progress.recorded.machine, progress.recorded.owner
            ),
        };
    };
    let have = replacements(&progress.owned, f.created);
    if i64::try_from(have).unwrap_or(i64::MAX) >= want {
        Step::Succeed {
            message: format!(
                "Machine {} deleted; {} has its {want} nodes",
                progress.recorded.machine, progress.recorded.owner
            ),
        }
    } else {
        Step::AwaitReplacement { have, want }
    }
}

/// A remediation being deleted (by its owner Machine's garbage collection, or the health check)
/// still releases what its deleted Machine left behind; one whose Machine was never deleted, or
/// still exists, lets go at once.
fn while_deleted(f: &Facts) -> Step {
    if !f.has_finalizer {
        return Step::Idle;
    }
    match &f.progress {
        Some(p) if p.machine == Presence::Deleting => Step::AwaitMachineGone,
        Some(p) if p.machine == Presence::Gone && p.leftovers > 0 => Step::ReleaseWorkloads,
        _ => Step::RemoveFinalizer,
    }
}

fn before_deletion(target: Option<&Target>) -> Step {
    match target {
        None => Step::Idle,
        Some(Target::NodeNotFound(node)) => Step::CannotStart {
            why: CannotStart::NodeNotFound,
            message: format!("node {node} does not exist"),
        },
        Some(Target::MachineNotFound(what)) => Step::CannotStart {
            why: CannotStart::MachineNotFound,
            message: what.clone(),
        },
        Some(Target::Found(machine)) => match &machine.owner {
            None => Step::CannotStart {
                why: CannotStart::NoControllerOwner,
                message: format!(
                    "Machine {} has no controller owner: nothing would replace it, so it is not deleted",
                    machine.id
                ),
            },
            Some(owner) => Step::DeleteMachine {
                machine: Box::new(machine.clone()),
                owner: Box::new(owner.clone()),
            },
        },
    }
}

/// The owner's nodes that count toward its replicas. A Machine made since the remediation began
/// counts once its node is Ready: that is the replacement. An older one counts while its node
/// exists, whatever its health: requiring it Ready would make two remediations of one owner
/// wait on each other's broken node forever.
pub(crate) fn replacements(owned: &[OwnedMachine], remediation_created: Option<Timestamp>) -> usize {
    owned
        .iter()
        .filter(|m| !m.deleting)
        .filter(|m| {
            let new = match (m.created, remediation_created) {
                (Some(made), Some(began)) => made >= began,
                _ => true,
            };
            if new {
                m.node_exists && m.node_ready
            } else {
                m.node_exists
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn owner() -> Owner {
        Owner {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "MachineSet".into(),
            name: "md-0".into(),
            uid: "u".into(),
        }
    }

    fn machine(owner: Option<Owner>) -> Machine {
        Machine {
            id: "default/md-0-a".into(),
            provider_id: Some("lab://node-1".into()),
            owner,
            node: Some("node-1".into()),
        }
    }

    fn before(target: Target) -> Facts {
        Facts {
            deleting: false,
            has_finalizer: false,
            timed_out_by_health_check: false,
            finished: false,
            created: Some(Timestamp::from_second(1000).expect("time")),
            progress: None,
            target: Some(target),
            turn_taken_by: None,
        }
    }

    fn after(machine: Presence, leftovers: usize, replicas: Option<i64>, owned: Vec<OwnedMachine>) -> Facts {
        Facts {
            progress: Some(Progress {
                recorded: Recorded {
                    machine: "default/md-0-a".into(),
                    owner: "MachineSet/md-0".into(),
                    node: Some("node-1".into()),
                },
                machine,
                leftovers,
                replicas,
                owned,
            }),
            target: None,
            has_finalizer: true,
            ..before(Target::MachineNotFound(String::new()))
        }
    }

    fn owned(created: i64, node_exists: bool, node_ready: bool) -> OwnedMachine {
        OwnedMachine {
            created: Some(Timestamp::from_second(created).expect("time")),
            deleting: false,
            node_exists,
            node_ready,
        }
    }

    #[test]
    fn it_refuses_what_nothing_would_replace_and_what_it_cannot_find() {
        assert!(matches!(
            next(&before(Target::NodeNotFound("n".into()))),
            Step::CannotStart {
                why: CannotStart::NodeNotFound,
                ..
            }
        ));
        assert!(matches!(
            next(&before(Target::MachineNotFound("m".into()))),
            Step::CannotStart {
                why: CannotStart::MachineNotFound,
                ..
            }
        ));
        assert!(matches!(
            next(&before(Target::Found(machine(None)))),
            Step::CannotStart {
                why: CannotStart::NoControllerOwner,
                ..
            }
        ));
        assert!(matches!(
            next(&before(Target::Found(machine(Some(owner()))))),
            Step::DeleteMachine { .. }
        ));
    }

    #[test]
    fn one_machine_of_an_owner_is_deleted_at_a_time() {
        let mut f = before(Target::Found(machine(Some(owner()))));
        f.turn_taken_by = Some("md-0-b".into());
        assert_eq!(
            next(&f),
            Step::AwaitTurn {
                behind: "md-0-b".into()
            }
        );
        // A refusal is said at once, turn or not.
        let mut refused = before(Target::Found(machine(None)));
        refused.turn_taken_by = Some("md-0-b".into());
        assert!(matches!(next(&refused), Step::CannotStart { .. }));
    }

    #[test]
    fn the_health_checks_timeout_stops_it_and_a_finished_one_rests() {
        let mut f = before(Target::Found(machine(Some(owner()))));
        f.timed_out_by_health_check = true;
        assert_eq!(next(&f), Step::Stop);
        f.finished = true;
        assert_eq!(next(&f), Step::Idle);
    }

    #[test]
    fn workloads_are_released_only_once_the_machine_is_gone() {
        assert_eq!(next(&after(Presence::Present, 2, Some(1), vec![])), Step::DeleteAgain);
        assert_eq!(
            next(&after(Presence::Deleting, 2, Some(1), vec![])),
            Step::AwaitMachineGone
        );
        assert_eq!(next(&after(Presence::Gone, 2, Some(1), vec![])), Step::ReleaseWorkloads);
    }

    #[test]
    fn it_succeeds_when_the_owner_has_its_replicas_again() {
        let waiting = after(
            Presence::Gone,
            0,
            Some(2),
            vec![owned(10, true, false), owned(2000, true, false)],
        );
        assert_eq!(next(&waiting), Step::AwaitReplacement { have: 1, want: 2 });
        let done = after(
            Presence::Gone,
            0,
            Some(2),
            vec![owned(10, true, false), owned(2000, true, true)],
        );
        assert!(matches!(next(&done), Step::Succeed { .. }));
        assert!(matches!(
            next(&after(Presence::Gone, 0, None, vec![])),
            Step::Succeed { .. }
        ));
        assert!(matches!(
            next(&after(Presence::Gone, 0, Some(0), vec![])),
            Step::Succeed { .. }
        ));
    }

    #[test]
    fn permanence_follows_the_provider() {
        assert_eq!(Permanence::of(Some("baremetalhost:///ns/h/uid")), Permanence::SameName);
        assert_eq!(Permanence::of(Some("aws:///us-east-1a/i-1")), Permanence::NewName);
        assert_eq!(Permanence::of(Some("")), Permanence::Unknown);
        assert_eq!(Permanence::of(None), Permanence::Unknown);
    }

    #[test]
    fn a_deleted_remediation_still_releases_what_its_machine_left() {
        let deleted = |p, leftovers| Facts {
            deleting: true,
            ..after(p, leftovers, Some(1), vec![])
        };
        assert_eq!(next(&deleted(Presence::Deleting, 1)), Step::AwaitMachineGone);
        assert_eq!(next(&deleted(Presence::Gone, 1)), Step::ReleaseWorkloads);
        assert_eq!(next(&deleted(Presence::Gone, 0)), Step::RemoveFinalizer);
        assert_eq!(next(&deleted(Presence::Present, 1)), Step::RemoveFinalizer);
    }

    fn presence() -> impl Strategy<Value = Presence> {
        prop_oneof![Just(Presence::Present), Just(Presence::Deleting), Just(Presence::Gone)]
    }

    fn any_owned() -> impl Strategy<Value = Vec<OwnedMachine>> {
        proptest::collection::vec(
            (0i64..3000, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(c, deleting, e, r)| OwnedMachine {
                deleting,
                ..owned(c, e, r)
            }),
            0..6,
        )
    }

    proptest! {
        // Never two writers: nothing of the old node is released while its Machine exists.
        #[test]
        fn nothing_is_released_while_the_machine_exists(p in presence(), deleting in any::<bool>(), leftovers in 0usize..4, replicas in proptest::option::of(0i64..4), owned in any_owned()) {
            let step = next(&Facts { deleting, ..after(p, leftovers, replicas, owned) });
            if p != Presence::Gone {
                let releases = matches!(step, Step::ReleaseWorkloads | Step::Succeed { .. });
                prop_assert!(!releases, "{:?} while the Machine is {:?}", step, p);
            }
        }

        // A remediation never succeeds with the old node's workloads still bound to it, nor before
        // its owner is whole again.
        #[test]
        fn success_means_released_and_replaced(leftovers in 0usize..4, replicas in 0i64..4, owned in any_owned()) {
            let step = next(&after(Presence::Gone, leftovers, Some(replicas), owned.clone()));
            let succeeded = matches!(step, Step::Succeed { .. });
            if succeeded {
                prop_assert_eq!(leftovers, 0);
                prop_assert!(replacements(&owned, Some(Timestamp::from_second(1000).expect("time"))) as i64 >= replicas);
            }
        }

        // Only a Machine with a controller owner is ever deleted, and only when no other
        // remediation is replacing one of the same owner.
        #[test]
        fn only_owned_machines_are_deleted_one_at_a_time(has_owner in any::<bool>(), busy in any::<bool>()) {
            let mut f = before(Target::Found(machine(has_owner.then(owner))));
            f.turn_taken_by = busy.then(|| "other".to_owned());
            let deletes = matches!(next(&f), Step::DeleteMachine { .. });
            prop_assert_eq!(deletes, has_owner && !busy);
        }
    }
}
