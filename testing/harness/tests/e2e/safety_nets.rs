//! The safety nets medik8s has (issue 48): a cluster upgrade (OpenShift's ClusterVersion and
//! MachineConfigPools, Cluster API's rollouts, an annotation) postpones new remediation and lets
//! remediations under way go on (README, "Cluster upgrades"); a MachineHealthCheck covering a
//! node the check selects disables the check; a control-plane node waits until etcd can spare it
//! (its members shown as pods, or external ones asked for their health). Cluster API's and
//! OpenShift's CRDs are served, and none of their controllers runs: the tests write their objects
//! (a MachineDeployment's status, a ClusterVersion's, a Machine and its node's annotations) as
//! those controllers would, to produce each state on demand.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams},
};
use nodemedic_api::{healthcheck::NodeHealthCheckPhase, names::conditions as types};
use nodemedic_lab::LabConfig;
use serde_json::json;

use crate::healthcheck::{ONLY_HEALTH_CHECK, nhc, phase_is, snr_for};
use crate::support::{NS, apply_seed, event_with, eventually, lab, start_controller};

const LONG: Duration = Duration::from_secs(90);
const CHECK: &str = "nhc-snr-3node";
const ANNOTATION: &str = "nodemedic.medik8s.io/upgrade-in-progress";

/// The check's `RemediationAllowed` condition: (status, reason, message).
async fn remediation_allowed(client: &Client) -> Option<(String, String, String)> {
    let status = nhc(client, CHECK).await.status?;
    let condition = status
        .conditions?
        .into_iter()
        .find(|c| c.type_ == types::REMEDIATION_ALLOWED)?;
    Some((condition.status, condition.reason, condition.message))
}

/// Waits until the condition is False for a cluster upgrade and names `what`.
async fn postponed_for(client: &Client, what: &str) {
    eventually(&format!("RemediationAllowed=False naming {what}"), LONG, || async {
        remediation_allowed(client).await.filter(|(status, reason, message)| {
            status == "False" && reason == "ClusterUpgrading" && message.contains(what)
        })
    })
    .await;
}

async fn annotate(client: &Client, node: &str, value: Option<&str>) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: value}}})),
        )
        .await
        .expect("annotate the node");
}

/// A Cluster API kind in the namespace, at the version the lab's Cluster API stores.
fn cluster_api(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), NS, &resource)
}

/// Writes the MachineDeployment's machine counts as Cluster API's controller does.
async fn up_to_date(client: &Client, up_to_date: i64) {
    cluster_api(client, "MachineDeployment", "machinedeployments")
        .patch_status(
            "md-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 3, "upToDateReplicas": up_to_date}})),
        )
        .await
        .expect("the MachineDeployment's status");
}

/// Makes lab node `node` the node of Cluster API Machine `m-<node>` of cluster `lab`, as Cluster
/// API's controllers record it (Machine labels, node annotations).
async fn a_machine_s_node(lab: &nodemedic_lab::Lab, node: &str, labels: serde_json::Value) {
    let mut labels = labels;
    labels["cluster.x-k8s.io/cluster-name"] = json!("lab");
    let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": format!("m-{node}"), "namespace": NS, "labels": labels},
        "spec": {"clusterName": "lab", "bootstrap": {"dataSecretName": "lab-bootstrap"},
            "infrastructureRef": {"apiGroup": "infrastructure.lab.nodemedic.io", "kind": "LabMachine", "name": format!("m-{node}")}}});
    lab.apply_yaml(&machine.to_string()).expect("Machine");
    Api::<Node>::all(lab.client())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "cluster.x-k8s.io/machine": format!("m-{node}"), "cluster.x-k8s.io/cluster-namespace": NS}}})),
        )
        .await
        .expect("the node's Machine annotations");
}

/// An OpenShift API kind (cluster-scoped, v1).
fn openshift(client: &Client, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::all_with(client.clone(), &resource)
}

