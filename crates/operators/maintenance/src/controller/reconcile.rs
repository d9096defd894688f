//! The NodeMaintenance reconciler, run by the shared step runner ([`nodemedic_kube::steps`]):
//! observe, ask [`steps::next`], act; repeat while a step leaves nothing to wait for.

use std::time::Duration;

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use nodemedic_api::{
    maintenance::{MaintenancePhase, NodeMaintenance, PodReference},
    names::{finalizers, leases},
};
use nodemedic_kube::{CallContext, events::Events, events::Note, steps::Outcome};
use serde_json::json;

use super::{
    Context, drain,
    metrics::{Metrics, NodeLabels},
    node,
    observe::{self, LEASE_DURATION, Observed},
    status::{self, stamped},
};
use crate::{
    Error, Result,
    decide::{
        drain::progress,
        steps::{self, Step},
    },
};

/// Waiting for the node lease, or after a failure to take it.
const BLOCKED_RETRY: Duration = Duration::from_secs(5);
/// Evicted pods still terminating are looked at again soon.
const TERMINATING_RETRY: Duration = Duration::from_secs(1);

impl nodemedic_kube::steps::Operator for Context {
    type Object = NodeMaintenance;
    type Observed = Observed;
    type Step = Step;
    type Error = Error;

    const NAME: &'static str = "node maintenance";
    const STEPS: usize = 12;

    fn api(&self, _: &NodeMaintenance) -> Result<Api<NodeMaintenance>> {
        Ok(Api::all(self.client.clone()))
    }

    async fn observe(&self, current: NodeMaintenance) -> Result<Observed> {
        observe::observe(self, current).await
    }

    fn current(seen: &Observed) -> &NodeMaintenance {
        &seen.current
    }

    fn decide(&self, seen: &Observed) -> Step {
        steps::next(&seen.facts)
    }

    fn routine(step: &Step) -> bool {
        matches!(step, Step::Idle | Step::Hold | Step::Drain)
    }

    async fn perform<'a>(
        &'a self,
        step: Step,
        seen: &'a Observed,
        api: &'a Api<NodeMaintenance>,
    ) -> Result<Outcome<'a, Self>> {
        perform(self, api, seen, step).await
    }

    fn events(&self) -> &Events {
        &self.events
    }

    fn count_error(&self, error: &Error) {
        Metrics::count(&self.metrics.errors, error.kind());
    }
}

