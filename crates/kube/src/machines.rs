//! Reading Machines of either machine layer (Cluster API or OpenShift), which nodemedic does not
//! compile types for: their schemas are the layers' own and differ by version.

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    core::NamespaceResourceScope,
};
use nodemedic_api::{
    machines::{self, MACHINE_KIND, MachineRef, NodeOf},
    names::annotations,
};
use serde::de::DeserializeOwned;

use crate::{CallContext, Result};

/// The API of one machine layer's kind at a version, e.g. MachineSet at `cluster.x-k8s.io/v1beta2`.
pub fn api_resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

pub fn machine_api(client: &Client, machine: &MachineRef) -> Api<DynamicObject> {
    let resource = api_resource(machine.api.group(), &machine.version, MACHINE_KIND);
    Api::namespaced_with(client.clone(), &machine.namespace, &resource)
}

/// The Machine, or None when it does not exist (or its API is not installed).
pub async fn get_machine(client: &Client, machine: &MachineRef) -> Result<Option<DynamicObject>> {
    match machine_api(client, machine).get_opt(&machine.name).await {
        // A missing CRD answers 404 for the whole resource: no such Machine either.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        other => other.with_context(|| format!("reading {machine}")),
    }
}

/// Where a remediation's node stands once its Machine, if it has one, is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    Node(String),
    /// The Machine exists and has no node yet (still provisioning).
    MachineWithoutNode(MachineRef),
    MachineNotFound(MachineRef),
}

impl Resolved {
    /// Why there is no node to remediate, for a status message or event.
    pub(crate) fn why_no_node(&self) -> Option<String> {
        match self {
            Self::Node(_) => None,
            Self::MachineWithoutNode(m) => Some(format!("{m} has no node yet (its status.nodeRef is empty)")),
            Self::MachineNotFound(m) => Some(format!("{m}, which owns this remediation, does not exist")),
        }
    }
}

/// What a remediation that names no node yet (one a MachineHealthCheck created, named after its
/// Machine) does before its own steps, once its Machine is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Nothing to resolve: the remediation is being deleted or has finished.
    Settled,
    /// Record the Machine's node on the remediation; the next observation remediates it.
    RecordNode(String),
    /// The Machine names no node, for this reason: nothing to remediate.
    NoNode(String),
}

impl From<Resolved> for Resolution {
    fn from(resolved: Resolved) -> Self {
        match resolved {
            Resolved::Node(node) => Self::RecordNode(node),
            unresolved => Self::NoNode(unresolved.why_no_node().unwrap_or_default()),
        }
    }
}

/// Reads the Machine of a remediation that names no node, unless it is `settled`.
pub async fn resolution(
    client: &Client,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    settled: bool,
) -> Result<Resolution> {
    if settled || meta.deletion_timestamp.is_some() {
        return Ok(Resolution::Settled);
    }
    Ok(resolve_node(client, meta).await?.into())
}

pub(crate) async fn resolve_node(
    client: &Client,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<Resolved> {
    match machines::node_of(meta) {
        NodeOf::Named(node) => Ok(Resolved::Node(node)),
        NodeOf::Machine(machine) => Ok(match get_machine(client, &machine).await? {
            None => Resolved::MachineNotFound(machine),
            Some(object) => match serde_json::to_value(&object).ok().as_ref().and_then(machines::node_ref) {
                Some(node) => Resolved::Node(node),
                None => Resolved::MachineWithoutNode(machine),
            },
        }),
    }
}

/// Records the node of a Machine-owned remediation in its node-name annotation, so that every
/// later reader (the agents among them, which do not read Machines) sees the same node even once
/// the Machine is gone.
pub async fn record_node<K>(client: &Client, object: &K, node: &str) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api = Api::<K>::namespaced(client.clone(), &object.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"annotations": {annotations::NODE_NAME: node}}});
    api.patch(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("recording node {node} on {} {}", K::kind(&()), object.name_any()))?;
    tracing::info!(remediation = %object.name_any(), %node, "node of the owning Machine recorded");
    Ok(())
}

#[cfg(test)]
mod tests {
    use nodemedic_api::machines::{MachineApi, MachineRef};

    use super::*;

    #[test]
    fn a_machine_named_remediation_records_its_node_or_says_why_there_is_none() {
        assert_eq!(
            Resolution::from(Resolved::Node("w1".into())),
            Resolution::RecordNode("w1".into())
        );
        let machine = MachineRef {
            api: MachineApi::ClusterApi,
            version: "v1beta2".into(),
            namespace: "ns".into(),
            name: "m1".into(),
        };
        let Resolution::NoNode(why) = Resolution::from(Resolved::MachineNotFound(machine.clone())) else {
            panic!("a missing Machine has no node");
        };
        assert!(why.contains("ns/m1") && why.contains("does not exist"), "{why}");
        let Resolution::NoNode(why) = Resolution::from(Resolved::MachineWithoutNode(machine)) else {
            panic!("a Machine still provisioning has no node");
        };
        assert!(why.contains("no node yet"), "{why}");
    }
}
