//! A MachineHealthCheck (Cluster API's or OpenShift's) that watches the Machines of nodes a
//! health check selects would remediate the same nodes: two remediators racing on one node
//! (medik8s disables its check, `ConflictingMachineHealthCheckDetected`). The check stands back
//! while such a MachineHealthCheck exists. Unlike medik8s, only one that covers a node the check
//! selects conflicts (medik8s disables every check when any MachineHealthCheck exists), and
//! OpenShift's termination handler (one that only remediates `Terminating` nodes) never does.

use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};
use nodemedic_api::machines::MachineApi;
use serde_json::Value;

use super::NodeFacts;

/// Cluster API's label naming a Machine's cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// A Machine, by API, namespace and name.
pub type MachineKey = (MachineApi, String, String);

/// A MachineHealthCheck as the decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineHealthCheckFacts {
    pub api: MachineApi,
    pub namespace: String,
    pub name: String,
    /// Over Machines' labels.
    pub selector: Selector,
    /// Cluster API: the cluster whose Machines it watches.
    pub cluster: Option<String>,
    /// OpenShift's termination handler: its only unhealthy condition is `Terminating`.
    pub termination_only: bool,
}

/// Reads a MachineHealthCheck of `api` as the API serves it (any version: Cluster API v1beta2
/// keeps its conditions under `spec.checks.unhealthyNodeConditions`, v1beta1 and OpenShift under
/// `spec.unhealthyConditions`). `None` when its selector cannot be read (it then selects nothing
/// its controller would act on either).
pub fn machine_health_check(api: MachineApi, object: &Value) -> Option<MachineHealthCheckFacts> {
    let spec = &object["spec"];
    let selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_value(spec["selector"].clone()).ok()?;
    let selector = Selector::try_from(selector).ok()?;
    let conditions = spec["checks"]["unhealthyNodeConditions"]
        .as_array()
        .or_else(|| spec["unhealthyConditions"].as_array());
    let termination_only = conditions.is_some_and(|c| c.len() == 1 && c[0]["type"] == "Terminating");
    Some(MachineHealthCheckFacts {
        api,
        namespace: object["metadata"]["namespace"].as_str()?.to_owned(),
        name: object["metadata"]["name"].as_str()?.to_owned(),
        selector,
        cluster: spec["clusterName"].as_str().map(str::to_owned),
        termination_only,
    })
}

impl MachineHealthCheckFacts {
    fn covers(&self, machine: &MachineKey, labels: &BTreeMap<String, String>) -> bool {
        let (api, namespace, _) = machine;
        *api == self.api
            && *namespace == self.namespace
            && !self.termination_only
            && self
                .cluster
                .as_ref()
                .is_none_or(|c| labels.get(CLUSTER_NAME_LABEL) == Some(c))
            && self.selector.matches(labels)
    }
}

/// The first MachineHealthCheck that covers a node the check selects, said for the check's
/// `Disabled` condition.
pub(super) fn conflicting(
    checks: &[MachineHealthCheckFacts],
    machines: &BTreeMap<MachineKey, BTreeMap<String, String>>,
    selected: &[&NodeFacts],
) -> Option<String> {
    if checks.is_empty() {
        return None;
    }
    selected.iter().find_map(|node| {
        let key = node.machine.as_ref()?;
        let labels = machines.get(key)?;
        let check = checks.iter().find(|c| c.covers(key, labels))?;
        Some(format!(
            "MachineHealthCheck {}/{} ({}) also remediates node {} (its Machine {}/{}): two remediators would act on one node; \
             delete the MachineHealthCheck, or change its selector or the Machine's labels so it no longer covers the node",
            check.namespace,
            check.name,
            check.api.group(),
            node.name,
            key.1,
            key.2
        ))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::decide::tests::node;

    fn capi_check(conditions: Value) -> MachineHealthCheckFacts {
        let object = json!({"metadata": {"namespace": "default", "name": "mhc"},
            "spec": {"clusterName": "lab", "selector": {"matchLabels": {"pool": "workers"}},
                "checks": {"unhealthyNodeConditions": conditions}}});
        machine_health_check(MachineApi::ClusterApi, &object).expect("readable")
    }

    fn machine(labels: &[(&str, &str)]) -> BTreeMap<MachineKey, BTreeMap<String, String>> {
        let key = (MachineApi::ClusterApi, "default".to_owned(), "m-1".to_owned());
        [(key, labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect())].into()
    }

    fn on_machine() -> NodeFacts {
        let mut n = node("w1", "True", 0);
        n.machine = Some((MachineApi::ClusterApi, "default".into(), "m-1".into()));
        n
    }

    #[test]
    fn a_machine_health_check_of_a_selected_node_s_machine_conflicts() {
        let ready = json!([{"type": "Ready", "status": "False", "timeoutSeconds": 300}]);
        let checks = [capi_check(ready)];
        let n = on_machine();
        let covered = machine(&[("pool", "workers"), (CLUSTER_NAME_LABEL, "lab")]);
        let why = conflicting(&checks, &covered, &[&n]).expect("a conflict");
        assert!(
            why.contains("MachineHealthCheck default/mhc") && why.contains("node w1"),
            "{why}"
        );

        let other_pool = machine(&[("pool", "infra"), (CLUSTER_NAME_LABEL, "lab")]);
        assert_eq!(conflicting(&checks, &other_pool, &[&n]), None);
        let other_cluster = machine(&[("pool", "workers"), (CLUSTER_NAME_LABEL, "other")]);
        assert_eq!(conflicting(&checks, &other_cluster, &[&n]), None);
        let no_machine = node("w1", "True", 0);
        assert_eq!(conflicting(&checks, &covered, &[&no_machine]), None);
    }

    #[test]
    fn openshift_s_termination_handler_never_conflicts() {
        let object = json!({"metadata": {"namespace": "openshift-machine-api", "name": "termination"},
            "spec": {"selector": {}, "unhealthyConditions": [{"type": "Terminating", "status": "True", "timeout": "0s"}]}});
        let check = machine_health_check(MachineApi::OpenShift, &object).expect("readable");
        assert!(check.termination_only);
        let mut n = node("w1", "True", 0);
        n.machine = Some((MachineApi::OpenShift, "openshift-machine-api".into(), "m-1".into()));
        let key = (
            MachineApi::OpenShift,
            "openshift-machine-api".to_owned(),
            "m-1".to_owned(),
        );
        let machines = [(key, BTreeMap::new())].into();
        assert_eq!(conflicting(&[check], &machines, &[&n]), None);
    }
}
