//! The licence loop: every `apiCheckInterval`, and at once when a remediation changes, a
//! consistent API read; when it fails, a vote round.
//! What it accepts it records in its registration.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Instant,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use nodemedic_api::{
    names::annotations,
    self_remediation::{SelfNodeRemediation, phases},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde_json::json;

use super::{AgentArgs, peers};
use crate::{
    Result,
    identity::PeerIdentity,
    protocol::{
        Timing,
        agent::{AgentState, ApiRead, Intent, Verdict},
    },
    registration::{self, Published},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Default)]
pub struct Metrics {
    api_checks: Family<ResultLabels, Counter>,
    vote_rounds: Family<ResultLabels, Counter>,
    votes_cast: Family<ResultLabels, Counter>,
    feeding: Gauge,
    fenced: Gauge,
}

impl Metrics {
    pub fn set_feeding(&self, on: bool) {
        self.feeding.set(on as i64);
    }
    pub fn fenced(&self) {
        self.fenced.set(1);
    }
    pub fn vote_cast(&self, v: Verdict) {
        let result = match v {
            Verdict::Granted => "granted",
            Verdict::Remediating => "remediating",
            Verdict::NotReady => "not_ready",
        };
        self.votes_cast.get_or_create(&ResultLabels { result }).inc();
    }
}

pub async fn serve_metrics(bind: SocketAddr, m: &Metrics) -> Result<()> {
    let mut registry = Registry::default();
    m.register(&mut registry);
    let readiness = nodemedic_kube::metrics_server::Readiness::default();
    readiness.set(true);
    nodemedic_kube::metrics_server::serve(bind, Arc::new(registry), readiness).await?;
    Ok(())
}

impl Metrics {
    pub fn register(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "nodemedic_agent_api_checks",
            "Licence checks against the API server, by result",
            m.api_checks.clone(),
        );
        registry.register(
            "nodemedic_agent_vote_rounds",
            "Vote rounds asked of the peers, by result",
            m.vote_rounds.clone(),
        );
        registry.register(
            "nodemedic_agent_votes_cast",
            "Votes this agent gave its peers, by verdict",
            m.votes_cast.clone(),
        );
        registry.register(
            "nodemedic_agent_feeding",
            "1 while the agent holds a licence and feeds its watchdog",
            m.feeding.clone(),
        );
        registry.register(
            "nodemedic_agent_fenced",
            "1 once the agent fenced its node",
            m.fenced.clone(),
        );
    }
}

/// The remediations a read shows, as the protocol sees them: timed-out and deleting ones are no
/// longer intents; one whose workloads were released before this node booted is completed.
fn intents(list: &[SelfNodeRemediation], booted: Option<jiff::Timestamp>) -> Vec<Intent> {
    list.iter()
        .filter(|r| {
            r.metadata.deletion_timestamp.is_none() && !r.annotations().contains_key(annotations::NHC_TIMED_OUT)
        })
        .map(|r| Intent {
            node: r
                .annotations()
                .get(annotations::NODE_NAME)
                .cloned()
                .unwrap_or_else(|| r.name_any()),
            uid: r.metadata.uid.clone().unwrap_or_default(),
            completed: r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phases::FENCING_COMPLETED)
                && booted
                    .zip(r.metadata.creation_timestamp.as_ref())
                    .is_some_and(|(boot, created)| created.0 < boot),
        })
        .collect()
}

/// One consistent read of the remediations and the registrations.
pub(super) async fn read(
    fast: &Client,
    namespace: &str,
    booted: Option<jiff::Timestamp>,
) -> Result<(Vec<Intent>, BTreeMap<String, String>)> {
    let selector = ListParams::default().labels(&format!(
        "{}={}",
        registration::COMPONENT_LABEL,
        registration::COMPONENT
    ));
    let remediation_api = Api::<SelfNodeRemediation>::all(fast.clone());
    let lease_api = Api::<Lease>::namespaced(fast.clone(), namespace);
    let all = ListParams::default();
    let (remediations, leases) = tokio::try_join!(remediation_api.list(&all), lease_api.list(&selector))?;
    let members = leases
        .items
        .iter()
        .filter_map(|l| Published::from_lease(l).map(|p| (p.node, p.address)))
        .collect();
    Ok((intents(&remediations.items, booted), members))
}

