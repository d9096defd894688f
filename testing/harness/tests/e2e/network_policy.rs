//! The chart's NetworkPolicy on real nodes that enforce it (kube-network-policies, see
//! `LabConfig::network_policies`): real connections from real pods and from the nodes' network,
//! with the policy off, on (`helm upgrade`), and off again. Part of a real-node test that
//! installs the chart anyway: a lab of its own would cost a minute or two.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use nodemedic_api::maintenance::{NodeMaintenance, NodeMaintenanceSpec};
use nodemedic_harness::real_nodes;
use nodemedic_lab::Lab;

use crate::support::{NS, eventually};

const LONG: Duration = Duration::from_secs(120);
/// A namespace the chart's default `networkPolicy.metricsFrom` admits (by its label), and one it
/// does not.
const SCRAPERS: &str = "scrapers";
const STRANGERS: &str = "strangers";
/// The controller's ports: metrics (the chart's default, HTTPS) and the agents' peer reports.
const METRICS: u16 = 8443;
const PEER_REPORTS: u16 = 9444;
/// On a node: the agent's port (the chart's default) and the kubelet's.
const AGENT: u16 = 9447;
const KUBELET: u16 = 10250;

/// What became of a connection attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Connected,
    /// No answer within two seconds: a policy drops the connection's first packet.
    Dropped,
    /// Refused or unreachable: no policy's doing.
    Failed(i32),
}

/// A pod in each of [`SCRAPERS`] and [`STRANGERS`], from the controller's image (it has bash
/// and coreutils' timeout), started now so that they run by the time [`check`] needs them.
pub(crate) async fn start_clients(lab: &Lab) {
    let controller = Api::<Deployment>::namespaced(lab.client(), NS)
        .get("nodemedic-controller")
        .await
        .expect("the controller's Deployment");
    let image = controller
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .expect("the controller's image");
    let client = |namespace: &str, labels: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}, labels: {{{labels}}}}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: {namespace}}}\n\
             spec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - {{name: client, image: \"{image}\", \
             imagePullPolicy: Never, command: [sleep, infinity]}}\n"
        )
    };
    lab.apply_yaml(&format!(
        "{}---\n{}",
        client(SCRAPERS, "nodemedic.io/metrics-scraper: \"true\""),
        client(STRANGERS, "")
    ))
    .expect("the client pods");
}

/// Tries every `ip:port` of `targets` at once from `pod` (namespace and name), two seconds each.
fn connect_from(lab: &Lab, pod: (&str, &str), targets: &[(Ipv4Addr, u16)]) -> Option<Vec<Outcome>> {
    let attempts: String = targets
        .iter()
        .map(|(ip, port)| {
            format!("(timeout 2 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null; echo {ip}:{port} $?) & ")
        })
        .collect();
    let said = lab
        .kubectl(&["exec", "-n", pod.0, pod.1, "--", "bash", "-c", &format!("{attempts}wait")])
        .ok()?;
    targets
        .iter()
        .map(|(ip, port)| {
            let code: i32 = said
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{ip}:{port} ")))?
                .trim()
                .parse()
                .ok()?;
            Some(match code {
                0 => Outcome::Connected,
                124 => Outcome::Dropped,
                other => Outcome::Failed(other),
            })
        })
        .collect()
}

fn pod_ip(pod: &Pod) -> Ipv4Addr {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("a pod IP")
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("a node")
}

/// With the policy off (the chart's default), a pod of an unlabelled namespace reaches the
/// controller's metrics and peer-report ports and the controller reaches a kubelet; with it on,
/// those are dropped while a labelled namespace's pod still reaches the metrics, the nodes' network
/// the peer-report port, the API server the webhook and the controller the agents' port; off
/// again, the dropped connections get through again: the policy is what stops them.
pub(crate) async fn check(lab: &Lab) {
    let started = Instant::now();
    let controllers = Api::<Pod>::namespaced(lab.client(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("the controller's pods")
        .items;
    let controller_name = controllers[0].name_any();
    let controller = (NS, controller_name.as_str());
    let controller_node = node_of(&controllers[0]);
    let other_node = lab
        .nodes()
        .into_iter()
        .find(|n| *n != controller_node)
        .expect("another node");
    let other_node_ip = lab.node_ip(&other_node).expect("its address");
    // Every replica: the policy is in force on each one's node once all are dropped.
    let refused_ports: Vec<(Ipv4Addr, u16)> = controllers
        .iter()
        .flat_map(|c| [(pod_ip(c), METRICS), (pod_ip(c), PEER_REPORTS)])
        .collect();
    let stranger = (STRANGERS, "client");
    let all = |outcome: Outcome, n: usize| vec![outcome; n];

    eventually("with the policy off, the stranger and the controller connect", LONG, || async {
        let from_stranger = connect_from(lab, stranger, &refused_ports)?;
        let from_controller = connect_from(lab, controller, &[(other_node_ip, KUBELET)])?;
        (from_stranger == all(Outcome::Connected, refused_ports.len())
            && from_controller == [Outcome::Connected])
            .then_some(())
    })
    .await;

    let [a, b, c, _] = other_node_ip.octets();
    let nodes = format!("[\"{a}.{b}.{c}.0/24\"]");
    real_nodes::helm_upgrade(
        lab,
        &[
            "networkPolicy.enabled=true".into(),
            format!("networkPolicy.nodeCidrs={nodes}"),
        ],
    )
    .expect("helm upgrade: the policy on");
    eventually("with the policy on, the stranger's and the controller's connections dropped", LONG, || async {
        let from_stranger = connect_from(lab, stranger, &refused_ports)?;
        let from_controller = connect_from(lab, controller, &[(other_node_ip, KUBELET), (other_node_ip, AGENT)])?;
        (from_stranger == all(Outcome::Dropped, refused_ports.len())
            && from_controller == [Outcome::Dropped, Outcome::Connected])
            .then_some(())
    })
    .await;
    let target = pod_ip(&controllers[0]);
    assert_eq!(
        connect_from(lab, (SCRAPERS, "client"), &[(target, METRICS)]),
        Some(vec![Outcome::Connected]),
        "a labelled namespace's pod reaches the metrics"
    );
    assert!(
        lab.node_can_reach(&other_node, target, PEER_REPORTS)
            .expect("a connection from the node"),
        "{other_node}'s network reaches the peer-report port"
    );
    the_webhook_answers(lab).await;

    real_nodes::helm_upgrade(lab, &["networkPolicy.enabled=false".into()]).expect("helm upgrade: the policy off");
    eventually("with the policy off again, the stranger connects", LONG, || async {
        let from_stranger = connect_from(lab, stranger, &refused_ports)?;
        (from_stranger == all(Outcome::Connected, refused_ports.len())).then_some(())
    })
    .await;
    println!(
        "the NetworkPolicy's checks took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The API server calls the admission webhook: a NodeMaintenance for a node that does not exist
/// is refused (the webhook's failurePolicy is Ignore: one it cannot reach is admitted).
async fn the_webhook_answers(lab: &Lab) {
    let maintenances = Api::<NodeMaintenance>::all(lab.client());
    let probe = NodeMaintenance::new(
        "probe",
        NodeMaintenanceSpec {
            node_name: "no-such-node".into(),
            reason: Some("the NetworkPolicy test".into()),
            drain_timeout: None,
        },
    );
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("the webhook refuses a maintenance of no node", LONG, || async {
        maintenances
            .create(&dry_run, &probe)
            .await
            .err()
            .filter(|e| e.to_string().contains("does not exist"))
    })
    .await;
}
