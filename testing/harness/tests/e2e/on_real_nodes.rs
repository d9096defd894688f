//! nodemedic on real nodes, installed as users install it: `helm install` of the shipped chart,
//! from the images `make image` builds (imported into each node's containerd: nothing can be
//! pulled here), the controller's replicas and the agent DaemonSet running as pods on real
//! kubelets (see [`nodemedic_harness::real_nodes`]), the stateful stand-in a process that
//! writes, checked by the data witness.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use nodemedic_harness::real_nodes::{self, NODES};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, data_witness::DataWitness};

use crate::{
    fenceagents::{adapt_template, bmc_power, far},
    selfremediation::snr,
    support::{NS, apply_seed, eventually, lab, scenario},
};

const LONG: Duration = Duration::from_secs(180);

fn real_config() -> LabConfig {
    real_nodes::config(&crate::nodemedic_exe()).expect("the images are built")
}

async fn helm_install(lab: &Lab, values: &[String]) {
    real_nodes::helm_install(lab, values).await.expect("helm install");
}

fn lab_values() -> Vec<String> {
    real_nodes::values(scenario::FAST_CONFIG, false).expect("values")
}

/// The writer running, its node, its volume's witness and its first records.
async fn start_writer(lab: &Lab) -> (String, DataWitness, Vec<nodemedic_lab::data_witness::Record>) {
    let (node, mut witness) = real_nodes::start_writer(lab).await.expect("the writer runs");
    let before = real_nodes::records(&mut witness, 5, 1, LONG)
        .await
        .expect("its records");
    (node, witness, before)
}

/// Crashes the writer's node `a`: the writer goes on on another node with every record synced
/// before and no second writer. Prints its last record on `a` and its first on the new node.
async fn crash_and_move(lab: &Lab, a: &str, witness: &mut DataWitness, before: &[nodemedic_lab::data_witness::Record]) {
    lab.crash(a).await.expect("crash");
    let b = lab.writer_running(Some(a), LONG).await.expect("the writer elsewhere");
    let after = real_nodes::records(witness, before.len() + 5, 2, LONG)
        .await
        .expect("its records");
    assert!(
        after.starts_with(before),
        "the records synced before the crash are intact"
    );
    let (last, first) = real_nodes::handover(&after, &before[0].instance).expect("a handover");
    println!(
        "the writer's last record on {a}: {} at {}; its first on {b}: {} at {} ({:.1} s later)",
        last.sequence,
        last.nanos,
        first.sequence,
        first.nanos,
        (first.nanos - last.nanos) as f64 / 1e9
    );
}

