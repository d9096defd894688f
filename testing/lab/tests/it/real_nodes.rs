//! Real nodes: a kubelet and containerd running a pod that writes, beside a kwok node; power,
//! freezing and the boot, checked from the pod's own records on the node's disk and from the API.

use std::{net::Ipv4Addr, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::{Api, api::PostParams};
use nodemedic_lab::{Lab, LabConfig, NodeSpec, data_witness, real_node::WRITER_IMAGE, wait};

use crate::support::logs;

/// The records the writer on `node` has synced: (instance, sequence) in file order.
fn records(lab: &Lab, node: &str) -> Vec<(String, u64)> {
    let path = lab
        .node_host_path(node, "/var/lib/nodemedic/writer/records")
        .expect("a real node's path");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    data_witness::parse(&text)
        .into_iter()
        .map(|r| (r.instance, r.sequence))
        .collect()
}

async fn wait_more_records(lab: &Lab, node: &str, than: usize, what: &str) -> Vec<(String, u64)> {
    wait::until(what, Duration::from_secs(60), || async {
        let now = records(lab, node);
        Ok((now.len() > than).then_some(now))
    })
    .await
    .expect(what)
}

fn writer_pod(node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "writer", "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "writer",
                "image": WRITER_IMAGE,
                "imagePullPolicy": "Never",
                "env": [
                    {"name": "INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "INTERVAL", "value": "100ms"}
                ],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "hostPath": {"path": "/var/lib/nodemedic/writer", "type": "DirectoryOrCreate"}}]
        }
    }))
    .expect("pod")
}

