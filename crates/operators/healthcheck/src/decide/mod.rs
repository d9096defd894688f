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

/// The health check's decision, step by step: which nodes it selects, whether it may act, how
/// healthy each is, whether the budget allows new remediation, what each node needs, then the
/// objects nothing selects any more and the status.
pub fn decide(input: &Input<'_>) -> Decision {
    let mut decision = Decision::default();
    // Without knowing whether a template's kind is served, the check does not know that
    // kind's remediations either: whatever it decided could undo what they do.
    if let Some(why) = kind_unknown(input) {
        decision.undecided = Some(why);
        decision.requeue(KIND_LOOK_AGAIN);
        return decision;
    }
    let selected = selected_nodes(input);
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

    let health = classify(input, &selected);
    let owned: Vec<&RemediationFacts> = input.remediations.iter().filter(|r| r.owned).collect();
    let count = budget::Count::of(input, &selected, &health, &owned);
    let storm = budget::storm(
        input.check.storm_cooldown,
        count.within_budget(),
        input.memory,
        input.now,
        &mut decision,
    );
    let gate = node::Gate {
        conflict,
        paused: !input.check.pause_requests.is_empty(),
        upgrade: upgrade::in_progress(input.upgrades, &selected, input.machines),
        over_budget: !count.within_budget() || storm.blocks,
    };
    budget::allowance(input, &count, &gate, storm, &mut decision);

    each_node(input, &selected, &health, &owned, &gate, &mut decision);
    node::orphans(input, &owned, &mut decision);
    old::flag(&owned, input.now, &mut decision);
    summarise(input, &count, storm, &owned, &gate, &mut decision);
    decision
}

/// The nodes the check's selector matches.
fn selected_nodes<'a>(input: &Input<'a>) -> Vec<&'a NodeFacts> {
    input
        .nodes
        .iter()
        .copied()
        .filter(|n| input.check.selector.matches(&n.labels))
        .collect()
}

/// Each selected node's health, by name.
fn classify<'a>(input: &Input<'_>, selected: &[&'a NodeFacts]) -> BTreeMap<&'a str, Health> {
    selected
        .iter()
        .map(|n| {
            (
                n.name.as_str(),
                health::classify(n, &input.check.rules, input.now, None),
            )
        })
        .collect()
}

/// The check's remediation objects for `node`.
fn of_node<'a>(owned: &[&'a RemediationFacts], node: &str) -> Vec<&'a RemediationFacts> {
    owned.iter().copied().filter(|r| r.node == node).collect()
}

/// What each selected node needs, by its health: its remediation removed, kept, or started,
/// continued or escalated.
fn each_node(
    input: &Input<'_>,
    selected: &[&NodeFacts],
    health: &BTreeMap<&str, Health>,
    owned: &[&RemediationFacts],
    gate: &node::Gate,
    decision: &mut Decision,
) {
    let mut control_plane_busy: Vec<String> = input
        .remediations
        .iter()
        .filter(|r| r.control_plane && !r.deleting)
        .map(|r| r.node.clone())
        .collect();
    for n in selected {
        let crs = of_node(owned, &n.name);
        match &health[n.name.as_str()] {
            Health::Healthy => node::healthy(input, n, &crs, decision),
            Health::Soon { at } => node::soon(input, n, &crs, *at, decision),
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
                node::unhealthy(input, n, &crs, gate, newly, &mut control_plane_busy, decision);
            }
        }
    }
}

/// The status once every node is decided: the budget's counts, the storm, the nodes still
/// remediated, and the phase with its reason.
fn summarise(
    input: &Input<'_>,
    count: &budget::Count,
    storm: budget::Storm,
    owned: &[&RemediationFacts],
    gate: &node::Gate,
    decision: &mut Decision,
) {
    let status = &mut decision.status;
    status.observed = count.observed;
    status.healthy = count.healthy;
    status.min_healthy = count.min_healthy;
    status.storm_since = storm.since;
    status.cooldown_since = storm.cooldown_since;
    // Objects of nodes that are no longer selected still show until they are gone.
    for cr in owned {
        status.unhealthy.entry(cr.node.clone()).or_default();
    }
    let remediating = decision
        .status
        .unhealthy
        .keys()
        .filter(|n| !of_node(owned, n).is_empty() || decision.create.iter().any(|c| &&c.node == n))
        .count();
    phase(input.check, gate, remediating, &mut decision.status);
}

/// The phase and its reason. A conflict's (said by [`enablement`]) stands; otherwise paused,
/// remediating or enabled, and a cluster upgrade under way said too.
fn phase(check: &CheckSpec, gate: &node::Gate, remediating: usize, status: &mut StatusPlan) {
    if gate.conflict.is_none() {
        (status.phase, status.reason) = if gate.paused {
            (
                Phase::Paused,
                format!("NHC is paused: {}", check.pause_requests.join(",")),
            )
        } else if remediating > 0 {
            (Phase::Remediating, format!("NHC is remediating {remediating} nodes"))
        } else {
            (Phase::Enabled, "NHC is enabled, no ongoing remediation".into())
        };
    }
    if gate.upgrade.is_some() && status.phase != Phase::Paused {
        status
            .reason
            .push_str("; new remediations wait for the cluster upgrade to end");
    }
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

/// How soon a check whose template kind's discovery failed is decided again: the kind is looked
/// up at every reconcile, and the API server that failed it is starting or back.
pub(crate) const KIND_LOOK_AGAIN: Duration = Duration::from_secs(2);

/// Why whether a referenced template's kind is served is not known (its discovery failed), if it
/// is not. The check then decides nothing (neither disabled nor enabled, nothing created or
/// removed, its status as it was): a 403 or a refused connection while the API server starts says
/// nothing of the kind, and the kind's remediations are not known either.
fn kind_unknown(input: &Input<'_>) -> Option<String> {
    input
        .check
        .steps
        .iter()
        .find_map(|step| match input.templates.get(&step.template) {
            Some(TemplateState::KindUnknown(why)) => Some(format!("template {}: {why}", step.template)),
            _ => None,
        })
}

/// A referenced template that is missing or unusable disables the check.
fn template_problem(input: &Input<'_>) -> Option<(&'static str, String)> {
    for step in &input.check.steps {
        match input.templates.get(&step.template) {
            // Never here: `decide` stops first (see [`kind_unknown`]).
            Some(TemplateState::Ready { .. } | TemplateState::KindUnknown(_)) => {}
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
