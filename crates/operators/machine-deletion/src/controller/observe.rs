//! Reads what a decision needs: the remediation, the Machine to delete or the one it deleted, its
//! owner's replicas and Machines, and what the old node left behind.

use std::collections::BTreeMap;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, ListParams},
};
use nodemedic_api::{
    machine_deletion::{FINALIZER, MachineDeletionRemediation, annotations as recorded},
    machines::{self, MachineApi, MachineRef, NodeOf},
    names::{annotations, conditions as types},
};
use nodemedic_kube::{
    CallContext,
    machines::{api_resource, get_machine, machine_api},
    paged, workloads,
};
use serde_json::Value;

use super::Context;
use crate::{
    Result,
    decide::{Facts, Machine, OwnedMachine, Owner, Presence, Progress, Recorded, Target},
};

pub struct Observed {
    pub current: MachineDeletionRemediation,
    pub facts: Facts,
    /// The Machine to delete, or the one deleted (recorded), to delete again or wait for.
    pub machine: Option<MachineRef>,
    /// The old node's pods and VolumeAttachments from before the remediation.
    pub leftovers: (
        Vec<k8s_openapi::api::core::v1::Pod>,
        Vec<k8s_openapi::api::storage::v1::VolumeAttachment>,
    ),
}

pub(super) async fn observe(current: MachineDeletionRemediation, ctx: &Context) -> Result<Observed> {
    let created = current.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let finished = finished(&current);
    let mut facts = Facts {
        deleting: current.metadata.deletion_timestamp.is_some(),
        has_finalizer: current.finalizers().iter().any(|f| f == FINALIZER),
        timed_out_by_health_check: current.annotations().contains_key(annotations::NHC_TIMED_OUT),
        finished,
        created,
        progress: None,
        target: None,
        turn_taken_by: None,
    };
    let mut seen = Observed {
        current: current.clone(),
        facts: facts.clone(),
        machine: None,
        leftovers: (Vec::new(), Vec::new()),
    };
    if let Some((record, machine)) = recorded_machine(&current) {
        let (progress, leftovers) = progress(ctx, &current, record, &machine, created).await?;
        facts.progress = Some(progress);
        seen.machine = Some(machine);
        seen.leftovers = leftovers;
    } else if !facts.deleting && !facts.finished && !facts.timed_out_by_health_check {
        let (found, reference) = target(ctx, &current).await?;
        if let (Target::Found(Machine { owner: Some(owner), .. }), Some(reference)) = (&found, &reference) {
            let api = Api::namespaced(ctx.client.clone(), &current.namespace().unwrap_or_default());
            facts.turn_taken_by = turn_taken_by(&api, &current, reference, owner).await?;
        }
        facts.target = Some(found);
        seen.machine = reference;
    }
    seen.facts = facts;
    Ok(seen)
}

/// Another remediation in the namespace that deleted a Machine of the same owner and is not done
/// with it (not finished, or still holding its finalizer to release the old node's workloads).
async fn turn_taken_by(
    api: &Api<MachineDeletionRemediation>,
    mdr: &MachineDeletionRemediation,
    machine: &MachineRef,
    owner: &Owner,
) -> Result<Option<String>> {
    let all = api
        .list(&ListParams::default())
        .await
        .context("listing MachineDeletionRemediations")?;
    Ok(all
        .items
        .into_iter()
        .filter(|other| other.uid() != mdr.uid())
        .filter(|other| {
            recorded_machine(other).is_some_and(|(record, reference)| {
                record.owner == owner.recorded()
                    && reference.api == machine.api
                    && reference.namespace == machine.namespace
            })
        })
        .find(|other| {
            let finished = finished(other);
            let releasing = other.finalizers().iter().any(|f| f == FINALIZER);
            if other.metadata.deletion_timestamp.is_some() {
                releasing
            } else {
                !finished
            }
        })
        .map(|other| other.name_any()))
}

/// The deleted Machine, from the annotations recorded before deleting it.
/// Whether the remediation has succeeded or failed (its Succeeded condition is no longer Unknown).
fn finished(mdr: &MachineDeletionRemediation) -> bool {
    let conditions = mdr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    nodemedic_kube::conditions::find(conditions, types::SUCCEEDED).is_some_and(|c| c.status != "Unknown")
}