/// Writes OpenShift's upgrade signals as its operators do: ClusterVersion `version`
/// `Progressing` and MachineConfigPool `worker` `Updating`, True since long before the test's
/// nodes failed, or False now.
async fn openshift_upgrading(lab: &nodemedic_lab::Lab, client: &Client, upgrading: bool) {
    let version = json!({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion",
        "metadata": {"name": "version"}, "spec": {"clusterID": "5f8b8d2e-8a4e-4c1b-9d0a-3b7c6a1e2f40"}});
    let pool = json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
        "metadata": {"name": "worker"}, "spec": {}});
    lab.apply_yaml(&version.to_string()).expect("ClusterVersion");
    lab.apply_yaml(&pool.to_string()).expect("MachineConfigPool");
    let (status, since) = if upgrading {
        ("True", "2026-01-01T00:00:00Z".to_owned())
    } else {
        ("False", jiff::Timestamp::now().to_string())
    };
    let condition = |type_: &str| json!([{"type": type_, "status": status, "lastTransitionTime": since, "reason": "Lab", "message": "lab"}]);
    openshift(client, "config.openshift.io", "ClusterVersion", "clusterversions")
        .patch_status(
            "version",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "desired": {"version": "4.16.3", "image": "quay.io/openshift-release-dev/ocp-release:4.16.3-x86_64"},
                "observedGeneration": 1, "versionHash": "lab", "availableUpdates": [],
                "conditions": condition("Progressing")}})),
        )
        .await
        .expect("the ClusterVersion's status");
    openshift(
        client,
        "machineconfiguration.openshift.io",
        "MachineConfigPool",
        "machineconfigpools",
    )
    .patch_status(
        "worker",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": condition("Updating")}})),
    )
    .await
    .expect("the MachineConfigPool's status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_upgrade_postpones_new_remediations_and_lets_those_under_way_go_on() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    lab.install_machine_crds().await.expect("Cluster API's CRDs");
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {});
    for node in ["node-1", "node-2", "node-3"] {
        a_machine_s_node(&lab, node, json!({"set": "md-0"})).await;
    }
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, CHECK, NodeHealthCheckPhase::Enabled).await;

    // An upgrade tool nodemedic does not know annotates a node the check selects.
    annotate(&client, "node-3", Some("lab: rolling reboots")).await;
    postponed_for(&client, "node node-3").await;
    lab.crash("node-2").await.expect("crash");
    event_with(&client, "RemediationSkipped", "Postponing remediation of node node-2").await;
    assert!(
        snr_for(&client, "node-2").await.is_empty(),
        "remediated during the upgrade"
    );

    // Cluster API rolls a MachineDeployment out; the annotation goes.
    let deployment = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": "md-0", "namespace": NS},
        "spec": {"clusterName": "lab", "replicas": 3, "selector": {"matchLabels": {"set": "md-0"}},
            "template": {"metadata": {"labels": {"set": "md-0"}}, "spec": {"clusterName": "lab",
                "bootstrap": {"dataSecretName": "lab-bootstrap"},
                "infrastructureRef": {"apiGroup": "infrastructure.lab.nodemedic.io", "kind": "LabMachineTemplate", "name": "md-0"}}}}});
    lab.apply_yaml(&deployment.to_string()).expect("MachineDeployment");
    up_to_date(&client, 1).await;
    // Seen before the annotation goes: nothing in between may look like the end of the upgrade.
    postponed_for(
        &client,
        "MachineDeployment workload-availability/md-0 is rolling out: 1 of 3",
    )
    .await;
    annotate(&client, "node-3", None).await;
    eventually("only the MachineDeployment said", LONG, || async {
        remediation_allowed(&client)
            .await
            .filter(|(_, _, message)| message.contains("MachineDeployment") && !message.contains("node node-3"))
    })
    .await;
    assert!(
        snr_for(&client, "node-2").await.is_empty(),
        "remediated during the upgrade"
    );

    // OpenShift upgrades too (its ClusterVersion progressing, a MachineConfigPool updating,
    // both since before node-2 failed); the rollout ends, and they still hold node-2 back.
    openshift_upgrading(&lab, &client, true).await;
    postponed_for(&client, "ClusterVersion version is progressing towards 4.16.3").await;
    postponed_for(&client, "MachineConfigPool worker is updating").await;
    up_to_date(&client, 3).await;
    eventually("only OpenShift's upgrade said", LONG, || async {
        remediation_allowed(&client)
            .await
            .filter(|(_, _, message)| message.contains("ClusterVersion") && !message.contains("MachineDeployment"))
    })
    .await;
    assert!(
        snr_for(&client, "node-2").await.is_empty(),
        "remediated during the upgrade"
    );

    // OpenShift's upgrade ends: node-2, unhealthy all along, is remediated.
    openshift_upgrading(&lab, &client, false).await;
    eventually("node-2's remediation once the upgrade is over", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
    phase_is(&client, CHECK, NodeHealthCheckPhase::Remediating).await;

    // Another upgrade begins: the remediation under way goes on, and is removed once node-2 is
    // healthy again, upgrade or not.
    annotate(&client, "node-1", Some("lab: second round")).await;
    postponed_for(&client, "node node-1").await;
    assert_eq!(
        snr_for(&client, "node-2").await.len(),
        1,
        "the remediation under way goes on"
    );
    lab.power_on("node-2").await.expect("power on");
    eventually("node-2's remediation removed during the upgrade", LONG, || async {
        snr_for(&client, "node-2").await.is_empty().then_some(())
    })
    .await;
    postponed_for(&client, "node node-1").await;
}