async fn wait_running(pods: &Api<Pod>, restarted: bool) -> Pod {
    wait::until("the writer pod running", Duration::from_secs(90), || async {
        let pod = pods.get("writer").await?;
        let status = pod.status.clone().unwrap_or_default();
        let container = status.container_statuses.unwrap_or_default().into_iter().next();
        let running = container.as_ref().is_some_and(|c| {
            c.state.as_ref().is_some_and(|s| s.running.is_some()) && (!restarted || c.restart_count > 0)
        });
        Ok(running.then_some(pod))
    })
    .await
    .expect("running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_runs_a_writer_loses_it_with_its_power_and_runs_it_again_after_its_boot() {
    logs();
    let mut config = LabConfig::new(vec![
        NodeSpec::worker("node-1").real(),
        NodeSpec::worker("node-2").real(),
        NodeSpec::worker("node-3"),
    ]);
    config.storage = false;
    config.persistent_volumes = 0;
    let lab = Lab::start(config).await.expect("a lab of real and kwok nodes starts");

    let nodes = Api::<Node>::all(lab.client());
    let info = nodes
        .get("node-1")
        .await
        .expect("node-1")
        .status
        .and_then(|s| s.node_info)
        .expect("node info");
    assert!(info.container_runtime_version.starts_with("containerd://"), "{info:?}");
    assert_eq!(
        info.kubelet_version,
        format!("v{}", nodemedic_lab::version("KUBERNETES_VERSION"))
    );
    let kwok = nodes.get("node-3").await.expect("node-3");
    assert_eq!(kwok.metadata.labels.expect("labels")["type"], "kwok");

    let pods = Api::<Pod>::namespaced(lab.client(), "default");
    pods.create(&PostParams::default(), &writer_pod("node-1"))
        .await
        .expect("writer created");
    let pod = wait_running(&pods, false).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let first = wait_more_records(&lab, "node-1", 3, "the writer's first records").await;
    assert!(first.iter().all(|(instance, _)| *instance == uid), "{first:?}");
    // The API server reaches the kubelet (its serving port, its client certificate).
    let logs = lab
        .kubectl(&["logs", "-n", "default", "writer", "--tail=1"])
        .expect("kubectl logs reaches the real kubelet");
    assert!(logs.starts_with(&uid), "{logs}");
    assert!(!lab.node_processes("node-1").expect("cgroup").is_empty());

    // Frozen, the writer writes nothing, and its kubelet is silent: the node turns Unknown.
    lab.freeze("node-1").await.expect("freeze");
    let frozen_at = records(&lab, "node-1").len();
    lab.wait_ready_status("node-1", "Unknown", Duration::from_secs(30))
        .await
        .expect("a frozen node turns Unknown");
    assert_eq!(records(&lab, "node-1").len(), frozen_at, "a frozen writer wrote");
    lab.thaw("node-1").await.expect("thaw");
    wait_more_records(&lab, "node-1", frozen_at, "the thawed writer's next records").await;
    lab.wait_ready_status("node-1", "True", Duration::from_secs(30))
        .await
        .expect("Ready after the thaw");

    // Off, every process of the node is gone at once, its pod's included; also when the node
    // hung first (a watchdog or a BMC powers off a frozen node).
    lab.freeze("node-1").await.expect("freeze");
    tokio::time::timeout(Duration::from_secs(30), lab.power_off("node-1"))
        .await
        .expect("a frozen node powers off")
        .expect("power off");
    assert!(lab.node_processes("node-1").expect("cgroup").is_empty());
    let at_power_off = records(&lab, "node-1");
    lab.wait_ready_status("node-1", "Unknown", Duration::from_secs(30))
        .await
        .expect("a node without power turns Unknown");
    assert_eq!(
        records(&lab, "node-1").len(),
        at_power_off.len(),
        "a writer outlived its node's power"
    );
    assert!(!lab.condition("node-2").expect("node-2").frozen);

    // The boot: the kubelet registers again and restarts the pod, which goes on from its disk.
    lab.power_on("node-1").await.expect("power on");
    lab.wait_ready_status("node-1", "True", Duration::from_secs(60))
        .await
        .expect("Ready after the boot");
    wait_running(&pods, true).await;
    let after = wait_more_records(&lab, "node-1", at_power_off.len() + 2, "the records after the boot").await;
    let sequences: Vec<u64> = after.iter().map(|(_, sequence)| *sequence).collect();
    assert!(
        sequences.windows(2).all(|w| w[1] == w[0] + 1),
        "the sequence has gaps or repeats: {sequences:?}"
    );
    assert!(after.iter().all(|(instance, _)| *instance == uid), "{after:?}");

    // The boot brought the node's routes back with its link: what runs on its network (an
    // agent pod, say) reaches the API server through the `kubernetes` Service again.
    let service = Api::<Service>::namespaced(lab.client(), "default")
        .get("kubernetes")
        .await
        .expect("the kubernetes Service");
    let ip: Ipv4Addr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .expect("its cluster IP");
    wait::until(
        "node-1 reaching the kubernetes Service",
        Duration::from_secs(30),
        || async { Ok(lab.node_can_reach("node-1", ip, 443)?.then_some(())) },
    )
    .await
    .expect("the Service reachable after the boot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_writer_s_volume_moves_with_it_through_the_lab_s_csi_driver_and_its_records_go_on() {
    logs();
    let mut config = LabConfig::new(vec![
        NodeSpec::worker("node-1").real(),
        NodeSpec::worker("node-2").real(),
    ]);
    config.persistent_volumes = 2;
    let lab = Lab::start(config).await.expect("lab starts");
    lab.kubectl(&["create", "namespace", "vm"]).expect("namespace");
    lab.apply_yaml(nodemedic_lab::workloads::WRITER_STATEFULSET)
        .expect("the writer");
    let first_node = lab
        .writer_running(None, Duration::from_secs(120))
        .await
        .expect("db-0 runs");
    let mut witness = lab.data_witness("vm", "data-db-0").await.expect("the claim's volume");
    let first = wait::until("the first instance's records", Duration::from_secs(60), || {
        let (records, violations) = witness.look();
        assert!(violations.is_empty(), "{violations:?}");
        async move { Ok((records.len() > 5).then_some(records)) }
    })
    .await
    .expect("records");

    // Moved: its node cordoned, the pod deleted; the claim's volume is detached from the old
    // node and attached to the new one before the new instance writes.
    lab.kubectl(&["cordon", &first_node]).expect("cordon");
    lab.kubectl(&["delete", "pod", "-n", "vm", "db-0", "--wait=false"])
        .expect("delete");
    let second_node = lab
        .writer_running(Some(&first_node), Duration::from_secs(120))
        .await
        .expect("db-0 runs elsewhere");
    let moved = wait::until("the second instance's records", Duration::from_secs(60), || {
        let (records, violations) = witness.look();
        assert!(violations.is_empty(), "{violations:?}");
        let instances: std::collections::BTreeSet<&str> = records.iter().map(|r| r.instance.as_str()).collect();
        let moved = instances.len() == 2 && records.len() > first.len() + 5;
        async move { Ok(moved.then_some(records)) }
    })
    .await
    .expect("records after the move");
    assert_ne!(first_node, second_node);
    assert!(moved.starts_with(&first), "the first instance's records are intact");
}