/// Powers `a` on: its kubelet returns and `gone` says its remediation is removed.
async fn boots_and_is_released<F, Fut>(lab: &Lab, a: &str, gone: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut gone = gone;
    if !lab.condition(a).expect("node").powered {
        lab.power_on(a).await.expect("power on");
    }
    lab.wait_ready_status(a, "True", LONG)
        .await
        .expect("its kubelet is back");
    eventually(&format!("{a}'s remediation removed"), LONG, || {
        let done = gone();
        async move { done.await.then_some(()) }
    })
    .await;
    // Its agent earns a licence in the new boot and keeps feeding the watchdog: nothing of the
    // last boot fences it again.
    let fed = lab.watchdog_device_stats(a).expect("its watchdog").keepalives;
    eventually(
        &format!("{a}'s agent feeding its watchdog after the boot"),
        LONG,
        || async {
            lab.watchdog_device_stats(a)
                .ok()
                .filter(|s| s.keepalives > fed + 5)
                .map(|_| ())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_nodemedic_from_its_images_and_every_agent_arms_its_node_s_watchdog_from_its_pod() {
    let lab = lab(real_config()).await;
    helm_install(&lab, &[]).await;
    // Each agent found its node, its peers and its certificates, and opened the node's
    // /dev/watchdog (the lab's emulated device) from inside its container.
    for node in NODES {
        eventually(&format!("{node}'s agent feeds its watchdog"), LONG, || async {
            lab.watchdog_device_stats(node)
                .ok()
                .filter(|s| s.keepalives > 0)
                .map(|_| ())
        })
        .await;
    }
}

/// Seed scenario (a) on real nodes: the node running the writer loses its power; the agents'
/// peers and the remediation fence it (its own agent's watchdog went with its power), the
/// writer runs on another node with every record it synced and no second writer, and the node
/// boots, its kubelet returns and the remediation is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_losing_power_is_remediated_and_its_writer_goes_on_elsewhere_with_every_record() {
    let lab = lab(real_config()).await;
    helm_install(&lab, &lab_values()).await;
    let (a, mut witness, before) = start_writer(&lab).await;
    crash_and_move(&lab, &a, &mut witness, &before).await;
    let client = lab.client();
    boots_and_is_released(&lab, &a, || async { snr(&client, &a).await.is_none() }).await;
    let (_, violations) = witness.look();
    assert!(violations.is_empty(), "the data witness: {violations:?}");
}

/// Seed scenario (b) on real nodes: fence agents through the node's Redfish BMC, the peer
/// failure detector on. The controller pod runs fence_redfish against the BMC, which powers the
/// real node off (its cgroup) and on (its boot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_losing_power_is_fenced_through_its_redfish_bmc_and_its_writer_goes_on_elsewhere() {
    let lab = lab(real_config().with_bmcs(BmcOptions::default())).await;
    let values = real_nodes::values(&scenario::with_detector(scenario::FAST_CONFIG), true).expect("values");
    helm_install(&lab, &values).await;
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    apply_seed(&lab, "002-far-template.yaml", adapt_template(&lab));
    scenario::apply_peer_detection_check(&lab, scenario::shorten_durations).expect("the example health check");
    let (a, mut witness, before) = start_writer(&lab).await;
    crash_and_move(&lab, &a, &mut witness, &before).await;
    eventually(&format!("the BMC powered {a} off, then on"), LONG, || async {
        (bmc_power(&lab, &a) == [false, true]).then_some(())
    })
    .await;
    let client = lab.client();
    boots_and_is_released(&lab, &a, || async { far(&client, &a).await.is_none() }).await;
    let (_, violations) = witness.look();
    assert!(violations.is_empty(), "the data witness: {violations:?}");
}

/// Two replicas spread over the real nodes, under a budget that allows no disruption.
const WEB: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers: [{name: web, image: "lab.nodemedic.io/pause:1", imagePullPolicy: Never}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shop}
spec:
  maxUnavailable: 0
  selector: {matchLabels: {app: web}}
"#;

/// Seed scenario (c) on real nodes: a NodeMaintenance drains a real node; the budget holds its
/// pod back (named in the status) until it allows one disruption, then the pod is evicted and
/// runs on another node, and the node stays cordoned until the maintenance is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_maintenance_drains_a_real_node_past_a_budget_that_first_holds_a_pod_back() {
    use nodemedic_api::maintenance::{MaintenancePhase, NodeMaintenance};

    use crate::maintenance::{all_ready, create, in_phase};
    let lab = lab(real_config()).await;
    helm_install(&lab, &lab_values()).await;
    let client = lab.client();
    lab.apply_yaml(WEB).expect("the web deployment");
    all_ready(&client, "app=web", 2).await;
    let pods = Api::<Pod>::namespaced(client.clone(), "shop");
    let web_node = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let listed = pods
        .list(&kube::api::ListParams::default().labels("app=web"))
        .await
        .expect("pods");
    let node = listed.items.iter().find_map(web_node).expect("a web pod's node");

    create(&client, "dimm", &node, None).await;
    let maintenances = Api::<NodeMaintenance>::all(client.clone());
    eventually("the held-back pod named", LONG, || async {
        let status = maintenances.get_opt("dimm").await.ok()??.status?;
        let blocking = status.blocking_pods?;
        (status.phase == Some(MaintenancePhase::Running)
            && blocking
                .iter()
                .any(|b| b.name.starts_with("web-") && b.reason.contains("disruption budget")))
        .then_some(())
    })
    .await;
    lab.kubectl(&[
        "patch",
        "pdb",
        "web",
        "-n",
        "shop",
        "--type=merge",
        "-p",
        r#"{"spec":{"maxUnavailable":1}}"#,
    ])
    .expect("the budget allows one");
    in_phase(&client, "dimm", MaintenancePhase::Succeeded).await;
    all_ready(&client, "app=web", 2).await;
    let now = pods
        .list(&kube::api::ListParams::default().labels("app=web"))
        .await
        .expect("pods");
    assert!(
        now.items.iter().filter_map(web_node).all(|n| n != node),
        "no web pod is left on the maintained node {node}"
    );
    let unschedulable = |n: k8s_openapi::api::core::v1::Node| n.spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    assert!(
        unschedulable(nodes.get(&node).await.expect("node")),
        "{node} is cordoned"
    );
    maintenances
        .delete("dimm", &Default::default())
        .await
        .expect("the maintenance deleted");
    eventually(&format!("{node} schedulable again"), LONG, || async {
        (!unschedulable(nodes.get(&node).await.ok()?)).then_some(())
    })
    .await;
}

/// Seed scenario (d) on real nodes: an agent pod is killed; its DaemonSet starts another on the
/// same healthy node, which arms the node's watchdog again, and nothing is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_pod_is_started_again_by_its_daemon_set_and_nothing_is_fenced() {
    let lab = lab(real_config()).await;
    helm_install(&lab, &lab_values()).await;
    let client = lab.client();
    let node = NODES[1];
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    let agent_on = |pod: &Pod| {
        pod.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("nodemedic-agent-"))
            && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            && pod.metadata.deletion_timestamp.is_none()
    };
    let listed = pods.list(&Default::default()).await.expect("pods");
    let old = listed
        .items
        .into_iter()
        .find(|p| agent_on(p))
        .expect("the agent on node-2");
    let old_name = old.metadata.name.clone().expect("name");
    let fed_before = lab.watchdog_device_stats(node).expect("stats").keepalives;
    lab.kubectl(&["delete", "pod", "-n", NS, &old_name, "--grace-period=0", "--force"])
        .expect("the agent pod killed");
    eventually("another agent pod ready on node-2", LONG, || async {
        let listed = pods.list(&Default::default()).await.ok()?;
        listed
            .items
            .into_iter()
            .find(|p| agent_on(p) && p.metadata.name.as_deref() != Some(old_name.as_str()))
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
    })
    .await;
    eventually("the new agent feeds node-2's watchdog", LONG, || async {
        let fed = lab.watchdog_device_stats(node).ok()?.keepalives;
        (fed > fed_before + 3).then_some(())
    })
    .await;
    let fenced: Vec<String> = lab
        .timeline()
        .entries()
        .into_iter()
        .filter(|e| {
            matches!(
                &e.event,
                nodemedic_lab::Event::Power { on: false, .. } | nodemedic_lab::Event::WatchdogExpired { .. }
            )
        })
        .map(|e| format!("{:?}", e.event))
        .collect();
    assert!(fenced.is_empty(), "a node was fenced: {fenced:?}");
    assert!(snr(&client, node).await.is_none(), "node-2 was remediated");
}
