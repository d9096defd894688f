//! Machine remediation end to end, with the Cluster API and OpenShift Machine API CRDs installed:
//! Machine Deletion Remediation for both APIs, and remediations made the way a
//! MachineHealthCheck makes them (named after the Machine, owned by it). The test plays the
//! machine layer's controllers (it creates the Machines and a MachineSet's replacement), which
//! nodemedic only reads and deletes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    machine_deletion::MachineDeletionRemediation,
    names::{annotations, conditions as types},
    self_remediation::SelfNodeRemediation,
};
use nodemedic_kube::conditions;
use nodemedic_lab::LabConfig;
use serde_json::{Value, json};

use crate::support::{History, NS, event_with, eventually, lab, list, start_controller};

const LONG: Duration = Duration::from_secs(60);
pub(crate) const CAPI: (&str, &str) = ("cluster.x-k8s.io", "v1beta2");
pub(crate) const OPENSHIFT: (&str, &str) = ("machine.openshift.io", "v1beta1");

pub(crate) fn api(client: &Client, (group, version): (&str, &str), kind: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(client.clone(), NS, &resource)
}

fn owner_ref(object: &DynamicObject, controller: bool) -> Value {
    let types = object.types.as_ref().expect("types");
    json!({"apiVersion": types.api_version, "kind": types.kind, "name": object.name_any(),
           "uid": object.uid().expect("uid"), "controller": controller})
}

/// A MachineSet of either API (the selector matches label `set: <name>`).
pub(crate) async fn machine_set(client: &Client, layer: (&str, &str), name: &str, replicas: i64) -> DynamicObject {
    let labels = json!({"set": name});
    let spec = if layer == CAPI {
        json!({"clusterName": "lab", "replicas": replicas, "selector": {"matchLabels": labels},
               "template": {"metadata": {"labels": labels}, "spec": machine_spec(name)}})
    } else {
        json!({"replicas": replicas, "selector": {"matchLabels": labels},
               "template": {"metadata": {"labels": labels}, "spec": {}}})
    };
    create(
        client,
        layer,
        "MachineSet",
        json!({"metadata": {"name": name}, "spec": spec}),
    )
    .await
}

fn machine_spec(name: &str) -> Value {
    json!({"clusterName": "lab", "bootstrap": {"dataSecretName": "lab-bootstrap"},
           "infrastructureRef": {"apiGroup": "infrastructure.lab.nodemedic.io", "kind": "LabMachine", "name": name}})
}

/// A Machine of either API whose node is `node` (status.nodeRef), owned by `set` if given.
pub(crate) async fn machine(
    client: &Client,
    layer: (&str, &str),
    name: &str,
    set: Option<&DynamicObject>,
    node: &str,
    provider_id: &str,
) -> DynamicObject {
    let created = unborn_machine(client, layer, name, set, provider_id).await;
    let status = json!({"status": {"nodeRef": {"name": node, "kind": "Node", "apiVersion": "v1"}}});
    api(client, layer, "Machine")
        .patch_status(&created.name_any(), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("Machine {name} status: {e}"))
}

/// A Machine still provisioning: no node yet.
async fn unborn_machine(
    client: &Client,
    layer: (&str, &str),
    name: &str,
    set: Option<&DynamicObject>,
    provider_id: &str,
) -> DynamicObject {
    let mut spec = if layer == CAPI { machine_spec(name) } else { json!({}) };
    spec["providerID"] = json!(provider_id);
    let mut metadata = json!({"name": name});
    if let Some(set) = set {
        metadata["ownerReferences"] = json!([owner_ref(set, true)]);
        metadata["labels"] = json!({"set": set.name_any()});
    }
    create(client, layer, "Machine", json!({"metadata": metadata, "spec": spec})).await
}

async fn create(client: &Client, layer: (&str, &str), kind: &str, mut body: Value) -> DynamicObject {
    body["apiVersion"] = json!(format!("{}/{}", layer.0, layer.1));
    body["kind"] = json!(kind);
    body["metadata"]["namespace"] = json!(NS);
    let object: DynamicObject = serde_json::from_value(body).expect("object");
    api(client, layer, kind)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {kind} {}: {e}", object.name_any()))
}

