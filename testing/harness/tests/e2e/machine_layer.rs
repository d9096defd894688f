//! Machine remediation with the lab's machine layer from real parts (see
//! `nodemedic_lab::machines`): Cluster API's own controllers (MachineSet, Machine,
//! MachineHealthCheck) manage the lab as a self-hosted cluster, the lab provisions their hosts,
//! and for OpenShift's Machine API the lab plays the machine controller.

use std::{collections::BTreeMap, time::Duration};

use kube::{
    Client, ResourceExt,
    api::{DynamicObject, ListParams},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    machine_deletion::MachineDeletionRemediation,
    names::conditions as types,
    self_remediation::{SelfNodeRemediation, phases},
};
use nodemedic_kube::conditions;
use nodemedic_lab::{
    BmcOptions, Lab, LabConfig,
    machines::{cluster_api, openshift},
};
use serde_json::{Value, json};

use crate::fenceagents::bmc_power;
use crate::selfremediation::{exe, fenced, running_pod};
use crate::support::{
    History, NS, apply_seed, assert_witness, event_with, eventually, lab, scenario, start_controller,
};
use scenario::{LabWatchdog, node_of};

const LONG: Duration = Duration::from_secs(180);
const MDR_API: &str = "machine-deletion-remediation.medik8s.io/v1alpha1";

/// A LabMachineTemplate and a Cluster API MachineSet of `replicas` Machines (label `set:
/// <name>`). Without Cluster API's webhooks nothing defaults: the deletion timeouts are
/// explicit, as the defaulting webhook would make them.
fn machine_set(lab: &Lab, name: &str, replicas: i64) {
    let template = json!({"apiVersion": "infrastructure.lab.nodemedic.io/v1alpha1", "kind": "LabMachineTemplate",
        "metadata": {"name": name, "namespace": NS}, "spec": {"template": {"spec": {}}}});
    let set = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterName": cluster_api::CLUSTER, "replicas": replicas,
            "selector": {"matchLabels": {"set": name}},
            "template": {"metadata": {"labels": {"set": name}}, "spec": machine_spec(name, "LabMachineTemplate")}}});
    for object in [template, set] {
        lab.apply_yaml(&object.to_string()).expect("MachineSet");
    }
}

fn machine_spec(infrastructure: &str, kind: &str) -> Value {
    json!({"clusterName": cluster_api::CLUSTER, "bootstrap": {"dataSecretName": "lab-bootstrap"},
        "infrastructureRef": {"apiGroup": "infrastructure.lab.nodemedic.io", "kind": kind, "name": infrastructure},
        "deletion": {"nodeDrainTimeoutSeconds": 60, "nodeVolumeDetachTimeoutSeconds": 60, "nodeDeletionTimeoutSeconds": 10}})
}

/// A Cluster API Machine of no MachineSet, named `name`, on the lab node `host`.
fn machine_on(lab: &Lab, name: &str, host: &str) {
    let infrastructure = json!({"apiVersion": "infrastructure.lab.nodemedic.io/v1alpha1", "kind": "LabMachine",
        "metadata": {"name": name, "namespace": NS}, "spec": {"host": host}});
    let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS}, "spec": machine_spec(name, "LabMachine")});
    for object in [infrastructure, machine] {
        lab.apply_yaml(&object.to_string()).expect("Machine");
    }
}

/// A Cluster API MachineHealthCheck of every Machine of the cluster: a node Ready=Unknown or
/// False for 2 s hands its Machine to the template's remediator.
fn machine_health_check(lab: &Lab, template_api: &str, template_kind: &str, template: &str) {
    let check = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
        "metadata": {"name": "lab", "namespace": NS},
        "spec": {"clusterName": cluster_api::CLUSTER,
            "selector": {"matchLabels": {"cluster.x-k8s.io/cluster-name": cluster_api::CLUSTER}},
            "checks": {"nodeStartupTimeoutSeconds": 0, "unhealthyNodeConditions": [
                {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
                {"type": "Ready", "status": "False", "timeoutSeconds": 2}]},
            "remediation": {"templateRef": {"apiVersion": template_api, "kind": template_kind, "name": template}}}});
    lab.apply_yaml(&check.to_string()).expect("MachineHealthCheck");
}

