//! A cluster upgrade postpones new remediation. During one, nodes drain and reboot one after
//! another and look unhealthy for a while; remediating them fights the upgrade (medik8s postpones
//! on OpenShift for the same reason, seed 001). Remediations already under way go on, escalation
//! included, and healthy nodes' remediations are still removed.
//!
//! What says an upgrade is under way, each a plain function of an object as the API serves it:
//! OpenShift's ClusterVersion (`Progressing=True`) and MachineConfigPools (`Updating=True`), a
//! node whose machine config is changing (the Machine Config Operator's desired and current
//! configs differ, as medik8s checks for hosted control planes), Cluster API's
//! KubeadmControlPlanes and MachineDeployments rolling out (fewer machines up to date than
//! exist, or a control plane moving to another version), and, for any other upgrade tool, the
//! node annotation [`UPGRADE_ANNOTATION`].

use std::collections::{BTreeMap, BTreeSet};

use nodemedic_api::machines::MachineApi;
use serde_json::Value;

use super::{
    NodeFacts,
    conflict::{CLUSTER_NAME_LABEL, MachineKey},
};

/// An upgrade an object says is under way.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Upgrade {
    pub what: String,
    /// When it began, when its object says (the condition's transition time): a node unhealthy
    /// since before then is not the upgrade's doing, and is remediated.
    pub since: Option<jiff::Timestamp>,
    /// A Cluster API object's cluster (namespace, name): it holds back only the nodes of that
    /// cluster's Machines. A management cluster's MachineDeployments roll its workload clusters
    /// out, not its own nodes.
    pub cluster: Option<(String, String)>,
}

impl Upgrade {
    /// An upgrade of the whole cluster (OpenShift's).
    pub fn everywhere(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            since: None,
            cluster: None,
        }
    }
}

/// The upgrades that hold a check's new remediations back, said, and since when the earliest
/// began (`None`: one of them cannot say, so it may have begun at any time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub why: String,
    pub since: Option<jiff::Timestamp>,
}

impl Hold {
    /// Whether it holds a node unhealthy since `unhealthy_since` back.
    pub(super) fn holds(&self, unhealthy_since: jiff::Timestamp) -> bool {
        self.since.is_none_or(|began| unhealthy_since >= began)
    }
}

/// Set on a node (any value: who is upgrading it and why) by an upgrade tool nodemedic does not
/// know: while a node a health check selects carries it, the check starts no new remediation.
pub const UPGRADE_ANNOTATION: &str = "nodemedic.medik8s.io/upgrade-in-progress";
/// The Machine Config Operator's node annotations.
pub const MCO_DESIRED_CONFIG: &str = "machineconfiguration.openshift.io/desiredConfig";
pub const MCO_CURRENT_CONFIG: &str = "machineconfiguration.openshift.io/currentConfig";

/// A kind whose objects may say the cluster is upgrading, found by its group (the served
/// version is discovered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    pub group: &'static str,
    pub kind: &'static str,
}

pub const SOURCES: [Source; 4] = [
    Source {
        group: "config.openshift.io",
        kind: "ClusterVersion",
    },
    Source {
        group: "machineconfiguration.openshift.io",
        kind: "MachineConfigPool",
    },
    Source {
        group: "controlplane.cluster.x-k8s.io",
        kind: "KubeadmControlPlane",
    },
    Source {
        group: "cluster.x-k8s.io",
        kind: "MachineDeployment",
    },
];

