//! The licence loop: every `apiCheckInterval`, and at once when a remediation changes, a
//! consistent read of the remediations; every `peerUpdateInterval`, and at once when the
//! membership changes, a read of the peers and the membership; when the remediations cannot be
//! read, a vote round. What it accepts and the epoch it adopts it records in its registration.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::ListParams};
use nodemedic_api::self_remediation::{SelfNodeRemediation, phases};
use nodemedic_kube::CallContext;

use super::{AgentArgs, metrics::Metrics, peers, publisher::Publisher};
use crate::{
    Result,
    identity::PeerIdentity,
    protocol::{
        agent::{AgentState, ApiRead, Intent, Round},
        membership::Configuration,
    },
    registration::{self, Published},
    remediation_object,
};

/// The remediations a read shows, as the protocol sees them: timed-out and deleting ones are no
/// longer intents; one whose workloads were released before this node booted is completed.
fn intents(list: &[SelfNodeRemediation], booted: Option<jiff::Timestamp>) -> Vec<Intent> {
    list.iter()
        .filter(|r| remediation_object::is_intent(r))
        .filter_map(|r| Some((r, remediation_object::node_of(r)?)))
        .map(|(r, node)| Intent {
            node,
            uid: r.metadata.uid.clone().unwrap_or_default(),
            completed: r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phases::FENCING_COMPLETED)
                && booted
                    .zip(r.metadata.creation_timestamp.as_ref())
                    .is_some_and(|(boot, created)| created.0 < boot),
        })
        .collect()
}

/// One consistent read of the remediations (the licence read).
pub(super) async fn read_intents(fast: &Client, booted: Option<jiff::Timestamp>) -> Result<Vec<Intent>> {
    let list = Api::<SelfNodeRemediation>::all(fast.clone())
        .list(&ListParams::default())
        .await
        .context("listing SelfNodeRemediations")?;
    Ok(intents(&list.items, booted))
}

/// What one read of the peers returns.
struct Peers {
    /// Node -> `ip:port`.
    addresses: BTreeMap<String, String>,
    latest: Option<Configuration>,
}

/// One list of the registrations and the membership.
async fn read_peers(client: &Client, namespace: &str) -> Result<Peers> {
    let leases = registration::list(client, namespace).await?;
    Ok(Peers {
        addresses: leases
            .iter()
            .filter_map(|l| Published::from_lease(l).map(|p| (p.node, p.address)))
            .collect(),
        latest: leases
            .iter()
            .find_map(registration::membership)
            .map(|m| m.latest().clone()),
    })
}

/// The agent's clients: kube's default (registration writes) and the fail-fast ones whose
/// answers renew the licence (`apiServerTimeout`) and refresh the peers (`peerApiServerTimeout`).
pub struct Clients {
    pub client: Client,
    pub fast: Client,
    pub peers: Client,
}

/// The shortest time between the start of one read and an early one.
const EARLY_READ_GAP: Duration = Duration::from_secs(1);
/// Vote rounds in a row when answers keep moving the agent to newer configurations.
const ROUNDS_PER_CHECK: usize = 3;

pub struct Loop<'a> {
    pub args: &'a AgentArgs,
    pub clients: Clients,
    pub identity: PeerIdentity,
    pub state: Arc<Mutex<AgentState<Instant>>>,
    pub metrics: Metrics,
    pub published: Published,
    /// The boot this process runs in, under which its licence is recorded for a successor.
    pub boot: Option<String>,
    pub publisher: &'a Publisher,
    /// Every registered agent's address, for the peer failure detector.
    pub addresses: tokio::sync::watch::Sender<BTreeMap<String, String>>,
}

