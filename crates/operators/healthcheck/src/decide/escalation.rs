//! Where a node's remediation stands in the template chain.

use std::time::Duration;

use jiff::Timestamp;

use super::model::{RemediationFacts, Step};

/// A remediation with no timeout of its own is declared overdue after this many times the default
/// duration (medik8s: 3 × 10 min), and its node lease released.
pub(crate) const DEFAULT_REMEDIATION_DURATION: Duration = Duration::from_secs(600);
pub(super) const OVERDUE_FACTOR: u32 = 3;
pub(super) const LEASE_BUFFER: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct StepState<'a> {
    pub step: &'a Step,
    pub remediation: Option<&'a RemediationFacts>,
    /// Timed out (annotated, or its timeout passed after it reported success).
    pub done: bool,
}

pub(super) fn belongs_to(cr: &RemediationFacts, step: &Step) -> bool {
    cr.id.kind == step.template.remediation_kind()
        && cr.id.api_version == step.template.api_version
        && step
            .template
            .namespace
            .as_deref()
            .is_none_or(|ns| ns == cr.id.namespace)
        && cr.template_name.as_deref().is_none_or(|t| t == step.template.name)
}

/// The steps in order, each with its remediation object (if created) and whether it is over.
pub(super) fn states<'a>(
    steps: &'a [Step],
    remediations: &[&'a RemediationFacts],
    now: Timestamp,
) -> Vec<StepState<'a>> {
    let mut ordered: Vec<&Step> = steps.iter().collect();
    ordered.sort_by_key(|s| s.order);
    ordered
        .into_iter()
        .map(|step| {
            let remediation = remediations.iter().copied().find(|cr| belongs_to(cr, step));
            let done = remediation.is_some_and(|cr| {
                cr.timed_out.is_some()
                    || (cr.succeeded == Some(true) && step.timeout.is_some_and(|t| now >= cr.created + t))
            });
            StepState {
                step,
                remediation,
                done,
            }
        })
        .collect()
}

/// How long the node lease is asked for while this step runs, and the total time the steps
/// before it had.
pub(super) fn lease_durations(steps: &[Step], current: &Step) -> (Duration, Duration) {
    let this = current.timeout.unwrap_or(DEFAULT_REMEDIATION_DURATION);
    let previous = steps
        .iter()
        .filter(|s| s.order < current.order)
        .filter_map(|s| s.timeout)
        .sum();
    (this, previous)
}
