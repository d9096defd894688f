//! The health check's decisions, as one pure function: given the nodes, the spec, the existing
//! remediation objects, the node leases, the templates and the time, which remediation objects
//! to create, escalate and delete, and what the status says. No I/O.

pub(crate) mod admission;
mod budget;
pub mod conflict;
mod escalation;
mod health;
mod holdback;
pub(crate) mod liveness;
pub(crate) mod model;
mod node;
mod old;
pub mod outage;
pub mod selection;
#[cfg(test)]
mod test_time;
#[cfg(test)]
mod tests;
pub mod upgrade;

use std::{collections::BTreeMap, time::Duration};

use kube::core::SelectorExt;
pub use model::*;

pub use self::health::Health;

/// Template kinds whose remediations may have generated names whatever their annotations say:
/// medik8s's webhook annotates every self-remediation template so, and nodemedic's self
/// remediation reads its node from the node-name annotation. A user's own template of the kind
/// escalates beside the default one.
pub(crate) const ESCALATION_CAPABLE: [&str; 1] = ["SelfNodeRemediationTemplate"];

/// The `Disabled` reason while a MachineHealthCheck covers a node the check selects (medik8s's).
pub(crate) const CONFLICTING_MHC: &str = "ConflictingMachineHealthCheckDetected";

/// The `RemediationAllowed` reason while a cluster upgrade postpones new remediation.
pub(crate) const UPGRADING: &str = "ClusterUpgrading";

/// While a template is missing, look again this often (its kind may not be served, so there is
/// nothing to watch).
pub(crate) const TEMPLATE_RETRY: Duration = Duration::from_secs(15);

pub fn decide(input: &Input<'_>) -> Decision {
    let mut decision = Decision::default();
    let check = input.check;
    let selected: Vec<&NodeFacts> = input
        .nodes
        .iter()
        .copied()
        .filter(|n| check.selector.matches(&n.labels))
        .collect();
    // Said even when a template is missing too: a seed manifest applied unchanged has both.
    selection::report(input, selected.len(), &mut decision);
    // Also while disabled: the observed-nodes gauge an alert reads must not say 0 for a check
    // that does select nodes.
    decision.status.observed = selected.len();
    let conflict = match enablement(input, &selected, &mut decision) {
        Enablement::Disabled => return decision,
        Enablement::Conflict(why) => Some(why),
        Enablement::Enabled => None,
    };

    let health: BTreeMap<&str, Health> = selected
        .iter()
        .map(|n| (n.name.as_str(), health::classify(n, &check.rules, input.now, None)))
        .collect();
    let owned: Vec<&RemediationFacts> = input.remediations.iter().filter(|r| r.owned).collect();
    let owned_by_node = |node: &str| owned.iter().copied().filter(|r| r.node == node).collect::<Vec<_>>();

    // Budget: healthy means no unhealthy condition at all (not even a pending one) and no
    // remediation object left.
    let observed = selected.len();
    let healthy = selected
        .iter()
        .filter(|n| health[n.name.as_str()] == Health::Healthy && owned_by_node(&n.name).is_empty())
        .count();
    let unhealthy = selected
        .iter()
        .filter(|n| matches!(health[n.name.as_str()], Health::Unhealthy { .. }))
        .count();
    let min_healthy = check.budget.min_healthy(observed);
    let within_budget = healthy >= min_healthy;
    let storm = budget::storm(
        check.storm_cooldown,
        within_budget,
        input.memory,
        input.now,
        &mut decision,
    );
    let budget_text = format!(
        "{healthy} of {observed} selected nodes are healthy and {unhealthy} unhealthy; {} requires at least {min_healthy} healthy",
        check.budget.describe()
    );
    let upgrade = upgrade::in_progress(input.upgrades, &selected, input.machines);
    decision.status.remediation_allowed = if let Some(why) = &conflict {
        (
            false,
            CONFLICTING_MHC,
            format!("No new remediation: {why}; remediations under way go on"),
        )
    } else if let Some(upgrade::Hold { why, .. }) = &upgrade {
        (
            false,
            UPGRADING,
            format!(
                "No new remediation while the cluster upgrades ({why}); remediations under way go on. {budget_text}"
            ),
        )
    } else if !within_budget {
        (
            false,
            "TooFewHealthyNodes",
            format!("No new remediation: {budget_text}"),
        )
    } else if storm.blocks {
        (
            false,
            "StormRecovery",
            format!("No new remediation until the storm cooldown ends: {budget_text}"),
        )
    } else {
        (true, "WithinBudget", format!("Remediation allowed: {budget_text}"))
    };
    if !within_budget && input.memory.remediation_allowed != Some(false) {
        decision.notice(
            None,
            Severity::Warning,
            "RemediationSkipped",
            format!("Skipped remediation because the number of healthy nodes selected by the selector is {healthy} and should equal or exceed {min_healthy} ({budget_text})"),
        );
    }

    if let Some(upgrade::Hold { why, .. }) = &upgrade
        && input.memory.remediation_allowed_reason.as_deref() != Some(UPGRADING)
    {
        decision.notice(
            None,
            Severity::Normal,
            "RemediationSkipped",
            format!("Postponing potential remediations because of ongoing cluster upgrade: {why}"),
        );
    }

    let gate = node::Gate {
        conflict: conflict.clone(),
        paused: !check.pause_requests.is_empty(),
        upgrade: upgrade.clone(),
        over_budget: !within_budget || storm.blocks,
    };
    let mut control_plane_busy: Vec<String> = input
        .remediations
        .iter()
        .filter(|r| r.control_plane && !r.deleting)
        .map(|r| r.node.clone())
        .collect();
    for n in &selected {
        let crs = owned_by_node(&n.name);
        match &health[n.name.as_str()] {
            Health::Healthy => node::healthy(input, n, &crs, &mut decision),
            Health::Soon { at } => node::soon(input, n, &crs, *at, &mut decision),
            Health::Unhealthy { type_, status, since } => {
                let newly = !input.memory.unhealthy.contains_key(&n.name);
                if newly {
                    decision.notice(
                        Some(&n.name),
                        Severity::Normal,
                        "DetectedUnhealthy",
                        format!("Node matches unhealthy condition. Node {:?}, condition type {type_:?}, condition status {status:?} since {since}", n.name),
                    );
                }
                node::unhealthy(input, n, &crs, &gate, newly, &mut control_plane_busy, &mut decision);
            }
        }
    }
    node::orphans(input, &owned, &mut decision);
    old::flag(&owned, input.now, &mut decision);

    let status = &mut decision.status;
    status.observed = observed;
    status.healthy = healthy;
    status.min_healthy = min_healthy;
    status.storm_since = storm.since;
    status.cooldown_since = storm.cooldown_since;
    // Objects of nodes that are no longer selected still show until they are gone.
    for cr in &owned {
        status.unhealthy.entry(cr.node.clone()).or_default();
    }
    let remediating = status
        .unhealthy
        .keys()
        .filter(|n| !owned_by_node(n).is_empty() || decision.create.iter().any(|c| &&c.node == n))
        .count();
    let status = &mut decision.status;
    (status.phase, status.reason) = if conflict.is_some() {
        (status.phase, std::mem::take(&mut status.reason))
    } else if gate.paused {
        (
            Phase::Paused,
            format!("NHC is paused: {}", check.pause_requests.join(",")),
        )
    } else if remediating > 0 {
        (Phase::Remediating, format!("NHC is remediating {remediating} nodes"))
    } else {
        (Phase::Enabled, "NHC is enabled, no ongoing remediation".into())
    };
    if upgrade.is_some() && status.phase != Phase::Paused {
        status
            .reason
            .push_str("; new remediations wait for the cluster upgrade to end");
    }
    decision
}

