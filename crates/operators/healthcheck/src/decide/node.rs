//! What to do for one node, by its health.

use jiff::Timestamp;
use nodemedic_api::names::labels;

use super::{
    Decision, HealthyDelay, Input, LeaseAction, NewRemediation, NodeFacts, RemediationFacts, Severity, TemplateState,
    budget::until,
    escalation::{self, LEASE_BUFFER, OVERDUE_FACTOR},
    holdback::{self, Candidate},
    model::Step,
};

pub(super) use super::holdback::{Gate, is_control_plane};

fn our_lease(input: &Input<'_>, node: &str) -> bool {
    input
        .leases
        .get(node)
        .is_some_and(|l| l.holder == input.lease_holder && l.valid_at(input.now))
}

/// Healthy again: remove its remediation objects (after `healthyDelay`), then its lease.
pub(super) fn healthy(input: &Input<'_>, node: &NodeFacts, crs: &[&RemediationFacts], d: &mut Decision) {
    let now = input.now;
    if crs.is_empty() {
        if our_lease(input, &node.name) {
            d.leases.push(LeaseAction::Release {
                node: node.name.clone(),
            });
        }
        if node.confirmed_healthy {
            d.clear_confirmation.push(node.name.clone());
        }
        return;
    }
    let since = input.memory.unhealthy.get(&node.name).copied().flatten().unwrap_or(now);
    let mut delayed = false;
    for cr in crs.iter().filter(|c| !c.deleting) {
        let remove = match (node.confirmed_healthy, input.check.healthy_delay) {
            (true, _) | (false, HealthyDelay::None) => true,
            (false, HealthyDelay::Never) => false,
            (false, HealthyDelay::After(delay)) => match cr.healthy_since {
                None => {
                    d.mark_healthy_since.push(cr.id.clone());
                    d.requeue(delay);
                    false
                }
                Some(start) if now >= start + delay => true,
                Some(start) => {
                    d.requeue(until(now, start + delay));
                    false
                }
            },
        };
        if remove {
            d.delete.push(cr.id.clone());
            d.notice(
                Some(&node.name),
                Severity::Normal,
                "RemediationRemoved",
                format!("Deleted {} for node {}: it is healthy again", cr.id, node.name),
            );
        } else {
            delayed = true;
        }
    }
    let entry = d.status.unhealthy.entry(node.name.clone()).or_default();
    entry.conditions_healthy_since = Some(since);
    entry.healthy_delayed = delayed;
}

/// Unhealthy condition present but not yet for its duration: keep what exists (a rebooting node
/// passes through such states) and look again when it expires.
pub(super) fn soon(input: &Input<'_>, node: &NodeFacts, crs: &[&RemediationFacts], at: Timestamp, d: &mut Decision) {
    d.requeue(until(input.now, at));
    if !crs.is_empty() {
        d.status.unhealthy.entry(node.name.clone()).or_default();
    }
}

/// Unhealthy: start, continue or escalate its remediation, unless a hold-back rule holds.
pub(super) fn unhealthy(
    input: &Input<'_>,
    node: &NodeFacts,
    crs: &[&RemediationFacts],
    gate: &Gate,
    newly: bool,
    control_plane_busy: &mut Vec<String>,
    d: &mut Decision,
) {
    let name = node.name.as_str();
    d.status.unhealthy.entry(name.to_owned()).or_default();
    if newly {
        warn_of_an_invalid_exclusion_label(node, d);
    }
    if let Some(hold) = holdback::for_node(input, node) {
        return holdback::record(hold, name, newly, input.now, d);
    }
    let mut timed_out_now = false;
    for state in escalation::states(&input.check.steps, crs, input.now) {
        if state.done {
            continue;
        }
        let Some(cr) = state.remediation else {
            // This step has no object yet: create it, if nothing holds remediation back.
            let candidate = Candidate {
                input,
                node,
                gate,
                step: state.step,
                control_plane_busy: control_plane_busy.as_slice(),
            };
            match holdback::for_creation(&candidate) {
                Some(hold) => holdback::record(hold, name, newly, input.now, d),
                None => create(input, node, state.step, control_plane_busy, d),
            }
            return;
        };
        match go_on(input, name, cr, state.step, d) {
            Progress::TimedOut => timed_out_now = true,
            Progress::UnderWay => return,
        }
    }
    if timed_out_now {
        d.notice(
            Some(name),
            Severity::Warning,
            "NoTemplateLeft",
            format!("Remediation of node {name} timed out, and no template left to try"),
        );
    }
}

