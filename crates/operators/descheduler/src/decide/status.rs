//! The KubeDescheduler's conditions, from what the reconciler found: OpenShift's
//! `TargetConfigControllerDegraded`, and the Available / Progressing / Degraded a user reads first.

use nodemedic_api::descheduler::OperatorCondition;

use super::render::Invalid;

/// What the operator is doing with the descheduler.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// The policy rendered and the descheduler Deployment is applied.
    Running {
        ready_replicas: i32,
        predictive: bool,
        notes: Vec<String>,
    },
    /// The spec cannot run: the descheduler is stopped until it is fixed.
    Invalid(Invalid),
    /// managementState Unmanaged: nothing is changed.
    Unmanaged,
    /// managementState Removed: the descheduler and its soft taints are gone.
    Removed,
    /// Another KubeDescheduler named cluster, in another namespace, came first.
    Superseded { by: String },
}

pub(crate) struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

fn desired(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Desired {
    Desired {
        type_,
        status,
        reason,
        message: message.into(),
    }
}

/// The four conditions for an outcome.
pub(crate) fn conditions(outcome: &Outcome) -> Vec<Desired> {
    match outcome {
        Outcome::Running {
            ready_replicas,
            predictive,
            notes,
        } => {
            let ready = *ready_replicas > 0;
            let mode = if *predictive {
                "in Predictive mode: it evicts nothing and logs each pod it would evict"
            } else {
                "in Automatic mode"
            };
            let mut available = if ready {
                format!("the descheduler runs {mode}")
            } else {
                format!("the descheduler is starting ({mode})")
            };
            for note in notes {
                available.push_str("; ");
                available.push_str(note);
            }
            vec![
                desired(
                    "Available",
                    ready,
                    if ready {
                        "DeschedulerRunning"
                    } else {
                        "DeschedulerStarting"
                    },
                    available,
                ),
                desired(
                    "Progressing",
                    !ready,
                    if ready { "AsExpected" } else { "DeschedulerStarting" },
                    if ready {
                        ""
                    } else {
                        "waiting for the descheduler pod to be ready"
                    },
                ),
                desired("Degraded", false, "AsExpected", ""),
                desired("TargetConfigControllerDegraded", false, "AsExpected", ""),
            ]
        }
        Outcome::Invalid(invalid) => {
            let message = format!("{invalid}; the descheduler is stopped until this is fixed");
            vec![
                desired("Available", false, "InvalidConfiguration", message.clone()),
                desired("Progressing", false, "InvalidConfiguration", ""),
                desired("Degraded", true, "InvalidConfiguration", message.clone()),
                desired("TargetConfigControllerDegraded", true, "InvalidConfiguration", message),
            ]
        }
        Outcome::Unmanaged => vec![
            desired(
                "Available",
                false,
                "Unmanaged",
                "managementState is Unmanaged: nodemedic leaves the descheduler as it is",
            ),
            desired("Progressing", false, "Unmanaged", ""),
            desired("Degraded", false, "Unmanaged", ""),
        ],
        Outcome::Removed => vec![
            desired(
                "Available",
                false,
                "Removed",
                "managementState is Removed: the descheduler and its soft taints are removed",
            ),
            desired("Progressing", false, "Removed", ""),
            desired("Degraded", false, "Removed", ""),
        ],
        Outcome::Superseded { by } => {
            let message =
                format!("{by} is the cluster's KubeDescheduler (the first one created): delete this one or that one");
            vec![
                desired("Available", false, "Superseded", message.clone()),
                desired("Degraded", true, "Superseded", message),
            ]
        }
    }
}

/// `current` with `wanted` merged in: a condition's transition time moves only when its status
/// does. Returns whether anything changed.
pub(crate) fn merge(
    current: &mut Vec<OperatorCondition>,
    wanted: Vec<Desired>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> bool {
    let mut changed = false;
    for want in wanted {
        let status = if want.status { "True" } else { "False" };
        let message = (!want.message.is_empty()).then_some(want.message);
        match current.iter_mut().find(|c| c.type_ == want.type_) {
            Some(existing) => {
                if existing.status != status {
                    existing.status = status.to_owned();
                    existing.last_transition_time = Some(now.clone());
                    changed = true;
                }
                if existing.reason.as_deref() != Some(want.reason) || existing.message != message {
                    existing.reason = Some(want.reason.to_owned());
                    existing.message = message;
                    changed = true;
                }
            }
            None => {
                current.push(OperatorCondition {
                    type_: want.type_.to_owned(),
                    status: status.to_owned(),
                    last_transition_time: Some(now.clone()),
                    reason: Some(want.reason.to_owned()),
                    message,
                });
                changed = true;
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(seconds).expect("valid"))
    }

    #[test]
    fn an_invalid_spec_is_degraded_and_names_the_field() {
        let outcome = Outcome::Invalid(Invalid {
            field: "spec.deschedulingIntervalSeconds",
            message: "is not set".into(),
        });
        let mut current = Vec::new();
        assert!(merge(&mut current, conditions(&outcome), &at(10)));
        let degraded = current.iter().find(|c| c.type_ == "Degraded").expect("degraded");
        assert_eq!(degraded.status, "True");
        assert!(
            degraded
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with("spec.deschedulingIntervalSeconds: is not set"))
        );
        assert!(
            current
                .iter()
                .any(|c| c.type_ == "TargetConfigControllerDegraded" && c.status == "True")
        );
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let starting = Outcome::Running {
            ready_replicas: 0,
            predictive: false,
            notes: vec![],
        };
        let mut current = Vec::new();
        merge(&mut current, conditions(&starting), &at(10));
        assert!(!merge(&mut current, conditions(&starting), &at(20)), "nothing changed");
        let running = Outcome::Running {
            ready_replicas: 1,
            predictive: true,
            notes: vec!["a note".into()],
        };
        assert!(merge(&mut current, conditions(&running), &at(30)));
        let available = current.iter().find(|c| c.type_ == "Available").expect("available");
        assert_eq!(
            (available.status.as_str(), available.last_transition_time.clone()),
            ("True", Some(at(30)))
        );
        assert!(
            available
                .message
                .as_deref()
                .is_some_and(|m| m.contains("Predictive") && m.ends_with("a note"))
        );
        let degraded = current.iter().find(|c| c.type_ == "Degraded").expect("degraded");
        assert_eq!(degraded.last_transition_time, Some(at(10)));
    }
}
