//! The chart's NetworkPolicy on real nodes that enforce it (kube-network-policies, see
//! `LabConfig::network_policies`): real connections from real pods and from the nodes' network,
//! with the policy off, on (`helm upgrade`), and off again. Part of a real-node test that
//! installs the chart anyway: a lab of its own would cost a minute or two.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use nodemedic_api::maintenance::{NodeMaintenance, NodeMaintenanceSpec};
use nodemedic_harness::real_nodes;
use nodemedic_lab::{Error, Lab, Result, wait};

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

/// Connections tried from a pod (namespace, name), each to be `expected`.
struct Probe<'a> {
    from: (&'a str, &'a str),
    targets: Vec<(Ipv4Addr, u16, Outcome)>,
}

impl<'a> Probe<'a> {
    fn from(pod: (&'a str, &'a str), targets: &[(Ipv4Addr, u16, Outcome)]) -> Self {
        Self {
            from: pod,
            targets: targets.to_vec(),
        }
    }

    /// Tries every target at once, two seconds each; what became of each.
    fn run(&self, lab: &Lab) -> Result<Vec<Outcome>> {
        let attempts: String = self
            .targets
            .iter()
            .map(|(ip, port, _)| {
                format!("(timeout 2 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null; echo {ip}:{port} $?) & ")
            })
            .collect();
        let (namespace, pod) = self.from;
        let said = lab.kubectl(&[
            "exec",
            "-n",
            namespace,
            pod,
            "--",
            "bash",
            "-c",
            &format!("{attempts}wait"),
        ])?;
        self.targets
            .iter()
            .map(|(ip, port, _)| {
                let code = said
                    .lines()
                    .find_map(|line| line.strip_prefix(&format!("{ip}:{port} ")))
                    .and_then(|code| code.trim().parse::<i32>().ok())
                    .ok_or_else(|| Error::Invalid(format!("{namespace}/{pod} said {said:?}")))?;
                Ok(match code {
                    0 => Outcome::Connected,
                    124 => Outcome::Dropped,
                    other => Outcome::Failed(other),
                })
            })
            .collect()
    }
}