/// The node annotations a machine controller sets.
pub(crate) async fn annotate_node(client: &Client, node: &str, layer: (&str, &str), machine: &str) {
    let notes = if layer == CAPI {
        json!({"cluster.x-k8s.io/machine": machine, "cluster.x-k8s.io/cluster-namespace": NS, "cluster.x-k8s.io/cluster-name": "lab"})
    } else {
        json!({"machine.openshift.io/machine": format!("{NS}/{machine}")})
    };
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": notes}})),
        )
        .await
        .expect("node annotated");
}

/// A remediation as a MachineHealthCheck makes it: named after the Machine, owned by it.
pub(crate) async fn as_machine_health_check(
    client: &Client,
    kind_api: &str,
    kind: &str,
    machine: &DynamicObject,
    spec: Value,
) {
    let body = json!({"apiVersion": kind_api, "kind": kind,
        "metadata": {"name": machine.name_any(), "namespace": NS, "ownerReferences": [owner_ref(machine, false)]},
        "spec": spec});
    let (group, version) = kind_api.split_once('/').expect("apiVersion");
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::<DynamicObject>::namespaced_with(client.clone(), NS, &resource)
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).expect("remediation"),
        )
        .await
        .unwrap_or_else(|e| panic!("creating {kind} {}: {e}", machine.name_any()));
}

