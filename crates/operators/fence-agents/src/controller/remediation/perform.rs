//! Carrying out one decision: the only code that changes the cluster on a fence agents
//! remediation's behalf. The status edit and events each decision returns are the step runner's
//! to write and publish.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceRemediationStrategy},
    names::{finalizers, taints as keys},
};
use nodemedic_kube::{events::Note, steps::Outcome, taints, workloads};

use super::{
    super::{
        Context,
        runs::Job,
        status::{set_failed, set_step},
    },
    observe::Observed,
};
use crate::{
    Result,
    decide::{
        fencing::{Decision, FailureReason, Step},
        parameters::{self, Action as FenceAction},
    },
};

/// Carries out `decision`, each kind by its own function below.
pub(super) async fn perform<'a>(
    decision: Decision,
    seen: &'a Observed,
    api: &'a Api<FenceAgentsRemediation>,
    ctx: &'a Context,
) -> Result<Outcome<'a, Context>> {
    Ok(match decision {
        Decision::Idle => Outcome::await_change(),
        Decision::WaitForSecret(why) => wait_for_secret(why, seen),
        Decision::AwaitRun => Outcome::requeue(Duration::from_secs(10)),
        Decision::Cleanup => cleanup(seen, api, ctx).await?,
        Decision::AddFinalizer => add_finalizer(seen, api).await?,
        Decision::AddRemediationTaint => add_remediation_taint(seen, ctx).await?,
        Decision::Run(step) => run(step, seen, api, ctx),
        Decision::Advance(next) => advance(next, seen, ctx),
        Decision::AddOutOfServiceTaint => add_out_of_service_taint(seen, ctx).await?,
        Decision::DeleteWorkloads => delete_workloads(seen, ctx).await?,
        Decision::Fail { reason, message } => fail(reason, message, seen, ctx),
    })
}

/// How often a remediation waiting for its Secret looks again (Secrets are not watched).
const SECRET_RETRY: Duration = Duration::from_secs(10);
const WAITING_FOR_SECRET: &str = "WaitingForSecret";

/// Says once (the condition's reason changes, an event) that the remediation waits for a
/// Secret, and looks again.
fn wait_for_secret<'a>(why: String, seen: &Observed) -> Outcome<'a, Context> {
    let message = format!("{why}; nothing is done to the node until it exists");
    let told = seen
        .current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| nodemedic_kube::conditions::find(c, nodemedic_api::names::conditions::PROCESSING))
        .is_some_and(|c| c.reason == WAITING_FOR_SECRET && c.message == message);
    let step = seen.facts.step;
    let outcome = Outcome::requeue(SECRET_RETRY);
    if told {
        return outcome;
    }
    let note = Note::warning("SecretMissing", message.clone());
    outcome
        .status(move |s, now| set_step(s, now, step, WAITING_FOR_SECRET, &message))
        .event(note)
}

/// Undoes what the remediation did to the node, then lets it go.
async fn cleanup<'a>(
    seen: &Observed,
    api: &Api<FenceAgentsRemediation>,
    ctx: &'a Context,
) -> Result<Outcome<'a, Context>> {
    let node = seen.node.as_str();
    let nodes = Api::<Node>::all(ctx.client.clone());
    ctx.runs.cancel(&seen.uid);
    let mut outcome = Outcome::await_change();
    if seen.current.spec.remediation_strategy == FenceRemediationStrategy::OutOfServiceTaint
        && taints::remove(&nodes, node, keys::OUT_OF_SERVICE_KEY, "NoExecute").await?
    {
        outcome = outcome.event(Note::normal(
            "RemoveOutOfServiceTaint",
            format!("removed the out-of-service taint from {node}"),
        ));
    }
    if taints::remove(&nodes, node, keys::FAR_KEY, "NoSchedule").await? {
        outcome = outcome.event(Note::normal(
            "RemoveRemediationTaint",
            format!("removed the remediation taint from {node}"),
        ));
    }
    if nodemedic_kube::finalizers::remove(api, &seen.current, finalizers::FAR).await? {
        outcome = outcome.event(Note::normal("RemoveFinalizer", "removed the finalizer"));
    }
    Ok(outcome)
}

/// Takes the remediation on (its finalizer lets it go only once what it did to the node is undone,
/// [`cleanup`]) and starts powering the node off.
async fn add_finalizer<'a>(seen: &Observed, api: &Api<FenceAgentsRemediation>) -> Result<Outcome<'a, Context>> {
    let node = seen.node.as_str();
    let updated = nodemedic_kube::finalizers::add(api, &seen.current, finalizers::FAR).await?;
    let why = format!("fencing node {node}");
    Ok(Outcome::again()
        .status_of(updated, move |s, now| {
            set_step(s, now, Step::PoweringOff, "RemediationStarted", &why)
        })
        .event(Note::normal(
            "RemediationStarted",
            format!("fencing node {node} with {}", seen.current.spec.agent),
        )))
}

/// Keeps new pods off the node while it is fenced.
async fn add_remediation_taint<'a>(seen: &Observed, ctx: &Context) -> Result<Outcome<'a, Context>> {
    let node = seen.node.as_str();
    let nodes = Api::<Node>::all(ctx.client.clone());
    taints::add(&nodes, node, &taints::taint(keys::FAR_KEY, None, "NoSchedule")).await?;
    Ok(Outcome::again().event(Note::normal(
        "AddRemediationTaint",
        format!("tainted {node} {}:NoSchedule", keys::FAR_KEY),
    )))
}

