//! Performing one step: the only code that changes the cluster on a remediation's behalf. The
//! status edit and events each step returns are the step runner's to write and publish.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, ResourceExt};
use nodemedic_api::{
    names::{conditions as types, finalizers, labels, taints as keys},
    self_remediation::{CONFIG_NAME, RemediationStrategy, SelfNodeRemediation, SelfNodeRemediationStatus},
};
use nodemedic_kube::{events::Note, steps::Outcome, taints, workloads};

use super::{
    Context,
    observe::Observed,
    status::{condition, finished, processing},
};
use crate::{
    Error, Result,
    decide::{Applied, Phase, Step},
};

/// No safe time comes near this; an older wait belongs to a remediation that is gone.
const FORGET_WAITS_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A Machine-owned remediation whose Machine names no node: nothing to fence, said the way a
/// missing node is (the health check escalates on it), and looked at again, since a provisioning
/// Machine may get its node.
pub(super) fn no_node<'a>(why: String) -> Outcome<'a, Context> {
    let note = Note::warning("RemediationCannotStart", why.clone());
    Outcome::requeue(Duration::from_secs(10))
        .status(move |s, now| finished(s, now, false, "RemediationSkippedNodeNotFound", &why))
        .event_if_changed(note)
}

pub(super) async fn perform<'a>(
    step: Step,
    snr: &'a SelfNodeRemediation,
    seen: &'a Observed,
    api: &'a Api<SelfNodeRemediation>,
    ctx: &'a Context,
) -> Result<Outcome<'a, Context>> {
    let nodes = Api::<Node>::all(ctx.client.clone());
    let node = seen.node.as_str();
    Ok(match step {
        Step::RemoveOutOfServiceTaint => {
            taints::remove(&nodes, node, keys::OUT_OF_SERVICE_KEY, "NoExecute").await?;
            Outcome::again().event(Note::normal(
                "RemoveOutOfService",
                format!("removed the out-of-service taint from {node}"),
            ))
        }
        Step::RemoveNoScheduleTaint => {
            taints::remove(&nodes, node, keys::SNR_KEY, "NoSchedule").await?;
            Outcome::again().event(Note::normal(
                "RemoveNoScheduleTaint",
                format!("removed the {} taint from {node}", keys::SNR_KEY),
            ))
        }
        Step::RemoveFinalizer => {
            nodemedic_kube::finalizers::remove(api, snr, finalizers::SNR).await?;
            forget_wait(ctx, snr)?;
            Outcome::await_change().event(Note::normal(
                "RemediationFinished",
                format!("node {node} is healthy again; remediation finished"),
            ))
        }
        Step::Idle => Outcome::await_change(),
        Step::Stop => {
            let why = "the health check timed this remediation out; nodemedic stops and recovers nothing";
            Outcome::await_change()
                .status(move |s, now| finished(s, now, false, "RemediationTimeoutByNHC", why))
                .event_if_changed(Note::normal("RemediationStopped", why))
        }
        Step::NodeNotFound => {
            let why = format!("node {node} does not exist");
            let note = Note::warning("RemediationCannotStart", why.clone());
            Outcome::requeue(Duration::from_secs(30))
                .status(move |s, now| finished(s, now, false, "RemediationSkippedNodeNotFound", &why))
                .event_if_changed(note)
        }
        Step::Disabled => {
            let why = format!(
                "SelfNodeRemediationConfig {CONFIG_NAME} does not exist in namespace {}: self remediation is disabled; create it again (or restart the controller, which creates it with the release's defaults)",
                ctx.namespace
            );
            let note = Note::warning("RemediationDisabled", why.clone());
            // The configuration's watch wakes this remediation when it is back.
            Outcome::await_change()
                .status(move |s, now| condition(s, now, types::DISABLED, true, "ConfigurationNotFound", why))
                .event_if_changed(note)
        }
        Step::Enabled => Outcome::again().status(|s, now| {
            condition(
                s,
                now,
                types::DISABLED,
                false,
                "ConfigurationFound",
                format!("SelfNodeRemediationConfig {CONFIG_NAME} exists"),
            )
        }),
        Step::Excluded => Outcome::requeue(Duration::from_secs(30)).event(Note::normal(
            "RemediationSkipped",
            format!("node {node} is labelled {}=true", labels::EXCLUDE_FROM_REMEDIATION),
        )),
        Step::CannotFence(why) => cannot_fence(why, snr, ctx)?,
        Step::AddFinalizer => {
            nodemedic_kube::finalizers::add(api, snr, finalizers::SNR).await?;
            Outcome::again().event(Note::normal("AddFinalizer", "added the finalizer"))
        }
        Step::AddNoScheduleTaint => {
            taints::add(&nodes, node, &taints::taint(keys::SNR_KEY, None, "NoSchedule")).await?;
            Outcome::again().event(Note::normal(
                "AddNoScheduleTaint",
                format!("tainted {node} {}:NoSchedule", keys::SNR_KEY),
            ))
        }
        Step::Start => start(seen),
        Step::AwaitAcceptance => {
            let by = seen.acceptance.by();
            Outcome::requeue(Duration::from_secs(2)).status(move |s: &mut SelfNodeRemediationStatus, _| {
                let changed = s.accepted_by.as_ref() != Some(&by);
                s.accepted_by = Some(by);
                changed
            })
        }
        Step::ObserveAcceptance => observe_acceptance(snr, seen, ctx).await?,
        Step::Wait(remaining) => Outcome::requeue(remaining + Duration::from_millis(100)),
        Step::MarkRebooted => Outcome::again()
            .status(|s: &mut SelfNodeRemediationStatus, _| {
                s.phase = Phase::RebootCompleted.as_str().map(str::to_owned);
                true
            })
            // The wait is over; only phases before RebootCompleted read it.
            .then(async move { forget_wait(ctx, snr) })
            .event(Note::normal("NodeFenced", format!("node {node} is proven fenced"))),
        Step::AddOutOfServiceTaint => {
            let taint = taints::taint(keys::OUT_OF_SERVICE_KEY, Some(keys::OUT_OF_SERVICE_VALUE), "NoExecute");
            taints::add(&nodes, node, &taint).await?;
            Outcome::again().event(Note::normal(
                "AddOutOfService",
                format!("tainted {node} out-of-service"),
            ))
        }
        Step::DeletePods => {
            let pods = workloads::pods(&ctx.client, node).await?;
            workloads::force_delete_pods(&ctx.client, &pods).await?;
            Outcome::again().event(Note::normal(
                "DeleteResources",
                format!("force-deleted {} pods of fenced node {node}", pods.len()),
            ))
        }
        Step::DeleteAttachments => delete_attachments(node, ctx).await?,
        Step::MarkCompleted => mark_completed(snr, seen, ctx),
    })
}