/// Waits until the check's phase is Disabled for a conflicting MachineHealthCheck.
async fn disabled_by_conflict(client: &Client) -> String {
    eventually("Disabled=True/ConflictingMachineHealthCheckDetected", LONG, || async {
        let status = nhc(client, CHECK).await.status?;
        let condition = status.conditions?.into_iter().find(|c| c.type_ == types::DISABLED)?;
        (condition.status == "True" && condition.reason == "ConflictingMachineHealthCheckDetected")
            .then_some(condition.message)
    })
    .await
}

/// Waits until the node has been Ready=Unknown for longer than the seed check's duration.
async fn unknown_past_the_duration(client: &Client, node: &str) {
    let past = jiff::SignedDuration::from_secs(15);
    eventually(&format!("{node} Unknown past the check's duration"), LONG, || async {
        let node = Api::<Node>::all(client.clone()).get(node).await.ok()?;
        let ready = node.status?.conditions?.into_iter().find(|c| c.type_ == "Ready")?;
        let since = ready.last_transition_time?.0;
        (ready.status == "Unknown" && jiff::Timestamp::now().duration_since(since) > past).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_health_check_covering_a_selected_node_disables_the_check_until_it_goes() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {});
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, CHECK, NodeHealthCheckPhase::Enabled).await;
    // Cluster API installed after the controller started: its CRDs tell it to look again.
    lab.install_machine_crds().await.expect("Cluster API's CRDs");

    // node-2 is a Cluster API Machine's node, as Cluster API's controllers record it.
    a_machine_s_node(&lab, "node-2", json!({"pool": "workers"})).await;
    // A MachineHealthCheck of another pool does not conflict.
    let check = |name: &str, pool: &str| {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterName": "lab", "selector": {"matchLabels": {"pool": pool}},
                "checks": {"unhealthyNodeConditions": [{"type": "Ready", "status": "Unknown", "timeoutSeconds": 300}]}}})
        .to_string()
    };
    lab.apply_yaml(&check("infra", "infra")).expect("MachineHealthCheck");
    lab.apply_yaml(&check("workers", "workers"))
        .expect("MachineHealthCheck");
    let why = disabled_by_conflict(&client).await;
    assert!(
        why.contains("MachineHealthCheck workload-availability/workers") && why.contains("node node-2"),
        "{why}"
    );
    assert!(!why.contains("/infra"), "{why}");
    phase_is(&client, CHECK, NodeHealthCheckPhase::Disabled).await;
    event_with(&client, "Disabled", "MachineHealthCheck").await;

    lab.crash("node-2").await.expect("crash");
    unknown_past_the_duration(&client, "node-2").await;
    assert!(
        snr_for(&client, "node-2").await.is_empty(),
        "remediated beside the MachineHealthCheck"
    );

    cluster_api(&client, "MachineHealthCheck", "machinehealthchecks")
        .delete("workers", &DeleteParams::default())
        .await
        .expect("the conflicting MachineHealthCheck deleted");
    eventually("node-2 remediated once the check is enabled", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
}

/// Where a cluster shows its etcd members as pods: kubeadm's mirror pods, or OpenShift's guards.
#[derive(Clone, Copy)]
enum MemberPods {
    Kubeadm,
    OpenShift,
}

