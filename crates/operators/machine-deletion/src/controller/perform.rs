//! Carrying out one step: the only code that changes the cluster on a machine deletion
//! remediation's behalf. `None` asks the reconciler to observe and decide again.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::controller::Action,
};
use nodemedic_api::{
    machine_deletion::{
        FINALIZER, MachineDeletionRemediation, MachineDeletionRemediationStatus, annotations as recorded,
    },
    names::{EVENT_PREFIX, conditions as types},
};
use nodemedic_kube::{CallContext, conditions, machines::machine_api, workloads};
use serde_json::json;

use super::{Context, observe::Observed};
use crate::{
    Result,
    decide::{Permanence, Step},
};

/// How often a wait on the machine layer looks again (medik8s polls every 30 s): a few reads of
/// one namespace's Machines per waiting remediation, so a replacement is seen within seconds.
const POLL: Duration = Duration::from_secs(2);

pub async fn perform(
    step: Step,
    seen: &Observed,
    api: &Api<MachineDeletionRemediation>,
    ctx: &Context,
) -> Result<Option<Action>> {
    let mdr = &seen.current;
    let on = nodemedic_kube::events::reference(mdr);
    let events = &ctx.events;
    match step {
        Step::Idle => return Ok(Some(Action::await_change())),
        Step::Stop => {
            let why = "the health check timed this remediation out; nothing more is deleted";
            if write(api, mdr, |s, now| {
                finished(s, now, false, "RemediationStoppedByNHC", why)
            })
            .await?
            {
                events
                    .normal(&on, "RemediationStoppedByNHC", format!("{EVENT_PREFIX}{why}"))
                    .await;
                ctx.metrics.finished("RemediationStoppedByNHC");
            }
            return Ok(Some(Action::await_change()));
        }
        Step::CannotStart { why, message } => {
            let reason = why.reason();
            if write(api, mdr, |s, now| finished(s, now, false, reason, &message)).await? {
                events.warning(&on, reason, format!("{EVENT_PREFIX}{message}")).await;
                tracing::warn!(remediation = %mdr.name_any(), reason, %message, "machine deletion remediation cannot start");
                ctx.metrics.finished(reason);
            }
            // The node or Machine may yet appear (a cache behind, a Machine being created).
            return Ok(Some(Action::requeue(Duration::from_secs(30))));
        }
        Step::AwaitTurn { behind } => {
            let owner = match &seen.facts.target {
                Some(crate::decide::Target::Found(m)) => m.owner.as_ref().map(|o| o.recorded()).unwrap_or_default(),
                _ => String::new(),
            };
            let why = format!(
                "waiting for its turn: {behind} is replacing a Machine of {owner}, and an owner's Machines are deleted one at a time"
            );
            if write(api, mdr, |s, now| processing(s, now, &why)).await? {
                events
                    .normal(&on, "WaitingForTurn", format!("{EVENT_PREFIX}{why}"))
                    .await;
            }
            return Ok(Some(Action::requeue(POLL)));
        }
        Step::DeleteMachine { machine, owner } => {
            let Some(reference) = &seen.machine else {
                return Ok(Some(Action::requeue(POLL)));
            };
            // Recorded first: once the Machine is gone, these are all that says what it was.
            let mut notes = serde_json::Map::new();
            notes.insert(recorded::MACHINE_NAME_NAMESPACE.into(), json!(machine.id));
            notes.insert(recorded::MACHINE_OWNER.into(), json!(owner.recorded()));
            notes.insert(
                recorded::MACHINE_API_VERSION.into(),
                json!(format!("{}/{}", reference.api.group(), reference.version)),
            );
            notes.insert(recorded::OWNER_API_VERSION.into(), json!(owner.api_version));
            if let Some(node) = &machine.node {
                notes.insert(recorded::NODE.into(), json!(node));
            }
            let mut finalizers = mdr.finalizers().to_vec();
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.into());
            }
            let patch = json!({"metadata": {
                "resourceVersion": mdr.resource_version(),
                "annotations": notes,
                "finalizers": finalizers,
            }});
            let patched = api
                .patch(&mdr.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("recording Machine {} on its remediation", machine.id))?;
            let permanence = Permanence::of(machine.provider_id.as_deref());
            let started = format!(
                "deleting Machine {} so that its owner {} replaces it",
                machine.id,
                owner.recorded()
            );
            write(api, &patched, |s, now| {
                let mut changed = processing(s, now, &started);
                let (status, reason, message) = permanence.condition();
                let list = s.conditions.get_or_insert_with(Vec::new);
                changed |= conditions::set_status(
                    list,
                    types::PERMANENT_NODE_DELETION_EXPECTED,
                    status,
                    reason,
                    message.into(),
                    None,
                    now,
                );
                changed
            })
            .await?;
            delete_machine(ctx, reference).await?;
            ctx.metrics.machine_deleted();
            events
                .normal(&on, "RemediationStarted", format!("{EVENT_PREFIX}{started}"))
                .await;
            let (_, reason, message) = permanence.condition();
            events
                .normal(
                    &on,
                    types::PERMANENT_NODE_DELETION_EXPECTED,
                    format!("{EVENT_PREFIX}{message} ({reason})"),
                )
                .await;
        }
        Step::DeleteAgain => {
            if let Some(reference) = &seen.machine {
                delete_machine(ctx, reference).await?;
            }
            return Ok(Some(Action::requeue(POLL)));
        }
        Step::AwaitMachineGone => {
            let machine = seen
                .facts
                .progress
                .as_ref()
                .map(|p| p.recorded.machine.clone())
                .unwrap_or_default();
            let why =
                format!("waiting for Machine {machine} to be deleted (its node drained, its infrastructure removed)");
            if !seen.facts.deleting {
                write(api, mdr, |s, now| processing(s, now, &why)).await?;
            }
            return Ok(Some(Action::requeue(POLL)));
        }
        Step::ReleaseWorkloads => {
            let (pods, attachments) = &seen.leftovers;
            let node = seen
                .facts
                .progress
                .as_ref()
                .and_then(|p| p.recorded.node.clone())
                .unwrap_or_default();
            workloads::force_delete_pods(&ctx.client, pods).await?;
            let released = workloads::release_attachments(&ctx.client, &node, attachments).await?;
            ctx.metrics.released(pods.len() + released);
            events
                .normal(
                    &on,
                    "WorkloadsReleased",
                    format!(
                        "{EVENT_PREFIX}the Machine of node {node} is gone: deleted {} pods and {released} VolumeAttachments it left, so its workloads start elsewhere now",
                        pods.len()
                    ),
                )
                .await;
            return Ok(Some(Action::requeue(Duration::from_secs(1))));
        }
        Step::AwaitReplacement { have, want } => {
            let owner = seen
                .facts
                .progress
                .as_ref()
                .map(|p| p.recorded.owner.clone())
                .unwrap_or_default();
            let why = format!("Machine deleted; waiting for {owner} to have its {want} nodes again ({have} now)");
            write(api, mdr, |s, now| processing(s, now, &why)).await?;
            return Ok(Some(Action::requeue(POLL)));
        }
        Step::Succeed { message } => {
            if write(api, mdr, |s, now| finished(s, now, true, "MachineDeleted", &message)).await? {
                events
                    .normal(&on, "MachineDeleted", format!("{EVENT_PREFIX}{message}"))
                    .await;
                ctx.metrics.finished("MachineDeleted");
            }
            return Ok(Some(Action::await_change()));
        }
        Step::RemoveFinalizer => {
            nodemedic_kube::finalizers::remove(api, mdr, FINALIZER).await?;
            return Ok(Some(Action::await_change()));
        }
    }
    Ok(None)
}