async fn machines(client: &Client, (group, version): (&str, &str)) -> Vec<DynamicObject> {
    let resource = nodemedic_kube::machines::api_resource(group, version, "Machine");
    kube::Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn node_ref(machine: &DynamicObject) -> Option<String> {
    machine
        .data
        .pointer("/status/nodeRef/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Waits until `count` Machines of the layer have their node; returns Machine -> node.
async fn machines_running(client: &Client, layer: (&str, &str), count: usize) -> BTreeMap<String, String> {
    eventually(&format!("{count} Machines with their nodes"), LONG, || async {
        let running: BTreeMap<String, String> = machines(client, layer)
            .await
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter_map(|m| Some((m.name_any(), node_ref(m)?)))
            .collect();
        (running.len() == count).then_some(running)
    })
    .await
}

fn owned_by_machine(object: &impl ResourceExt, machine: &str) -> bool {
    object
        .owner_references()
        .iter()
        .any(|o| o.kind == "Machine" && o.name == machine)
}

/// Three Cluster API Machines on the lab's nodes: one named like another node, on `a` (where
/// db-0 runs), and a MachineSet of two on the others. Returns the namesake Machine's name.
async fn machines_with_a_namesake_on(lab: &Lab, a: &str) -> String {
    let namesake = lab.nodes().into_iter().find(|n| n != a).expect("another node");
    machine_on(lab, &namesake, a);
    machine_set(lab, "md-0", 2);
    let running = machines_running(&lab.client(), CAPI, 3).await;
    assert_eq!(running[&namesake], a, "{running:?}");
    namesake
}

/// Crashes `a` and waits for db-0 Running elsewhere.
async fn crash_and_move(lab: &Lab, a: &str, machine: &str) {
    lab.crash(a).await.expect("crash");
    let moved = running_pod(&lab.client(), &[a]).await;
    println!("{a} (Machine {machine}) crashed: db-0 Running on {}", node_of(&moved));
}

/// A Cluster API MachineHealthCheck with the SelfNodeRemediationTemplate: its remediation is
/// named after the Machine, which here bears another node's name. nodemedic fences the
/// Machine's node, never the namesake; the StatefulSet comes back elsewhere; the health check
/// deletes the remediation once the node is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_api_health_check_hands_a_crashed_machine_to_self_remediation() {
    let mut lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    let config = scenario::configure_with(&lab, scenario::FAST_CONFIG)
        .await
        .expect("config");
    start_controller(&lab, "controller", &["--disable=health-check"]);
    scenario::start_agents_with(&lab, &exe(), &config, LabWatchdog::Device).expect("agents");
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    lab.start_machine_layer(NS).await.expect("machine layer");
    let namesake = machines_with_a_namesake_on(&lab, &a).await;
    scenario::agents_settled(&lab).await.expect("agents settled");
    let made = History::<SelfNodeRemediation>::record(&client);
    machine_health_check(
        &lab,
        "self-node-remediation.medik8s.io/v1alpha1",
        "SelfNodeRemediationTemplate",
        "self-node-remediation-automatic-strategy-template",
    );

    crash_and_move(&lab, &a, &namesake).await;
    let remediation = made
        .wait_for("the health check's SelfNodeRemediation", LONG, |r| {
            r.name_any() == namesake && owned_by_machine(r, &namesake)
        })
        .await;
    assert_eq!(
        remediation
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some(cluster_api::CLUSTER)
    );
    made.wait_for("the remediation fenced the Machine's node", LONG, |r| {
        r.name_any() == namesake
            && r.annotations().get("remediation.medik8s.io/node-name") == Some(&a)
            && r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phases::FENCING_COMPLETED)
    })
    .await;
    assert!(
        !fenced(&lab).contains(&namesake),
        "the namesake {namesake} was fenced: {:?}",
        fenced(&lab)
    );
    assert_witness(&lab);

    lab.power_on(&a).await.expect("power on");
    eventually(
        "the health check deletes the remediation once the Machine is healthy",
        LONG,
        || async {
            let live = crate::support::list::<SelfNodeRemediation>(&client, NS).await;
            live.iter().all(|r| r.name_any() != namesake).then_some(())
        },
    )
    .await;
}

/// The same with the FenceAgentsRemediationTemplate and the BMCs: the Machine's node is
/// powered off and on through its own BMC, the namesake's BMC is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_api_health_check_hands_a_crashed_machine_to_fence_agents() {
    let mut lab = lab(LabConfig::seed().with_bmcs(BmcOptions::default())).await;
    let client = lab.client();
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    lab.apply_yaml(
        &scenario::ipmi_far_template(
            &lab,
            "ipmi",
            "fence-agents-credentials-shared-sm-bmc",
            "ResourceDeletion",
        )
        .to_string(),
    )
    .expect("template");
    start_controller(
        &lab,
        "controller",
        &["--disable=self-remediation", "--disable=health-check"],
    );
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    lab.start_machine_layer(NS).await.expect("machine layer");
    let namesake = machines_with_a_namesake_on(&lab, &a).await;
    let made = History::<FenceAgentsRemediation>::record(&client);
    machine_health_check(
        &lab,
        "fence-agents-remediation.medik8s.io/v1alpha1",
        "FenceAgentsRemediationTemplate",
        "ipmi",
    );

    crash_and_move(&lab, &a, &namesake).await;
    made.wait_for("the health check's FenceAgentsRemediation succeeded", LONG, |r| {
        r.name_any() == namesake
            && owned_by_machine(r, &namesake)
            && r.annotations().get("remediation.medik8s.io/node-name") == Some(&a)
            && r.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| conditions::find(c, types::SUCCEEDED))
                .is_some_and(|c| c.status == "True")
    })
    .await;
    eventually(&format!("{a}'s BMC powered it off, then on"), LONG, || async {
        (bmc_power(&lab, &a) == [false, true]).then_some(())
    })
    .await;
    assert!(
        bmc_power(&lab, &namesake).is_empty(),
        "the namesake {namesake} was power-cycled"
    );
    assert_witness(&lab);
    eventually(
        "the health check deletes the remediation once the Machine is healthy",
        LONG,
        || async {
            let live = crate::support::list::<FenceAgentsRemediation>(&client, NS).await;
            live.iter().all(|r| r.name_any() != namesake).then_some(())
        },
    )
    .await;
}

