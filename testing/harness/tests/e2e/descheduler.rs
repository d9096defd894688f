//! Rebalancing end to end: a KubeDescheduler runs the upstream descheduler (built from its Go
//! module, run by the lab as the kubelet of its pod, with the pod's in-cluster identity and the
//! chart's RBAC) against the lab's real scheduler and disruption controller.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Node, Pod},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use nodemedic_api::descheduler::KubeDescheduler;
use nodemedic_lab::{Lab, LabConfig, pods::PodRunner, rebalancing_dir};
use serde_json::json;

use crate::support::{event_with, eventually, lab, start_controller};

const LONG: Duration = Duration::from_secs(180);
/// The seed's namespace (an openshift-* one: the descheduler never evicts its own pod).
pub(crate) const OPERATOR_NS: &str = "openshift-kube-descheduler-operator";
pub(crate) const DESCHEDULER_ONLY: &[&str] = &[
    "--disable=health-check",
    "--disable=self-remediation",
    "--disable=fence-agents",
    "--disable=maintenance",
    "--disable=machine-deletion",
];

/// Three replicas of a ReplicaSet in `namespace` (all on node-1 while the others are cordoned),
/// which prefer to run apart.
fn replicas(namespace: &str, name: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      # As replicas usually ask: apart if possible (the scheduler alone ties between kwok's
      # equally empty nodes).
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm: {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: {name}}}}}}}
      containers: [{{name: main, image: registry.example/{name}:1}}]
"#
    )
}

/// Two replicas that must spread over zones; only node-1 has a zone when they are scheduled.
const ZONAL: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: zonal, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: zonal}}
  template:
    metadata: {labels: {app: zonal}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: zonal}}}
      containers: [{name: main, image: registry.example/zonal:1}]
"#;

/// A budget that allows no disruption of `held`.
const HELD_BUDGET: &str = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: held, namespace: guarded}
spec:
  maxUnavailable: 0
  selector: {matchLabels: {app: held}}
"#;

fn descheduler(mode: &str) -> String {
    format!(
        r#"
apiVersion: operator.openshift.io/v1
kind: KubeDescheduler
metadata: {{name: cluster, namespace: {OPERATOR_NS}}}
spec:
  managementState: Managed
  mode: {mode}
  deschedulingIntervalSeconds: 2
  profiles: [TopologyAndDuplicates]
  profileCustomizations:
    namespaces:
      excluded: [cpuload]
"#
    )
}

/// Runs the descheduler's pods with the upstream binary, and the controller with only the
/// descheduler operator.
pub(crate) fn run_descheduler(lab: &mut Lab) {
    lab.run_pods(PodRunner {
        selector: "app.kubernetes.io/managed-by=nodemedic-descheduler".into(),
        executable: rebalancing_dir().join("descheduler"),
    });
    start_controller(lab, "controller", DESCHEDULER_ONLY);
}

pub(crate) async fn set_unschedulable(client: &Client, node: &str, unschedulable: bool) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .unwrap_or_else(|e| panic!("cordoning {node}: {e}"));
}

pub(crate) async fn label_node(client: &Client, node: &str, key: &str, value: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("labelling {node}: {e}"));
}

/// Running pods of `app` in `namespace`: name -> (uid, node).
pub(crate) async fn running(client: &Client, namespace: &str, app: &str) -> BTreeMap<String, (String, String)> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            Some((p.name_any(), (p.uid()?, node)))
        })
        .collect()
}

fn nodes_of(pods: &BTreeMap<String, (String, String)>) -> Vec<String> {
    let mut nodes: Vec<String> = pods.values().map(|(_, node)| node.clone()).collect();
    nodes.sort();
    nodes
}

async fn all_on_node_1(
    client: &Client,
    namespace: &str,
    app: &str,
    count: usize,
) -> BTreeMap<String, (String, String)> {
    eventually(&format!("{count} {app} pods running on node-1"), LONG, || async {
        let pods = running(client, namespace, app).await;
        (pods.len() == count && pods.values().all(|(_, n)| n == "node-1")).then_some(pods)
    })
    .await
}

/// The log of the descheduler process that runs now (the lab runs each pod as `<node>/<pod>`).
async fn descheduler_log(lab: &Lab) -> String {
    let pods = Api::<Pod>::namespaced(lab.client(), OPERATOR_NS)
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=nodemedic-descheduler"))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut text = String::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        text.push_str(
            &std::fs::read_to_string(lab.log_path(&format!("{node}/{}", pod.name_any()))).unwrap_or_default(),
        );
    }
    text
}