/// What an object of one of the [`SOURCES`] says, when it says an upgrade is under way.
pub fn upgrading(kind: &str, object: &Value) -> Option<Upgrade> {
    let what = describe(kind, object)?;
    let condition = match kind {
        "ClusterVersion" => "Progressing",
        "MachineConfigPool" => "Updating",
        _ => "RollingOut",
    };
    let since = object["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == condition && c["status"] == "True"))
        .and_then(|c| c["lastTransitionTime"].as_str()?.parse().ok());
    let cluster = match kind {
        "KubeadmControlPlane" | "MachineDeployment" => {
            let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = object["spec"]["clusterName"]
                .as_str()
                .or_else(|| object["metadata"]["labels"][CLUSTER_NAME_LABEL].as_str())
                .unwrap_or_default();
            Some((namespace.to_owned(), name.to_owned()))
        }
        _ => None,
    };
    Some(Upgrade { what, since, cluster })
}

fn describe(kind: &str, object: &Value) -> Option<String> {
    let what = format!("{kind} {}", name_of(object));
    // Said without the conditions' messages, which change with every step of the upgrade ("512 of
    // 870 done"): each change would wake every check and rewrite its condition.
    match kind {
        "ClusterVersion" => {
            condition_true(object, "Progressing").map(|_| match object["status"]["desired"]["version"].as_str() {
                Some(version) => format!("{what} is progressing towards {version}"),
                None => format!("{what} is progressing"),
            })
        }
        "MachineConfigPool" => condition_true(object, "Updating").map(|_| format!("{what} is updating")),
        "KubeadmControlPlane" | "MachineDeployment" => rolling_out(object).map(|how| format!("{what} {how}")),
        _ => None,
    }
}

/// What a node's own annotations say.
pub fn node_upgrading(annotations: &BTreeMap<String, String>) -> Option<String> {
    if let Some(why) = annotations.get(UPGRADE_ANNOTATION) {
        return Some(format!("it is annotated {UPGRADE_ANNOTATION}={why:?}"));
    }
    let desired = annotations.get(MCO_DESIRED_CONFIG)?;
    let current = annotations.get(MCO_CURRENT_CONFIG)?;
    (desired != current).then(|| format!("its machine config changes from {current} to {desired}"))
}

/// The upgrade that postpones a check's new remediations: one of the whole cluster, one of the
/// Cluster API cluster a selected node's Machine is of, or one on a node the check selects.
/// Says at most three, and how many more.
pub(super) fn in_progress(
    upgrades: &[Upgrade],
    selected: &[&NodeFacts],
    machines: &BTreeMap<MachineKey, BTreeMap<String, String>>,
) -> Option<Hold> {
    let clusters: BTreeSet<(String, String)> = selected
        .iter()
        .filter_map(|n| {
            let key = n
                .machine
                .as_ref()
                .filter(|(api, _, _)| *api == MachineApi::ClusterApi)?;
            let cluster = machines.get(key)?.get(CLUSTER_NAME_LABEL)?;
            Some((key.1.clone(), cluster.clone()))
        })
        .collect();
    let ours: Vec<&Upgrade> = upgrades
        .iter()
        .filter(|u| u.cluster.as_ref().is_none_or(|c| clusters.contains(c)))
        .collect();
    let on_nodes: Vec<String> = selected
        .iter()
        .filter_map(|n| Some(format!("node {}: {}", n.name, n.upgrading.as_deref()?)))
        .collect();
    // A node's own sign (an annotation) says nothing of when it began.
    let since = if on_nodes.is_empty() {
        ours.iter().map(|u| u.since).min().flatten()
    } else {
        None
    };
    let all: Vec<String> = ours.iter().map(|u| u.what.clone()).chain(on_nodes).collect();
    let (shown, more) = all.split_at(all.len().min(3));
    let why = match (shown.is_empty(), more.len()) {
        (true, _) => return None,
        (false, 0) => shown.join("; "),
        (false, n) => format!("{}; and {n} more", shown.join("; ")),
    };
    Some(Hold { why, since })
}

fn name_of(object: &Value) -> String {
    let meta = &object["metadata"];
    match (meta["namespace"].as_str(), meta["name"].as_str()) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_owned(),
        _ => "(unnamed)".to_owned(),
    }
}

/// `Some(": <message>")` (or `Some("")`) when the status condition is True.
fn condition_true(object: &Value, type_: &str) -> Option<String> {
    let condition = object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == "True")?;
    Some(match condition["message"].as_str() {
        Some(m) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    })
}

