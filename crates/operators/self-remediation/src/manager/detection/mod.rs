//! The controller's side of peer failure detection (docs/peer-detection.md): it keeps the
//! agents' reports, reads the kubelet leases, probes the hosts its peers lost, and writes the
//! `PeersReachable` node condition from the verdict. The decisions are the
//! `nodemedic-peer-detection` crate's; this module only gathers their inputs and writes their
//! outcome.

mod condition;
mod server;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, runtime::watcher};
use nodemedic_kube::{events::Events, paged::Projection, pki::Authority};
use nodemedic_peer_detection::{HostProbes, MemberFacts, Policy, Reports, Verdict, verdicts};
use tokio::sync::mpsc;

use crate::{Result, manager::Metrics, registration};

/// Where the report server listens, and the address the agents are told.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub bind: SocketAddr,
    pub advertise: IpAddr,
}

/// How often the verdicts are computed.
const PASS_EVERY: Duration = Duration::from_millis(200);
/// How long the controller waits for a suspected host to answer.
const HOST_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const HOST_PROBE_SPACING: Duration = Duration::from_millis(300);
const KUBELET_LEASES: &str = "kube-node-lease";

/// Runs until the process ends.
pub async fn run(
    client: Client,
    namespace: String,
    authority: Arc<Authority>,
    settings: Settings,
    metrics: Metrics,
    events: Events,
) -> Result<()> {
    let (batches_in, mut batches) = mpsc::channel(1024);
    let server_client = client.clone();
    let server_namespace = namespace.clone();
    tokio::spawn(async move {
        let served = server::serve(
            &server_client,
            &server_namespace,
            &authority,
            settings.bind,
            settings.advertise,
            batches_in,
        )
        .await;
        if let Err(error) = served {
            tracing::error!(%error, "the peer-report server stopped: no PeersReachable conditions");
        }
    });
    // Only what the verdicts read of each lease: a store of the Leases would hold every field of
    // one Lease per node (docs/memory.md).
    let agent_addresses = Projection::spawn(
        Api::<Lease>::namespaced(client.clone(), &namespace),
        watcher::Config::default().labels(&registration::registrations_selector()),
        |lease| registration::Published::from_lease(lease).map(|p| (p.node, p.address)),
    );
    let kubelet_renewals = Projection::spawn(
        Api::<Lease>::namespaced(client.clone(), KUBELET_LEASES),
        watcher::Config::default(),
        |lease: &Lease| Some(lease.spec.as_ref()?.renew_time.as_ref()?.0),
    );
    let mut writer = condition::Writer::start(client, events, metrics.clone()).await;
    let policy = Policy::default();
    let mut reports = Reports::default();
    let mut hosts: BTreeMap<String, HostProbes> = BTreeMap::new();
    let mut probing: BTreeSet<String> = BTreeSet::new();
    let (probe_results_in, mut probe_results) = mpsc::unbounded_channel::<(String, bool, Timestamp)>();
    let mut pass = tokio::time::interval(PASS_EVERY);
    pass.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(batch) = batches.recv() => {
                for report in &batch.reports {
                    let kind = if report.since.is_some() { "unreachable" } else { "withdrawn" };
                    Metrics::count(&metrics.peer_reports, kind);
                }
                reports.receive(&batch.observer, &batch.reports, batch.at);
            }
            Some((node, answered, sent)) = probe_results.recv() => {
                probing.remove(&node);
                let host = hosts.entry(node.clone()).or_default();
                if answered {
                    host.last_answered = Some(Timestamp::now());
                } else {
                    host.last_unanswered_sent = Some(host.last_unanswered_sent.map_or(sent, |s| s.max(sent)));
                }
                Metrics::count(&metrics.host_probes, if answered { "answered" } else { "silent" });
                tracing::info!(%node, answered, "probed the host its peers lost");
            }
            _ = pass.tick() => {
                let now = Timestamp::now();
                reports.expire(now, policy.report_ttl);
                // At rest nothing is reported and every condition is written: no need to read
                // thousands of leases five times a second to decide nothing.
                if reports.is_empty() && probing.is_empty() && writer.settled(agent_addresses.len()) {
                    continue;
                }
                let addresses: BTreeMap<String, String> = agent_addresses.snapshot().into_values().collect();
                hosts.retain(|node, _| addresses.contains_key(node));
                let members: BTreeMap<String, MemberFacts> = kubelet_renewals.read(|renewals| {
                    addresses
                        .keys()
                        .map(|node| {
                            let facts = MemberFacts {
                                lease_renewed: renewals.get(node).copied(),
                                host: hosts.get(node).copied().unwrap_or_default(),
                            };
                            (node.clone(), facts)
                        })
                        .collect()
                });
                let decided = verdicts(&reports, &members, now, &policy);
                for (node, verdict) in &decided {
                    if let Verdict::ProbeHost { .. } = verdict
                        && let Some(address) = addresses.get(node)
                        && probing.insert(node.clone())
                    {
                        spawn_host_probe(node.clone(), address.clone(), probe_results_in.clone());
                    }
                }
                writer.write(&decided, &members).await;
            }
        }
    }
}

/// Whether the host at `address` (the agent's `ip:port`) answers a connection attempt: an
/// accepted or a refused connection both come from a live kernel. Three attempts, 300 ms apart,
/// within [`HOST_PROBE_TIMEOUT`]: one lost packet does not make a live host silent.
fn spawn_host_probe(node: String, address: String, results: mpsc::UnboundedSender<(String, bool, Timestamp)>) {
    tokio::spawn(async move {
        let sent = Timestamp::now();
        let attempts = (0..3u32).map(|i| {
            let address = address.clone();
            Box::pin(async move {
                tokio::time::sleep(HOST_PROBE_SPACING * i).await;
                match tokio::net::TcpStream::connect(&address).await {
                    Ok(_) => Ok(()),
                    Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
                    Err(error) => Err(error),
                }
            })
        });
        let answered = matches!(
            tokio::time::timeout(HOST_PROBE_TIMEOUT, futures::future::select_ok(attempts)).await,
            Ok(Ok(_))
        );
        let _ = results.send((node, answered, sent));
    });
}