pub(super) fn boot_time() -> Option<jiff::Timestamp> {
    // A lab node's processes share the host's kernel: the lab records each simulated boot.
    if let Some(path) = std::env::var_os("LAB_NODE_BOOT_FILE") {
        return std::fs::read_to_string(path).ok()?.trim().parse().ok();
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let seconds: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    jiff::Timestamp::from_second(seconds).ok()
}

/// Creates or updates the registration (never re-creates it: its age is what makes it count).
async fn register(client: &Client, namespace: &str, published: &Published) -> Result<()> {
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let name = registration::lease_name(&published.node);
    let now = nodemedic_kube::time::micro_now();
    match api.get_opt(&name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some(published.labels()),
                    annotations: Some(published.annotations()),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some(published.node.clone()),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
        Some(_) => {
            let patch = json!({ "metadata": { "labels": published.labels(), "annotations": published.annotations() }, "spec": { "renewTime": now } });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
    }
    Ok(())
}

/// medik8s's node annotations, for tools that read them.
async fn annotate_node(client: &Client, node: &str, timing: &Timing) {
    let patch = json!({ "metadata": { "annotations": {
        annotations::SNR_IS_REBOOT_CAPABLE: "true",
        annotations::SNR_WATCHDOG_TIMEOUT: timing.watchdog.as_secs().max(1).to_string(),
    } } });
    if let Err(error) = Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(%error, "cannot annotate the node");
    }
}

/// The shortest time between the start of one read and an early one.
const EARLY_READ_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// The agent's two clients: kube's default (registration writes) and the fail-fast one whose
/// answers renew the licence.
pub struct Clients {
    pub client: Client,
    pub fast: Client,
}

pub async fn run(
    args: &AgentArgs,
    Clients { client, fast }: Clients,
    identity: PeerIdentity,
    timing: Timing,
    state: Arc<Mutex<AgentState<Instant>>>,
    metrics: Metrics,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let remediation_changed = super::wake::watch_remediations(client.clone());
    let mut published = Published {
        node: args.node.clone(),
        address: format!("{}:{}", args.address, args.host_port),
        watchdog: timing.watchdog,
        licence: timing.licence,
        software_reboot: args.software_reboot,
        certificate_sha256: identity.fingerprint(),
        boot_time: boot_time(),
        accepts: BTreeSet::new(),
        // Registering says the watchdog is armed: it was opened before this runs.
        disarmed: false,
    };
    let mut registered = false;
    let mut addresses: BTreeMap<String, String> = BTreeMap::new();
    let mut api_was_up = true;
    annotate_node(&client, &args.node, &timing).await;
    loop {
        let sent = Instant::now();
        match read(&fast, &args.namespace, published.boot_time).await {
            Ok((intents, members)) => {
                metrics.api_checks.get_or_create(&ResultLabels { result: "ok" }).inc();
                if !api_was_up {
                    tracing::info!("the API server answers again");
                    api_was_up = true;
                }
                let member_names = members.keys().cloned().collect();
                addresses = members;
                let accepted = {
                    let mut s = state.lock().map_err(|_| crate::Error::Poisoned)?;
                    s.on_api_read(&ApiRead {
                        sent,
                        intents,
                        members: member_names,
                    });
                    s.accepted()
                        .iter()
                        .map(|(n, u)| (n.clone(), u.clone()))
                        .collect::<BTreeSet<_>>()
                };
                if accepted != published.accepts || !registered {
                    for (node, _) in accepted.difference(&published.accepts) {
                        tracing::info!(%node, "accepted the remediation of a peer: no more votes for it");
                    }
                    published.accepts = accepted;
                    match register(&client, &args.namespace, &published).await {
                        Ok(()) => registered = true,
                        Err(error) => tracing::warn!(%error, "cannot update the registration"),
                    }
                }
            }
            Err(error) => {
                metrics
                    .api_checks
                    .get_or_create(&ResultLabels { result: "failed" })
                    .inc();
                if api_was_up {
                    tracing::warn!(%error, "API check failed; asking the peers");
                    api_was_up = false;
                }
                let peers: Vec<(String, String)> = {
                    let s = state.lock().map_err(|_| crate::Error::Poisoned)?;
                    s.peers()
                        .into_iter()
                        .filter_map(|p| addresses.get(&p).map(|a| (p, a.clone())))
                        .collect()
                };
                let answers = peers::ask(&identity, &peers, args.peer_dial_timeout, args.peer_request_timeout).await;
                let granted = answers.iter().filter(|v| **v == Verdict::Granted).count();
                let mut s = state.lock().map_err(|_| crate::Error::Poisoned)?;
                let before = s.licence_until();
                s.on_votes(sent, &answers);
                let result = if s.fenced().is_some() {
                    "remediating"
                } else if s.licence_until() != before {
                    "licensed"
                } else {
                    "no_majority"
                };
                metrics.vote_rounds.get_or_create(&ResultLabels { result }).inc();
                tracing::debug!(granted, asked = peers.len(), result, "vote round");
            }
        }
        if let Some(why) = state.lock().map_err(|_| crate::Error::Poisoned)?.fenced() {
            tracing::warn!(reason = super::describe(why), "this node is fenced");
        }
        // Stopping only here, between rounds, leaves no registration write in flight that could
        // land after the shutdown's `disarmed` and undo it.
        tokio::select! {
            _ = tokio::time::sleep(args.api_check_interval) => {}
            _ = remediation_changed.notified() => {
                // At most one early read a second: a burst of new remediations wakes every agent.
                tokio::time::sleep_until((sent + EARLY_READ_GAP).into()).await;
            }
            _ = stop.changed() => return Ok(()),
        }
    }
}