/// A Cluster API control plane or machine deployment rolling out, in either API version:
/// v1beta2 counts `upToDateReplicas` and has a `RollingOut` condition, v1beta1 counts
/// `updatedReplicas`; a control plane also names the version its machines are at.
fn rolling_out(object: &Value) -> Option<String> {
    let status = &object["status"];
    if let (Some(wanted), Some(at)) = (object["spec"]["version"].as_str(), status["version"].as_str())
        && wanted != at
    {
        return Some(format!("is moving from {at} to {wanted}"));
    }
    if let Some(message) = condition_true(object, "RollingOut") {
        return Some(format!("is rolling out{message}"));
    }
    let replicas = status["replicas"].as_u64()?;
    let up_to_date = status["upToDateReplicas"]
        .as_u64()
        .or_else(|| status["updatedReplicas"].as_u64())?;
    (up_to_date < replicas).then(|| format!("is rolling out: {up_to_date} of {replicas} machines up to date"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_progressing_cluster_version_is_an_upgrade_and_a_settled_one_is_not() {
        let mut version = json!({"metadata": {"name": "version"}, "status": {"desired": {"version": "4.16.3"}, "conditions": [
            {"type": "Available", "status": "True"},
            {"type": "Progressing", "status": "True", "message": "Working towards 4.16.3: 512 of 870 done",
                "lastTransitionTime": "2026-11-29T10:00:00Z"}
        ]}});
        let upgrade = upgrading("ClusterVersion", &version).expect("an upgrade");
        assert_eq!(upgrade.what, "ClusterVersion version is progressing towards 4.16.3");
        assert_eq!(
            upgrade.since,
            "2026-11-29T10:00:00Z".parse().ok(),
            "began when it started progressing"
        );
        version["status"]["conditions"][1]["status"] = json!("False");
        assert_eq!(upgrading("ClusterVersion", &version), None);
        assert_eq!(
            upgrading("ClusterVersion", &json!({"metadata": {"name": "version"}})),
            None
        );
    }

    #[test]
    fn an_updating_machine_config_pool_is_an_upgrade() {
        let pool = json!({"metadata": {"name": "worker"}, "status": {"conditions": [
            {"type": "Updating", "status": "True", "message": "2 of 5 machines updated"}
        ]}});
        assert_eq!(
            upgrading("MachineConfigPool", &pool).map(|u| u.what).as_deref(),
            Some("MachineConfigPool worker is updating")
        );
    }

    #[test]
    fn cluster_api_rollouts_are_seen_in_both_api_versions() {
        let v1beta1 = |updated: u64| {
            json!({"metadata": {"namespace": "default", "name": "md"},
                "status": {"replicas": 3, "updatedReplicas": updated}})
        };
        assert_eq!(
            upgrading("MachineDeployment", &v1beta1(1)).map(|u| u.what).as_deref(),
            Some("MachineDeployment default/md is rolling out: 1 of 3 machines up to date")
        );
        assert_eq!(upgrading("MachineDeployment", &v1beta1(3)), None);
        let v1beta2 = json!({"metadata": {"namespace": "default", "name": "md"},
            "status": {"replicas": 3, "upToDateReplicas": 2}});
        assert!(upgrading("MachineDeployment", &v1beta2).is_some());
        let condition = json!({"metadata": {"namespace": "default", "name": "md"},
            "status": {"replicas": 3, "upToDateReplicas": 3, "conditions": [
                {"type": "RollingOut", "status": "True", "message": "Rolling out 1 machine"}]}});
        assert_eq!(
            upgrading("MachineDeployment", &condition).map(|u| u.what).as_deref(),
            Some("MachineDeployment default/md is rolling out: Rolling out 1 machine")
        );
        let control_plane = json!({"metadata": {"namespace": "default", "name": "cp"},
            "spec": {"version": "v1.31.1"},
            "status": {"version": "v1.30.4", "replicas": 3, "updatedReplicas": 3}});
        assert_eq!(
            upgrading("KubeadmControlPlane", &control_plane)
                .map(|u| u.what)
                .as_deref(),
            Some("KubeadmControlPlane default/cp is moving from v1.30.4 to v1.31.1")
        );
        let new_deployment = json!({"metadata": {"namespace": "default", "name": "md"}, "status": {}});
        assert_eq!(upgrading("MachineDeployment", &new_deployment), None, "no counts yet");
    }

    #[test]
    fn a_cluster_api_rollout_holds_back_only_the_nodes_of_its_cluster() {
        let deployment = json!({"metadata": {"namespace": "tenants", "name": "md"},
            "spec": {"clusterName": "tenant-a"}, "status": {"replicas": 3, "upToDateReplicas": 1}});
        let upgrade = upgrading("MachineDeployment", &deployment).expect("rolling out");
        assert_eq!(upgrade.cluster, Some(("tenants".into(), "tenant-a".into())));
        let mut own = crate::decide::tests::node("w1", "True", 0);
        own.machine = Some((MachineApi::ClusterApi, "tenants".into(), "m-1".into()));
        let machines = |cluster: &str| -> BTreeMap<MachineKey, BTreeMap<String, String>> {
            let key = (MachineApi::ClusterApi, "tenants".to_owned(), "m-1".to_owned());
            [(key, [(CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned())].into())].into()
        };
        let upgrades = [upgrade];
        assert!(in_progress(&upgrades, &[&own], &machines("tenant-a")).is_some());
        assert_eq!(in_progress(&upgrades, &[&own], &machines("management")), None);
        let not_a_machine = crate::decide::tests::node("w2", "True", 0);
        assert_eq!(in_progress(&upgrades, &[&not_a_machine], &machines("tenant-a")), None);
        let openshift = [Upgrade::everywhere("ClusterVersion version is progressing")];
        assert!(in_progress(&openshift, &[&not_a_machine], &BTreeMap::new()).is_some());
    }

    #[test]
    fn a_node_says_so_by_the_annotation_or_by_its_machine_config() {
        let annotations = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        assert_eq!(node_upgrading(&annotations(&[])), None);
        assert!(
            node_upgrading(&annotations(&[(UPGRADE_ANNOTATION, "kured")])).is_some_and(|why| why.contains("\"kured\""))
        );
        let settled = [(MCO_DESIRED_CONFIG, "rendered-a"), (MCO_CURRENT_CONFIG, "rendered-a")];
        assert_eq!(node_upgrading(&annotations(&settled)), None);
        let moving = [(MCO_DESIRED_CONFIG, "rendered-b"), (MCO_CURRENT_CONFIG, "rendered-a")];
        assert_eq!(
            node_upgrading(&annotations(&moving)).as_deref(),
            Some("its machine config changes from rendered-a to rendered-b")
        );
    }
}
