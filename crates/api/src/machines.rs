//! The two machine layers a remediation may come from: Cluster API (`cluster.x-k8s.io`, plain
//! Kubernetes) and OpenShift's Machine API (`machine.openshift.io`). Which node a remediation is
//! for, read from its metadata alone; reading the Machine itself is the callers' I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::annotations;

pub const CLUSTER_API_GROUP: &str = "cluster.x-k8s.io";
pub const OPENSHIFT_GROUP: &str = "machine.openshift.io";
pub const MACHINE_KIND: &str = "Machine";

/// The version nodemedic reads Cluster API Machines at (served and stored since v1.11); the owner
/// reference's own version is used when it names one.
pub const CLUSTER_API_VERSION: &str = "v1beta2";
pub const OPENSHIFT_VERSION: &str = "v1beta1";

/// Node annotations the machine controllers set.
pub mod node_annotations {
    /// Cluster API: the Machine's name; its namespace is in `CLUSTER_API_NAMESPACE`.
    pub const CLUSTER_API_MACHINE: &str = "cluster.x-k8s.io/machine";
    pub const CLUSTER_API_NAMESPACE: &str = "cluster.x-k8s.io/cluster-namespace";
    /// OpenShift: `<namespace>/<name>`.
    pub const OPENSHIFT_MACHINE: &str = "machine.openshift.io/machine";
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MachineApi {
    ClusterApi,
    OpenShift,
}

impl MachineApi {
    pub fn group(self) -> &'static str {
        match self {
            Self::ClusterApi => CLUSTER_API_GROUP,
            Self::OpenShift => OPENSHIFT_GROUP,
        }
    }

    pub fn default_version(self) -> &'static str {
        match self {
            Self::ClusterApi => CLUSTER_API_VERSION,
            Self::OpenShift => OPENSHIFT_VERSION,
        }
    }

    /// The API of an `apiVersion` (`group/version`), if it is a machine layer's.
    pub fn of_api_version(api_version: &str) -> Option<Self> {
        match api_version.split_once('/')?.0 {
            CLUSTER_API_GROUP => Some(Self::ClusterApi),
            OPENSHIFT_GROUP => Some(Self::OpenShift),
            _ => None,
        }
    }
}

/// One Machine, by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MachineRef {
    pub api: MachineApi,
    /// The version to read it at.
    pub version: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for MachineRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} Machine {}/{}", self.api.group(), self.namespace, self.name)
    }
}

/// What a remediation's metadata says about its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOf {
    /// Named: by the node-name annotation (a health check's, or recorded from a Machine), else by
    /// the object's own name.
    Named(String),
    /// Owned by a Machine and not yet resolved: the node is the Machine's `status.nodeRef`. The
    /// object's name is the Machine's, and may be another node's name, so it names nothing.
    Machine(MachineRef),
}

/// The node of a remediation, from its metadata: the node-name annotation, else a Machine owner
/// reference (either API), else its name.
pub fn node_of(meta: &ObjectMeta) -> NodeOf {
    if let Some(node) = meta.annotations.as_ref().and_then(|a| a.get(annotations::NODE_NAME)) {
        return NodeOf::Named(node.clone());
    }
    match machine_owner(meta) {
        Some(machine) => NodeOf::Machine(machine),
        None => NodeOf::Named(meta.name.clone().unwrap_or_default()),
    }
}

