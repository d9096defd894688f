//! The FenceAgentsRemediation reconciler: observes, asks [`fencing::next`], performs the answer,
//! and asks again until it is to wait.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceRemediationStrategy},
    names::{annotations, finalizers, taints as keys},
};
use nodemedic_kube::{taints, workloads};
use serde_json::json;

use super::{
    Context, options,
    runs::Job,
    status::{set_failed, set_step, write},
};
use crate::{
    Error, Result,
    decide::{
        fencing::{self, Decision, Facts, Step},
        parameters::{self, Action as FenceAction},
    },
};

pub async fn reconcile(far: Arc<FenceAgentsRemediation>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = far.namespace().ok_or_else(|| Error::Unnamespaced(far.name_any()))?;
    let api = Api::<FenceAgentsRemediation>::namespaced(ctx.client.clone(), &namespace);
    let name = far.name_any();
    for _ in 0..16 {
        let Some(current) = api.get_opt(&name).await? else {
            return Ok(Action::await_change());
        };
        let node = node_name(&current);
        let uid = current.uid().unwrap_or_default();
        let step = current_step(&current);
        let deleting = current.metadata.deletion_timestamp.is_some();
        let live = !deleting && !step.finished();
        let node_object = Api::<Node>::all(ctx.client.clone()).get_opt(&node).await?;
        let node_taints = node_object
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let checked = if live {
            options::for_node(&ctx.client, &ctx.agents, &namespace, &current.spec, &node).await?
        } else {
            Err("not needed".into())
        };
        let (pods, attachments) = if live && step == Step::RecoveringWorkloads {
            (
                workloads::pods(&ctx.client, &node).await?,
                workloads::attachments(&ctx.client, &node).await?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let facts = Facts {
            deleting,
            timed_out_by_health_check: current.annotations().contains_key(annotations::NHC_TIMED_OUT),
            node_exists: node_object.is_some(),
            has_finalizer: current.finalizers().iter().any(|f| f == finalizers::FAR),
            has_remediation_taint: taints::has(&node_taints, keys::FAR_KEY, "NoSchedule"),
            has_out_of_service_taint: taints::has(&node_taints, keys::OUT_OF_SERVICE_KEY, "NoExecute"),
            parameters: checked.as_ref().map(|c| c.options.action).map_err(Clone::clone),
            strategy: current.spec.remediation_strategy,
            step,
            run: ctx.runs.state(&uid),
            pods_left: pods.len(),
            attachments_left: attachments.len(),
        };
        let decision = fencing::next(&facts);
        if !matches!(decision, Decision::Idle | Decision::AwaitRun) {
            tracing::info!(remediation = %name, %node, step = step.as_str(), ?decision, "fence agents remediation");
        }
        let on = nodemedic_kube::events::reference(&current);
        let events = &ctx.events;
        let nodes = Api::<Node>::all(ctx.client.clone());
        match decision {
            Decision::Idle => return Ok(Action::await_change()),
            Decision::AwaitRun => return Ok(Action::requeue(Duration::from_secs(10))),
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
                let kept: Vec<String> = current
                    .finalizers()
                    .iter()
                    .filter(|f| *f != finalizers::FAR)
                    .cloned()
                    .collect();
                if kept.len() != current.finalizers().len() {
                    patch_finalizers(&api, &current, kept).await?;
                    events.normal(&on, "RemoveFinalizer", "removed the finalizer").await;
                }
                return Ok(Action::await_change());
            }
            Decision::AddFinalizer => {
                let mut all = current.finalizers().to_vec();
                all.push(finalizers::FAR.to_owned());
                let updated = patch_finalizers(&api, &current, all).await?;
                write(&api, &updated, |s, now| {
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
                let Ok(checked) = checked else { continue };
                let Some((action, expect)) = step.agent_action() else {
                    continue;
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
                return Ok(Action::requeue(Duration::from_secs(10)));
            }
            Decision::Advance(next) => {
                let (reason, message) = advance_reason(next, &node, facts.parameters.unwrap_or(FenceAction::Reboot));
                // Written first: a failed write must not lose the run's result.
                write(&api, &current, |s, now| set_step(s, now, next, reason, &message)).await?;
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
                let fresh: Vec<_> = attachments
                    .into_iter()
                    .filter(|va| va.metadata.deletion_timestamp.is_none())
                    .collect();
                let strategy = current.spec.remediation_strategy;
                if strategy == FenceRemediationStrategy::ResourceDeletion {
                    workloads::clear_volumes_in_use(&ctx.client, &node).await;
                    workloads::delete_attachments(&ctx.client, &fresh).await?;
                }
                if step_changed_something(&pods, &fresh, strategy) {
                    events
                        .normal(
                            &on,
                            "DeleteResources",
                            format!(
                                "{node} is powered off: deleted {} pods and {} volume attachments",
                                pods.len(),
                                if strategy == FenceRemediationStrategy::ResourceDeletion {
                                    fresh.len()
                                } else {
                                    0
                                }
                            ),
                        )
                        .await;
                }
                // What is left finishes deleting on its own (finalizers, the attach-detach
                // controller); look again shortly rather than spin.
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
            Decision::Fail { reason, message } => {
                write(&api, &current, |s, now| {
                    set_failed(s, now, step, reason.as_str(), &message)
                })
                .await?;
                ctx.runs.cancel(&uid);
                events.warning(&on, reason.as_str(), message.clone()).await;
                tracing::warn!(remediation = %name, %node, reason = reason.as_str(), %message, "fence agents remediation failed");
                ctx.metrics.finished(reason.as_str());
            }
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
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

fn current_step(far: &FenceAgentsRemediation) -> Step {
    let status = far.status.as_ref();
    if let Some(step) = status.and_then(|s| s.step.as_deref()) {
        return Step::parse(Some(step));
    }
    let condition = |type_| {
        status
            .and_then(|s| s.conditions.as_deref())
            .and_then(|c| nodemedic_kube::conditions::find(c, type_))
            .map(|c| c.status.as_str())
    };
    Step::from_conditions(
        condition(nodemedic_api::names::conditions::SUCCEEDED),
        condition(nodemedic_api::names::conditions::FENCE_AGENT_ACTION_SUCCEEDED),
    )
}

fn step_changed_something(
    pods: &[k8s_openapi::api::core::v1::Pod],
    attachments: &[k8s_openapi::api::storage::v1::VolumeAttachment],
    strategy: FenceRemediationStrategy,
) -> bool {
    pods.iter().any(|p| p.metadata.deletion_timestamp.is_none())
        || (strategy == FenceRemediationStrategy::ResourceDeletion && !attachments.is_empty())
}

/// medik8s: the node-name annotation, else the CR's name.
pub fn node_name(far: &FenceAgentsRemediation) -> String {
    far.annotations()
        .get(annotations::NODE_NAME)
        .cloned()
        .unwrap_or_else(|| far.name_any())
}

async fn patch_finalizers(
    api: &Api<FenceAgentsRemediation>,
    far: &FenceAgentsRemediation,
    all: Vec<String>,
) -> Result<FenceAgentsRemediation> {
    let patch = json!({"metadata": {"resourceVersion": far.resource_version(), "finalizers": all}});
    Ok(api
        .patch(&far.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}
