//! Node Maintenance end to end: cordon and drain through the Eviction API against the lab's real
//! disruption controller, give the node back, the etcd-quorum refusal, and the interplay with the
//! health check and fence agents through the node lease and the exclusion label.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_api::maintenance::{MaintenancePhase, NodeMaintenance};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, PowerDelays};
use serde_json::json;

use crate::{
    fenceagents::{adapt_template, far},
    support::{apply_seed, apply_seed_check, event_with, eventually, lab, metrics, sample, start_controller, taints},
};

const LONG: Duration = Duration::from_secs(180);
const MAINTENANCE_ONLY: &[&str] = &[
    "--disable=health-check",
    "--disable=self-remediation",
    "--disable=fence-agents",
];

/// Six replicas spread over the nodes, a budget that lets one go at a time, a DaemonSet, and an
/// unmanaged pod with emptyDir data on node-1.
const SHOP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: web}}}
      containers: [{name: web, image: registry.example/web:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shop}
spec:
  minAvailable: 5
  selector: {matchLabels: {app: web}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-agent, namespace: shop}
spec:
  selector: {matchLabels: {app: node-agent}}
  template:
    metadata: {labels: {app: node-agent}}
    spec:
      containers: [{name: agent, image: registry.example/agent:1}]
---
apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: shop}
spec:
  nodeName: node-1
  terminationGracePeriodSeconds: 1
  volumes: [{name: scratch, emptyDir: {}}]
  containers: [{name: bare, image: registry.example/bare:1, volumeMounts: [{name: scratch, mountPath: /scratch}]}]
"#;

/// One replica pinned to node-3 under a budget that allows no disruption at all.
const PINNED: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: pinned, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: pinned}}
  template:
    metadata: {labels: {app: pinned}}
    spec:
      nodeSelector: {kubernetes.io/hostname: node-3}
      containers: [{name: pinned, image: registry.example/pinned:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pinned, namespace: shop}
spec:
  maxUnavailable: 0
  selector: {matchLabels: {app: pinned}}
"#;

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The fewest ready `app=web` pods the API server showed at any moment once all six were ready
/// (a watch replays the pods' changes in order, so every intermediate state is seen).
struct ReadyLow {
    low: Arc<Mutex<Option<usize>>>,
    watch: tokio::task::AbortHandle,
}

impl ReadyLow {
    fn record(client: &Client) -> Self {
        let low = Arc::new(Mutex::new(None));
        let into = low.clone();
        let api = Api::<Pod>::namespaced(client.clone(), "shop");
        let task = tokio::spawn(async move {
            let mut pods: BTreeMap<String, bool> = BTreeMap::new();
            let config = watcher::Config::default().labels("app=web");
            let mut stream = std::pin::pin!(watcher(api, config).backoff(nodemedic_kube::backoff::prompt()));
            while let Some(Ok(event)) = stream.next().await {
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        pods.insert(p.name_any(), ready(&p));
                    }
                    watcher::Event::Delete(p) => {
                        pods.remove(&p.name_any());
                    }
                    _ => {}
                }
                let now = pods.values().filter(|r| **r).count();
                if let Ok(mut low) = into.lock() {
                    *low = match *low {
                        None if now == 6 => Some(6),
                        Some(l) => Some(l.min(now)),
                        None => None,
                    };
                }
            }
        });
        Self {
            low,
            watch: task.abort_handle(),
        }
    }

    fn get(&self) -> Option<usize> {
        self.low.lock().ok().and_then(|l| *l)
    }
}

