//! Performing one step: the only code that changes the cluster on a remediation's behalf.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, ResourceExt, runtime::controller::Action};
use nodemedic_api::{
    names::{conditions as types, finalizers, labels, taints as keys},
    self_remediation::{RemediationStrategy, SelfNodeRemediation},
};
use nodemedic_kube::{machines::Resolved, taints, workloads};

use super::{
    Context,
    audience::Audience,
    observe::Observed,
    status::{condition, finished, processing, set_status},
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
pub async fn unresolved(
    snr: &SelfNodeRemediation,
    unresolved: &Resolved,
    api: &Api<SelfNodeRemediation>,
    ctx: &Context,
) -> Result<Action> {
    if snr.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let why = unresolved.why_no_node().unwrap_or_default();
    if set_status(api, snr, |s, now| {
        finished(s, now, false, "RemediationSkippedNodeNotFound", &why)
    })
    .await?
    {
        Audience::of(snr, &ctx.events)
            .warning("RemediationCannotStart", why)
            .await;
    }
    Ok(Action::requeue(Duration::from_secs(10)))
}

pub async fn perform(
    step: &Step,
    snr: &SelfNodeRemediation,
    seen: &Observed,
    api: &Api<SelfNodeRemediation>,
    ctx: &Context,
) -> Result<Option<Action>> {
    let nodes = Api::<Node>::all(ctx.client.clone());
    let node = seen.node.as_str();
    let events = Audience::of(snr, &ctx.events);
    match step {
        Step::RemoveOutOfServiceTaint => {
            taints::remove(&nodes, node, keys::OUT_OF_SERVICE_KEY, "NoExecute").await?;
            events
                .normal(
                    "RemoveOutOfService",
                    format!("removed the out-of-service taint from {node}"),
                )
                .await;
        }
        Step::RemoveNoScheduleTaint => {
            taints::remove(&nodes, node, keys::SNR_KEY, "NoSchedule").await?;
            events
                .normal(
                    "RemoveNoScheduleTaint",
                    format!("removed the {} taint from {node}", keys::SNR_KEY),
                )
                .await;
        }
        Step::RemoveFinalizer => {
            nodemedic_kube::finalizers::remove(api, snr, finalizers::SNR).await?;
            ctx.observed
                .lock()
                .map_err(|_| Error::Poisoned)?
                .remove(&snr.uid().unwrap_or_default());
            events
                .normal(
                    "RemediationFinished",
                    format!("node {node} is healthy again; remediation finished"),
                )
                .await;
            return Ok(Some(Action::await_change()));
        }
        Step::Idle => return Ok(Some(Action::await_change())),
        Step::Stop => {
            let why = "the health check timed this remediation out; nodemedic stops and recovers nothing";
            if set_status(api, snr, |s, now| {
                finished(s, now, false, "RemediationTimeoutByNHC", why)
            })
            .await?
            {
                events.normal("RemediationStopped", why).await;
            }
            return Ok(Some(Action::await_change()));
        }
        Step::NodeNotFound => {
            let why = format!("node {node} does not exist");
            if set_status(api, snr, |s, now| {
                finished(s, now, false, "RemediationSkippedNodeNotFound", &why)
            })
            .await?
            {
                events.warning("RemediationCannotStart", why).await;
            }
            return Ok(Some(Action::requeue(Duration::from_secs(30))));
        }
        Step::Excluded => {
            events
                .normal(
                    "RemediationSkipped",
                    format!("node {node} is labelled {}=true", labels::EXCLUDE_FROM_REMEDIATION),
                )
                .await;
            return Ok(Some(Action::requeue(Duration::from_secs(30))));
        }
        Step::CannotFence(why) => {
            // A wait that began before the node's agent disarmed proves nothing about a
            // watchdog armed again later: the wait starts over if the agent comes back, here
            // and in a new leader (the recorded start goes too).
            ctx.observed
                .lock()
                .map_err(|_| Error::Poisoned)?
                .remove(&snr.uid().unwrap_or_default());
            let changed = set_status(api, snr, |s, now| {
                let a = finished(s, now, false, "FencingNotSafe", why);
                let b = condition(s, now, types::FENCING_SAFE, false, "NoWorkingAgent", why.clone());
                let c = s.wait_started_at.take().is_some() | s.membership_epoch.take().is_some();
                a | b | c
            })
            .await?;
            if changed {
                events
                    .warning(
                        "RemediationCannotStart",
                        format!("{why}: reporting Succeeded=False so an escalating health check moves on"),
                    )
                    .await;
            }
            return Ok(Some(Action::requeue(Duration::from_secs(10))));
        }
        Step::AddFinalizer => {
            nodemedic_kube::finalizers::add(api, snr, finalizers::SNR).await?;
            events.normal("AddFinalizer", "added the finalizer").await;
        }
        Step::AddNoScheduleTaint => {
            taints::add(&nodes, node, &taints::taint(keys::SNR_KEY, None, "NoSchedule")).await?;
            events
                .normal(
                    "AddNoScheduleTaint",
                    format!("tainted {node} {}:NoSchedule", keys::SNR_KEY),
                )
                .await;
        }
        Step::Start => {
            let safe = seen.safe_time;
            let adjusted = seen.adjusted_from;
            let applied = match seen.facts.strategy {
                Applied::OutOfServiceTaint => RemediationStrategy::OutOfServiceTaint,
                Applied::ResourceDeletion => RemediationStrategy::ResourceDeletion,
            };
            set_status(api, snr, |s, now| {
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
            .await?;
            events
                .normal("RemediationStarted", format!("remediating node {node} ({applied:?})"))
                .await;
            if let Some(configured) = adjusted {
                events
                    .warning(
                        "SafeTimeAdjusted",
                        format!(
                            "configured {}s is below the provable minimum {}s; using the minimum",
                            configured.as_secs(),
                            safe.as_secs()
                        ),
                    )
                    .await;
            }
        }
        Step::AwaitAcceptance => {
            let by = seen.acceptance.by();
            set_status(api, snr, |s, _| {
                let changed = s.accepted_by.as_ref() != Some(&by);
                s.accepted_by = Some(by.clone());
                changed
            })
            .await?;
            return Ok(Some(Action::requeue(Duration::from_secs(2))));
        }
        Step::ObserveAcceptance => {
            let epoch = seen.acceptance.epoch;
            // The start on the API server's clock, read after the acceptance read: a new leader
            // continues from it. Without it a new leader would start the wait again.
            let started = match nodemedic_kube::time::server_now(&ctx.client).await {
                Ok(now) => Some(now),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the API server's clock: a new leader would wait afresh");
                    None
                }
            };
            {
                let mut observed = ctx.observed.lock().map_err(|_| Error::Poisoned)?;
                // A remediation deleted mid-wait never reaches RemoveFinalizer: forget waits
                // older than any safe time (forgetting one only makes it start again).
                observed.retain(|_, (since, _)| since.elapsed() < FORGET_WAITS_AFTER);
                observed.insert(snr.uid().unwrap_or_default(), (Instant::now(), epoch));
            }
            let by = seen.acceptance.by();
            let assumed =
                nodemedic_kube::time::add(&Time(started.unwrap_or_else(jiff::Timestamp::now)), seen.safe_time);
            let restarted = seen.facts.phase == Phase::PreRebootCompleted;
            set_status(api, snr, |s, _| {
                s.phase = Phase::PreRebootCompleted.as_str().map(str::to_owned);
                s.accepted_by = Some(by.clone());
                s.time_assumed_rebooted = Some(assumed.clone());
                s.wait_started_at = started.map(Time);
                s.membership_epoch = i64::try_from(epoch).ok();
                true
            })
            .await?;
            let note = format!(
                "{} of the other agents refuse {node} a licence ({}) in membership epoch {epoch}; its workloads are released at {} unless this changes",
                by.len(),
                by.join(", "),
                assumed.0
            );
            events
                .normal(
                    if restarted {
                        "SafeTimeRestarted"
                    } else {
                        "UpdateTimeAssumedRebooted"
                    },
                    note,
                )
                .await;
        }
        Step::Wait(remaining) => return Ok(Some(Action::requeue(*remaining + Duration::from_millis(100)))),
        Step::MarkRebooted => {
            set_status(api, snr, |s, _| {
                s.phase = Phase::RebootCompleted.as_str().map(str::to_owned);
                true
            })
            .await?;
            // The wait is over; only phases before RebootCompleted read it.
            ctx.observed
                .lock()
                .map_err(|_| Error::Poisoned)?
                .remove(&snr.uid().unwrap_or_default());
            events
                .normal("NodeFenced", format!("node {node} is proven fenced"))
                .await;
        }
        Step::AddOutOfServiceTaint => {
            let taint = taints::taint(keys::OUT_OF_SERVICE_KEY, Some(keys::OUT_OF_SERVICE_VALUE), "NoExecute");
            taints::add(&nodes, node, &taint).await?;
            events
                .normal("AddOutOfService", format!("tainted {node} out-of-service"))
                .await;
        }
        Step::DeletePods => {
            let pods = workloads::pods(&ctx.client, node).await?;
            workloads::force_delete_pods(&ctx.client, &pods).await?;
            events
                .normal(
                    "DeleteResources",
                    format!("force-deleted {} pods of fenced node {node}", pods.len()),
                )
                .await;
        }
        Step::DeleteAttachments => {
            let vas = workloads::attachments(&ctx.client, node).await?;
            let deleted = workloads::release_attachments(&ctx.client, node, &vas).await?;
            // Attachments already going away finish on their own (the attach-detach controller).
            if deleted > 0 {
                events
                    .normal(
                        "DeleteResources",
                        format!("deleted {deleted} volume attachments of fenced node {node}"),
                    )
                    .await;
            }
        }
        Step::MarkCompleted => {
            set_status(api, snr, |s, now| {
                s.phase = Phase::FencingCompleted.as_str().map(str::to_owned);
                finished(
                    s,
                    now,
                    true,
                    "RemediationFinishedSuccessfully",
                    &format!("node {node} is fenced and its workloads were released"),
                );
                true
            })
            .await?;
            if let Some(created) = snr.creation_timestamp() {
                ctx.metrics
                    .fenced_seconds
                    .observe(nodemedic_kube::time::since(&created.0, &jiff::Timestamp::now()).as_secs_f64());
            }
            events
                .normal(
                    "RemediationFinished",
                    format!("node {node} is fenced and its workloads may run elsewhere"),
                )
                .await;
        }
    }
    Ok(None)
}
