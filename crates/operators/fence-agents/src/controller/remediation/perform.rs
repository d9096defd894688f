//! Carrying out one decision: the only code that changes the cluster on a fence agents
//! remediation's behalf. `None` asks the reconciler to observe and decide again.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt, runtime::controller::Action};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceRemediationStrategy},
    names::{finalizers, taints as keys},
};
use nodemedic_kube::{taints, workloads};

use super::{
    super::{
        Context,
        runs::Job,
        status::{set_failed, set_step, write},
    },
    observe::Observed,
};
use crate::{
    Result,
    decide::{
        fencing::{Decision, Step},
        parameters::{self, Action as FenceAction},
    },
};

pub async fn perform(
    decision: Decision,
    seen: Observed,
    api: &Api<FenceAgentsRemediation>,
    ctx: &Context,
) -> Result<Option<Action>> {
    let Observed {
        current,
        node,
        uid,
        checked,
        pods,
        attachments,
        facts,
    } = seen;
    let name = current.name_any();
    let step = facts.step;
    let on = nodemedic_kube::events::reference(&current);
    let events = &ctx.events;
    let nodes = Api::<Node>::all(ctx.client.clone());
    match decision {
        Decision::Idle => return Ok(Some(Action::await_change())),
        Decision::AwaitRun => return Ok(Some(Action::requeue(Duration::from_secs(10)))),
        Decision::Cleanup => {
            ctx.runs.cancel(&uid);
            if current.spec.remediation_strategy == FenceRemediationStrategy::OutOfServiceTaint
                && taints::remove(&nodes, &node, keys::OUT_OF_SERVICE_KEY, "NoExecute").await?
            {
                events
                    .normal(
                        &on,
                        "RemoveOutOfServiceTaint",
                        format!("removed the out-of-service taint from {node}"),
                    )
                    .await;
            }
            if taints::remove(&nodes, &node, keys::FAR_KEY, "NoSchedule").await? {
                events
                    .normal(
                        &on,
                        "RemoveRemediationTaint",
                        format!("removed the remediation taint from {node}"),
                    )
                    .await;
            }
            if nodemedic_kube::finalizers::remove(api, &current, finalizers::FAR).await? {
                events.normal(&on, "RemoveFinalizer", "removed the finalizer").await;
            }
            return Ok(Some(Action::await_change()));
        }
        Decision::AddFinalizer => {
            let updated = nodemedic_kube::finalizers::add(api, &current, finalizers::FAR).await?;
            write(api, &updated, |s, now| {
                set_step(
                    s,
                    now,
                    Step::PoweringOff,
                    "RemediationStarted",
                    &format!("fencing node {node}"),
                )
            })
            .await?;
            events
                .normal(
                    &on,
                    "RemediationStarted",
                    format!("fencing node {node} with {}", current.spec.agent),
                )
                .await;
        }
        Decision::AddRemediationTaint => {
            let taint = taints::taint(keys::FAR_KEY, None, "NoSchedule");
            taints::add(&nodes, &node, &taint).await?;
            events
                .normal(
                    &on,
                    "AddRemediationTaint",
                    format!("tainted {node} {}:NoSchedule", keys::FAR_KEY),
                )
                .await;
        }
        Decision::Run(step) => {
            let Ok(checked) = checked else { return Ok(None) };
            let Some((action, expect)) = step.agent_action() else {
                return Ok(None);
            };
            let spec = &current.spec;
            ctx.runs.start(
                &uid,
                Job {
                    api: api.clone(),
                    name: name.clone(),
                    agent: spec.agent.clone(),
                    step,
                    action,
                    expect,
                    stdin: parameters::stdin(&checked.options, &checked.metadata, action),
                    secrets: checked
                        .options
                        .secret
                        .iter()
                        .filter_map(|k| checked.options.values.get(k).cloned())
                        .collect(),
                    attempts: spec.retrycount.max(1) as u32,
                    interval: spec.retryinterval.duration().unwrap_or(Duration::from_secs(5)),
                    timeout: spec.timeout.duration().unwrap_or(Duration::from_secs(60)),
                    recorded: current.status.as_ref().and_then(|s| s.attempts).unwrap_or(0),
                    events: ctx.events.clone(),
                    on: on.clone(),
                },
                ctx.agents.clone(),
                ctx.metrics.clone(),
            );
            events
                .normal(
                    &on,
                    "FenceAgentExecuted",
                    format!(
                        "running {} --action={action} for {node} ({}); up to {} attempts",
                        spec.agent,
                        parameters::describe(&checked.options),
                        spec.retrycount
                    ),
                )
                .await;
            return Ok(Some(Action::requeue(Duration::from_secs(10))));
        }
        Decision::Advance(next) => {
            let (reason, message) = advance_reason(next, &node, facts.parameters.unwrap_or(FenceAction::Reboot));
            // Written first: a failed write must not lose the run's result.
            write(api, &current, |s, now| set_step(s, now, next, reason, &message)).await?;
            ctx.runs.cancel(&uid);
            events.normal(&on, reason, message).await;
            if matches!(next, Step::PoweringOn | Step::Done)
                && step == Step::RecoveringWorkloads
                && let Some(created) = current.creation_timestamp()
            {
                {
                    ctx.metrics
                        .recovery_seconds
                        .observe(nodemedic_kube::time::since(&created.0, &jiff::Timestamp::now()).as_secs_f64());
                }
            }
            if next == Step::Done {
                ctx.metrics.finished("succeeded");
            }
        }
        Decision::AddOutOfServiceTaint => {
            let taint = taints::taint(keys::OUT_OF_SERVICE_KEY, Some(keys::OUT_OF_SERVICE_VALUE), "NoExecute");
            taints::add(&nodes, &node, &taint).await?;
            events
                .normal(
                    &on,
                    "AddOutOfServiceTaint",
                    format!("tainted {node} out-of-service: it is powered off"),
                )
                .await;
        }
        Decision::DeleteWorkloads => {
            // Pods are force-deleted even when already terminating: the node that would
            // finish a graceful deletion is off.
            workloads::force_delete_pods(&ctx.client, &pods).await?;
            let strategy = current.spec.remediation_strategy;
            let released = if strategy == FenceRemediationStrategy::ResourceDeletion {
                workloads::release_attachments(&ctx.client, &node, &attachments).await?
            } else {
                0
            };
            if pods.iter().any(|p| p.metadata.deletion_timestamp.is_none()) || released > 0 {
                events
                    .normal(
                        &on,
                        "DeleteResources",
                        format!(
                            "{node} is powered off: deleted {} pods and {released} volume attachments",
                            pods.len(),
                        ),
                    )
                    .await;
            }
            // What is left finishes deleting on its own (finalizers, the attach-detach
            // controller); look again shortly rather than spin.
            return Ok(Some(Action::requeue(Duration::from_secs(2))));
        }
        Decision::Fail { reason, message } => {
            write(api, &current, |s, now| {
                set_failed(s, now, step, reason.as_str(), &message)
            })
            .await?;
            ctx.runs.cancel(&uid);
            events.warning(&on, reason.as_str(), message.clone()).await;
            tracing::warn!(remediation = %name, %node, reason = reason.as_str(), %message, "fence agents remediation failed");
            ctx.metrics.finished(reason.as_str());
        }
    }
    Ok(None)
}

fn advance_reason(next: Step, node: &str, action: FenceAction) -> (&'static str, String) {
    match next {
        Step::ConfirmingOff => (
            "PowerOffRequested",
            format!("the BMC accepted powering {node} off; confirming"),
        ),
        Step::RecoveringWorkloads => (
            "FenceAgentSucceeded",
            format!("the BMC reports {node} powered off; releasing its workloads"),
        ),
        Step::PoweringOn => (
            "WorkloadsReleased",
            format!("{node}'s workloads are released; powering it on"),
        ),
        _ => (
            "RemediationFinishedSuccessfully",
            match action {
                FenceAction::Reboot => format!("{node} was power-cycled and its workloads released"),
                FenceAction::Off => format!("{node} is powered off and its workloads released"),
            },
        ),
    }
}
