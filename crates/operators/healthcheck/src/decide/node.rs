//! What to do for one node, by its health.

use jiff::Timestamp;
use nodemedic_api::names::labels;

use super::{
    Decision, Health, HealthyDelay, Input, LeaseAction, NewRemediation, NodeFacts, RemediationFacts, Severity,
    TemplateState,
    budget::until,
    escalation::{self, LEASE_BUFFER, OVERDUE_FACTOR},
    health, liveness,
};

/// Why new remediation may be held back for every node.
pub struct Gate {
    pub paused: bool,
    pub over_budget: bool,
}

pub fn is_control_plane(node: &NodeFacts) -> bool {
    node.labels.contains_key(labels::ROLE_CONTROL_PLANE) || node.labels.contains_key(labels::ROLE_MASTER)
}

fn our_lease(input: &Input<'_>, node: &str) -> bool {
    input
        .leases
        .get(node)
        .is_some_and(|l| l.holder == input.lease_holder && l.valid_at(input.now))
}

/// Healthy again: remove its remediation objects (after `healthyDelay`), then its lease.
pub fn healthy(input: &Input<'_>, node: &NodeFacts, crs: &[&RemediationFacts], d: &mut Decision) {
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
pub fn soon(input: &Input<'_>, node: &NodeFacts, crs: &[&RemediationFacts], at: Timestamp, d: &mut Decision) {
    d.requeue(until(input.now, at));
    if !crs.is_empty() {
        d.status.unhealthy.entry(node.name.clone()).or_default();
    }
}

/// Unhealthy: start, continue or escalate its remediation.
pub fn unhealthy(
    input: &Input<'_>,
    node: &NodeFacts,
    crs: &[&RemediationFacts],
    gate: &Gate,
    newly: bool,
    control_plane_busy: &mut Vec<String>,
    d: &mut Decision,
) {
    let name = node.name.as_str();
    let now = input.now;
    d.status.unhealthy.entry(name.to_owned()).or_default();
    let skip = |d: &mut Decision, why: String| {
        if newly {
            d.notice(Some(name), Severity::Warning, "RemediationSkipped", why);
        }
    };
    match node.labels.get(labels::EXCLUDE_FROM_REMEDIATION).map(String::as_str) {
        Some("true") => {
            return skip(
                d,
                format!(
                    "Skipped remediation of node {name}: it is labelled {}=true (node maintenance)",
                    labels::EXCLUDE_FROM_REMEDIATION
                ),
            );
        }
        Some(other) if newly => d.notice(
            Some(name),
            Severity::Warning,
            "InvalidNodeLabel",
            format!(
                "Node {name} has label {} with value {other:?}; only \"true\" excludes it",
                labels::EXCLUDE_FROM_REMEDIATION
            ),
        ),
        _ => {}
    }
    let lease = input.leases.get(name).filter(|l| l.valid_at(now));
    if let Some(held) = lease.filter(|l| l.holder != input.lease_holder) {
        return skip(
            d,
            format!(
                "Skipped remediation of node {name} because node lease is already taken by {}",
                held.holder
            ),
        );
    }

    let steps = &input.check.steps;
    let mut timed_out_now = false;
    for state in escalation::states(steps, crs, now) {
        if state.done {
            continue;
        }
        if let Some(cr) = state.remediation {
            if cr.deleting {
                return;
            }
            let (current, previous) = escalation::lease_durations(steps, state.step);
            let overdue_at = match state.step.timeout {
                Some(timeout) => Some(cr.created + timeout),
                None => lease
                    .and_then(|l| l.acquired)
                    .map(|acquired| acquired + current * OVERDUE_FACTOR + previous),
            };
            let failed = state.step.timeout.is_some() && cr.succeeded == Some(false);
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
                timed_out_now = true;
                continue;
            }
            if let Some(at) = overdue_at {
                d.requeue(until(now, at));
            }
            d.leases.push(LeaseAction::Request {
                node: name.to_owned(),
                duration: current + LEASE_BUFFER,
            });
            d.requeue(current / 2);
            return;
        }
        // This step has no object yet: create it, if nothing holds remediation back.
        if gate.paused {
            return skip(
                d,
                format!(
                    "Skipped remediation of node {name}: the health check is paused ({})",
                    input.check.pause_requests.join(",")
                ),
            );
        }
        if gate.over_budget {
            d.blocked_by_budget.insert(name.to_owned());
            return;
        }
        // Before the control-plane rule: a node whose Unknown an outage may explain, or that is
        // alive, is not being remediated and must not keep another control-plane node waiting.
        if let Some(at) = deferred(input, node) {
            d.deferred.insert(name.to_owned());
            d.notice(
                Some(name),
                Severity::Normal,
                "RemediationDeferred",
                format!(
                    "Node {name} turned Unknown after the health check last heard from the API server before losing it, when no node could renew its lease: its remediation waits until {at}, a lease duration after the API answered again plus the condition's duration, in case the node renews meanwhile"
                ),
            );
            d.requeue(until(now, at));
            return;
        }
        if let Some(alive) = input.alive.get(name) {
            d.held_back_alive.insert(name.to_owned());
            d.notice(
                Some(name),
                Severity::Normal,
                "RemediationHeldBack",
                format!(
                    "Node {name} is Ready=Unknown since {}, but its kubelet renewed its node lease at {}, after that: the status is stale (as after a control-plane outage), so no remediation is created while the renewals go on",
                    alive.unknown_since, alive.renewed
                ),
            );
            d.requeue(liveness::LOOK_AGAIN);
            return;
        }
        let control_plane = is_control_plane(node);
        if control_plane && let Some(busy) = control_plane_busy.iter().find(|n| n.as_str() != name) {
            return skip(
                d,
                format!(
                    "Skipped remediation of control-plane node {name}: control-plane node {busy} is being remediated, one at a time"
                ),
            );
        }
        let Some(TemplateState::Ready {
            spec,
            multiple_templates,
        }) = input.templates.get(&state.step.template)
        else {
            return;
        };
        let template = &state.step.template;
        let namespace = template.namespace.clone().unwrap_or_default();
        let fixed_name = (!multiple_templates).then(|| name.to_owned());
        let taken = input.remediations.iter().any(|r| {
            !r.owned
                && r.id.kind == template.remediation_kind()
                && r.id.namespace == namespace
                && Some(&r.id.name) == fixed_name.as_ref()
        });
        if taken {
            return skip(
                d,
                format!(
                    "Skipped remediation of node {name}: a {} named {name} owned by someone else already exists",
                    template.remediation_kind()
                ),
            );
        }
        let (current, _) = escalation::lease_durations(steps, state.step);
        d.create.push(NewRemediation {
            node: name.to_owned(),
            template: template.clone(),
            api_version: template.api_version.clone(),
            kind: template.remediation_kind().to_owned(),
            namespace,
            name: fixed_name,
            spec: spec.clone(),
            control_plane,
        });
        d.leases.push(LeaseAction::Request {
            node: name.to_owned(),
            duration: current + LEASE_BUFFER,
        });
        if let Some(timeout) = state.step.timeout {
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
        return;
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

/// When the node's unhealthy condition counts as held for its duration, if the outage window
/// puts that later than now.
fn deferred(input: &Input<'_>, node: &NodeFacts) -> Option<Timestamp> {
    let window = input
        .outage?
        .for_node(input.kubelet_renewals.get(&node.name).copied())?;
    match health::classify(node, &input.check.rules, input.now, Some(window)) {
        Health::Soon { at } => Some(at),
        Health::Healthy | Health::Unhealthy { .. } => None,
    }
}

/// Objects of nodes that no longer exist go, unless their remediator said the node is meant to
/// disappear and has not finished yet.
pub fn orphans(input: &Input<'_>, owned: &[&RemediationFacts], d: &mut Decision) {
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