impl Drop for ReadyLow {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

pub(crate) async fn create(client: &Client, name: &str, node: &str, drain_timeout: Option<&str>) {
    let mut spec = json!({"nodeName": node, "reason": "test"});
    if let Some(t) = drain_timeout {
        spec["drainTimeout"] = json!(t);
    }
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a NodeMaintenance");
    Api::<NodeMaintenance>::all(client.clone())
        .create(&PostParams::default(), &nm)
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
}

pub(crate) async fn in_phase(client: &Client, name: &str, phase: MaintenancePhase) -> NodeMaintenance {
    eventually(&format!("NodeMaintenance {name} {phase:?}"), LONG, || async {
        let nm = Api::<NodeMaintenance>::all(client.clone()).get_opt(name).await.ok()??;
        (nm.status.as_ref()?.phase == Some(phase)).then_some(nm)
    })
    .await
}

async fn delete_and_wait(client: &Client, name: &str) {
    let api = Api::<NodeMaintenance>::all(client.clone());
    api.delete(name, &DeleteParams::default()).await.expect("delete");
    eventually(&format!("NodeMaintenance {name} gone"), LONG, || async {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
}

/// (cordoned, our taints, exclusion label, lease holder)
async fn node_state(client: &Client, node: &str) -> (bool, bool, bool, Option<String>) {
    let n = Api::<Node>::all(client.clone()).get(node).await.expect("node");
    let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let t = taints(client, node).await;
    let tainted = t.contains(&"medik8s.io/drain:NoSchedule".to_owned());
    let labelled = n
        .labels()
        .get("remediation.medik8s.io/exclude-from-remediation")
        .map(String::as_str)
        == Some("true");
    let lease = Api::<Lease>::namespaced(client.clone(), "medik8s-leases")
        .get_opt(&format!("node-{node}"))
        .await
        .expect("lease read")
        .and_then(|l| l.spec?.holder_identity);
    (cordoned, tainted, labelled, lease)
}

async fn pods_on(client: &Client, node: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), "shop")
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

pub(crate) async fn all_ready(client: &Client, label: &str, count: usize) {
    eventually(&format!("{count} ready pods {label}"), LONG, || async {
        let pods = Api::<Pod>::namespaced(client.clone(), "shop")
            .list(&ListParams::default().labels(label))
            .await
            .ok()?;
        (pods.items.iter().filter(|p| ready(p)).count() == count).then_some(())
    })
    .await;
}

/// Every control-plane node's etcd mirror pod, ready. Applied again after a remediation, as a
/// booting kubelet re-creates the mirror pods of its static pods (remediation deleted them).
async fn etcd_members_ready(lab: &Lab) {
    lab.add_etcd_members().expect("etcd mirror pods");
    let pods = Api::<Pod>::namespaced(lab.client(), "kube-system");
    eventually("three ready etcd members", LONG, || async {
        let list = pods.list(&ListParams::default().labels("component=etcd")).await.ok()?;
        (list.items.iter().filter(|p| ready(p)).count() == 3).then_some(())
    })
    .await;
}

fn status_text(nm: &NodeMaintenance) -> String {
    format!("{:?}", nm.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "a scenario on one lab, read whole in the order it happens: its steps share the lab, its clients and its objects"
)]
async fn maintenance_drains_at_the_budgets_pace_gives_the_node_back_and_guards_etcd() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    etcd_members_ready(&lab).await;
    let port = start_controller(&lab, "controller", MAINTENANCE_ONLY);
    lab.apply_yaml(SHOP).expect("shop");
    all_ready(&client, "app=web", 6).await;
    all_ready(&client, "app=node-agent", 3).await;
    let low = ReadyLow::record(&client);
    let web_on_1 = pods_on(&client, "node-1")
        .await
        .iter()
        .filter(|p| p.labels().get("app").map(String::as_str) == Some("web"))
        .count();

    // The seed manifest, its node name adapted.
    apply_seed(&lab, "002-node-maintenance.yaml", |m| {
        m["spec"]["nodeName"] = json!("node-1")
    });
    let name = "nodemaintenance-worker-1";
    let done = in_phase(&client, name, MaintenancePhase::Succeeded).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.drain_progress, Some(100), "{}", status_text(&done));
    // The web replicas, the unmanaged pod and the DaemonSet pod (counted, never evicted).
    assert!(status.totalpods >= Some(web_on_1 as i32 + 2), "{}", status_text(&done));
    assert_eq!(
        status.eviction_pods,
        Some(web_on_1 as i32 + 1),
        "{}",
        status_text(&done)
    );
    assert!(status.pending_pods.unwrap_or_default().is_empty());
    let left: Vec<String> = pods_on(&client, "node-1").await.iter().map(|p| p.name_any()).collect();
    assert!(
        left.len() == 1 && left[0].starts_with("node-agent-"),
        "only the DaemonSet pod stays on node-1: {left:?}"
    );
    assert_eq!(
        node_state(&client, "node-1").await,
        (true, true, true, Some("node-maintenance".into()))
    );
    assert!(
        taints(&client, "node-1")
            .await
            .contains(&"node.kubernetes.io/unschedulable:NoSchedule".to_owned())
    );
    all_ready(&client, "app=web", 6).await;
    let lowest = low.get().expect("the watch saw all six ready");
    assert!(lowest >= 5, "the budget (minAvailable 5) was violated: {lowest} ready");
    let text = metrics(port).expect("metrics");
    let evictions: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nodemedic_maintenance_evictions"))
        .collect();
    println!("{web_on_1} web replicas on node-1; lowest ready {lowest}; {evictions:?}");
    assert_eq!(
        sample(&text, "nodemedic_maintenance_finished_total{result=\"succeeded\"}"),
        Some(1.0)
    );
    for reason in ["BeginMaintenance", "CordonNode", "SucceedMaintenance"] {
        event_with(&client, reason, "node-1").await;
    }

