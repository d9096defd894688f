//! nodemedic on real nodes, installed as users install it: `helm install` of the shipped chart,
//! from the images `make image` builds (imported into each node's containerd: nothing can be
//! pulled here), the controller's replicas and the agent DaemonSet running as pods on real
//! kubelets (see [`nodemedic_harness::real_nodes`]), the stateful stand-in a process that
//! writes, checked by the data witness.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::{Api, ResourceExt, api::ListParams};
use nodemedic_harness::real_nodes::{self, NODES};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, data_witness::DataWitness};

use crate::{
    doctor,
    fenceagents::{adapt_template, bmc_power, far},
    network_policy,
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

/// Installed as a hardened cluster's user installs it: the API server enforces the baseline Pod
/// Security level in every namespace without a level of its own, nodemedic's namespace included
/// (created unlabelled, as `helm install --create-namespace` creates it), and the nodes enforce
/// NetworkPolicies: the chart's lets through what it allows and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_nodemedic_from_its_images_under_baseline_pod_security_and_every_hardened_agent_arms_its_watchdog()
 {
    let mut config = real_config();
    config.pod_security = Some("baseline");
    config.network_policies = true;
    let lab = lab(config).await;
    helm_install(&lab, &[]).await;
    network_policy::start_clients(&lab).await;
    hardened(&lab).await;
    metrics_only_for_authorized_scrapers(&lab).await;
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
    network_policy::check(&lab).await;
}

/// The controller labelled its namespace for the privileged agents, whose pods run with a
/// read-only root on a port outside the NodePort range; `nodemedic doctor` finds the namespace
/// admits them, and finds a namespace left at the cluster's baseline would refuse them, with
/// the fix.
async fn hardened(lab: &Lab) {
    let namespaces = Api::<Namespace>::all(lab.client());
    let labels = namespaces.get(NS).await.expect("nodemedic's namespace").metadata.labels;
    assert_eq!(
        labels
            .unwrap_or_default()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged")
    );
    let agents = Api::<Pod>::namespaced(lab.client(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/component=nodemedic-agent"))
        .await
        .expect("the agents' pods");
    assert_eq!(agents.items.len(), NODES.len());
    for pod in &agents.items {
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let security = container.security_context.as_ref().expect("a security context");
        assert_eq!(security.read_only_root_filesystem, Some(true), "{}", pod.name_any());
        for port in container.ports.iter().flatten() {
            assert!(
                !(30000..=32767).contains(&port.container_port),
                "{} listens on {} in the NodePort range",
                pod.name_any(),
                port.container_port
            );
        }
    }
    let report = doctor::report(&doctor::doctor(lab, &["-o", "json", "-n", NS]));
    let admitted = doctor::findings(&report, "pod-security", NS);
    assert_eq!(admitted.len(), 1, "{report:#}");
    assert_eq!(admitted[0]["severity"], "ok", "{report:#}");

    scenario::create_namespace(&lab.client(), "hardened")
        .await
        .expect("namespace");
    // The agents' ServiceAccount, so the dry run meets Pod Security and not a missing account.
    lab.apply_yaml("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: nodemedic-agent, namespace: hardened}\n")
        .expect("the ServiceAccount");
    let out = doctor::doctor(lab, &["-o", "json", "-n", "hardened"]);
    assert!(!out.status.success(), "a blocking finding fails the doctor");
    let report = doctor::report(&out);
    let refused = doctor::findings(&report, "pod-security", "hardened");
    assert_eq!(refused.len(), 1, "{report:#}");
    assert_eq!(refused[0]["severity"], "blocking", "{report:#}");
    assert!(
        refused[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("violates PodSecurity \"baseline")),
        "{report:#}"
    );
    assert!(
        refused[0]["fix"].as_str().is_some_and(
            |f| f.contains("kubectl label namespace hardened pod-security.kubernetes.io/enforce=privileged")
        ),
        "{report:#}"
    );
}

/// The controller's metrics, as the chart serves them: HTTPS under nodemedic's CA for the
/// metrics Service's name; no token is 401, an account without the grant 403, and an account
/// bound to nodemedic-metrics-reader is served.
async fn metrics_only_for_authorized_scrapers(lab: &Lab) {
    let controllers = Api::<Pod>::namespaced(lab.client(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("the controller's pods");
    let ip = controllers.items[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a pod IP");
    let ca = Api::<Secret>::namespaced(lab.client(), NS)
        .get("nodemedic-webhook-ca")
        .await
        .expect("nodemedic's CA")
        .data
        .and_then(|d| d.get("tls.crt").cloned())
        .expect("its certificate");
    let ca_file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(ca_file.path(), &ca.0).expect("written");
    lab.apply_yaml(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: scraper, namespace: {NS}}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: stranger, namespace: {NS}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: scraper-reads-nodemedic}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodemedic-metrics-reader}}\nsubjects: [{{kind: ServiceAccount, name: scraper, namespace: {NS}}}]\n"
    ))
    .expect("the scrapers' accounts");
    let token = |account: &str| {
        lab.kubectl(&["create", "token", account, "-n", NS])
            .expect("a token")
            .trim()
            .to_owned()
    };
    let (scraper, stranger) = (token("scraper"), token("stranger"));
    let host = format!("nodemedic-controller-metrics.{NS}.svc");
    let scrape = |token: Option<&str>| {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", "--cacert"])
            .arg(ca_file.path())
            .args([
                "--resolve",
                &format!("{host}:8443:{ip}"),
                &format!("https://{host}:8443/metrics"),
            ]);
        if let Some(token) = token {
            curl.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        let out = curl.output().expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().to_owned(), body.to_owned())
    };
    // The certificate is issued and the grant seen within moments of the install.
    let served = eventually("the metrics served to the authorized scraper", LONG, || async {
        let (code, body) = scrape(Some(&scraper));
        (code == "200").then_some(body)
    })
    .await;
    assert!(
        served.contains("# TYPE nodemedic_healthcheck_") && served.trim_end().ends_with("# EOF"),
        "{served}"
    );
    assert_eq!(scrape(None).0, "401", "no token");
    let (code, body) = scrape(Some(&stranger));
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains("nodemedic-metrics-reader"),
        "the refusal says what grants it: {body}"
    );
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

/// Seed scenario (d) on real nodes: an agent pod is deleted (SIGTERM, then the DaemonSet's grace
/// period); its DaemonSet starts another on the same healthy node, which arms the node's watchdog
/// again. Then the node is labelled exclude-from-remediation: its agent leaves, closing the
/// watchdog, and comes back once the label goes. Nothing is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_pod_comes_back_an_excluded_node_loses_its_agent_and_nothing_is_fenced() {
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
    // The seed's scenario kills a running agent (one killed as it starts is
    // selfremediation::an_agent_stopped_while_starting_ends_cleanly_with_nothing_armed).
    let old = eventually("the agent on node-2 ready", LONG, || async {
        let listed = pods.list(&Default::default()).await.ok()?;
        listed.items.into_iter().find(|p| agent_on(p) && ready(p))
    })
    .await;
    established(&lab, node).await;
    let old_name = old.metadata.name.clone().expect("name");
    let opened_before = lab.watchdog_device_stats(node).expect("stats").opens;
    // Deleted as `kubectl delete pod` does, with the DaemonSet's grace period: the agent's safe
    // stop (disarm recorded, no remediation of its node, then the magic close) needs a few API
    // calls. `--grace-period=0 --force` gives it the kubelet's two seconds, which under load are
    // not enough; then the watchdog stays armed by design and resets the node before the
    // replacement arms (ci-20261207T191128Z, ci-20261207T210804Z).
    lab.kubectl(&["delete", "pod", "-n", NS, &old_name, "--wait=false"])
        .expect("the agent pod deleted");
    eventually("another agent pod ready on node-2", LONG, || async {
        let listed = pods.list(&Default::default()).await.ok()?;
        listed
            .items
            .into_iter()
            .find(|p| agent_on(p) && p.metadata.name.as_deref() != Some(old_name.as_str()))
            .filter(ready)
    })
    .await;
    // Feeds alone do not say whose they are: the killed agent may feed a few more times before
    // its process ends (ci-20261207T033025Z labelled the node while the new agent was 0.3 s old
    // and unarmed, and the old agent's watchdog reset the node). The new agent opens the device.
    eventually("the new agent opened node-2's watchdog", LONG, || async {
        (lab.watchdog_device_stats(node).ok()?.opens > opened_before).then_some(())
    })
    .await;
    let fed_since_open = lab.watchdog_device_stats(node).expect("stats").keepalives;
    eventually("the new agent feeds node-2's watchdog", LONG, || async {
        let fed = lab.watchdog_device_stats(node).ok()?.keepalives;
        (fed > fed_since_open + 3).then_some(())
    })
    .await;

    // A node labelled exclude-from-remediation loses its agent (medik8s's DaemonSet rule), which
    // closes the watchdog as it goes; without the label the agent comes back.
    let closes_before = lab.watchdog_device_stats(node).expect("stats").magic_closes;
    let exclude = |value: &str| {
        lab.kubectl(&[
            "label",
            "node",
            node,
            &format!("remediation.medik8s.io/exclude-from-remediation{value}"),
            "--overwrite",
        ])
        .expect("labelling node-2")
    };
    exclude("=true");
    let on_node = |pod: &Pod| {
        pod.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("nodemedic-agent-"))
            && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
    };
    eventually("no agent pod left on the excluded node-2", LONG, || async {
        let listed = pods.list(&Default::default()).await.ok()?;
        (!listed.items.iter().any(&on_node)).then_some(())
    })
    .await;
    // The device hears of the close when the kernel's release reaches the lab's FUSE server,
    // which may be after the pod is gone from the API.
    eventually("the leaving agent closed node-2's watchdog", LONG, || async {
        let stats = lab.watchdog_device_stats(node).ok()?;
        (stats.magic_closes > closes_before).then_some(())
    })
    .await;
    exclude("-");
    eventually("an agent ready on node-2 again", LONG, || async {
        let listed = pods.list(&Default::default()).await.ok()?;
        listed.items.into_iter().find(|p| agent_on(p) && ready(p))
    })
    .await;
    let fenced = network_policy::fences(&lab);
    assert!(fenced.is_empty(), "a node was fenced: {fenced:?}");
    assert!(snr(&client, node).await.is_none(), "node-2 was remediated");
}

/// The agent on `node` is past its start: its registration is in the API, armed, and it has fed
/// the node's watchdog since. A ready pod is not enough: the agent has no readiness probe, so its
/// pod is ready as its process starts. Killed that early (0.6 s after its start, in the red run
/// ci-20261206T144734Z), an agent that has armed its watchdog but not finished its first licence
/// round cannot disarm within a forced deletion's 2 s, which is the seed's scenario no more.
async fn established(lab: &Lab, node: &str) {
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(lab.client(), NS);
    let registration = format!("nodemedic-agent-{node}");
    eventually(&format!("{node}'s agent registered and armed"), LONG, || async {
        let lease = leases.get_opt(&registration).await.ok()??;
        let disarmed = lease
            .annotations()
            .get("nodemedic.medik8s.io/disarmed")
            .map(String::as_str);
        (disarmed != Some("true")).then_some(())
    })
    .await;
    let fed = lab.watchdog_device_stats(node).expect("stats").keepalives;
    eventually(&format!("{node}'s agent feeding its watchdog"), LONG, || async {
        (lab.watchdog_device_stats(node).ok()?.keepalives > fed + 3).then_some(())
    })
    .await;
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
