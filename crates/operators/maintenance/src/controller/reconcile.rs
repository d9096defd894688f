//! Observe, ask [`steps::next`], act; repeat while a step leaves nothing to wait for.

use std::{sync::Arc, time::Duration};

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use nodemedic_api::{
    maintenance::{MaintenancePhase, NodeMaintenance, PodReference},
    names::{finalizers, leases},
};
use nodemedic_kube::{CallContext, events};
use serde_json::json;

use super::{
    Context, drain,
    metrics::{Metrics, NodeLabels},
    node,
    observe::{self, LEASE_DURATION, Observed},
    status,
};
use crate::{
    Result,
    decide::{
        drain::progress,
        steps::{self, Step},
    },
};

/// Steps taken in one reconcile before handing back to the controller.
const MAX_STEPS: usize = 12;
/// Waiting for the node lease, or after a failure to take it.
const BLOCKED_RETRY: Duration = Duration::from_secs(5);
/// Evicted pods still terminating are looked at again soon.
const TERMINATING_RETRY: Duration = Duration::from_secs(1);

enum Next {
    Continue,
    Done(Action),
}

pub async fn reconcile(nm: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Action> {
    let api = Api::<NodeMaintenance>::all(ctx.client.clone());
    // The controller's copy may predate our own last write; acting on it would only conflict.
    let Some(fresh) = api
        .get_opt(&nm.name_any())
        .await
        .with_context(|| format!("reading NodeMaintenance {}", nm.name_any()))?
    else {
        return Ok(Action::await_change());
    };
    let mut current = Arc::new(fresh);
    for _ in 0..MAX_STEPS {
        let observed = observe::observe(&ctx, &current).await?;
        let step = steps::next(&observed.facts);
        tracing::debug!(maintenance = %current.name_any(), node = %current.spec.node_name, ?step, "step");
        match act(&ctx, &api, &current, &observed, step).await? {
            Next::Done(action) => return Ok(action),
            Next::Continue => match api
                .get_opt(&current.name_any())
                .await
                .with_context(|| format!("reading NodeMaintenance {}", current.name_any()))?
            {
                Some(fresh) => current = Arc::new(fresh),
                None => return Ok(Action::await_change()),
            },
        }
    }
    Ok(Action::requeue(TERMINATING_RETRY))
}

async fn act(
    ctx: &Context,
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    observed: &Observed,
    step: Step,
) -> Result<Next> {
    let node_name = nm.spec.node_name.as_str();
    let on = events::reference(nm);
    match step {
        Step::Idle => return Ok(Next::Done(Action::await_change())),
        Step::Hold => {
            // A lease wait (after an expiry) may have left its explanation behind.
            status::write(api, nm, |s, _| s.last_error = None).await?;
            return Ok(Next::Done(Action::requeue(LEASE_DURATION / 4)));
        }
        Step::Cleanup { give_back } => {
            if give_back {
                node::give_back(ctx, node_name).await?;
                ctx.events
                    .normal(
                        &on,
                        "UncordonNode",
                        format!("Node {node_name} is schedulable again; maintenance taints, label and lease removed"),
                    )
                    .await;
            }
            forget_drain(ctx, nm);
            nodemedic_kube::finalizers::remove(api, nm, finalizers::NODE_MAINTENANCE).await?;
            ctx.events
                .normal(
                    &on,
                    "RemovedMaintenance",
                    format!("Maintenance of node {node_name} ended"),
                )
                .await;
            return Ok(Next::Done(Action::await_change()));
        }
        Step::Fail { message, give_back } => {
            let blocking = nm
                .status
                .as_ref()
                .and_then(|s| s.blocking_pods.as_deref())
                .unwrap_or_default();
            let message = if blocking.is_empty() {
                message
            } else {
                format!("{message}: {}", drain::summary(blocking))
            };
            if give_back {
                node::give_back(ctx, node_name).await?;
            }
            status::write(api, nm, |s, now| {
                s.phase = Some(MaintenancePhase::Failed);
                s.last_error = Some(message.clone());
                status::drained(s, now, false, "Failed", message.clone());
            })
            .await?;
            tracing::warn!(maintenance = %nm.name_any(), node = node_name, %message, "maintenance failed");
            ctx.events.warning(&on, "FailedMaintenance", message).await;
            Metrics::count(&ctx.metrics.finished, "failed");
            forget_drain(ctx, nm);
            return Ok(Next::Done(Action::await_change()));
        }
        Step::AddFinalizer => {
            add_finalizer_and_owner(api, nm, &observed.node_uid()).await?;
            let why = nm.spec.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            ctx.events
                .normal(
                    &on,
                    "BeginMaintenance",
                    format!("Begin a maintenance of node {node_name}{why}"),
                )
                .await;
        }
        Step::Start => {
            let remove = observed.to_remove();
            let total = observed.pods.len() as i32;
            let selected = remove.len();
            status::write(api, nm, |s, now| {
                s.phase = Some(MaintenancePhase::Running);
                s.totalpods = Some(total);
                s.eviction_pods = Some(selected as i32);
                s.drain_progress = Some(progress(selected, selected));
                s.error_on_lease_count = Some(0);
                status::pending(s, refs(&remove));
                // Unknown until the node is ours and cordoned: the drain (and its timeout) starts then.
                status::drained_unknown(
                    s,
                    now,
                    "Preparing",
                    format!("{selected} of the {total} pods on the node will be drained"),
                );
            })
            .await?;
            ctx.metrics.started.inc();
        }
        Step::AcquireLease => match ctx
            .leases
            .request(
                node_name,
                &observed.node_uid(),
                leases::MAINTENANCE_HOLDER,
                LEASE_DURATION,
            )
            .await
        {
            Ok(()) => {
                if observed.facts.lease_errors > 0 {
                    status::write(api, nm, |s, _| s.error_on_lease_count = Some(0)).await?;
                }
            }
            // Taken between our read and our request: the next observation waits for it.
            Err(nodemedic_kube::Error::LeaseHeld { .. }) => {}
            Err(error) => {
                let count = observed.facts.lease_errors as i32 + 1;
                let message = format!("taking the node lease failed ({count} in a row): {error}");
                status::write(api, nm, |s, _| {
                    s.error_on_lease_count = Some(count);
                    s.last_error = Some(message.clone());
                })
                .await?;
                ctx.events.warning(&on, "LeaseFailed", message).await;
                return Ok(Next::Done(Action::requeue(BLOCKED_RETRY)));
            }
        },
        Step::WaitForLease(holder) => {
            let message = format!(
                "waiting for the node lease, held by {holder} (the health check is remediating this node); the drain starts once it is released"
            );
            let drained_already = observed.facts.phase == crate::decide::steps::Phase::Succeeded;
            let changed = status::write(api, nm, |s, now| {
                s.last_error = Some(message.clone());
                if !drained_already {
                    status::drained_unknown(s, now, "WaitingForLease", message.clone());
                }
            })
            .await?;
            if changed {
                ctx.events.warning(&on, "WaitingForLease", message).await;
            }
            return Ok(Next::Done(Action::requeue(BLOCKED_RETRY)));
        }
        Step::Label => node::label(ctx, node_name).await?,
        Step::Taint => node::taint(ctx, node_name).await?,
        Step::Cordon => {
            node::cordon(ctx, node_name, true).await?;
            status::write(api, nm, |s, now| {
                s.last_error = None;
                status::drained(s, now, false, "Draining", "the node is cordoned; draining".into());
            })
            .await?;
            ctx.events
                .normal(&on, "CordonNode", format!("Node {node_name} cordoned; draining"))
                .await;
        }
        Step::Drain => return drain_step(ctx, api, nm, observed).await.map(Next::Done),
        Step::Succeed => {
            let started = nm
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .and_then(|c| nodemedic_kube::conditions::find(c, nodemedic_api::names::conditions::DRAINED))
                .map(|c| c.last_transition_time.0);
            status::write(api, nm, |s, now| {
                s.phase = Some(MaintenancePhase::Succeeded);
                s.drain_progress = Some(100);
                s.last_error = None;
                s.blocking_pods = None;
                status::pending(s, Vec::new());
                status::drained(s, now, true, "Drained", "every pod to evict is gone".into());
            })
            .await?;
            if let Some(started) = started {
                let took = nodemedic_kube::time::since(&started, &jiff::Timestamp::now());
                ctx.metrics.drain_seconds.observe(took.as_secs_f64());
            }
            forget_drain(ctx, nm);
            Metrics::count(&ctx.metrics.finished, "succeeded");
            ctx.events
                .normal(&on, "SucceedMaintenance", format!("Node {node_name} is drained"))
                .await;
        }
    }
    Ok(Next::Continue)
}

async fn drain_step(
    ctx: &Context,
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
    observed: &Observed,
) -> Result<Action> {
    let node_name = nm.spec.node_name.as_str();
    let pass = drain::pass(ctx, observed).await?;
    let left = observed.to_remove();
    let selected = nm.status.as_ref().and_then(|s| s.eviction_pods).unwrap_or(0).max(0) as usize;
    let done = progress(selected.max(left.len()), left.len());
    let before = nm.status.clone().unwrap_or_default();
    let blocked = (!pass.blocked.is_empty()).then(|| pass.blocked.clone());
    let summary = blocked.as_deref().map(drain::summary);
    status::write(api, nm, |s, now| {
        s.drain_progress = Some(done);
        status::pending(s, refs(&left));
        s.blocking_pods = blocked.clone();
        s.last_error = summary.clone();
        match &summary {
            Some(why) => status::drained(s, now, false, "DrainBlocked", why.clone()),
            None => status::drained(s, now, false, "Draining", format!("{} pods left to go", left.len())),
        }
    })
    .await?;
    ctx.metrics
        .blocked_pods
        .get_or_create(&NodeLabels { node: node_name.into() })
        .set(pass.blocked.len() as i64);
    let on = events::reference(nm);
    if before.drain_progress != Some(done) {
        let note = format!("Drain of node {node_name}: {done}% ({} pods left)", left.len());
        ctx.events.normal(&on, "DrainProgress", note).await;
    }
    if let Some(why) = summary
        && before.blocking_pods != blocked
    {
        tracing::info!(maintenance = %nm.name_any(), node = node_name, %why, "drain blocked");
        ctx.events.warning(&on, "DrainBlocked", why).await;
    }
    let blocked_passes = match ctx.blocked_passes.lock() {
        Ok(mut all) => {
            let n = all.entry(nm.name_any()).or_default();
            *n = if pass.blocked.is_empty() {
                0
            } else {
                n.saturating_add(1)
            };
            *n
        }
        Err(_) => 1,
    };
    Ok(Action::requeue(if blocked_passes == 0 {
        TERMINATING_RETRY
    } else {
        crate::decide::drain::retry_after(blocked_passes)
    }))
}

/// The drain's in-memory traces (blocked gauge, backoff count), once it is over.
fn forget_drain(ctx: &Context, nm: &NodeMaintenance) {
    ctx.metrics.blocked_pods.remove(&NodeLabels {
        node: nm.spec.node_name.clone(),
    });
    if let Ok(mut all) = ctx.blocked_passes.lock() {
        all.remove(&nm.name_any());
    }
}

fn refs(pods: &[(&k8s_openapi::api::core::v1::Pod, crate::decide::drain::PodFacts)]) -> Vec<PodReference> {
    pods.iter()
        .map(|(_, f)| PodReference {
            namespace: f.namespace.clone(),
            name: f.name.clone(),
        })
        .collect()
}

/// The finalizer, and an owner reference to the node so a deleted node takes its maintenance
/// (and the maintenance its lease) along (as medik8s does).
async fn add_finalizer_and_owner(api: &Api<NodeMaintenance>, nm: &NodeMaintenance, node_uid: &str) -> Result<()> {
    let mut finalizers = nm.finalizers().to_vec();
    finalizers.push(finalizers::NODE_MAINTENANCE.to_owned());
    let mut owners = nm.owner_references().to_vec();
    if !node_uid.is_empty() && !owners.iter().any(|o| o.uid == node_uid) {
        owners.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: nm.spec.node_name.clone(),
            uid: node_uid.to_owned(),
            ..Default::default()
        });
    }
    let patch = json!({"metadata": {
        "resourceVersion": nm.resource_version(),
        "finalizers": finalizers,
        "ownerReferences": owners,
    }});
    let name = nm.name_any();
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("adding the finalizer and node owner to NodeMaintenance {name}"))?;
    Ok(())
}