/// The node has no working agent: nothing can prove it fenced, so the remediation reports
/// failure for an escalating health check to move on.
fn cannot_fence<'a>(why: String, snr: &SelfNodeRemediation, ctx: &Context) -> Result<Outcome<'a, Context>> {
    // A wait that began before the node's agent disarmed proves nothing about a watchdog armed
    // again later: the wait starts over if the agent comes back, here and in a new leader (the
    // recorded start goes too).
    forget_wait(ctx, snr)?;
    let note = Note::warning(
        "RemediationCannotStart",
        format!("{why}: reporting Succeeded=False so an escalating health check moves on"),
    );
    Ok(Outcome::requeue(Duration::from_secs(10))
        .status(move |s, now| {
            let a = finished(s, now, false, "FencingNotSafe", &why);
            let b = condition(s, now, types::FENCING_SAFE, false, "NoWorkingAgent", why.clone());
            let c = s.wait_started_at.take().is_some() | s.membership_epoch.take().is_some();
            a | b | c
        })
        .event_if_changed(note))
}

async fn delete_attachments<'a>(node: &str, ctx: &Context) -> Result<Outcome<'a, Context>> {
    let vas = workloads::attachments(&ctx.client, node).await?;
    let deleted = workloads::release_attachments(&ctx.client, node, &vas).await?;
    // Attachments already going away finish on their own (the attach-detach controller).
    if deleted == 0 {
        return Ok(Outcome::again());
    }
    Ok(Outcome::again().event(Note::normal(
        "DeleteResources",
        format!("deleted {deleted} volume attachments of fenced node {node}"),
    )))
}

fn mark_completed<'a>(snr: &'a SelfNodeRemediation, seen: &Observed, ctx: &'a Context) -> Outcome<'a, Context> {
    let node = seen.node.clone();
    let why = format!("node {node} is fenced and its workloads were released");
    Outcome::again()
        .status(move |s: &mut SelfNodeRemediationStatus, now| {
            s.phase = Phase::FencingCompleted.as_str().map(str::to_owned);
            finished(s, now, true, "RemediationFinishedSuccessfully", &why);
            true
        })
        .then(async move {
            if let Some(created) = snr.creation_timestamp() {
                ctx.metrics
                    .fenced_seconds
                    .observe(nodemedic_kube::time::since(&created.0, &jiff::Timestamp::now()).as_secs_f64());
            }
            Ok(())
        })
        .event(Note::normal(
            "RemediationFinished",
            format!("node {node} is fenced and its workloads may run elsewhere"),
        ))
}

