//! nodemedic on real nodes, installed as users install it: `helm install` of the shipped chart,
//! from the images `make image` builds (imported into each node's containerd: nothing can be
//! pulled here), the controller's replicas and the agent DaemonSet running as pods on real
//! kubelets.

use std::{path::Path, process::Command, time::Duration};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    core::v1::Pod,
};
use kube::Api;
use nodemedic_harness::images::Images;
use nodemedic_lab::{
    BmcOptions, Lab, LabConfig, NodeSpec,
    data_witness::{DataWitness, Record},
    tools_dir, workloads,
};

use crate::{
    fenceagents::{adapt_template, bmc_power, far},
    selfremediation::snr,
    support::{NS, apply_seed, eventually, lab, scenario},
    text,
};

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const INSTALLED: Duration = Duration::from_secs(180);
const LONG: Duration = Duration::from_secs(180);

/// The seed's three nodes, real, each importing nodemedic's images at its boot, with the lab's
/// ReadWriteOnce volumes.
fn real_config() -> LabConfig {
    let images = Images::of(&crate::nodemedic_exe()).expect("the images are built");
    let mut config = LabConfig::new(NODES.iter().map(|n| NodeSpec::control_plane_worker(n).real()).collect());
    config.persistent_volumes = 2;
    config.node_images = vec![images.controller, images.agent];
    config
}

/// The values a lab installs with, and why: the default health check's conditions last 2 s
/// instead of 300 s, and self remediation's timings are the lab's (API checks every second, a
/// 5 s safe time) instead of the seed's minutes, so a scenario takes seconds. Nothing else:
/// the images, their tags and every other default are the chart's.
fn lab_values() -> Vec<String> {
    let fast: serde_json::Value = serde_json::from_str(scenario::FAST_CONFIG).expect("json");
    vec![
        format!("defaultHealthCheck.unhealthyConditions={}", scenario::test_conditions()),
        format!("selfNodeRemediationConfig.spec={}", fast["spec"]),
    ]
}

/// `helm install` of charts/nodemedic as shipped, with `values` (`--set-json` pairs) on top.
fn helm_install(lab: &Lab, values: &[String]) {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/nodemedic");
    let mut helm = Command::new(tools_dir().join("helm"));
    helm.args(["install", "nodemedic"])
        .arg(&chart)
        .args(["--namespace", NS, "--kubeconfig"])
        .arg(lab.kubeconfig());
    for value in values {
        helm.args(["--set-json", value]);
    }
    let out = helm.output().expect("helm runs");
    assert!(out.status.success(), "helm install: {}", text(&out));
}