const CAPI: (&str, &str) = (cluster_api::API_GROUP, cluster_api::API_VERSION);
const OPENSHIFT: (&str, &str) = (openshift::GROUP, openshift::VERSION);

fn mdr_template(lab: &Lab) {
    let template = json!({"apiVersion": MDR_API, "kind": "MachineDeletionRemediationTemplate",
        "metadata": {"name": "replace", "namespace": NS}, "spec": {"template": {"spec": {}}}});
    lab.apply_yaml(&template.to_string()).expect("MDR template");
}

/// A NodeHealthCheck of every node with these remediation steps.
fn node_health_check(lab: &Lab, remediation: Value) {
    let mut spec = json!({
        "selector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]},
        "minHealthy": "51%",
        "unhealthyConditions": scenario::test_conditions()});
    if let (Some(spec), Some(remediation)) = (spec.as_object_mut(), remediation.as_object()) {
        spec.extend(remediation.clone());
    }
    let check = json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck",
        "metadata": {"name": "machines"}, "spec": spec});
    lab.apply_yaml(&check.to_string()).expect("NodeHealthCheck");
}

fn mdr_condition(mdr: &MachineDeletionRemediation, type_: &str) -> Option<(String, String)> {
    let list = mdr.status.as_ref()?.conditions.as_ref()?;
    conditions::find(list, type_).map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits for the remediation of `node` to succeed (its Machine deleted and replaced), then for
/// the owner's replacement Machine with a new node; returns that node.
async fn replaced(
    client: &Client,
    history: &History<MachineDeletionRemediation>,
    layer: (&str, &str),
    node: &str,
    before: &BTreeMap<String, String>,
) -> String {
    let done = history
        .wait_for(&format!("{node}'s MachineDeletionRemediation succeeded"), LONG, |m| {
            m.annotations()
                .get("remediation.medik8s.io/node-name")
                .map(String::as_str)
                == Some(node)
                && mdr_condition(m, types::SUCCEEDED) == Some(("True".into(), "MachineDeleted".into()))
        })
        .await;
    assert_eq!(
        mdr_condition(&done, types::PERMANENT_NODE_DELETION_EXPECTED),
        Some(("True".into(), "MachineDeletionOnCloudProviderCausesNewNodeName".into()))
    );
    let now = machines_running(client, layer, before.len()).await;
    let old = before
        .iter()
        .find(|(_, n)| *n == node)
        .map(|(m, _)| m.clone())
        .expect("the old Machine");
    assert!(!now.contains_key(&old), "Machine {old} still there: {now:?}");
    let (new, new_node) = now
        .iter()
        .find(|(m, _)| !before.contains_key(*m))
        .expect("a replacement Machine");
    assert!(
        !before.values().any(|n| n == new_node),
        "{new} on an old node {new_node}"
    );
    event_with(client, "MachineDeleted", &old).await;
    new_node.clone()
}

/// A NodeHealthCheck escalating from self remediation to Machine Deletion Remediation on Cluster
/// API Machines: the crashed node is fenced and its StatefulSet runs elsewhere; the node never
/// comes back, so the check moves on and its Machine is deleted; Cluster API's MachineSet
/// creates a new Machine, the lab provisions a new node for it, and the remediation succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_health_check_escalates_from_self_remediation_to_replacing_the_cluster_api_machine() {
    let mut lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    let config = scenario::configure_with(&lab, scenario::FAST_CONFIG)
        .await
        .expect("config");
    start_controller(&lab, "controller", &[]);
    scenario::start_agents_with(&lab, &exe(), &config, LabWatchdog::Device).expect("agents");
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    lab.start_machine_layer(NS).await.expect("machine layer");
    machine_set(&lab, "md-0", 3);
    let before = machines_running(&client, CAPI, 3).await;
    scenario::agents_settled(&lab).await.expect("agents settled");
    mdr_template(&lab);
    let history = History::<MachineDeletionRemediation>::record(&client);
    node_health_check(
        &lab,
        json!({"escalatingRemediations": [
            {"remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediationTemplate", "namespace": NS,
                "name": "self-node-remediation-automatic-strategy-template"}, "order": 0, "timeout": "60s"},
            {"remediationTemplate": {"apiVersion": MDR_API, "kind": "MachineDeletionRemediationTemplate",
                "namespace": NS, "name": "replace"}, "order": 1, "timeout": "300s"}]}),
    );

    lab.crash(&a).await.expect("crash");
    let moved = running_pod(&client, &[&a]).await;
    println!("{a} crashed: db-0 Running on {} (self remediation)", node_of(&moved));
    let new_node = replaced(&client, &history, CAPI, &a, &before).await;
    println!("{a}'s Machine replaced: new node {new_node}");
    assert!(!lab.nodes().contains(&a), "{a} is still in the lab");
    running_pod(&client, &[&a]).await;
    assert_witness(&lab);
}