    // A second maintenance for the same node, and one for a node that does not exist.
    create(&client, "again-1", "node-1", None).await;
    create(&client, "ghost", "node-9", None).await;
    let again = in_phase(&client, "again-1", MaintenancePhase::Failed).await;
    assert!(
        status_text(&again).contains("already covers this node"),
        "{}",
        status_text(&again)
    );
    let ghost = in_phase(&client, "ghost", MaintenancePhase::Failed).await;
    assert!(
        status_text(&ghost).contains("does not exist"),
        "{}",
        status_text(&ghost)
    );
    // Etcd: node-1 is in maintenance; taking node-2 too would leave 1 of 3 members.
    create(&client, "second-cp", "node-2", None).await;
    let refused = in_phase(&client, "second-cp", MaintenancePhase::Failed).await;
    assert!(
        status_text(&refused).contains("etcd would keep 1 of 3"),
        "{}",
        status_text(&refused)
    );
    assert_eq!(node_state(&client, "node-2").await, (false, false, false, None));
    // Deleting the duplicate leaves node-1 in maintenance.
    delete_and_wait(&client, "again-1").await;
    delete_and_wait(&client, "ghost").await;
    delete_and_wait(&client, "second-cp").await;
    assert_eq!(
        node_state(&client, "node-1").await,
        (true, true, true, Some("node-maintenance".into()))
    );

    // Ending the maintenance gives the node back.
    delete_and_wait(&client, name).await;
    assert_eq!(node_state(&client, "node-1").await, (false, false, false, None));
    eventually("node-1 without the unschedulable taint", LONG, || async {
        (!taints(&client, "node-1")
            .await
            .iter()
            .any(|t| t.starts_with("node.kubernetes.io/unschedulable")))
        .then_some(())
    })
    .await;
    event_with(&client, "RemovedMaintenance", "node-1").await;

    // A budget that allows nothing: the drain keeps trying and names the pod, then the drain
    // timeout fails it and gives the node back.
    lab.apply_yaml(PINNED).expect("pinned");
    all_ready(&client, "app=pinned", 1).await;
    create(&client, "stuck", "node-3", Some("25s")).await;
    let blocked = eventually("the blocking pod named", LONG, || async {
        let nm = Api::<NodeMaintenance>::all(client.clone())
            .get_opt("stuck")
            .await
            .ok()??;
        let status = nm.status.clone()?;
        let blocking = status.blocking_pods.clone()?;
        (status.phase == Some(MaintenancePhase::Running) && blocking.iter().any(|b| b.name.starts_with("pinned-")))
            .then_some(nm)
    })
    .await;
    let reason = &blocked
        .status
        .as_ref()
        .and_then(|s| s.blocking_pods.clone())
        .expect("blocking")[0]
        .reason;
    assert!(reason.contains("disruption budget"), "{reason}");
    event_with(&client, "DrainBlocked", "pinned-").await;
    let failed = in_phase(&client, "stuck", MaintenancePhase::Failed).await;
    let error = failed
        .status
        .as_ref()
        .and_then(|s| s.last_error.clone())
        .unwrap_or_default();
    assert!(error.contains("timed out") && error.contains("pinned-"), "{error}");
    assert_eq!(node_state(&client, "node-3").await, (false, false, false, None));
    assert_eq!(
        pods_on(&client, "node-3")
            .await
            .iter()
            .filter(|p| p.name_any().starts_with("pinned-"))
            .count(),
        1
    );
    delete_and_wait(&client, "stuck").await;