/// Waits until every probe's connections (run side by side) end as expected.
async fn until(lab: &Lab, what: &str, probes: &[Probe<'_>]) {
    wait::until(what, LONG, || async {
        // The probes aim at addresses read once: a reset node's pods come back elsewhere, and the
        // wait would blame the policy for its own stale aim.
        let fenced = fences(lab);
        assert!(
            fenced.is_empty(),
            "a node was fenced during the policy check: {fenced:?}\n{}",
            agents_last_words(lab, &fenced)
        );
        let seen: Vec<Result<Vec<Outcome>>> = std::thread::scope(|scope| {
            let running: Vec<_> = probes.iter().map(|p| scope.spawn(|| p.run(lab))).collect();
            running
                .into_iter()
                .map(|r| {
                    r.join()
                        .unwrap_or_else(|_| Err(Error::Invalid("a probe panicked".into())))
                })
                .collect()
        });
        let mut unexpected = Vec::new();
        for (probe, outcomes) in probes.iter().zip(seen) {
            for ((ip, port, expected), outcome) in probe.targets.iter().zip(outcomes?) {
                if outcome != *expected {
                    unexpected.push(format!("{}/{} to {ip}:{port}: {outcome:?}", probe.from.0, probe.from.1));
                }
            }
        }
        if unexpected.is_empty() {
            Ok(Some(()))
        } else {
            Err(Error::Invalid(unexpected.join("; ")))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Every power-off and watchdog expiry of the lab so far.
pub(crate) fn fences(lab: &Lab) -> Vec<String> {
    lab.timeline()
        .entries()
        .into_iter()
        .filter(|e| {
            matches!(
                &e.event,
                nodemedic_lab::Event::Power { on: false, .. } | nodemedic_lab::Event::WatchdogExpired { .. }
            )
        })
        .map(|e| format!("{} {:?}", e.at, e.event))
        .collect()
}

/// The last lines the agents of the nodes named in `fenced` logged: why each stopped feeding its
/// watchdog (its licence, or a feed that came late).
pub(crate) fn agents_last_words(lab: &Lab, fenced: &[String]) -> String {
    let mut said = String::new();
    for node in lab
        .nodes()
        .into_iter()
        .filter(|n| fenced.iter().any(|f| f.contains(&format!("{n:?}"))))
    {
        let Ok(pods) = lab.node_host_path(&node, "/var/log/pods") else {
            continue;
        };
        let agents = std::fs::read_dir(pods).into_iter().flatten().flatten();
        for pod in agents.filter(|p| p.file_name().to_string_lossy().contains("_nodemedic-agent-")) {
            let logs = std::fs::read_dir(pod.path().join("agent"))
                .into_iter()
                .flatten()
                .flatten();
            for log in logs {
                let text = std::fs::read_to_string(log.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                said.push_str(&format!("== {node}: {}\n{tail}\n", log.path().display()));
            }
        }
    }
    said
}

/// The leading controller's address, where the agents send their peer reports.
async fn peer_reports_address(lab: &Lab) -> Ipv4Addr {
    let configmaps = Api::<ConfigMap>::namespaced(lab.client(), NS);
    eventually("the leader publishing its peer-report address", LONG, || async {
        let published = configmaps.get_opt("nodemedic-peer-ca").await.ok()??;
        let address = published.data?.get("peer-reports")?.clone();
        address.parse::<std::net::SocketAddr>().ok().and_then(|a| match a.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        })
    })
    .await
}

fn pod_ip(pod: &Pod) -> Ipv4Addr {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("a pod IP")
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).expect("a node")
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
    // The leader serves the peer reports, at the address it publishes.
    let leader_ip = peer_reports_address(lab).await;
    let leader = controllers
        .iter()
        .find(|c| pod_ip(c) == leader_ip)
        .expect("the leader among the controller's pods");
    let leader_name = leader.name_any();
    let controller = (NS, leader_name.as_str());
    let leader_node = node_of(leader);
    let other_node = lab
        .nodes()
        .into_iter()
        .find(|n| *n != leader_node)
        .expect("another node");
    let other_node_ip = lab.node_ip(&other_node).expect("its address");
    let stranger = (STRANGERS, "client");
    // Every replica's metrics: the policy is in force on each one's node once all are dropped.
    let stranger_to = |outcome| -> Vec<(Ipv4Addr, u16, Outcome)> {
        controllers
            .iter()
            .map(|c| (pod_ip(c), METRICS, outcome))
            .chain([(leader_ip, PEER_REPORTS, outcome)])
            .collect()
    };
    use Outcome::{Connected, Dropped};

    until(
        lab,
        "with the policy off, the stranger and the controller connect",
        &[
            Probe::from(stranger, &stranger_to(Connected)),
            Probe::from(controller, &[(other_node_ip, KUBELET, Connected)]),
        ],
    )
    .await;

    let [a, b, c, _] = other_node_ip.octets();
    real_nodes::helm_upgrade(
        lab,
        &[
            "networkPolicy.enabled=true".into(),
            format!("networkPolicy.nodeCidrs=[\"{a}.{b}.{c}.0/24\"]"),
        ],
    )
    .expect("helm upgrade: the policy on");
    let target = leader_ip;
    until(
        lab,
        "with the policy on, only what it allows connects",
        &[
            Probe::from(stranger, &stranger_to(Dropped)),
            Probe::from(
                controller,
                &[(other_node_ip, KUBELET, Dropped), (other_node_ip, AGENT, Connected)],
            ),
            Probe::from((SCRAPERS, "client"), &[(target, METRICS, Connected)]),
        ],
    )
    .await;
    assert!(
        lab.node_can_reach(&other_node, target, PEER_REPORTS)
            .expect("a connection from the node"),
        "{other_node}'s network reaches the peer-report port"
    );
    the_webhook_answers(lab).await;

    real_nodes::helm_upgrade(lab, &["networkPolicy.enabled=false".into()]).expect("helm upgrade: the policy off");
    until(
        lab,
        "with the policy off again, the stranger connects",
        &[Probe::from(stranger, &stranger_to(Connected))],
    )
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