fn recorded_machine(mdr: &MachineDeletionRemediation) -> Option<(Recorded, MachineRef)> {
    let a = mdr.annotations();
    let machine = a.get(recorded::MACHINE_NAME_NAMESPACE)?;
    let (namespace, name) = machine.split_once('/')?;
    // Without nodemedic's apiVersion annotation, medik8s recorded it: an OpenShift Machine.
    let api_version = a
        .get(recorded::MACHINE_API_VERSION)
        .cloned()
        .unwrap_or_else(|| format!("{}/{}", machines::OPENSHIFT_GROUP, machines::OPENSHIFT_VERSION));
    let api = MachineApi::of_api_version(&api_version)?;
    let reference = MachineRef {
        api,
        version: api_version.split_once('/').map(|(_, v)| v.to_owned())?,
        namespace: namespace.into(),
        name: name.into(),
    };
    let record = Recorded {
        machine: machine.clone(),
        owner: a.get(recorded::MACHINE_OWNER).cloned().unwrap_or_default(),
        node: a.get(recorded::NODE).cloned(),
    };
    Some((record, reference))
}

type Leftovers = (
    Vec<k8s_openapi::api::core::v1::Pod>,
    Vec<k8s_openapi::api::storage::v1::VolumeAttachment>,
);

async fn progress(
    ctx: &Context,
    mdr: &MachineDeletionRemediation,
    record: Recorded,
    machine: &MachineRef,
    began: Option<Timestamp>,
) -> Result<(Progress, Leftovers)> {
    let presence = match get_machine(&ctx.client, machine).await? {
        None => Presence::Gone,
        Some(m) if m.metadata.deletion_timestamp.is_some() => Presence::Deleting,
        Some(_) => Presence::Present,
    };
    // Timestamps have whole seconds: one from the remediation's second counts as before it (a
    // replacement's objects come after the Machine's deletion, well after).
    let before = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| match (t, began) {
        (Some(t), Some(began)) => t.0 <= began,
        _ => false,
    };
    let leftovers = match (&record.node, presence) {
        (Some(node), Presence::Gone) => {
            let pods = workloads::pods(&ctx.client, node).await?;
            let attachments = workloads::attachments(&ctx.client, node).await?;
            (
                pods.into_iter()
                    .filter(|p| before(p.metadata.creation_timestamp.as_ref()))
                    .collect(),
                attachments
                    .into_iter()
                    .filter(|a| before(a.metadata.creation_timestamp.as_ref()))
                    .collect(),
            )
        }
        _ => (Vec::new(), Vec::new()),
    };
    let (replicas, owned) = if presence == Presence::Gone {
        owner_state(ctx, mdr, &record, machine).await?
    } else {
        (None, Vec::new())
    };
    let progress = Progress {
        recorded: record,
        machine: presence,
        leftovers: leftovers.0.len() + leftovers.1.len(),
        replicas,
        owned,
    };
    Ok((progress, leftovers))
}

/// The owner's desired replicas (None: the owner is gone) and its Machines.
async fn owner_state(
    ctx: &Context,
    mdr: &MachineDeletionRemediation,
    record: &Recorded,
    machine: &MachineRef,
) -> Result<(Option<i64>, Vec<OwnedMachine>)> {
    let Some((kind, name)) = record.owner.split_once('/') else {
        return Ok((None, Vec::new()));
    };
    let api_version = mdr
        .annotations()
        .get(recorded::OWNER_API_VERSION)
        .cloned()
        .unwrap_or_else(|| format!("{}/{}", machines::OPENSHIFT_GROUP, machines::OPENSHIFT_VERSION));
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    let owners: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &machine.namespace,
        &api_resource(group, version, kind),
    );
    let owner = match owners.get_opt(name).await {
        Err(kube::Error::Api(status)) if status.code == 404 => None,
        other => other.with_context(|| format!("reading {kind} {}/{name}", machine.namespace))?,
    };
    let Some(owner) = owner else {
        return Ok((None, Vec::new()));
    };
    let replicas = owner
        .data
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let owner_uid = owner.metadata.uid.clone().unwrap_or_default();
    let nodes = node_readiness(ctx).await?;
    Ok((Some(replicas), owned_machines(ctx, machine, &owner_uid, &nodes).await?))
}

