//! The lab as Cluster API's infrastructure provider: a `LabMachine` gets a host (a lab node,
//! adopted or added, see [`super::pool`]) and reports it provisioned; a deleted one has its host
//! powered off and removed before it may go, so a Machine that is gone has nothing running.

use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

use super::{
    Hosts,
    kinds::{FINALIZER, LabMachine},
    pool,
};
use crate::{Result, lab::Inner};

pub(super) async fn reconcile(inner: &Inner, hosts: &Hosts) -> Result<()> {
    let all = Api::<LabMachine>::all(inner.client.clone())
        .list(&ListParams::default())
        .await?;
    for machine in all.items {
        let api = Api::<LabMachine>::namespaced(inner.client.clone(), &machine.namespace().unwrap_or_default());
        if machine.metadata.deletion_timestamp.is_some() {
            release(inner, &api, &machine).await?;
        } else {
            provision(inner, hosts, &api, &machine).await?;
        }
    }
    Ok(())
}

async fn provision(inner: &Inner, hosts: &Hosts, api: &Api<LabMachine>, machine: &LabMachine) -> Result<()> {
    let name = machine.name_any();
    let machine = nodemedic_kube::finalizers::add(api, machine, FINALIZER).await?;
    let provider_id = match machine.spec.provider_id.clone() {
        Some(id) => id,
        None => {
            let node = hosts
                .provision_into(inner, api, &name, machine.spec.host.as_deref())
                .await?;
            crate::nodes::provider_id(&node)
        }
    };
    let provisioned = machine
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        .unwrap_or(false);
    if !provisioned && pool::node_of(&provider_id).is_some() {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"initialization": {"provisioned": true}}})),
        )
        .await?;
    }
    Ok(())
}

async fn release(inner: &Inner, api: &Api<LabMachine>, machine: &LabMachine) -> Result<()> {
    if !nodemedic_kube::finalizers::has(machine, FINALIZER) {
        return Ok(());
    }
    if let Some(node) = machine.spec.provider_id.as_deref().and_then(pool::node_of) {
        Hosts::decommission(inner, node, &format!("LabMachine {}", machine.name_any())).await?;
    }
    nodemedic_kube::finalizers::remove(api, machine, FINALIZER).await?;
    Ok(())
}