async fn delete_machine(ctx: &Context, reference: &nodemedic_api::machines::MachineRef) -> Result<()> {
    match machine_api(&ctx.client, reference)
        .delete(&reference.name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(nodemedic_kube::Error::call(format!("deleting {reference}"), e).into()),
    }
}

fn processing(s: &mut MachineDeletionRemediationStatus, now: &Time, why: &str) -> bool {
    conditions::set_processing(
        s.conditions.get_or_insert_with(Vec::new),
        "RemediationStarted",
        why,
        now,
    )
}

fn finished(s: &mut MachineDeletionRemediationStatus, now: &Time, ok: bool, reason: &str, why: &str) -> bool {
    conditions::set_finished(s.conditions.get_or_insert_with(Vec::new), ok, reason, why, now)
}

/// Edits the status; writes it (optimistically locked) only when `edit` reports a change.
async fn write(
    api: &Api<MachineDeletionRemediation>,
    mdr: &MachineDeletionRemediation,
    edit: impl FnOnce(&mut MachineDeletionRemediationStatus, &Time) -> bool,
) -> Result<bool> {
    let before = mdr.status.clone().unwrap_or_default();
    let mut status = before.clone();
    if !edit(&mut status, &nodemedic_kube::time::now()) {
        return Ok(false);
    }
    // Fields the edit emptied are removed, not kept as a plain merge patch would keep them.
    let status = nodemedic_kube::merge_patch::replacing(&before, &status);
    let patch = json!({"metadata": {"resourceVersion": mdr.resource_version()}, "status": status});
    api.patch_status(&mdr.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing the status of MachineDeletionRemediation {}", mdr.name_any()))?;
    Ok(true)
}
