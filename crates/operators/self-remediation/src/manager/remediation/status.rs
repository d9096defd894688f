//! Status edits: medik8s's Processing/Succeeded pair and nodemedic's own conditions.

use nodemedic_api::self_remediation::SelfNodeRemediationStatus;
use nodemedic_kube::conditions;

pub(super) fn condition(
    s: &mut SelfNodeRemediationStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
) -> bool {
    let list = s.conditions.get_or_insert_with(Vec::new);
    conditions::set(
        list,
        conditions::Desired {
            type_,
            status,
            reason,
            message,
        },
        None,
        now,
    )
}

pub(super) fn processing(
    s: &mut SelfNodeRemediationStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    why: &str,
) -> bool {
    conditions::set_processing(
        s.conditions.get_or_insert_with(Vec::new),
        "RemediationStarted",
        why,
        now,
    )
}

pub(super) fn finished(
    s: &mut SelfNodeRemediationStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    ok: bool,
    reason: &str,
    why: &str,
) -> bool {
    let changed = conditions::set_finished(s.conditions.get_or_insert_with(Vec::new), ok, reason, why, now);
    let error = (!ok).then(|| why.to_owned());
    let error_changed = s.last_error != error;
    s.last_error = error;
    changed | error_changed
}