fn condition(mdr: &MachineDeletionRemediation, type_: &str) -> Option<(String, String, String)> {
    let list = mdr.status.as_ref()?.conditions.as_ref()?;
    conditions::find(list, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn succeeded_is(mdr: &MachineDeletionRemediation, status: &str, reason: &str) -> bool {
    condition(mdr, types::SUCCEEDED).is_some_and(|(s, r, _)| s == status && r == reason)
}

async fn mdr(client: &Client, name: &str, node_annotation: Option<&str>) {
    let mut metadata = json!({"name": name, "namespace": NS});
    if let Some(node) = node_annotation {
        metadata["annotations"] = json!({annotations::NODE_NAME: node});
    }
    let body = json!({"apiVersion": "machine-deletion-remediation.medik8s.io/v1alpha1",
        "kind": "MachineDeletionRemediation", "metadata": metadata, "spec": {}});
    Api::<MachineDeletionRemediation>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &serde_json::from_value(body).expect("mdr"))
        .await
        .unwrap_or_else(|e| panic!("creating MachineDeletionRemediation {name}: {e}"));
}

async fn gone(client: &Client, layer: (&str, &str), name: &str) {
    eventually(&format!("Machine {name} deleted"), LONG, || async {
        api(client, layer, "Machine")
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
}

/// Sets a Cluster API Machine's finalizers: one of the test's holds its deletion, as a drain would.
async fn hold(client: &Client, name: &str, finalizers: Value) {
    api(client, CAPI, "Machine")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .unwrap_or_else(|e| panic!("Machine {name} finalizers: {e}"));
}

/// A pod bound to `node` by name (no scheduler), standing for a workload stranded there.
async fn stranded_pod(client: &Client, name: &str, node: &str) {
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "db"}]}}))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "a scenario on one lab, read whole in the order it happens: its steps share the lab, its clients and its objects"
)]
async fn machine_deletion_refuses_what_nothing_would_replace_and_replaces_machines_of_both_apis() {
    let lab = lab(LabConfig::seed()).await;
    lab.install_machine_crds().await.expect("machine CRDs");
    let client = lab.client();
    let seen = History::<MachineDeletionRemediation>::record(&client);
    start_controller(&lab, "controller", &["--disable=health-check"]);

    // Refusals, each with medik8s's reason and an event.
    mdr(&client, "ghost", Some("ghost")).await;
    mdr(&client, "node-1", None).await;
    let lonely = machine(&client, CAPI, "lonely", None, "node-1", "lab://node-1").await;
    as_machine_health_check(
        &client,
        "machine-deletion-remediation.medik8s.io/v1alpha1",
        "MachineDeletionRemediation",
        &lonely,
        json!({}),
    )
    .await;
    for (name, reason, says) in [
        (
            "ghost",
            "RemediationCannotStartNodeNotFound",
            "node ghost does not exist",
        ),
        (
            "node-1",
            "RemediationCannotStartMachineNotFound",
            "node node-1 belongs to no Machine",
        ),
        (
            "lonely",
            "RemediationCannotStartNoControllerOwner",
            "has no controller owner",
        ),
    ] {
        let refused = seen
            .wait_for(&format!("{name} refused with {reason}"), LONG, |m| {
                m.name_any() == name && succeeded_is(m, "False", reason)
            })
            .await;
        let (_, _, message) = condition(&refused, types::SUCCEEDED).expect("Succeeded");
        assert!(message.contains(says), "{name}: {message}");
        event_with(&client, reason, says).await;
    }
    // Self remediation and fence agents for a Machine still provisioning: nothing to fence, and
    // they say so (a health check escalates on it).
    let unborn = unborn_machine(&client, CAPI, "unborn", None, "lab://node-9").await;
    as_machine_health_check(
        &client,
        "self-node-remediation.medik8s.io/v1alpha1",
        "SelfNodeRemediation",
        &unborn,
        json!({"remediationStrategy": "Automatic"}),
    )
    .await;
    as_machine_health_check(
        &client,
        "fence-agents-remediation.medik8s.io/v1alpha1",
        "FenceAgentsRemediation",
        &unborn,
        json!({"agent": "fence_ipmilan", "remediationStrategy": "ResourceDeletion"}),
    )
    .await;
    let snrs = History::<SelfNodeRemediation>::record(&client);
    let fars = History::<FenceAgentsRemediation>::record(&client);
    let says = "cluster.x-k8s.io Machine workload-availability/unborn has no node yet";
    snrs.wait_for("the SelfNodeRemediation ended for want of a node", LONG, |r| {
        let found = r.status.as_ref().and_then(|s| s.conditions.as_ref());
        found
            .and_then(|c| conditions::find(c, types::SUCCEEDED))
            .is_some_and(|c| {
                c.status == "False" && c.reason == "RemediationSkippedNodeNotFound" && c.message.contains(says)
            })
    })
    .await;
    fars.wait_for("the FenceAgentsRemediation ended for want of a node", LONG, |r| {
        let found = r.status.as_ref().and_then(|s| s.conditions.as_ref());
        found
            .and_then(|c| conditions::find(c, types::SUCCEEDED))
            .is_some_and(|c| {
                c.status == "False" && c.reason == "RemediationFinishedNodeNotFound" && c.message.contains(says)
            })
    })
    .await;
    for reason in ["RemediationCannotStart", "RemediationFinishedNodeNotFound"] {
        event_with(&client, reason, says).await;
    }

    assert!(
        api(&client, CAPI, "Machine")
            .get_opt("lonely")
            .await
            .expect("read")
            .is_some(),
        "a Machine nothing replaces was deleted"
    );

    // Cluster API, as a MachineHealthCheck asks: the Machine goes, and with it (garbage
    // collection) the remediation, but only after the node's stranded workload is released.
    // One Machine of an owner at a time: the second waits while the first is being deleted (a
    // finalizer holds it, as a drain would).
    let set = machine_set(&client, CAPI, "md-0", 2).await;
    let first = machine(&client, CAPI, "md-0-a", Some(&set), "node-2", "lab://node-2").await;
    let second = machine(&client, CAPI, "md-0-b", Some(&set), "node-1", "lab://node-1").await;
    hold(&client, "md-0-a", json!(["lab.nodemedic.io/hold"])).await;
    stranded_pod(&client, "stranded", "node-2").await;
    let mdr_api = "machine-deletion-remediation.medik8s.io/v1alpha1";
    as_machine_health_check(&client, mdr_api, "MachineDeletionRemediation", &first, json!({})).await;
    let started = seen
        .wait_for("md-0-a's remediation started", LONG, |m| {
            m.name_any() == "md-0-a" && condition(m, types::PERMANENT_NODE_DELETION_EXPECTED).is_some()
        })
        .await;
    assert_eq!(
        condition(&started, types::PERMANENT_NODE_DELETION_EXPECTED).map(|c| (c.0, c.1)),
        Some(("True".into(), "MachineDeletionOnCloudProviderCausesNewNodeName".into()))
    );
    assert_eq!(
        started
            .annotations()
            .get("machine-deletion-remediation.medik8s.io/machineOwner")
            .map(String::as_str),
        Some("MachineSet/md-0")
    );
    as_machine_health_check(&client, mdr_api, "MachineDeletionRemediation", &second, json!({})).await;
    seen.wait_for("md-0-b's remediation waiting for its turn", LONG, |m| {
        m.name_any() == "md-0-b"
            && condition(m, types::PROCESSING).is_some_and(|c| {
                c.2.contains("waiting for its turn: md-0-a is replacing a Machine of MachineSet/md-0")
            })
    })
    .await;
    event_with(&client, "WaitingForTurn", "md-0-a").await;
    let waiting = api(&client, CAPI, "Machine").get("md-0-b").await.expect("md-0-b");
    assert!(
        waiting.metadata.deletion_timestamp.is_none(),
        "md-0-b deleted while md-0-a was"
    );
    assert!(
        Api::<Pod>::namespaced(client.clone(), NS)
            .get_opt("stranded")
            .await
            .expect("read")
            .is_some(),
        "a workload was released while its Machine still existed"
    );
    hold(&client, "md-0-a", json!([])).await;
    gone(&client, CAPI, "md-0-a").await;
    eventually("the stranded pod released", LONG, || async {
        Api::<Pod>::namespaced(client.clone(), NS)
            .get_opt("stranded")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    event_with(&client, "WorkloadsReleased", "node-2").await;
    gone(&client, CAPI, "md-0-b").await;
    eventually(
        "both remediations garbage-collected with their Machines",
        LONG,
        || async {
            list::<MachineDeletionRemediation>(&client, NS)
                .await
                .iter()
                .all(|m| !m.name_any().starts_with("md-0-"))
                .then_some(())
        },
    )
    .await;

    // OpenShift, as a NodeHealthCheck asks (named after the node, found through the node's
    // annotation): bare metal keeps the node's name, and success waits for the replacement.
    let set = machine_set(&client, OPENSHIFT, "workers", 1).await;
    machine(
        &client,
        OPENSHIFT,
        "workers-a",
        Some(&set),
        "node-3",
        "baremetalhost:///openshift-machine-api/host-3/uid",
    )
    .await;
    annotate_node(&client, "node-3", OPENSHIFT, "workers-a").await;
    mdr(&client, "node-3", Some("node-3")).await;
    gone(&client, OPENSHIFT, "workers-a").await;
    let waiting = seen
        .wait_for("node-3's remediation waiting for the replacement", LONG, |m| {
            m.name_any() == "node-3"
                && condition(m, types::PROCESSING).is_some_and(|c| {
                    c.2.contains("waiting for MachineSet/workers to have its 1 nodes again (0 now)")
                })
        })
        .await;
    assert_eq!(
        condition(&waiting, types::PERMANENT_NODE_DELETION_EXPECTED).map(|c| (c.0, c.1)),
        Some(("False".into(), "MachineDeletionOnBareMetalProviderKeepsNodeName".into()))
    );
    machine(
        &client,
        OPENSHIFT,
        "workers-b",
        Some(&set),
        "node-3",
        "baremetalhost:///openshift-machine-api/host-3/uid2",
    )
    .await;
    seen.wait_for("node-3's remediation succeeded", LONG, |m| {
        m.name_any() == "node-3" && succeeded_is(m, "True", "MachineDeleted")
    })
    .await;
    event_with(&client, "MachineDeleted", "workers-a").await;
}