/// Machine Deletion Remediation on OpenShift Machine API objects, with the lab as machine
/// controller: the crashed node's Machine is deleted, its StatefulSet is released and runs
/// elsewhere, the MachineSet gets a new Machine on a new node, and the remediation succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_deletion_replaces_an_openshift_machine() {
    let mut lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    start_controller(&lab, "controller", &["--disable=self-remediation"]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&client, &[]).await);
    lab.start_machine_layer(NS).await.expect("machine layer");
    let set = json!({"apiVersion": "machine.openshift.io/v1beta1", "kind": "MachineSet",
        "metadata": {"name": "workers", "namespace": NS},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"set": "workers"}},
            "template": {"metadata": {"labels": {"set": "workers"}}, "spec": {}}}});
    lab.apply_yaml(&set.to_string()).expect("MachineSet");
    let before = machines_running(&client, OPENSHIFT, 3).await;
    mdr_template(&lab);
    let history = History::<MachineDeletionRemediation>::record(&client);
    node_health_check(
        &lab,
        json!({"remediationTemplate": {"apiVersion": MDR_API, "kind": "MachineDeletionRemediationTemplate",
            "namespace": NS, "name": "replace"}}),
    );

    lab.crash(&a).await.expect("crash");
    let moved = running_pod(&client, &[&a]).await;
    println!("{a} crashed: db-0 Running on {} (its Machine deleted)", node_of(&moved));
    event_with(&client, "WorkloadsReleased", &a).await;
    let new_node = replaced(&client, &history, OPENSHIFT, &a, &before).await;
    println!("{a}'s Machine replaced: new node {new_node}");
    assert_witness(&lab);
}
