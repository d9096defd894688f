//! Carrying out one step: the only code that changes the cluster on a machine deletion
//! remediation's behalf. The status edit and events each step returns are the step runner's to
//! write and publish.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use nodemedic_api::{
    machine_deletion::{
        FINALIZER, MachineDeletionRemediation, MachineDeletionRemediationStatus, annotations as recorded,
    },
    machines::MachineRef,
    names::{EVENT_PREFIX, conditions as types},
};
use nodemedic_kube::{CallContext, conditions, events::Note, machines::machine_api, steps::Outcome, workloads};
use serde_json::json;

use super::{Context, observe::Observed};
use crate::{
    Result,
    decide::{Machine, Owner, Permanence, Recorded, Step, Target},
};

/// How often a wait on the machine layer looks again (medik8s polls every 30 s): a few reads of
/// one namespace's Machines per waiting remediation, so a replacement is seen within seconds.
const POLL: Duration = Duration::from_secs(2);

pub(super) async fn perform<'a>(
    step: Step,
    seen: &'a Observed,
    api: &'a Api<MachineDeletionRemediation>,
    ctx: &'a Context,
) -> Result<Outcome<'a, Context>> {
    Ok(match step {
        Step::Idle => Outcome::await_change(),
        Step::Stop => {
            let why = "the health check timed this remediation out; nothing more is deleted";
            // Decided only while Succeeded is unset, so a successful write is the one change.
            Outcome::await_change()
                .status(move |s, now| finished(s, now, false, "RemediationStoppedByNHC", why))
                .then(count_finished(ctx, "RemediationStoppedByNHC"))
                .event_if_changed(Note::normal("RemediationStoppedByNHC", format!("{EVENT_PREFIX}{why}")))
        }
        Step::CannotStart { why, message } => cannot_start(why.reason(), message, seen, ctx),
        Step::AwaitTurn { behind } => {
            let owner = match &seen.facts.target {
                Some(Target::Found(m)) => m.owner.as_ref().map(|o| o.recorded()).unwrap_or_default(),
                _ => String::new(),
            };
            let why = format!(
                "waiting for its turn: {behind} is replacing a Machine of {owner}, and an owner's Machines are deleted one at a time"
            );
            let note = Note::normal("WaitingForTurn", format!("{EVENT_PREFIX}{why}"));
            Outcome::requeue(POLL)
                .status(move |s, now| processing(s, now, &why))
                .event_if_changed(note)
        }
        Step::DeleteMachine { machine, owner } => match &seen.machine {
            Some(reference) => delete(&machine, &owner, reference, seen, api, ctx).await?,
            None => Outcome::requeue(POLL),
        },
        Step::DeleteAgain => {
            if let Some(reference) = &seen.machine {
                delete_machine(ctx, reference).await?;
            }
            Outcome::requeue(POLL)
        }
        Step::AwaitMachineGone => {
            let why = format!(
                "waiting for Machine {} to be deleted (its node drained, its infrastructure removed)",
                recorded(seen, |r| r.machine.clone())
            );
            let outcome = Outcome::requeue(POLL);
            if seen.facts.deleting {
                outcome
            } else {
                outcome.status(move |s, now| processing(s, now, &why))
            }
        }
        Step::ReleaseWorkloads => {
            let (pods, attachments) = &seen.leftovers;
            let node = recorded(seen, |r| r.node.clone().unwrap_or_default());
            workloads::force_delete_pods(&ctx.client, pods).await?;
            let released = workloads::release_attachments(&ctx.client, &node, attachments).await?;
            ctx.metrics.released(pods.len() + released);
            Outcome::requeue(Duration::from_secs(1)).event(Note::normal(
                "WorkloadsReleased",
                format!(
                    "{EVENT_PREFIX}the Machine of node {node} is gone: deleted {} pods and {released} VolumeAttachments it left, so its workloads start elsewhere now",
                    pods.len()
                ),
            ))
        }
        Step::AwaitReplacement { have, want } => {
            let owner = recorded(seen, |r| r.owner.clone());
            let why = format!("Machine deleted; waiting for {owner} to have its {want} nodes again ({have} now)");
            Outcome::requeue(POLL).status(move |s, now| processing(s, now, &why))
        }
        Step::Succeed { message } => {
            let note = Note::normal("MachineDeleted", format!("{EVENT_PREFIX}{message}"));
            Outcome::await_change()
                .status(move |s, now| finished(s, now, true, "MachineDeleted", &message))
                .then(count_finished(ctx, "MachineDeleted"))
                .event_if_changed(note)
        }
        Step::RemoveFinalizer => {
            nodemedic_kube::finalizers::remove(api, &seen.current, FINALIZER).await?;
            Outcome::await_change()
        }
    })
}

/// Why a remediation cannot start, said once; looked at again later, since the node or Machine
/// may yet appear (a cache behind, a Machine being created).
fn cannot_start<'a>(
    reason: &'static str,
    message: String,
    seen: &'a Observed,
    ctx: &'a Context,
) -> Outcome<'a, Context> {
    let name = seen.current.name_any();
    let note = Note::warning(reason, format!("{EVENT_PREFIX}{message}"));
    let logged = message.clone();
    Outcome::requeue(Duration::from_secs(30))
        .status(move |s, now| finished(s, now, false, reason, &message))
        .then(async move {
            tracing::warn!(remediation = %name, reason, message = %logged, "machine deletion remediation cannot start");
            ctx.metrics.finished(reason);
            Ok(())
        })
        .event_if_changed(note)
}

/// Records the Machine, its owner and node on the remediation, then deletes the Machine.
async fn delete<'a>(
    machine: &Machine,
    owner: &Owner,
    reference: &'a MachineRef,
    seen: &'a Observed,
    api: &'a Api<MachineDeletionRemediation>,
    ctx: &'a Context,
) -> Result<Outcome<'a, Context>> {
    let mdr = &seen.current;
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
    let (status, reason, message) = permanence.condition();
    let started = format!(
        "deleting Machine {} so that its owner {} replaces it",
        machine.id,
        owner.recorded()
    );
    let started_note = Note::normal("RemediationStarted", format!("{EVENT_PREFIX}{started}"));
    Ok(Outcome::again()
        .status_of(patched, move |s, now| {
            let mut changed = processing(s, now, &started);
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
        .then(async move {
            delete_machine(ctx, reference).await?;
            ctx.metrics.machine_deleted();
            Ok(())
        })
        .event(started_note)
        .event(Note::normal(
            types::PERMANENT_NODE_DELETION_EXPECTED,
            format!("{EVENT_PREFIX}{message} ({reason})"),
        )))
}

/// What the remediation's annotations record of the deleted Machine.
fn recorded(seen: &Observed, field: impl FnOnce(&Recorded) -> String) -> String {
    seen.facts
        .progress
        .as_ref()
        .map(|p| field(&p.recorded))
        .unwrap_or_default()
}

async fn count_finished(ctx: &Context, reason: &'static str) -> Result<()> {
    ctx.metrics.finished(reason);
    Ok(())
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