async fn perform<'a>(
    ctx: &'a Context,
    api: &Api<NodeMaintenance>,
    seen: &'a Observed,
    step: Step,
) -> Result<Outcome<'a, Context>> {
    let nm = &seen.current;
    let node_name = nm.spec.node_name.as_str();
    Ok(match step {
        Step::Idle => Outcome::await_change(),
        // A lease wait (after an expiry) may have left its explanation behind.
        Step::Hold => Outcome::requeue(LEASE_DURATION / 4).status(stamped(|s, _| s.last_error = None)),
        Step::Cleanup { give_back } => {
            let mut outcome = Outcome::await_change();
            if give_back {
                node::give_back(ctx, node_name).await?;
                outcome = outcome.event(Note::normal(
                    "UncordonNode",
                    format!("Node {node_name} is schedulable again; maintenance taints, label and lease removed"),
                ));
            }
            forget_drain(ctx, nm);
            nodemedic_kube::finalizers::remove(api, nm, finalizers::NODE_MAINTENANCE).await?;
            outcome.event(Note::normal(
                "RemovedMaintenance",
                format!("Maintenance of node {node_name} ended"),
            ))
        }
        Step::Fail { message, give_back } => fail(ctx, seen, message, give_back).await?,
        Step::AddFinalizer => {
            add_finalizer_and_owner(api, nm, &seen.node_uid()).await?;
            let why = nm.spec.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            Outcome::again().event(Note::normal(
                "BeginMaintenance",
                format!("Begin a maintenance of node {node_name}{why}"),
            ))
        }
        Step::Start => {
            let remove = refs(&seen.to_remove());
            let total = seen.pods.len() as i32;
            let selected = remove.len();
            Outcome::again()
                .status(stamped(move |s, now| {
                    s.phase = Some(MaintenancePhase::Running);
                    s.totalpods = Some(total);
                    s.eviction_pods = Some(selected as i32);
                    s.drain_progress = Some(progress(selected, selected));
                    s.error_on_lease_count = Some(0);
                    status::pending(s, remove);
                    // Unknown until the node is ours and cordoned: the drain (and its timeout)
                    // starts then.
                    status::drained_unknown(
                        s,
                        now,
                        "Preparing",
                        format!("{selected} of the {total} pods on the node will be drained"),
                    );
                }))
                .then(async move {
                    ctx.metrics.started.inc();
                    Ok(())
                })
        }
        Step::AcquireLease => acquire_lease(ctx, seen).await?,
        Step::WaitForLease(holder) => {
            let message = format!(
                "waiting for the node lease, held by {holder} (the health check is remediating this node); the drain starts once it is released"
            );
            let drained_already = seen.facts.phase == crate::decide::steps::Phase::Succeeded;
            let note = Note::warning("WaitingForLease", message.clone());
            Outcome::requeue(BLOCKED_RETRY)
                .status(stamped(move |s, now| {
                    if !drained_already {
                        status::drained_unknown(s, now, "WaitingForLease", message.clone());
                    }
                    s.last_error = Some(message);
                }))
                .event_if_changed(note)
        }
        Step::Label => {
            node::label(ctx, node_name).await?;
            Outcome::again()
        }
        Step::Taint => {
            node::taint(ctx, node_name).await?;
            Outcome::again()
        }
        Step::Cordon => {
            node::cordon(ctx, node_name, true).await?;
            Outcome::again()
                .status(stamped(|s, now| {
                    s.last_error = None;
                    status::drained(s, now, false, "Draining", "the node is cordoned; draining".into());
                }))
                .event(Note::normal(
                    "CordonNode",
                    format!("Node {node_name} cordoned; draining"),
                ))
        }
        Step::Drain => drain_step(ctx, seen).await?,
        Step::Succeed => succeed(ctx, seen),
    })
}

/// The maintenance failed: the node is given back if it was taken, and the status says why.
async fn fail<'a>(
    ctx: &'a Context,
    seen: &'a Observed,
    message: String,
    give_back: bool,
) -> Result<Outcome<'a, Context>> {
    let nm = &seen.current;
    let node_name = nm.spec.node_name.as_str();
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
    let note = Note::warning("FailedMaintenance", message.clone());
    let logged = message.clone();
    Ok(Outcome::await_change()
        .status(stamped(move |s, now| {
            s.phase = Some(MaintenancePhase::Failed);
            s.last_error = Some(message.clone());
            status::drained(s, now, false, "Failed", message);
        }))
        .then(async move {
            tracing::warn!(maintenance = %nm.name_any(), node = node_name, message = %logged, "maintenance failed");
            Metrics::count(&ctx.metrics.finished, "failed");
            forget_drain(ctx, nm);
            Ok(())
        })
        .event(note))
}

/// Takes the node lease, so the health check does not remediate a node under maintenance.
async fn acquire_lease<'a>(ctx: &'a Context, seen: &Observed) -> Result<Outcome<'a, Context>> {
    let node_name = seen.current.spec.node_name.as_str();
    let requested = ctx
        .leases
        .request(node_name, &seen.node_uid(), leases::MAINTENANCE_HOLDER, LEASE_DURATION)
        .await;
    Ok(match requested {
        Ok(()) if seen.facts.lease_errors > 0 => {
            Outcome::again().status(stamped(|s, _| s.error_on_lease_count = Some(0)))
        }
        // Taken between our read and our request: the next observation waits for it.
        Ok(()) | Err(nodemedic_kube::Error::LeaseHeld { .. }) => Outcome::again(),
        Err(error) => {
            let count = seen.facts.lease_errors as i32 + 1;
            let message = format!("taking the node lease failed ({count} in a row): {error}");
            let note = Note::warning("LeaseFailed", message.clone());
            Outcome::requeue(BLOCKED_RETRY)
                .status(stamped(move |s, _| {
                    s.error_on_lease_count = Some(count);
                    s.last_error = Some(message);
                }))
                .event(note)
        }
    })
}