    // A node deleted during maintenance ends it: the maintenance and the lease go with the node.
    create(&client, "doomed", "node-2", None).await;
    in_phase(&client, "doomed", MaintenancePhase::Running).await;
    eventually("node-2's lease taken", LONG, || async {
        (node_state(&client, "node-2").await.3.as_deref() == Some("node-maintenance")).then_some(())
    })
    .await;
    Api::<Node>::all(client.clone())
        .delete("node-2", &DeleteParams::default())
        .await
        .expect("delete node-2");
    eventually("the maintenance of the deleted node gone", LONG, || async {
        matches!(
            Api::<NodeMaintenance>::all(client.clone()).get_opt("doomed").await,
            Ok(None)
        )
        .then_some(())
    })
    .await;
    eventually("the deleted node's lease gone", LONG, || async {
        matches!(
            Api::<Lease>::namespaced(client.clone(), "medik8s-leases")
                .get_opt("node-node-2")
                .await,
            Ok(None)
        )
        .then_some(())
    })
    .await;
}

/// The health check and maintenance keep off each other's nodes: a node in maintenance that
/// loses power is not remediated, and is once the maintenance ends (seed 002's chain: the fence
/// agents power it back on, no one pushes a button); a node the health check is remediating
/// makes a new maintenance wait for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_and_the_health_check_take_turns_through_the_node_lease() {
    let lab = lab(LabConfig::seed().with_bmcs(BmcOptions {
        delays: PowerDelays::None,
        ..BmcOptions::default()
    }))
    .await;
    let client = lab.client();
    etcd_members_ready(&lab).await;
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    start_controller(&lab, "controller", &["--disable=self-remediation"]);
    apply_seed(&lab, "002-far-template.yaml", adapt_template(&lab));
    apply_seed_check(&lab, "002-nhc-far-3node.yaml", |_| {});

    // In maintenance, powered off: excluded from remediation.
    create(&client, "dimm-1", "node-1", None).await;
    in_phase(&client, "dimm-1", MaintenancePhase::Succeeded).await;
    lab.power_off("node-1").await.expect("power off");
    lab.wait_ready_status("node-1", "Unknown", LONG)
        .await
        .expect("node-1 silent");
    event_with(&client, "RemediationSkipped", "node node-1: it is labelled").await;
    assert!(
        far(&client, "node-1").await.is_none(),
        "a node in maintenance is not remediated"
    );

    // The maintenance ends with the node still off: the health check sees it and the fence
    // agents bring it back.
    delete_and_wait(&client, "dimm-1").await;
    eventually("node-1 Ready again", LONG, || async {
        lab.wait_ready_status("node-1", "True", Duration::from_secs(1))
            .await
            .ok()
    })
    .await;
    eventually("node-1's remediation done and gone", LONG, || async {
        far(&client, "node-1").await.is_none().then_some(())
    })
    .await;
    assert!(
        lab.timeline().entries().iter().any(|e| matches!(
            &e.event,
            nodemedic_lab::Event::Power { node, on: true, cause } if node == "node-1" && cause == "bmc"
        )),
        "the BMC powered node-1 on"
    );
    etcd_members_ready(&lab).await;

    // The health check remediates node-2 (its BMC hangs, so the fencing cannot finish yet): a
    // maintenance waits for the lease and touches nothing.
    lab.hang_bmc("node-2").await.expect("hang bmc");
    lab.crash("node-2").await.expect("crash");
    let holder = format!("NodeHealthCheck-{}", "nhc-far-3node");
    eventually("the health check holding node-2's lease", LONG, || async {
        (node_state(&client, "node-2").await.3.as_deref() == Some(holder.as_str())).then_some(())
    })
    .await;
    create(&client, "dimm-2", "node-2", None).await;
    let waiting = eventually("dimm-2 waiting for the lease", LONG, || async {
        let nm = Api::<NodeMaintenance>::all(client.clone())
            .get_opt("dimm-2")
            .await
            .ok()??;
        nm.status
            .as_ref()?
            .last_error
            .as_deref()?
            .contains("waiting for the node lease")
            .then_some(nm)
    })
    .await;
    assert!(status_text(&waiting).contains(&holder), "{}", status_text(&waiting));
    assert_eq!(
        node_state(&client, "node-2").await,
        (false, false, false, Some(holder.clone()))
    );
    event_with(&client, "WaitingForLease", &holder).await;
    assert!(far(&client, "node-2").await.is_some());

    // The BMC answers again: the node is fenced and back, the health check lets go, the
    // maintenance takes over.
    lab.resume_bmc("node-2").await.expect("resume bmc");
    in_phase(&client, "dimm-2", MaintenancePhase::Succeeded).await;
    assert_eq!(
        node_state(&client, "node-2").await,
        (true, true, true, Some("node-maintenance".into()))
    );
    delete_and_wait(&client, "dimm-2").await;
    assert_eq!(node_state(&client, "node-2").await, (false, false, false, None));
}