/// Both controller replicas ready and an agent ready on every node.
async fn installed(lab: &Lab) {
    let deployments = Api::<Deployment>::namespaced(lab.client(), NS);
    eventually("the controller's two replicas ready", INSTALLED, || async {
        let ready = deployments.get_opt("nodemedic-controller").await.ok().flatten()?;
        (ready.status?.ready_replicas? == 2).then_some(())
    })
    .await;
    let daemon_sets = Api::<DaemonSet>::namespaced(lab.client(), NS);
    eventually("an agent ready on every node", INSTALLED, || async {
        let status = daemon_sets.get_opt("nodemedic-agent").await.ok().flatten()?.status?;
        (status.number_ready == NODES.len() as i32).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_nodemedic_from_its_images_and_every_agent_arms_its_node_s_watchdog_from_its_pod() {
    let lab = lab(real_config()).await;
    helm_install(&lab, &[]);
    installed(&lab).await;
    // Each agent found its node, its peers and its certificates, and opened the node's
    // /dev/watchdog (the lab's emulated device) from inside its container.
    for node in NODES {
        eventually(&format!("{node}'s agent feeds its watchdog"), INSTALLED, || async {
            lab.watchdog_device_stats(node)
                .ok()
                .filter(|s| s.keepalives > 0)
                .map(|_| ())
        })
        .await;
    }
}

/// The node `vm/db-0` runs on once it runs (not on `not_on`).
async fn writer_running(lab: &Lab, not_on: Option<&str>) -> String {
    let pods = Api::<Pod>::namespaced(lab.client(), "vm");
    eventually("db-0 running", LONG, || async {
        let pod = pods.get_opt("db-0").await.ok().flatten()?;
        let node = pod.spec.as_ref()?.node_name.clone()?;
        let running = pod.status.as_ref()?.phase.as_deref() == Some("Running");
        (running && Some(node.as_str()) != not_on).then_some(node)
    })
    .await
}

/// Waits until the volume holds more than `than` records of `instances` writers, checking the
/// data witness at every look.
async fn records(witness: &mut DataWitness, than: usize, instances: usize) -> Vec<Record> {
    eventually(
        &format!("more than {than} records of {instances} writers"),
        LONG,
        || {
            let (records, violations) = witness.look();
            assert!(
                violations.is_empty(),
                "the data witness: {violations:?} in {}",
                witness.path().display()
            );
            let writers: std::collections::BTreeSet<&str> = records.iter().map(|r| r.instance.as_str()).collect();
            let enough = records.len() > than && writers.len() == instances;
            async move { enough.then_some(records) }
        },
    )
    .await
}

/// The writer, running with a few records synced; its node and the witness of its volume.
async fn start_writer(lab: &Lab) -> (String, DataWitness, Vec<Record>) {
    lab.kubectl(&["create", "namespace", "vm"]).expect("namespace");
    lab.apply_yaml(workloads::WRITER_STATEFULSET).expect("the writer");
    let node = writer_running(lab, None).await;
    let mut witness = lab.data_witness("vm", "data-db-0").await.expect("the writer's volume");
    let before = records(&mut witness, 5, 1).await;
    (node, witness, before)
}

/// Crashes the writer's node `a`: the writer goes on on another node with every record synced
/// before and no second writer. Prints its last record on `a` and its first on the new node.
async fn crash_and_move(lab: &Lab, a: &str, witness: &mut DataWitness, before: &[Record]) {
    lab.crash(a).await.expect("crash");
    let b = writer_running(lab, Some(a)).await;
    let after = records(witness, before.len() + 5, 2).await;
    assert!(
        after.starts_with(before),
        "the records synced before the crash are intact"
    );
    let last_on_a = after
        .iter()
        .take_while(|r| r.instance == before[0].instance)
        .last()
        .expect("a's records");
    let first_on_b = after
        .iter()
        .find(|r| r.instance != before[0].instance)
        .expect("b's records");
    println!(
        "the writer's last record on {a}: {} at {}; its first on {b}: {} at {} ({:.1} s later)",
        last_on_a.sequence,
        last_on_a.nanos,
        first_on_b.sequence,
        first_on_b.nanos,
        (first_on_b.nanos - last_on_a.nanos) as f64 / 1e9
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
}

/// Seed scenario (a) on real nodes: the node running the writer loses its power; the agents'
/// peers and the remediation fence it (its own agent's watchdog went with its power), the
/// writer runs on another node with every record it synced and no second writer, and the node
/// boots, its kubelet returns and the remediation is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_losing_power_is_remediated_and_its_writer_goes_on_elsewhere_with_every_record() {
    let lab = lab(real_config()).await;
    helm_install(&lab, &lab_values());
    installed(&lab).await;
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
    let mut values = lab_values();
    let fast: serde_json::Value = serde_json::from_str(&scenario::with_detector(scenario::FAST_CONFIG)).expect("json");
    values[1] = format!("selfNodeRemediationConfig.spec={}", fast["spec"]);
    // The example health check below fences through fence agents; the default one would race
    // it with self remediation.
    values.push("defaultHealthCheck.enabled=false".into());
    helm_install(&lab, &values);
    installed(&lab).await;
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
    helm_install(&lab, &lab_values());
    installed(&lab).await;
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
    helm_install(&lab, &lab_values());
    installed(&lab).await;
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
    eventually("another agent pod ready on node-2", INSTALLED, || async {
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
    eventually("the new agent feeds node-2's watchdog", INSTALLED, || async {
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
