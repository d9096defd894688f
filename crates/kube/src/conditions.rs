//! Status conditions, set the way Kubernetes API conventions ask: the transition time moves only
//! when the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use nodemedic_api::names::conditions::{PROCESSING, SUCCEEDED};

/// The desired state of one condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired<'a> {
    pub type_: &'a str,
    pub status: bool,
    pub reason: &'a str,
    pub message: String,
}

pub fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Sets `desired` in `conditions`; returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, desired: Desired<'_>, generation: Option<i64>, now: &Time) -> bool {
    set_status(
        conditions,
        desired.type_,
        status_str(desired.status),
        desired.reason,
        desired.message,
        generation,
        now,
    )
}

/// Like [`set`] with a free-form status ("Unknown" included).
pub fn set_status(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let changed = existing.status != status
                || existing.reason != reason
                || existing.message != message
                || existing.observed_generation != generation;
            if existing.status != status {
                existing.last_transition_time = now.clone();
            }
            existing.status = status.to_owned();
            existing.reason = reason.to_owned();
            existing.message = message;
            existing.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
                observed_generation: generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

/// A remediator's medik8s signal while it works: `Processing=True`, `Succeeded=Unknown`, both with
/// `reason` and `why`. Returns whether anything changed.
pub fn set_processing(conditions: &mut Vec<Condition>, reason: &str, why: &str, now: &Time) -> bool {
    let a = set_status(conditions, PROCESSING, "True", reason, why.to_owned(), None, now);
    let b = set_status(conditions, SUCCEEDED, "Unknown", reason, why.to_owned(), None, now);
    a | b
}

/// A remediator's medik8s signal once it ends: `Processing=False`, `Succeeded` as `ok` says
/// (False lets a health check escalate), both with `reason` and `why`.
pub fn set_finished(conditions: &mut Vec<Condition>, ok: bool, reason: &str, why: &str, now: &Time) -> bool {
    let a = set_status(conditions, PROCESSING, "False", reason, why.to_owned(), None, now);
    let b = set_status(conditions, SUCCEEDED, status_str(ok), reason, why.to_owned(), None, now);
    a | b
}

pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

pub fn is_false(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "False")
}

pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).expect("valid"))
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut c = Vec::new();
        let desired = |status, msg: &str| Desired {
            type_: "Ready",
            status,
            reason: "R",
            message: msg.into(),
        };
        assert!(set(&mut c, desired(true, "a"), Some(1), &at(10)));
        assert!(set(&mut c, desired(true, "b"), Some(1), &at(20)));
        assert_eq!(c[0].last_transition_time, at(10));
        assert!(!set(&mut c, desired(true, "b"), Some(1), &at(30)));
        assert!(set(&mut c, desired(false, "b"), Some(1), &at(40)));
        assert_eq!(c[0].last_transition_time, at(40));
        assert!(is_false(&c, "Ready"));
    }
}