impl MemberPods {
    fn add(self, lab: &nodemedic_lab::Lab) {
        match self {
            Self::Kubeadm => lab.add_etcd_members(),
            Self::OpenShift => lab.add_etcd_guard_pods(),
        }
        .expect("etcd member pods");
    }

    fn api(self, client: &Client) -> (Api<k8s_openapi::api::core::v1::Pod>, &'static str) {
        match self {
            Self::Kubeadm => (Api::namespaced(client.clone(), "kube-system"), "component=etcd"),
            Self::OpenShift => (Api::namespaced(client.clone(), "openshift-etcd"), "app=guard"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_node_is_remediated_only_once_etcd_can_spare_it() {
    remediated_once_etcd_can_spare_it(MemberPods::Kubeadm).await;
}

/// OpenShift's etcd guard pods, as medik8s reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_openshift_a_control_plane_node_is_remediated_only_once_the_etcd_guards_can_spare_it() {
    remediated_once_etcd_can_spare_it(MemberPods::OpenShift).await;
}

async fn remediated_once_etcd_can_spare_it(pods: MemberPods) {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    pods.add(&lab);
    let (members, selector) = pods.api(&client);
    let ready_members = || async {
        let list = members
            .list(&kube::api::ListParams::default().labels(selector))
            .await
            .ok()?;
        Some(
            list.items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count(),
        )
    };
    eventually("three ready etcd members", LONG, || async {
        (ready_members().await? == 3).then_some(())
    })
    .await;
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {});
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, CHECK, NodeHealthCheckPhase::Enabled).await;

    // node-3's member is gone: etcd has two, and node-2's loss would leave one.
    let node_3_member = members
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .expect("the members")
        .items
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node-3"))
        .and_then(|p| p.metadata.name)
        .expect("node-3's member");
    members
        .delete(&node_3_member, &DeleteParams::default().grace_period(0))
        .await
        .expect("node-3's member removed");
    lab.crash("node-2").await.expect("crash");
    event_with(
        &client,
        "RemediationSkipped",
        "etcd would keep 1 of its 2 members ready",
    )
    .await;
    assert!(
        snr_for(&client, "node-2").await.is_empty(),
        "remediated at etcd's expense"
    );

    // node-3's member is back and ready: etcd can spare node-2.
    pods.add(&lab);
    eventually("node-2 remediated once etcd can spare it", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
}

/// Whether etcd's member at `url` (http://ip:port) answers its health check healthy.
async fn member_healthy(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(address) = url.strip_prefix("http://") else {
        return false;
    };
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").await.ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer.contains(r#""health":"true""#))
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// External etcd: a member on each control-plane host, outside any pod, named to the controller
/// with `--etcd-member`; the quorum guard asks each for its health. With node-3's member stopped,
/// node-2's loss leaves no member healthy: node-2 is held back. Once node-3's member is back, it
/// and node-1's have a quorum, and node-2 is remediated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_external_etcd_a_control_plane_node_is_remediated_only_once_the_members_can_spare_it() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    let members = lab
        .start_etcd_cluster(&["node-1", "node-2", "node-3"])
        .expect("the etcd cluster");
    let all_healthy = || async {
        for (_, url) in &members {
            if !member_healthy(url).await {
                return None;
            }
        }
        Some(())
    };
    eventually("three healthy etcd members", LONG, all_healthy).await;
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {});
    let flags: Vec<String> = members
        .iter()
        .map(|(node, url)| format!("--etcd-member={node}={url}"))
        .collect();
    let mut args: Vec<&str> = ONLY_HEALTH_CHECK.to_vec();
    args.extend(flags.iter().map(String::as_str));
    start_controller(&lab, "controller", &args);
    phase_is(&client, CHECK, NodeHealthCheckPhase::Enabled).await;

    lab.kill_process("node-3/etcd").expect("node-3's member stopped");
    lab.crash("node-2").await.expect("crash");
    event_with(&client, "RemediationSkipped", "of its 3 members ready").await;
    assert!(
        snr_for(&client, "node-2").await.is_empty(),
        "remediated at etcd's expense"
    );

    lab.restart_process("node-3/etcd").expect("node-3's member started");
    eventually("node-2 remediated once etcd can spare it", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
}