/// The remediation starts: the agent fences its node, and the workloads wait for the proof.
fn start<'a>(seen: &Observed) -> Outcome<'a, Context> {
    let node = seen.node.clone();
    let safe = seen.safe_time;
    let adjusted = seen.adjusted_from;
    let applied = match seen.facts.strategy {
        Applied::OutOfServiceTaint => RemediationStrategy::OutOfServiceTaint,
        Applied::ResourceDeletion => RemediationStrategy::ResourceDeletion,
    };
    let started = Note::normal("RemediationStarted", format!("remediating node {node} ({applied:?})"));
    let outcome = Outcome::again()
        .status(move |s: &mut SelfNodeRemediationStatus, now| {
            s.phase = Phase::FencingStarted.as_str().map(str::to_owned);
            s.applied_strategy = Some(applied);
            let why = format!("node {node}'s agent fences it; its workloads are released once a majority of the other agents refuse it a licence and {}s have passed", safe.as_secs());
            processing(s, now, &why);
            condition(s, now, types::FENCING_SAFE, true, "AgentRegistered", format!("node {node} has a registered agent with a working watchdog"));
            let (reason, message) = match adjusted {
                Some(configured) => ("BelowProvableMinimum", format!("safeTimeToAssumeNodeRebootedSeconds {}s is below the provable minimum; using {}s", configured.as_secs(), safe.as_secs())),
                None => ("ProvableMinimum", format!("using {}s", safe.as_secs())),
            };
            condition(s, now, types::SAFE_TIME_ADJUSTED, adjusted.is_some(), reason, message);
            true
        })
        .event(started);
    match adjusted {
        Some(configured) => outcome.event(Note::warning(
            "SafeTimeAdjusted",
            format!(
                "configured {}s is below the provable minimum {}s; using the minimum",
                configured.as_secs(),
                safe.as_secs()
            ),
        )),
        None => outcome,
    }
}

/// A majority of the other agents refuse the node a licence: the safe time starts now, on this
/// manager's clock and, for a new leader to continue from, on the API server's.
async fn observe_acceptance<'a>(
    snr: &SelfNodeRemediation,
    seen: &Observed,
    ctx: &'a Context,
) -> Result<Outcome<'a, Context>> {
    let node = seen.node.as_str();
    let epoch = seen.acceptance.epoch;
    // Read after the acceptance read. Without it a new leader would start the wait again.
    let started = match nodemedic_kube::time::server_now(&ctx.client).await {
        Ok(now) => Some(now),
        Err(error) => {
            tracing::warn!(%error, "cannot read the API server's clock: a new leader would wait afresh");
            None
        }
    };
    {
        let mut observed = ctx.observed.lock().map_err(|_| Error::Poisoned)?;
        // A remediation deleted mid-wait never reaches RemoveFinalizer: forget waits older than
        // any safe time (forgetting one only makes it start again).
        observed.retain(|_, (since, _)| since.elapsed() < FORGET_WAITS_AFTER);
        observed.insert(snr.uid().unwrap_or_default(), (Instant::now(), epoch));
    }
    let by = seen.acceptance.by();
    let assumed = nodemedic_kube::time::add(&Time(started.unwrap_or_else(jiff::Timestamp::now)), seen.safe_time);
    let restarted = seen.facts.phase == Phase::PreRebootCompleted;
    let note = Note::normal(
        if restarted {
            "SafeTimeRestarted"
        } else {
            "UpdateTimeAssumedRebooted"
        },
        format!(
            "{} of the other agents refuse {node} a licence ({}) in membership epoch {epoch}; its workloads are released at {} unless this changes",
            by.len(),
            by.join(", "),
            assumed.0
        ),
    );
    Ok(Outcome::again()
        .status(move |s: &mut SelfNodeRemediationStatus, _| {
            s.phase = Phase::PreRebootCompleted.as_str().map(str::to_owned);
            s.accepted_by = Some(by);
            s.time_assumed_rebooted = Some(assumed);
            s.wait_started_at = started.map(Time);
            s.membership_epoch = i64::try_from(epoch).ok();
            true
        })
        .event(note))
}

/// Drops this manager's record of the remediation's wait.
fn forget_wait(ctx: &Context, snr: &SelfNodeRemediation) -> Result<()> {
    ctx.observed
        .lock()
        .map_err(|_| Error::Poisoned)?
        .remove(&snr.uid().unwrap_or_default());
    Ok(())
}