/// Every pod to evict is gone.
fn succeed<'a>(ctx: &'a Context, seen: &'a Observed) -> Outcome<'a, Context> {
    let nm = &seen.current;
    let started = nm
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| nodemedic_kube::conditions::find(c, nodemedic_api::names::conditions::DRAINED))
        .map(|c| c.last_transition_time.0);
    Outcome::again()
        .status(stamped(|s, now| {
            s.phase = Some(MaintenancePhase::Succeeded);
            s.drain_progress = Some(100);
            s.last_error = None;
            s.blocking_pods = None;
            status::pending(s, Vec::new());
            status::drained(s, now, true, "Drained", "every pod to evict is gone".into());
        }))
        .then(async move {
            if let Some(started) = started {
                let took = nodemedic_kube::time::since(&started, &jiff::Timestamp::now());
                ctx.metrics.drain_seconds.observe(took.as_secs_f64());
            }
            forget_drain(ctx, nm);
            Metrics::count(&ctx.metrics.finished, "succeeded");
            Ok(())
        })
        .event(Note::normal(
            "SucceedMaintenance",
            format!("Node {} is drained", nm.spec.node_name),
        ))
}

/// One drain pass: evicts (or deletes) what may go now, and reports what is left and what blocks.
async fn drain_step<'a>(ctx: &'a Context, seen: &'a Observed) -> Result<Outcome<'a, Context>> {
    let nm = &seen.current;
    let node_name = nm.spec.node_name.as_str();
    let pass = drain::pass(ctx, seen).await?;
    let left = seen.to_remove();
    let selected = nm.status.as_ref().and_then(|s| s.eviction_pods).unwrap_or(0).max(0) as usize;
    let done = progress(selected.max(left.len()), left.len());
    let before = nm.status.clone().unwrap_or_default();
    let blocked = (!pass.blocked.is_empty()).then(|| pass.blocked.clone());
    let summary = blocked.as_deref().map(drain::summary);
    ctx.metrics
        .blocked_pods
        .get_or_create(&NodeLabels { node: node_name.into() })
        .set(pass.blocked.len() as i64);
    let blocked_passes = count_blocked_pass(ctx, nm, pass.blocked.is_empty());
    let mut outcome = Outcome::requeue(if blocked_passes == 0 {
        TERMINATING_RETRY
    } else {
        crate::decide::drain::retry_after(blocked_passes)
    });
    if before.drain_progress != Some(done) {
        outcome = outcome.event(Note::normal(
            "DrainProgress",
            format!("Drain of node {node_name}: {done}% ({} pods left)", left.len()),
        ));
    }
    if let Some(why) = &summary
        && before.blocking_pods != blocked
    {
        tracing::info!(maintenance = %nm.name_any(), node = node_name, %why, "drain blocked");
        outcome = outcome.event(Note::warning("DrainBlocked", why.clone()));
    }
    let pending = refs(&left);
    let left = left.len();
    Ok(outcome.status(stamped(move |s, now| {
        s.drain_progress = Some(done);
        status::pending(s, pending);
        s.blocking_pods = blocked;
        s.last_error = summary.clone();
        match summary {
            Some(why) => status::drained(s, now, false, "DrainBlocked", why),
            None => status::drained(s, now, false, "Draining", format!("{left} pods left to go")),
        }
    })))
}

/// Consecutive drain passes a budget blocked (0 after one it did not), for the backoff.
fn count_blocked_pass(ctx: &Context, nm: &NodeMaintenance, unblocked: bool) -> u32 {
    match ctx.blocked_passes.lock() {
        Ok(mut all) => {
            let n = all.entry(nm.name_any()).or_default();
            *n = if unblocked { 0 } else { n.saturating_add(1) };
            *n
        }
        Err(_) => 1,
    }
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