/// Starts the agent run for `step` in the background; its result comes back as an observation.
fn run<'a>(step: Step, seen: &Observed, api: &Api<FenceAgentsRemediation>, ctx: &'a Context) -> Outcome<'a, Context> {
    let Ok(checked) = &seen.checked else {
        return Outcome::again();
    };
    let Some((action, expect)) = step.agent_action() else {
        return Outcome::again();
    };
    let spec = &seen.current.spec;
    ctx.runs.start(
        &seen.uid,
        Job {
            api: api.clone(),
            name: seen.current.name_any(),
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
            recorded: seen.current.status.as_ref().and_then(|s| s.attempts).unwrap_or(0),
            events: ctx.events.clone(),
            on: nodemedic_kube::events::reference(&seen.current),
        },
        ctx.agents.clone(),
        ctx.metrics.clone(),
    );
    Outcome::requeue(Duration::from_secs(10)).event(Note::normal(
        "FenceAgentExecuted",
        format!(
            "running {} --action={action} for {} ({}); up to {} attempts",
            spec.agent,
            seen.node,
            parameters::describe(&checked.options),
            spec.retrycount
        ),
    ))
}

/// Moves to `next` once a run or a wait has ended.
fn advance<'a>(next: Step, seen: &'a Observed, ctx: &'a Context) -> Outcome<'a, Context> {
    let action = seen.facts.parameters.clone().unwrap_or(FenceAction::Reboot);
    let (reason, message) = advance_reason(next, &seen.node, action);
    let note = Note::normal(reason, message.clone());
    // The status is written first and the run forgotten after: a failed write must not lose the
    // run's result.
    Outcome::again()
        .status(move |s, now| set_step(s, now, next, reason, &message))
        .then(async move {
            ctx.runs.cancel(&seen.uid);
            if matches!(next, Step::PoweringOn | Step::Done)
                && seen.facts.step == Step::RecoveringWorkloads
                && let Some(created) = seen.current.creation_timestamp()
            {
                ctx.metrics
                    .recovery_seconds
                    .observe(nodemedic_kube::time::since(&created.0, &jiff::Timestamp::now()).as_secs_f64());
            }
            if next == Step::Done {
                ctx.metrics.finished("succeeded");
            }
            Ok(())
        })
        .event(note)
}

/// Tells Kubernetes the powered-off node is out of service, so its workloads are released.
async fn add_out_of_service_taint<'a>(seen: &Observed, ctx: &Context) -> Result<Outcome<'a, Context>> {
    let node = seen.node.as_str();
    let nodes = Api::<Node>::all(ctx.client.clone());
    let taint = taints::taint(keys::OUT_OF_SERVICE_KEY, Some(keys::OUT_OF_SERVICE_VALUE), "NoExecute");
    taints::add(&nodes, node, &taint).await?;
    Ok(Outcome::again().event(Note::normal(
        "AddOutOfServiceTaint",
        format!("tainted {node} out-of-service: it is powered off"),
    )))
}

/// Releases the powered-off node's workloads: its pods, and with ResourceDeletion its volume
/// attachments.
async fn delete_workloads<'a>(seen: &Observed, ctx: &'a Context) -> Result<Outcome<'a, Context>> {
    let node = seen.node.as_str();
    // Pods are force-deleted even when already terminating: the node that would finish a
    // graceful deletion is off.
    workloads::force_delete_pods(&ctx.client, &seen.pods).await?;
    let released = if seen.current.spec.remediation_strategy == FenceRemediationStrategy::ResourceDeletion {
        workloads::release_attachments(&ctx.client, node, &seen.attachments).await?
    } else {
        0
    };
    // What is left finishes deleting on its own (finalizers, the attach-detach controller); look
    // again shortly rather than spin.
    let outcome = Outcome::requeue(Duration::from_secs(2));
    if seen.pods.iter().any(|p| p.metadata.deletion_timestamp.is_none()) || released > 0 {
        return Ok(outcome.event(Note::normal(
            "DeleteResources",
            format!(
                "{node} is powered off: deleted {} pods and {released} volume attachments",
                seen.pods.len(),
            ),
        )));
    }
    Ok(outcome)
}

/// Says the remediation failed, and why; its run is forgotten once that is written.
fn fail<'a>(reason: FailureReason, message: String, seen: &'a Observed, ctx: &'a Context) -> Outcome<'a, Context> {
    let node = seen.node.as_str();
    let step = seen.facts.step;
    let name = seen.current.name_any();
    let note = Note::warning(reason.as_str(), message.clone());
    let logged = message.clone();
    Outcome::again()
        .status(move |s, now| set_failed(s, now, step, reason.as_str(), &message))
        .then(async move {
            ctx.runs.cancel(&seen.uid);
            tracing::warn!(remediation = %name, node, reason = reason.as_str(), message = %logged, "fence agents remediation failed");
            ctx.metrics.finished(reason.as_str());
            Ok(())
        })
        .event(note)
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
