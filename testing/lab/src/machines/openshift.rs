//! The lab as OpenShift's Machine API controllers, which cannot be had here (no upstream
//! controller builds outside OpenShift): a `machine.openshift.io` MachineSet gets Machines up to
//! its replicas; a Machine gets a host (see [`super::pool`]), its `status.nodeRef`, and the
//! node annotation `machine.openshift.io/machine`; a deleted Machine has its host powered off
//! and removed before it may go. Only what nodemedic reads and relies on: no scale-down, no
//! phases beyond Running, no drain.

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::{Hosts, pool};
use crate::{Result, lab::Inner};

pub const GROUP: &str = "machine.openshift.io";
pub const VERSION: &str = "v1beta1";
/// The finalizer OpenShift's machine controller puts on every Machine.
const FINALIZER: &str = "machine.machine.openshift.io";
const MACHINE_ANNOTATION: &str = "machine.openshift.io/machine";

pub(super) fn all(client: &Client, kind: &str) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &nodemedic_kube::machines::api_resource(GROUP, VERSION, kind),
    )
}

fn namespaced(client: &Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &nodemedic_kube::machines::api_resource(GROUP, VERSION, kind),
    )
}

pub(super) async fn reconcile(inner: &Inner, hosts: &Hosts) -> Result<()> {
    let machines = all(&inner.client, "Machine").list(&ListParams::default()).await?.items;
    for set in all(&inner.client, "MachineSet")
        .list(&ListParams::default())
        .await?
        .items
    {
        scale_up(&inner.client, &set, &machines).await?;
    }
    for machine in &machines {
        if machine.metadata.deletion_timestamp.is_some() {
            release(inner, machine).await?;
        } else {
            provision(inner, hosts, machine).await?;
        }
    }
    Ok(())
}

fn controlled_by(machine: &DynamicObject, set: &DynamicObject) -> bool {
    machine
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == set.metadata.uid.as_ref())
}

async fn scale_up(client: &Client, set: &DynamicObject, machines: &[DynamicObject]) -> Result<()> {
    let wanted = set.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let live = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none() && controlled_by(m, set))
        .count() as i64;
    let (Some(uid), Some(namespace)) = (set.metadata.uid.clone(), set.namespace()) else {
        return Ok(());
    };
    for _ in live..wanted {
        let template = set.data.pointer("/spec/template").cloned().unwrap_or_default();
        let body = json!({
            "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Machine",
            "metadata": {
                "generateName": format!("{}-", set.name_any()),
                "namespace": namespace,
                "labels": template.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
                "ownerReferences": [{"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "MachineSet",
                    "name": set.name_any(), "uid": uid, "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": template.get("spec").cloned().unwrap_or(json!({})),
        });
        let machine: DynamicObject = serde_json::from_value(body)
            .map_err(|e| crate::Error::Invalid(format!("a Machine of MachineSet {}: {e}", set.name_any())))?;
        namespaced(client, &namespace, "Machine")
            .create(&PostParams::default(), &machine)
            .await?;
        tracing::info!(set = %set.name_any(), "lab machine controller: created a Machine");
    }
    Ok(())
}

async fn provision(inner: &Inner, hosts: &Hosts, machine: &DynamicObject) -> Result<()> {
    let (name, namespace) = (machine.name_any(), machine.namespace().unwrap_or_default());
    let api = namespaced(&inner.client, &namespace, "Machine");
    if !machine.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = machine.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        set_finalizers(&api, machine, finalizers).await?;
    }
    let provider_id = machine.data.pointer("/spec/providerID").and_then(Value::as_str);
    let node = match provider_id.and_then(pool::node_of) {
        Some(node) => node.to_owned(),
        None => hosts.provision_into(inner, &api, &name, None).await?,
    };
    if machine.data.pointer("/status/nodeRef/name").is_some() {
        return Ok(());
    }
    let nodes = Api::<Node>::all(inner.client.clone());
    let Some(found) = nodes.get_opt(&node).await? else {
        return Ok(());
    };
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {MACHINE_ANNOTATION: format!("{namespace}/{name}")}}})),
        )
        .await?;
    let status = json!({"status": {"phase": "Running",
        "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": found.metadata.uid}}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    tracing::info!(machine = %name, %node, "lab machine controller: Machine running");
    Ok(())
}

async fn release(inner: &Inner, machine: &DynamicObject) -> Result<()> {
    if !machine.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let name = machine.name_any();
    let provider_id = machine.data.pointer("/spec/providerID").and_then(Value::as_str);
    if let Some(node) = provider_id.and_then(pool::node_of) {
        Hosts::decommission(inner, node, &format!("Machine {name}")).await?;
    }
    let api = namespaced(&inner.client, &machine.namespace().unwrap_or_default(), "Machine");
    let kept = machine
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(&api, machine, kept).await
}

/// Writes the finalizer list as of the object's resourceVersion (a conflict retries next round).
async fn set_finalizers(api: &Api<DynamicObject>, machine: &DynamicObject, finalizers: Vec<String>) -> Result<()> {
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": machine.resource_version()}});
    match api
        .patch(&machine.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map(|_| ()).map_err(Into::into),
    }
}