pub(crate) async fn available(client: &Client) -> bool {
    let Ok(kd) = Api::<KubeDescheduler>::namespaced(client.clone(), OPERATOR_NS)
        .get("cluster")
        .await
    else {
        return false;
    };
    kd.status
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Available" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_and_duplicates_spread_pods_predictive_evicts_nothing_and_excluded_namespaces_and_budgets_hold() {
    let mut lab = lab(LabConfig::workers(3)).await;
    let client = lab.client();
    run_descheduler(&mut lab);

    for node in ["node-2", "node-3"] {
        set_unschedulable(&client, node, true).await;
    }
    label_node(&client, "node-1", "topology.kubernetes.io/zone", "a").await;
    lab.apply_yaml(&replicas("shop", "dup")).expect("shop");
    lab.apply_yaml(ZONAL).expect("zonal");
    lab.apply_yaml(&replicas("cpuload", "hog")).expect("cpuload");
    lab.apply_yaml(&replicas("guarded", "held")).expect("guarded");
    lab.apply_yaml(HELD_BUDGET).expect("budget");
    let dup = all_on_node_1(&client, "shop", "dup", 3).await;
    let zonal = all_on_node_1(&client, "shop", "zonal", 2).await;
    let hog = all_on_node_1(&client, "cpuload", "hog", 3).await;
    let held = all_on_node_1(&client, "guarded", "held", 3).await;
    for node in ["node-2", "node-3"] {
        set_unschedulable(&client, node, false).await;
    }
    label_node(&client, "node-2", "topology.kubernetes.io/zone", "b").await;

    // Predictive: the descheduler decides, logs each eviction it would make, and evicts nothing.
    lab.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OPERATOR_NS}}}\n"
    ))
    .expect("operator namespace");
    lab.apply_yaml(&descheduler("Predictive")).expect("KubeDescheduler");
    eventually("the KubeDescheduler Available", LONG, || async {
        available(&client).await.then_some(())
    })
    .await;
    let would = eventually(
        "dry-run evictions of the duplicates and the zone violation",
        LONG,
        || async {
            let log = descheduler_log(&lab).await;
            let named = |pods: &BTreeMap<String, (String, String)>| {
                pods.keys().any(|p| {
                    log.lines()
                        .any(|l| l.contains("Evicted pod in dry run mode") && l.contains(p.as_str()))
                })
            };
            (named(&dup) && named(&zonal)).then_some(log)
        },
    )
    .await;
    assert!(
        !hog.keys().any(|p| would.contains(p.as_str())),
        "an excluded namespace's pod was considered:\n{would}"
    );
    assert_eq!(running(&client, "shop", "dup").await, dup, "Predictive evicted a pod");
    assert_eq!(
        running(&client, "shop", "zonal").await,
        zonal,
        "Predictive evicted a pod"
    );

    // Automatic: the duplicates spread over the three nodes, the zones even out.
    lab.apply_yaml(&descheduler("Automatic")).expect("Automatic");
    eventually("one dup pod per node", LONG, || async {
        let pods = running(&client, "shop", "dup").await;
        (nodes_of(&pods) == ["node-1", "node-2", "node-3"]).then_some(())
    })
    .await;
    eventually("a zonal pod in each zone", LONG, || async {
        let pods = running(&client, "shop", "zonal").await;
        (nodes_of(&pods) == ["node-1", "node-2"]).then_some(())
    })
    .await;
    event_with(&client, "RemoveDuplicates", "sigs.k8s.io/descheduler").await;
    eventually("the budget refusing the held pods' eviction", LONG, || async {
        let log = descheduler_log(&lab).await;
        log.lines()
            .any(|l| l.contains("Error evicting pod") && held.keys().any(|p| l.contains(p.as_str())))
            .then_some(())
    })
    .await;
    assert_eq!(
        running(&client, "cpuload", "hog").await,
        hog,
        "an excluded namespace was descheduled"
    );
    assert_eq!(
        running(&client, "guarded", "held").await,
        held,
        "a PodDisruptionBudget was broken"
    );

    // Deleting the KubeDescheduler removes what it made.
    Api::<KubeDescheduler>::namespaced(client.clone(), OPERATOR_NS)
        .delete("cluster", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the descheduler's objects gone", LONG, || async {
        let deployment = Api::<Deployment>::namespaced(client.clone(), OPERATOR_NS)
            .get_opt("descheduler")
            .await
            .ok()?;
        let policy = Api::<ConfigMap>::namespaced(client.clone(), OPERATOR_NS)
            .get_opt("descheduler-policy")
            .await
            .ok()?;
        let binding = Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(&format!("nodemedic-descheduler-{OPERATOR_NS}"))
            .await
            .ok()?;
        (deployment.is_none() && policy.is_none() && binding.is_none()).then_some(())
    })
    .await;
}