enum Enablement {
    /// A template is missing or unusable: nothing is done.
    Disabled,
    /// A MachineHealthCheck covers a selected node: no new remediation, those under way go on.
    Conflict(String),
    Enabled,
}

/// Whether the check may act, with its `Disabled` condition and the events when that changes.
fn enablement(input: &Input<'_>, selected: &[&NodeFacts], decision: &mut Decision) -> Enablement {
    let conflict = conflict::conflicting(input.machine_health_checks, input.machines, selected);
    let problem = template_problem(input);
    let disabled = problem
        .clone()
        .or_else(|| conflict.clone().map(|why| (CONFLICTING_MHC, why)));
    let Some((reason, message)) = disabled else {
        if input.memory.disabled == Some(true) {
            decision.notice(
                None,
                Severity::Normal,
                "Enabled",
                "No issues found, NodeHealthCheck is enabled.".into(),
            );
        }
        decision.status.disabled = Some((
            false,
            "NodeHealthCheckEnabled",
            "No issues found, NodeHealthCheck is enabled.".into(),
        ));
        return Enablement::Enabled;
    };
    if input.memory.disabled != Some(true) {
        decision.notice(None, Severity::Warning, "Disabled", message.clone());
    }
    decision.status.phase = Phase::Disabled;
    decision.status.reason = format!("NHC is disabled: {reason}: {message}");
    decision.status.disabled = Some((true, reason, message.clone()));
    decision.status.remediation_allowed = (false, "Disabled", "the health check is disabled".into());
    if problem.is_some() {
        decision.requeue(TEMPLATE_RETRY);
        return Enablement::Disabled;
    }
    Enablement::Conflict(message)
}

/// A referenced template that is missing or unusable disables the check.
fn template_problem(input: &Input<'_>) -> Option<(&'static str, String)> {
    for step in &input.check.steps {
        match input.templates.get(&step.template) {
            Some(TemplateState::Ready { .. }) => {}
            Some(TemplateState::KindMissing) => {
                return Some((
                    "RemediationTemplateNotFound",
                    format!(
                        "remediation template {} not found: the kind {} is not served in this cluster (is its remediator installed?)",
                        step.template, step.template.kind
                    ),
                ));
            }
            Some(TemplateState::NotFound) | None => {
                return Some((
                    "RemediationTemplateNotFound",
                    format!("remediation template {} not found", step.template),
                ));
            }
            Some(TemplateState::Invalid(why)) => {
                return Some((
                    "RemediationTemplateInvalid",
                    format!("remediation template {} is invalid: {why}", step.template),
                ));
            }
        }
    }
    // Two steps of one kind would create objects with the same name unless the templates ask for
    // generated names (or their remediator reads the node from the annotation, as nodemedic's
    // self remediation does).
    let steps = &input.check.steps;
    for (i, a) in steps.iter().enumerate() {
        for b in &steps[i + 1..] {
            let multiple = |t: &TemplateRef| {
                ESCALATION_CAPABLE.contains(&t.kind.as_str())
                    || matches!(
                        input.templates.get(t),
                        Some(TemplateState::Ready {
                            multiple_templates: true,
                            ..
                        })
                    )
            };
            if a.template.kind == b.template.kind && !(multiple(&a.template) && multiple(&b.template)) {
                return Some((
                    "RemediationTemplateInvalid",
                    format!(
                        "escalatingRemediations use kind {} twice ({} and {}); templates of a kind used more than once need the remediation.medik8s.io/multiple-templates-support annotation",
                        a.template.kind, a.template.name, b.template.name
                    ),
                ));
            }
        }
    }
    None
}