/// The Machine that owns an object, if one does (an owner reference of kind Machine of either
/// API; the controller reference first).
pub fn machine_owner(meta: &ObjectMeta) -> Option<MachineRef> {
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let mut machines: Vec<_> = owners
        .iter()
        .filter(|o| o.kind == MACHINE_KIND)
        .filter_map(|o| Some((o, MachineApi::of_api_version(&o.api_version)?)))
        .collect();
    machines.sort_by_key(|(o, _)| o.controller != Some(true));
    let (owner, api) = machines.into_iter().next()?;
    Some(MachineRef {
        api,
        version: owner
            .api_version
            .split_once('/')
            .map_or(api.default_version(), |(_, v)| v)
            .to_owned(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: owner.name.clone(),
    })
}

/// The Machine a Node belongs to, from the annotations its machine controller sets.
pub fn machine_of_node(node: &ObjectMeta) -> Option<MachineRef> {
    let annotations = node.annotations.as_ref()?;
    if let Some((namespace, name)) = annotations
        .get(node_annotations::OPENSHIFT_MACHINE)
        .and_then(|v| v.split_once('/'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
    {
        return Some(MachineRef {
            api: MachineApi::OpenShift,
            version: OPENSHIFT_VERSION.into(),
            namespace: namespace.into(),
            name: name.into(),
        });
    }
    let name = annotations
        .get(node_annotations::CLUSTER_API_MACHINE)
        .filter(|n| !n.is_empty())?;
    let namespace = annotations
        .get(node_annotations::CLUSTER_API_NAMESPACE)
        .filter(|n| !n.is_empty())?;
    Some(MachineRef {
        api: MachineApi::ClusterApi,
        version: CLUSTER_API_VERSION.into(),
        namespace: namespace.clone(),
        name: name.clone(),
    })
}

/// The node a Machine's status names (`status.nodeRef.name` in every version of both APIs).
pub fn node_ref(machine: &serde_json::Value) -> Option<String> {
    machine
        .pointer("/status/nodeRef/name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use proptest::prelude::*;

    use super::*;

    fn owner(api_version: &str, kind: &str, name: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(controller),
            ..Default::default()
        }
    }

    fn meta(name: &str, annotation: Option<&str>, owners: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            annotations: annotation.map(|n| BTreeMap::from([(annotations::NODE_NAME.to_owned(), n.to_owned())])),
            owner_references: Some(owners),
            ..Default::default()
        }
    }

    #[test]
    fn the_annotation_wins_then_a_machine_owner_then_the_name() {
        let machine = owner("cluster.x-k8s.io/v1beta2", "Machine", "md-0-abc", true);
        assert_eq!(
            node_of(&meta("x", Some("node-1"), vec![machine.clone()])),
            NodeOf::Named("node-1".into())
        );
        assert_eq!(
            node_of(&meta("md-0-abc", None, vec![machine])),
            NodeOf::Machine(MachineRef {
                api: MachineApi::ClusterApi,
                version: "v1beta2".into(),
                namespace: "ns".into(),
                name: "md-0-abc".into()
            })
        );
        let nhc = owner("remediation.medik8s.io/v1alpha1", "NodeHealthCheck", "nhc", false);
        assert_eq!(
            node_of(&meta("node-2", None, vec![nhc])),
            NodeOf::Named("node-2".into())
        );
    }

    #[test]
    fn an_openshift_machine_owner_is_read_at_its_own_version() {
        let m = meta(
            "w-1",
            None,
            vec![owner("machine.openshift.io/v1beta1", "Machine", "w-1", false)],
        );
        assert!(matches!(node_of(&m), NodeOf::Machine(r) if r.api == MachineApi::OpenShift && r.version == "v1beta1"));
    }

    #[test]
    fn a_machine_of_another_group_is_no_machine_owner() {
        let m = meta("n", None, vec![owner("example.com/v1", "Machine", "n", true)]);
        assert_eq!(node_of(&m), NodeOf::Named("n".into()));
    }

    #[test]
    fn nodes_name_their_machine_through_either_controllers_annotations() {
        let node = |pairs: &[(&str, &str)]| ObjectMeta {
            annotations: Some(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()),
            ..Default::default()
        };
        let openshift = machine_of_node(&node(&[(
            node_annotations::OPENSHIFT_MACHINE,
            "openshift-machine-api/w-1",
        )]));
        assert_eq!(
            openshift.map(|m| (m.api, m.namespace, m.name)),
            Some((MachineApi::OpenShift, "openshift-machine-api".into(), "w-1".into()))
        );
        let capi = machine_of_node(&node(&[
            (node_annotations::CLUSTER_API_MACHINE, "md-0-abc"),
            (node_annotations::CLUSTER_API_NAMESPACE, "default"),
        ]));
        assert_eq!(
            capi.map(|m| (m.api, m.namespace, m.name)),
            Some((MachineApi::ClusterApi, "default".into(), "md-0-abc".into()))
        );
        assert_eq!(
            machine_of_node(&node(&[(node_annotations::OPENSHIFT_MACHINE, "no-slash")])),
            None
        );
        assert_eq!(
            machine_of_node(&node(&[(node_annotations::CLUSTER_API_MACHINE, "m")])),
            None
        );
    }

    #[test]
    fn the_node_ref_is_read_from_any_version() {
        assert_eq!(
            node_ref(&serde_json::json!({"status": {"nodeRef": {"name": "node-3"}}})),
            Some("node-3".into())
        );
        assert_eq!(
            node_ref(&serde_json::json!({"status": {"nodeRef": {"name": ""}}})),
            None
        );
        assert_eq!(node_ref(&serde_json::json!({"status": {}})), None);
    }

    proptest! {
        // The safety property behind "Machines named like other nodes": an unresolved
        // Machine-owned remediation never names a node by its own name.
        #[test]
        fn a_machine_owned_remediation_without_annotation_never_names_a_node(
            name in "[a-z0-9-]{1,20}",
            api in prop_oneof![Just("cluster.x-k8s.io/v1beta1"), Just("cluster.x-k8s.io/v1beta2"), Just("machine.openshift.io/v1beta1")],
            controller in any::<bool>(),
            others in proptest::collection::vec("[a-z]{1,8}", 0..3),
        ) {
            let mut owners: Vec<_> = others.iter().map(|o| owner("apps/v1", "ReplicaSet", o, false)).collect();
            owners.push(owner(api, "Machine", &name, controller));
            prop_assert!(matches!(node_of(&meta(&name, None, owners)), NodeOf::Machine(_)));
        }
    }
}