// Both read a page at a time, keeping only what the decision needs: a MachineSet of thousands
// of machines, or thousands of nodes, would otherwise be read whole (see nodemedic_kube::paged).

/// Every node's name and whether it is Ready.
async fn node_readiness(ctx: &Context) -> Result<BTreeMap<String, bool>> {
    let mut nodes = BTreeMap::new();
    let api = Api::<Node>::all(ctx.client.clone());
    let mut pages = std::pin::pin!(paged::pages(&api, &ListParams::default()));
    while let Some(page) = pages.next().await {
        nodes.extend(
            page.context("listing nodes")?
                .iter()
                .map(|n| (n.name_any(), is_ready(n))),
        );
    }
    Ok(nodes)
}

/// The Machines in `machine`'s namespace whose controller is the owner `owner_uid`.
async fn owned_machines(
    ctx: &Context,
    machine: &MachineRef,
    owner_uid: &str,
    nodes: &BTreeMap<String, bool>,
) -> Result<Vec<OwnedMachine>> {
    let mut owned = Vec::new();
    let mut pages = std::pin::pin!(paged::pages(&machine_api(&ctx.client, machine), &ListParams::default()));
    while let Some(page) = pages.next().await {
        let page =
            page.with_context(|| format!("listing {} Machines in {}", machine.api.group(), machine.namespace))?;
        let of_owner = page
            .iter()
            .filter(|m| controller_owner(m).is_some_and(|o| o.uid == owner_uid));
        owned.extend(of_owner.map(|m| {
            let node = serde_json::to_value(m).ok().as_ref().and_then(machines::node_ref);
            let ready = node.as_ref().and_then(|n| nodes.get(n));
            OwnedMachine {
                created: m.metadata.creation_timestamp.as_ref().map(|t| t.0),
                deleting: m.metadata.deletion_timestamp.is_some(),
                node_exists: ready.is_some(),
                node_ready: ready.copied().unwrap_or(false),
            }
        }));
    }
    Ok(owned)
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn controller_owner(machine: &DynamicObject) -> Option<Owner> {
    machine
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| Owner {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        })
}

/// The Machine to delete: a Machine owner reference (MachineHealthCheck), else the node's
/// machine annotations (NodeHealthCheck).
async fn target(ctx: &Context, mdr: &MachineDeletionRemediation) -> Result<(Target, Option<MachineRef>)> {
    let reference = match machines::node_of(&mdr.metadata) {
        NodeOf::Machine(reference) => reference,
        NodeOf::Named(node) => {
            if let Some(reference) = machines::machine_owner(&mdr.metadata) {
                reference
            } else {
                let found = Api::<Node>::all(ctx.client.clone())
                    .get_opt(&node)
                    .await
                    .with_context(|| format!("reading node {node}"))?;
                let Some(found) = found else {
                    return Ok((Target::NodeNotFound(node), None));
                };
                match machines::machine_of_node(&found.metadata) {
                    Some(reference) => reference,
                    None => {
                        let why = format!(
                            "node {node} belongs to no Machine: it has neither the {} nor the {} annotation",
                            machines::node_annotations::CLUSTER_API_MACHINE,
                            machines::node_annotations::OPENSHIFT_MACHINE
                        );
                        return Ok((Target::MachineNotFound(why), None));
                    }
                }
            }
        }
    };
    let Some(found) = get_machine(&ctx.client, &reference).await? else {
        return Ok((Target::MachineNotFound(format!("{reference} does not exist")), None));
    };
    let value = serde_json::to_value(&found).unwrap_or(Value::Null);
    let machine = Machine {
        id: format!("{}/{}", reference.namespace, reference.name),
        provider_id: value
            .pointer("/spec/providerID")
            .and_then(Value::as_str)
            .map(str::to_owned),
        owner: controller_owner(&found),
        node: machines::node_ref(&value),
    };
    Ok((Target::Found(machine), Some(reference)))
}
