//! The NodeHealthCheck status from a decision's plan, and the decision's memory from the status.

use k8s_openapi::{
    api::core::v1::ObjectReference,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use nodemedic_api::{
    healthcheck::{NodeHealthCheckPhase, NodeHealthCheckStatus, Remediation, UnhealthyNode},
    names::conditions,
};
use nodemedic_kube::conditions::{self as cond, Desired};

use crate::decide::{Memory, Phase, RemediationFacts, StatusPlan};

pub(super) fn memory(status: Option<&NodeHealthCheckStatus>) -> Memory {
    let Some(status) = status else { return Memory::default() };
    let conds = status.conditions.clone().unwrap_or_default();
    let since_if_true = |t: &str| {
        cond::find(&conds, t)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0)
    };
    let state = |t: &str| cond::find(&conds, t).map(|c| c.status == "True");
    Memory {
        unhealthy: status
            .unhealthy_nodes
            .iter()
            .flatten()
            .map(|n| (n.name.clone(), n.conditions_healthy_timestamp.as_ref().map(|t| t.0)))
            .collect(),
        storm_since: since_if_true(conditions::STORM_ACTIVE),
        cooldown_since: since_if_true(conditions::STORM_COOLDOWN_ACTIVE),
        remediation_allowed: state(conditions::REMEDIATION_ALLOWED),
        remediation_allowed_reason: cond::find(&conds, conditions::REMEDIATION_ALLOWED).map(|c| c.reason.clone()),
        disabled: state(conditions::DISABLED),
        nodes_selected: state(conditions::NODES_SELECTED),
    }
}

fn phase(p: Phase) -> NodeHealthCheckPhase {
    match p {
        Phase::Disabled => NodeHealthCheckPhase::Disabled,
        Phase::Paused => NodeHealthCheckPhase::Paused,
        Phase::Remediating => NodeHealthCheckPhase::Remediating,
        Phase::Enabled => NodeHealthCheckPhase::Enabled,
    }
}

pub(super) fn reference(r: &RemediationFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some(r.id.api_version.clone()),
        kind: Some(r.id.kind.clone()),
        namespace: Some(r.id.namespace.clone()).filter(|n| !n.is_empty()),
        name: Some(r.id.name.clone()),
        uid: Some(r.uid.clone()),
        ..Default::default()
    }
}

/// The status the plan describes; `owned` are the check's remediation objects as they now are.
pub(super) fn build(
    plan: &StatusPlan,
    previous: Option<&NodeHealthCheckStatus>,
    owned: &[RemediationFacts],
    storm_configured: bool,
    generation: Option<i64>,
    now: &Time,
) -> NodeHealthCheckStatus {
    let mut conditions: Vec<Condition> = previous.and_then(|p| p.conditions.clone()).unwrap_or_default();
    if let Some((disabled, reason, message)) = &plan.disabled {
        cond::set(
            &mut conditions,
            Desired {
                type_: conditions::DISABLED,
                status: *disabled,
                reason,
                message: message.clone(),
            },
            generation,
            now,
        );
    }
    if let Some((selected, reason, message)) = &plan.nodes_selected {
        cond::set(
            &mut conditions,
            Desired {
                type_: conditions::NODES_SELECTED,
                status: *selected,
                reason,
                message: message.clone(),
            },
            generation,
            now,
        );
    }
    let (allowed, reason, message) = &plan.remediation_allowed;
    cond::set(
        &mut conditions,
        Desired {
            type_: conditions::REMEDIATION_ALLOWED,
            status: *allowed,
            reason,
            message: message.clone(),
        },
        generation,
        now,
    );
    if storm_configured {
        let storm = plan.storm_since.is_some();
        let cooling = plan.cooldown_since.is_some();
        let message = |on: bool, what: &str| {
            if on {
                format!("{what} since {}", now.0)
            } else {
                format!("no {what}")
            }
        };
        cond::set(
            &mut conditions,
            Desired {
                type_: conditions::STORM_ACTIVE,
                status: storm,
                reason: "HealthyNodeThresholdChange",
                message: message(storm, "storm recovery"),
            },
            generation,
            now,
        );
        cond::set(
            &mut conditions,
            Desired {
                type_: conditions::STORM_COOLDOWN_ACTIVE,
                status: cooling,
                reason: "HealthyNodeThresholdChange",
                message: message(cooling, "storm cooldown"),
            },
            generation,
            now,
        );
    } else {
        cond::remove(&mut conditions, conditions::STORM_ACTIVE);
        cond::remove(&mut conditions, conditions::STORM_COOLDOWN_ACTIVE);
    }
    let unhealthy_nodes = plan
        .unhealthy
        .iter()
        .map(|(node, entry)| {
            let mut mine: Vec<&RemediationFacts> = owned.iter().filter(|r| &r.node == node).collect();
            mine.sort_by_key(|r| r.created);
            UnhealthyNode {
                name: node.clone(),
                remediations: mine
                    .into_iter()
                    .map(|r| Remediation {
                        resource: reference(r),
                        started: Time(r.created),
                        timed_out: r.timed_out.map(Time),
                        template_name: r.template_name.clone(),
                    })
                    .collect(),
                conditions_healthy_timestamp: entry.conditions_healthy_since.map(Time),
                healthy_delayed: entry.healthy_delayed.then_some(true),
            }
        })
        .collect();
    NodeHealthCheckStatus {
        observed_nodes: Some(plan.observed as i32),
        healthy_nodes: Some(plan.healthy as i32),
        unhealthy_nodes: Some(unhealthy_nodes),
        in_flight_remediations: None,
        conditions: Some(conditions),
        phase: Some(phase(plan.phase)),
        reason: Some(plan.reason.clone()),
        last_update_time: previous.and_then(|p| p.last_update_time.clone()),
    }
}