/// Only "true" excludes a node: any other value is said, once, to be ignored.
fn warn_of_an_invalid_exclusion_label(node: &NodeFacts, d: &mut Decision) {
    match node.labels.get(labels::EXCLUDE_FROM_REMEDIATION).map(String::as_str) {
        None | Some("true") => {}
        Some(other) => d.notice(
            Some(&node.name),
            Severity::Warning,
            "InvalidNodeLabel",
            format!(
                "Node {} has label {} with value {other:?}; only \"true\" excludes it",
                node.name,
                labels::EXCLUDE_FROM_REMEDIATION
            ),
        ),
    }
}

/// Where an existing remediation object stands.
enum Progress {
    /// Timed out or failed: the next step escalates.
    TimedOut,
    /// Being deleted, or still working: the lease is kept and nothing else is done.
    UnderWay,
}

/// An existing remediation: marked timed out when it failed or is overdue, else its lease kept.
fn go_on(input: &Input<'_>, name: &str, cr: &RemediationFacts, step: &Step, d: &mut Decision) -> Progress {
    if cr.deleting {
        return Progress::UnderWay;
    }
    let now = input.now;
    let steps = &input.check.steps;
    let lease = input.leases.get(name).filter(|l| l.valid_at(now));
    let (current, previous) = escalation::lease_durations(steps, step);
    let overdue_at = match step.timeout {
        Some(timeout) => Some(cr.created + timeout),
        None => lease
            .and_then(|l| l.acquired)
            .map(|acquired| acquired + current * OVERDUE_FACTOR + previous),
    };
    let failed = step.timeout.is_some() && cr.succeeded == Some(false);
    if failed || overdue_at.is_some_and(|at| now >= at) {
        if cr.timed_out.is_none() && cr.succeeded != Some(true) {
            d.mark_timed_out.push(cr.id.clone());
        }
        let why = if failed {
            "reported Succeeded=False"
        } else {
            "timed out"
        };
        d.notice(
            Some(name),
            Severity::Warning,
            "RemediationTimedOut",
            format!("{} for node {name} {why}", cr.id),
        );
        return Progress::TimedOut;
    }
    if let Some(at) = overdue_at {
        d.requeue(until(now, at));
    }
    d.leases.push(LeaseAction::Request {
        node: name.to_owned(),
        duration: current + LEASE_BUFFER,
    });
    d.requeue(current / 2);
    Progress::UnderWay
}

/// Creates the step's remediation object (its template is ready: a hold-back rule checked) and
/// takes the node's lease for it.
fn create(input: &Input<'_>, node: &NodeFacts, step: &Step, control_plane_busy: &mut Vec<String>, d: &mut Decision) {
    let Some(TemplateState::Ready {
        spec,
        multiple_templates,
    }) = input.templates.get(&step.template)
    else {
        return;
    };
    let name = node.name.as_str();
    let template = &step.template;
    let control_plane = is_control_plane(node);
    let (current, _) = escalation::lease_durations(&input.check.steps, step);
    d.create.push(NewRemediation {
        node: name.to_owned(),
        template: template.clone(),
        api_version: template.api_version.clone(),
        kind: template.remediation_kind().to_owned(),
        namespace: template.namespace.clone().unwrap_or_default(),
        name: (!multiple_templates && !shares_its_kind(input, template)).then(|| name.to_owned()),
        spec: spec.clone(),
        control_plane,
    });
    d.leases.push(LeaseAction::Request {
        node: name.to_owned(),
        duration: current + LEASE_BUFFER,
    });
    if let Some(timeout) = step.timeout {
        d.requeue(timeout);
    }
    d.requeue(current / 2);
    if control_plane {
        control_plane_busy.push(name.to_owned());
    }
    d.notice(
        Some(name),
        Severity::Normal,
        "RemediationCreated",
        format!("Created remediation object for node {name} from {template}"),
    );
}

/// Another step of the check uses the template's kind: fixed names would collide (only
/// escalation-capable kinds get this far, see `template_problem`).
pub(super) fn shares_its_kind(input: &Input<'_>, template: &super::TemplateRef) -> bool {
    input
        .check
        .steps
        .iter()
        .filter(|s| s.template.kind == template.kind)
        .count()
        > 1
}

/// Objects of nodes that no longer exist go, unless their remediator said the node is meant to
/// disappear and has not finished yet.
pub(super) fn orphans(input: &Input<'_>, owned: &[&RemediationFacts], d: &mut Decision) {
    let existing: std::collections::BTreeSet<&str> = input.nodes.iter().map(|n| n.name.as_str()).collect();
    for cr in owned
        .iter()
        .filter(|c| !c.deleting && !existing.contains(c.node.as_str()))
    {
        if cr.permanent_node_deletion_expected && cr.succeeded != Some(true) {
            continue;
        }
        d.delete.push(cr.id.clone());
        d.notice(
            None,
            Severity::Normal,
            "RemediationRemoved",
            format!("Deleted {}: its node {} no longer exists", cr.id, cr.node),
        );
    }
}