impl Loop<'_> {
    /// Records the licence for a later process of this boot (see [`super::inherited`]).
    fn record_licence(&self, last: &mut Option<Option<Instant>>) -> Result<()> {
        let Some(boot) = &self.boot else { return Ok(()) };
        let until = {
            let s = self.lock()?;
            s.licence_until().filter(|_| s.fenced().is_none())
        };
        if *last != Some(until) {
            match super::inherited::save(&self.args.state_dir, boot, until) {
                Ok(()) => *last = Some(until),
                Err(error) => tracing::warn!(%error, "cannot record the licence for a restarted agent"),
            }
        }
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, AgentState<Instant>>> {
        self.state.lock().map_err(|_| crate::Error::Poisoned)
    }

    /// Votes while the API cannot be read; moves to a newer configuration a voter names.
    async fn vote_round(&self, addresses: &BTreeMap<String, String>) -> Result<()> {
        for _ in 0..ROUNDS_PER_CHECK {
            let sent = Instant::now();
            let (peers, epoch) = {
                let s = self.lock()?;
                let peers: Vec<(String, String)> = s
                    .peers()
                    .into_iter()
                    .filter_map(|p| addresses.get(&p).map(|a| (p, a.clone())))
                    .collect();
                (peers, s.epoch())
            };
            let answers = peers::ask(
                &self.identity,
                &peers,
                epoch,
                self.args.peer_dial_timeout,
                self.args.peer_request_timeout,
            )
            .await;
            let round = self.lock()?.on_votes(sent, epoch, &answers);
            let result = match round {
                Round::Licensed => "licensed",
                Round::NoMajority => "no_majority",
                Round::Fenced => "remediating",
                Round::Adopted => "stale",
                Round::CannotCount => "cannot_count",
            };
            Metrics::count(&self.metrics.vote_rounds, result);
            tracing::debug!(asked = peers.len(), epoch, result, "vote round");
            if round != Round::Adopted {
                return Ok(());
            }
            let adopted = self.lock()?.epoch();
            self.metrics.epoch.set(i64::try_from(adopted).unwrap_or(i64::MAX));
            tracing::info!(epoch = adopted, "a peer knew a newer membership: asking again in it");
        }
        Ok(())
    }

    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<()> {
        let remediation_changed = super::wake::watch_remediations(self.clients.client.clone());
        let membership_changed = super::wake::watch_membership(self.clients.client.clone(), &self.args.namespace);
        let booted = self.published.boot_time;
        let mut kept = false;
        // Whether this process's registration says `disarmed: false`: only then may it take a
        // configuration in, from a read made after (the manager counts a disarmed registration
        // as having acknowledged every epoch, which only an agent that votes for no one does).
        let mut announced = false;
        let mut addresses: BTreeMap<String, String> = BTreeMap::new();
        let mut peers_due = true;
        let mut last_peer_read: Option<Instant> = None;
        let mut api_was_up = true;
        let mut recorded: Option<Option<Instant>> = None;
        loop {
            let sent = Instant::now();
            let peers_wanted = announced
                && (peers_due || last_peer_read.is_none_or(|t| t.elapsed() >= self.args.peer_update_interval));
            let peer_read = async {
                if peers_wanted {
                    Some(read_peers(&self.clients.peers, &self.args.namespace).await)
                } else {
                    None
                }
            };
            // The licence read comes first and waits for nothing else, the registration included.
            let (intents, peers) = tokio::join!(read_intents(&self.clients.fast, booted), peer_read);
            match peers {
                Some(Ok(read)) => {
                    // Its registration went with its Node object (deleted and registered again by
                    // the kubelet): register again, owned by the Node as it is now.
                    if !read.addresses.contains_key(&self.args.node) {
                        tracing::warn!("this agent's registration is gone; registering again");
                        self.published.node_uid = self.node_uid().await;
                        self.publisher.rewrite(&self.published);
                    }
                    addresses = read.addresses;
                    self.addresses.send_if_modified(|known| {
                        let changed = *known != addresses;
                        if changed {
                            known.clone_from(&addresses);
                        }
                        changed
                    });
                    if let Some(latest) = read.latest {
                        self.lock()?.on_configuration(&latest);
                        peers_due = false;
                    }
                    last_peer_read = Some(sent);
                }
                Some(Err(error)) => tracing::debug!(%error, "cannot read the peers; keeping the last list"),
                None => {}
            }
            match intents {
                Ok(intents) => {
                    Metrics::count(&self.metrics.api_checks, "ok");
                    if !api_was_up {
                        tracing::info!("the API server answers again");
                        api_was_up = true;
                    }
                    let (accepted, epoch) = {
                        let mut s = self.lock()?;
                        s.on_api_read(&ApiRead {
                            sent,
                            intents,
                            configuration: None,
                        });
                        let accepted: BTreeSet<(String, String)> =
                            s.accepted().iter().map(|(n, u)| (n.clone(), u.clone())).collect();
                        (accepted, s.epoch())
                    };
                    self.metrics.epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
                    // The acknowledged epoch is only ever raised: what it says stays true.
                    if kept && (accepted != self.published.accepts || epoch > self.published.epoch) {
                        for (node, _) in accepted.difference(&self.published.accepts) {
                            tracing::info!(%node, "accepted the remediation of a peer: no more votes for it");
                        }
                        if epoch > self.published.epoch {
                            tracing::info!(epoch, "adopted a membership epoch");
                        }
                        self.published.accepts = accepted;
                        self.published.epoch = self.published.epoch.max(epoch);
                        self.publisher.want(&self.published);
                    }
                }
                Err(error) => {
                    Metrics::count(&self.metrics.api_checks, "failed");
                    if api_was_up {
                        tracing::warn!(%error, "API check failed; asking the peers");
                        api_was_up = false;
                        self.probe_endpoint().await;
                    }
                    self.vote_round(&addresses).await?;
                }
            }
            if let Some(why) = self.lock()?.fenced() {
                tracing::warn!(reason = super::describe(why), "this node is fenced");
            }
            self.record_licence(&mut recorded)?;
            if !kept {
                kept = self.keep_recorded().await;
            }
            if kept && !announced {
                self.publisher.want(&self.published);
                announced = self
                    .publisher
                    .landed(&self.published, self.args.api_server_timeout)
                    .await;
                if announced {
                    // Read the peers and the membership now, after the registration landed.
                    peers_due = true;
                    continue;
                }
            }
            // Stopping only here, between rounds; the publisher's writes are stopped after this.
            tokio::select! {
                _ = tokio::time::sleep(self.args.api_check_interval) => {}
                _ = remediation_changed.notified() => {
                    // At most one early read a second: a burst of new remediations wakes every agent.
                    tokio::time::sleep_until((sent + EARLY_READ_GAP).into()).await;
                }
                _ = membership_changed.notified() => {
                    peers_due = true;
                    tokio::time::sleep_until((sent + EARLY_READ_GAP).into()).await;
                }
                _ = stop.changed() => return Ok(()),
            }
        }
    }

    /// The uid of this agent's Node, its registration's owner.
    async fn node_uid(&self) -> Option<String> {
        let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(self.clients.client.clone());
        match nodes.get_opt(&self.args.node).await {
            Ok(node) => node.and_then(|n| n.metadata.uid),
            Err(error) => {
                tracing::warn!(%error, "cannot read this agent's Node; registering without an owner");
                None
            }
        }
    }

    /// A restarted agent keeps what its registration recorded (acceptances, acknowledged epoch):
    /// it refuses every vote until it has read the API, and that read shows it the same or
    /// newer, so the record stays true; clearing it would only make the manager count less.
    /// Returns whether the registration could be read (absent counts): until then nothing is
    /// written, lest an acknowledgement go down.
    async fn keep_recorded(&mut self) -> bool {
        let name = registration::lease_name(&self.args.node);
        let leases = Api::<Lease>::namespaced(self.clients.client.clone(), &self.args.namespace);
        match leases.get_opt(&name).await {
            Ok(existing) => {
                if let Some(recorded) = existing.as_ref().and_then(Published::from_lease) {
                    self.published.accepts = recorded.accepts;
                    self.published.epoch = recorded.epoch;
                }
                true
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read this agent's registration yet");
                false
            }
        }
    }

    /// medik8s pings `endpointHealthCheckUrl` from control-plane nodes as a diagnostic when the
    /// API check fails. nodemedic probes it once per outage, for the log and a metric only: an
    /// endpoint that answers proves nothing about remediations.
    async fn probe_endpoint(&self) {
        let Some(url) = &self.args.endpoint_health_check_url else {
            return;
        };
        let reachable = super::endpoint::probe(url, self.args.api_server_timeout).await;
        Metrics::count(
            &self.metrics.endpoint_checks,
            if reachable { "reachable" } else { "unreachable" },
        );
        tracing::info!(%url, reachable, "endpointHealthCheckUrl probed (diagnostic only)");
    }
}