/// The stand-in VM: one replica whose pod is named like KubeVirt's launcher pods and carries
/// the annotation KubeVirt puts on them; and ordinary replicas.
const VMS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: vms}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: virt-launcher-vm1, namespace: vms}
spec:
  replicas: 1
  serviceName: vm1
  selector: {matchLabels: {app: vm1}}
  template:
    metadata:
      labels: {app: vm1, kubevirt.io: virt-launcher}
      annotations: {descheduler.alpha.kubernetes.io/request-evict-only: ""}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: compute, image: registry.example/virt-launcher:1}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: vms}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: main, image: registry.example/web:1}]
"#;

fn soft_taints(node: &Node) -> Vec<String> {
    let mut keys: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key.starts_with("nodeutilization.descheduler.openshift.io/") && t.effect == "PreferNoSchedule")
        .map(|t| t.key)
        .collect();
    keys.sort();
    keys
}

async fn node_soft_taints(client: &Client, node: &str) -> Vec<String> {
    Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map(|n| soft_taints(&n))
        .unwrap_or_default()
}

/// The chart's ValidatingAdmissionPolicy, against the identity the tainter writes nodes as.
async fn the_soft_tainters_identity_may_set_only_soft_taints(lab: &Lab) {
    let kubeconfig = lab
        .kubeconfig_for(
            &format!(
                "system:serviceaccount:{}:nodemedic-soft-tainter",
                nodemedic_harness::scenario::NS
            ),
            &["system:serviceaccounts"],
        )
        .expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let nodes = Api::<Node>::all(Client::try_from(config).expect("client"));
    let taint =
        |key: &str, effect: &str| json!({"spec": {"taints": [{"key": key, "value": "true", "effect": effect}]}});
    let soft = "nodeutilization.descheduler.openshift.io/overutilized";
    eventually("the admission policy enforced", LONG, || async {
        let refused = nodes
            .patch(
                "node-3",
                &PatchParams::default(),
                &Patch::Merge(taint(soft, "NoSchedule")),
            )
            .await
            .err()?
            .to_string();
        refused.contains("only set PreferNoSchedule taints").then_some(())
    })
    .await;
    let foreign = nodes
        .patch(
            "node-3",
            &PatchParams::default(),
            &Patch::Merge(taint("example.com/other", "PreferNoSchedule")),
        )
        .await
        .expect_err("a foreign taint is refused")
        .to_string();
    assert!(
        foreign.contains("other than nodeutilization.descheduler.openshift.io"),
        "{foreign}"
    );
    nodes
        .patch(
            "node-3",
            &PatchParams::default(),
            &Patch::Merge(taint(soft, "PreferNoSchedule")),
        )
        .await
        .expect("a soft taint is allowed");
    nodes
        .patch(
            "node-3",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .expect("and removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubevirt_relieve_and_migrate_soft_taints_a_hot_node_and_moves_its_pods_as_live_migrations() {
    use nodemedic_lab::prometheus::{NodeFigures, with_interval};

    let mut lab = lab(LabConfig::workers(3)).await;
    let client = lab.client();
    for node in ["node-1", "node-2", "node-3"] {
        label_node(&client, node, "kubevirt.io/schedulable", "true").await;
    }
    lab.apply_yaml(&nodemedic_harness::scenario::chart_rbac())
        .expect("the chart's RBAC and policies");
    the_soft_tainters_identity_may_set_only_soft_taints(&lab).await;
    lab.set_node_figures("node-1", NodeFigures::cpu(0.9)).expect("figures");
    let rules = with_interval(
        include_str!("../../../../charts/nodemedic/files/descheduler-rules.yaml"),
        "1s",
    );
    let prometheus = lab.start_prometheus(&rules).await.expect("Prometheus starts");
    lab.stand_in_for_kubevirt_evictions().await.expect("eviction webhook");
    lab.run_pods(PodRunner {
        selector: "app.kubernetes.io/managed-by=nodemedic-descheduler".into(),
        executable: rebalancing_dir().join("descheduler"),
    });
    let prometheus_flag = format!("--descheduler-prometheus-url={prometheus}");
    let mut flags = DESCHEDULER_ONLY.to_vec();
    flags.push(&prometheus_flag);
    start_controller(&lab, "controller", &flags);

    for node in ["node-2", "node-3"] {
        set_unschedulable(&client, node, true).await;
    }
    lab.apply_yaml(VMS).expect("workloads");
    let vm = all_on_node_1(&client, "vms", "vm1", 1).await;
    let web = all_on_node_1(&client, "vms", "web", 4).await;
    for node in ["node-2", "node-3"] {
        set_unschedulable(&client, node, false).await;
    }

    // Seed 002's KubeDescheduler, with a lab-sized interval and the descheduler's debug log.
    lab.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OPERATOR_NS}}}\n"
    ))
    .expect("operator namespace");
    let mut seed = nodemedic_lab::seeds::load("002-kube-descheduler.yaml").expect("seed");
    seed["spec"]["deschedulingIntervalSeconds"] = json!(3);
    seed["spec"]["logLevel"] = json!("Debug");
    lab.apply_yaml(&nodemedic_lab::seeds::yaml(&seed))
        .expect("KubeDescheduler");
    eventually("the KubeDescheduler Available", LONG, || async {
        available(&client).await.then_some(())
    })
    .await;

    eventually("node-1 soft-tainted as over-utilized, the others not", LONG, || async {
        let hot = node_soft_taints(&client, "node-1").await;
        let others = [
            node_soft_taints(&client, "node-2").await,
            node_soft_taints(&client, "node-3").await,
        ];
        (hot == [
            "nodeutilization.descheduler.openshift.io/appropriate",
            "nodeutilization.descheduler.openshift.io/overutilized",
        ] && others.iter().all(Vec::is_empty))
        .then_some(())
    })
    .await;

    // The launcher pod's eviction is a live migration: it runs again on a cooler node.
    eventually("the VM moved off node-1", LONG, || async {
        let now = running(&client, "vms", "vm1").await;
        (now.len() == 1
            && now
                .values()
                .all(|(uid, node)| node != "node-1" && !vm.values().any(|(old, _)| old == uid)))
        .then_some(())
    })
    .await;
    eventually("web pods moved to cooler nodes", LONG, || async {
        let now = running(&client, "vms", "web").await;
        let moved = now
            .values()
            .filter(|(uid, node)| node != "node-1" && !web.values().any(|(old, _)| old == uid))
            .count();
        (moved >= 2).then_some(())
    })
    .await;
    let log = descheduler_log(&lab).await;
    let launcher = vm.keys().next().expect("the VM's pod");
    assert!(
        log.lines()
            .any(|l| l.contains("Eviction in background assumed") && l.contains(launcher.as_str())),
        "the launcher's 429 was not taken as an eviction in progress:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("Error evicting pod") && l.contains(launcher.as_str())),
        "the launcher's eviction counted as a failure:\n{log}"
    );
    // The limit is per node and per cycle (a cycle starts by resetting the evictor's counters);
    // several nodes may each give up to it in one cycle.
    for cycle in log.split("Resetting pod evictor counters") {
        let mut by_node: BTreeMap<&str, u32> = BTreeMap::new();
        for line in cycle.lines().filter(|l| l.contains("\"Evicted pod\"")) {
            let node = line
                .split("node=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default();
            *by_node.entry(node).or_default() += 1;
        }
        assert!(
            by_node.values().all(|evicted| *evicted <= 2),
            "more than the node limit (2) evicted from one node in one cycle: {by_node:?}\n{cycle}"
        );
    }

    // Cooled down (now the coolest): the taints go.
    lab.set_node_figures("node-1", NodeFigures::cpu(0.1)).expect("figures");
    eventually("node-1's soft taints gone once it cools", LONG, || async {
        node_soft_taints(&client, "node-1").await.is_empty().then_some(())
    })
    .await;
    let kd = Api::<KubeDescheduler>::namespaced(client.clone(), OPERATOR_NS)
        .get("cluster")
        .await
        .expect("KubeDescheduler");
    let available = kd
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Available"))
        .and_then(|c| c.message)
        .unwrap_or_default();
    assert!(available.contains("KubevirtMigrationAware"), "{available}");
}
