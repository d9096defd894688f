//! A remediation still there two days after it was created is flagged, as medik8s flags it (the
//! annotation `nodehealthcheck.medik8s.io/old-remediation-cr-flag` and the counter
//! `nodehealthcheck_old_remediation_cr`): a node that neither recovers nor gets replaced for that
//! long needs a person, and an alert on the counter finds one.

use std::time::Duration;

use super::{Decision, RemediationFacts, Severity, budget::until};

/// How long a remediation may exist before it is flagged (medik8s's).
pub(crate) const OLD_AFTER: Duration = Duration::from_secs(48 * 3600);

/// Flags the check's remediations older than [`OLD_AFTER`] (each once), and looks again when the
/// next one comes of age.
pub(super) fn flag(owned: &[&RemediationFacts], now: jiff::Timestamp, d: &mut Decision) {
    for cr in owned.iter().filter(|c| !c.deleting && !c.flagged_old) {
        let of_age = cr.created + OLD_AFTER;
        if now < of_age {
            d.requeue(until(now, of_age));
            continue;
        }
        d.flag_old.push(cr.id.clone());
        d.notice(
            Some(&cr.node),
            Severity::Warning,
            "OldRemediation",
            format!(
                "{} for node {} was created at {} and is still there after 48 h: the node has neither recovered nor been replaced; look at its remediator's status",
                cr.id, cr.node, cr.created
            ),
        );
    }
}
