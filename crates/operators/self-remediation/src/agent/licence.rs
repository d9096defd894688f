//! The licence loop's I/O: every `apiCheckInterval`, and at once when a remediation changes, a
//! consistent read of the remediations; a read of the peers and the membership when the
//! protocol's [`Rounds`] says; when the remediations cannot be read, a vote round. What it
//! accepts and the epoch it adopts it records in its registration. Every decision about what to
//! read, write or record next is [`Rounds`]'s, model-checked with the protocol.

use std::{
    collections::BTreeMap,
    sync::Arc,
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
        agent::{ApiRead, Intent, Round},
        membership::Configuration,
        rounds::{Answer, Record, Rounds},
    },
    registration::{self, Published},
    remediation_object,
};

/// The remediations a read shows, as the protocol sees them: timed-out and deleting ones are no
/// longer intents; one whose workloads were released carries its creation time, for the boots
/// it is over for.
fn intents(list: &[SelfNodeRemediation]) -> Vec<Intent> {
    list.iter()
        .filter(|r| remediation_object::is_intent(r))
        .filter_map(|r| Some((r, remediation_object::node_of(r)?)))
        .map(|(r, node)| Intent {
            node,
            uid: r.metadata.uid.clone().unwrap_or_default(),
            released: r
                .metadata
                .creation_timestamp
                .as_ref()
                .filter(|_| r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phases::FENCING_COMPLETED))
                .map(|created| created.0),
        })
        .collect()
}

/// One consistent read of the remediations (the licence read).
pub(super) async fn read_intents(fast: &Client) -> Result<Vec<Intent>> {
    let list = Api::<SelfNodeRemediation>::all(fast.clone())
        .list(&ListParams::default())
        .await
        .context("listing SelfNodeRemediations")?;
    Ok(intents(&list.items))
}

/// The peers' read as [`read_side_by_side`] leaves it.
enum PeersRead<P> {
    /// Done (or not planned, or given up on: `None`).
    Done(Option<Result<P>>),
    /// Still under way after a licence read that answered: finished after the licence is renewed.
    Pending,
}

/// The licence read and, when planned, the peers' read (`peers`), side by side. The licence
/// read waits for nothing else, the registration included: a peers' read still under way when
/// it answered is left [`PeersRead::Pending`], for after the licence is renewed. When it failed,
/// the peers are waited for only until `give_up` (the round's send time plus apiServerTimeout):
/// the agent votes next, and a peers' read still hanging on the API server the licence read
/// just failed on would only hold the vote back, for up to peerApiServerTimeout, longer than
/// the licence allows for. A read given up on counts as failed (`None`): the peers are read
/// again next round.
async fn read_side_by_side<T, P, F>(
    give_up: Instant,
    intents: impl std::future::Future<Output = Result<T>>,
    mut peers: std::pin::Pin<&mut F>,
) -> (Result<T>, PeersRead<P>)
where
    F: std::future::Future<Output = Option<Result<P>>>,
{
    tokio::pin!(intents);
    let mut read_peers = None;
    let intents = loop {
        tokio::select! {
            done = peers.as_mut(), if read_peers.is_none() => read_peers = Some(done),
            done = &mut intents => break done,
        }
    };
    let peers = match read_peers {
        Some(done) => PeersRead::Done(done),
        None if intents.is_ok() => PeersRead::Pending,
        None => PeersRead::Done(
            tokio::time::timeout_at(give_up.into(), peers)
                .await
                .unwrap_or_else(|_| {
                    tracing::debug!("the peers' read outlasted the failed licence read; voting without it");
                    None
                }),
        ),
    };
    (intents, peers)
}

/// The peers' read left pending after a renewed licence, given up on (`None`, so read again
/// next round) when the next round is due: rounds start every apiCheckInterval, which the
/// licence's length counts on, and a read hanging on a slow API server for its whole
/// peerApiServerTimeout (5 s by default, more than the interval) would hold the next one back.
async fn finish_by<P>(
    next_round: Instant,
    peers: impl std::future::Future<Output = Option<Result<P>>>,
) -> Option<Result<P>> {
    tokio::time::timeout_at(next_round.into(), peers)
        .await
        .unwrap_or_else(|_| {
            tracing::debug!("the peers' read outlasted the round; reading them again next round");
            None
        })
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
pub(super) struct Clients {
    pub client: Client,
    pub fast: Client,
    pub peers: Client,
}

/// The shortest time between the start of one read and an early one.
const EARLY_READ_GAP: Duration = Duration::from_secs(1);

/// Between rounds while the agent has not had its first licence: its watchdog has been armed
/// since it started, and the chart's default watchdog (2 s) runs out well within an
/// apiCheckInterval (4 s), so one failed first read would reset a healthy node. More reads only
/// grant the licence sooner; each is as valid as a scheduled one.
const FIRST_LICENCE_RETRY: Duration = Duration::from_millis(250);

pub(super) struct Loop<'a> {
    pub args: &'a AgentArgs,
    pub clients: Clients,
    pub identity: PeerIdentity,
    pub state: Arc<super::shared::SharedState>,
    pub metrics: Metrics,
    pub published: Published,
    /// The boot this process runs in, under which its licence is recorded for a successor.
    pub boot: Option<String>,
    pub publisher: &'a Publisher,
    /// Every registered agent's address, for the peer failure detector.
    pub addresses: tokio::sync::watch::Sender<BTreeMap<String, String>>,
    /// Told after every answer, so a licence just granted is fed at once.
    pub feeder: super::feeder::Kick,
}

impl Loop<'_> {
    /// The rounds, as [`Rounds`] sequences them, until `stop` says to stop.
    pub(super) async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<()> {
        let remediation_changed = super::wake::watch_remediations(self.clients.client.clone());
        let membership_changed = super::wake::watch_membership(self.clients.client.clone(), &self.args.namespace);
        let mut rounds = Rounds::<Instant>::default();
        let mut addresses: BTreeMap<String, String> = BTreeMap::new();
        loop {
            let sent = Instant::now();
            let plan = rounds.plan(sent, self.args.peer_update_interval);
            let (peers_client, namespace) = (self.clients.peers.clone(), self.args.namespace.clone());
            let peer_read = async move {
                if plan.read_peers {
                    Some(read_peers(&peers_client, &namespace).await)
                } else {
                    None
                }
            };
            tokio::pin!(peer_read);
            let (intents, peers) = read_side_by_side(
                sent + self.args.api_server_timeout,
                read_intents(&self.clients.fast),
                peer_read.as_mut(),
            )
            .await;
            let pending = match peers {
                PeersRead::Done(done) => {
                    self.take_peers_read(done, &mut rounds, sent, &mut addresses).await?;
                    false
                }
                PeersRead::Pending => true,
            };
            self.answer(&mut rounds, sent, intents, &addresses).await?;
            self.feeder.licence_may_have_changed();
            if pending {
                let done = finish_by(sent + self.args.api_check_interval, peer_read).await;
                self.take_peers_read(done, &mut rounds, sent, &mut addresses).await?;
            }
            if let Some(why) = self.lock()?.fenced() {
                tracing::warn!(reason = super::describe(why), "this node is fenced");
            }
            self.record_licence(&mut rounds)?;
            if !rounds.kept()
                && let Some(recorded) = self.read_registration().await
            {
                rounds.on_registration(recorded);
                self.published.accepts = rounds.record().accepts.clone();
                self.published.epoch = rounds.record().epoch;
            }
            if rounds.wants_announcement() {
                self.publisher.want(&self.published);
                let landed = self
                    .publisher
                    .landed(&self.published, self.args.api_server_timeout)
                    .await;
                if rounds.on_announced(landed) {
                    continue;
                }
            }
            // Stopping only here, between rounds; the publisher's writes are stopped after this.
            // Rounds start every apiCheckInterval, however long one took: the licence's length
            // counts on a failed check being followed by the next within the interval, a vote
            // round included.
            let next = if self.lock()?.awaits_first_licence() {
                sent + FIRST_LICENCE_RETRY
            } else {
                sent + self.args.api_check_interval
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = remediation_changed.notified() => {
                    // At most one early read a second: a burst of new remediations wakes every agent.
                    tokio::time::sleep_until((sent + EARLY_READ_GAP).into()).await;
                }
                _ = membership_changed.notified() => {
                    rounds.on_membership_changed();
                    tokio::time::sleep_until((sent + EARLY_READ_GAP).into()).await;
                }
                _ = stop.changed() => return Ok(()),
            }
        }
    }

    /// What a round's read of the peers brought, if it was planned and answered.
    async fn take_peers_read(
        &mut self,
        done: Option<Result<Peers>>,
        rounds: &mut Rounds<Instant>,
        sent: Instant,
        addresses: &mut BTreeMap<String, String>,
    ) -> Result<()> {
        match done {
            Some(Ok(read)) => {
                let latest = self.take_peers(read, addresses).await;
                rounds.on_peers(sent, latest.as_ref(), &mut *self.lock()?);
            }
            Some(Err(error)) => tracing::debug!(%error, "cannot read the peers; keeping the last list"),
            None => {}
        }
        Ok(())
    }

    /// A read of the peers: registers again if this agent's registration is gone and passes the
    /// addresses on. Returns the membership's newest configuration.
    async fn take_peers(&mut self, read: Peers, addresses: &mut BTreeMap<String, String>) -> Option<Configuration> {
        // Its registration went with its Node object (deleted and registered again by the
        // kubelet): register again, owned by the Node as it is now.
        if !read.addresses.contains_key(&self.args.node) {
            tracing::warn!("this agent's registration is gone; registering again");
            self.published.node_uid = self.node_uid().await;
            self.publisher.rewrite(&self.published);
        }
        *addresses = read.addresses;
        self.addresses.send_if_modified(|known| {
            let changed = known != addresses;
            if changed {
                known.clone_from(addresses);
            }
            changed
        });
        read.latest
    }

    /// The remediations read renews the licence and what it changes goes into the registration;
    /// when they cannot be read, the agent asks its peers.
    async fn answer(
        &mut self,
        rounds: &mut Rounds<Instant>,
        sent: Instant,
        intents: Result<Vec<Intent>>,
        addresses: &BTreeMap<String, String>,
    ) -> Result<()> {
        let intents = match intents {
            Ok(intents) => intents,
            Err(error) => {
                Metrics::count(&self.metrics.api_checks, "failed");
                if rounds.on_intents(None, &mut *self.lock()?) == (Answer::Failed { first: true }) {
                    tracing::warn!(%error, "API check failed; asking the peers");
                    self.probe_endpoint().await;
                }
                return self.vote_round(addresses).await;
            }
        };
        Metrics::count(&self.metrics.api_checks, "ok");
        let read = ApiRead {
            sent,
            intents,
            configuration: None,
        };
        let (answer, epoch) = {
            let mut s = self.lock()?;
            (rounds.on_intents(Some(&read), &mut s), s.epoch())
        };
        self.metrics.epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
        let Answer::Answered { back, record } = answer else {
            return Ok(());
        };
        if back {
            tracing::info!("the API server answers again");
        }
        if let Some(change) = record {
            for node in &change.newly_accepted {
                tracing::info!(%node, "accepted the remediation of a peer: no more votes for it");
            }
            if let Some(epoch) = change.epoch_raised {
                tracing::info!(epoch, "adopted a membership epoch");
            }
            self.published.accepts = rounds.record().accepts.clone();
            self.published.epoch = rounds.record().epoch;
            self.publisher.want(&self.published);
        }
        Ok(())
    }

    /// Records the licence for a later process of this boot (see [`super::inherited`]).
    fn record_licence(&self, rounds: &mut Rounds<Instant>) -> Result<()> {
        let Some(boot) = &self.boot else { return Ok(()) };
        let Some(until) = rounds.licence_to_record(&*self.lock()?) else {
            return Ok(());
        };
        match super::inherited::save(&self.args.state_dir, boot, until) {
            Ok(()) => rounds.licence_recorded(until),
            Err(error) => tracing::warn!(%error, "cannot record the licence for a restarted agent"),
        }
        Ok(())
    }

    fn lock(&self) -> Result<super::shared::Guard<'_>> {
        self.state.lock()
    }

    /// Votes while the API cannot be read; moves to a newer configuration a voter names.
    async fn vote_round(&self, addresses: &BTreeMap<String, String>) -> Result<()> {
        for done in 1.. {
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
                self.published.boot_time,
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
            if round == Round::Adopted {
                let adopted = self.lock()?.epoch();
                self.metrics.epoch.set(i64::try_from(adopted).unwrap_or(i64::MAX));
                tracing::info!(epoch = adopted, "a peer knew a newer membership: asking again in it");
            }
            if !Rounds::<Instant>::vote_again(round, done) {
                break;
            }
        }
        Ok(())
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
    /// `None` while the registration cannot be read; `Some(None)` when there is none.
    async fn read_registration(&self) -> Option<Option<Record>> {
        let name = registration::lease_name(&self.args.node);
        let leases = Api::<Lease>::namespaced(self.clients.client.clone(), &self.args.namespace);
        match leases.get_opt(&name).await {
            Ok(existing) => Some(
                existing
                    .as_ref()
                    .and_then(Published::from_lease)
                    .map(|recorded| Record {
                        accepts: recorded.accepts,
                        epoch: recorded.epoch,
                    }),
            ),
            Err(error) => {
                tracing::debug!(%error, "cannot read this agent's registration yet");
                None
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn failed() -> Result<()> {
        Err(crate::Error::Poisoned)
    }

    /// A read of the peers hanging on a slow API server for `delay`.
    async fn peers_answering_after(delay: Duration) -> Option<Result<()>> {
        tokio::time::sleep(delay).await;
        Some(Ok(()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_peers_read_holds_the_next_round_back_never() {
        // One reading of the paused clock: a second, real one would drift under load.
        let clock = tokio::time::Instant::now();
        let sent = clock.into_std();
        let hanging_peers = peers_answering_after(Duration::from_secs(5));
        let done = finish_by(sent + Duration::from_secs(4), hanging_peers).await;
        assert!(done.is_none(), "given up on, read again next round");
        // The timer rounds up to the millisecond.
        let waited = clock.elapsed().as_millis();
        assert!(
            (4000..=4002).contains(&waited),
            "the next round due after 4 s, not {waited} ms"
        );

        let prompt_peers = async { Some(Ok(())) };
        assert!(matches!(
            finish_by(Instant::now() + Duration::from_secs(4), prompt_peers).await,
            Some(Ok(()))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_licence_read_waits_for_the_peers_only_until_its_timeout() {
        // One reading of the paused clock: a second, real one would drift under load.
        let clock = tokio::time::Instant::now();
        let start = clock.into_std();
        let hanging_peers = peers_answering_after(Duration::from_secs(5));
        tokio::pin!(hanging_peers);
        let (intents, peers) = read_side_by_side(
            start + Duration::from_millis(1500),
            async { failed() },
            hanging_peers.as_mut(),
        )
        .await;
        assert!(intents.is_err());
        assert!(matches!(peers, PeersRead::Done(None)), "given up on");
        // The timer rounds up to the millisecond.
        let waited = clock.elapsed().as_millis();
        assert!(
            (1500..=1502).contains(&waited),
            "voting 1.5 s after the round began, not {waited} ms"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_licence_read_that_answers_leaves_the_peers_for_after_the_licence() {
        // One reading of the paused clock: a second, real one would drift under load.
        let clock = tokio::time::Instant::now();
        let start = clock.into_std();
        let slow_peers = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Some(Ok(7))
        };
        tokio::pin!(slow_peers);
        let (intents, peers) = read_side_by_side(
            start + Duration::from_millis(1500),
            async { Ok::<_, crate::Error>(()) },
            slow_peers.as_mut(),
        )
        .await;
        assert!(intents.is_ok());
        assert!(matches!(peers, PeersRead::Pending));
        assert_eq!(clock.elapsed().as_secs(), 0, "the licence is renewed without waiting");
        assert!(matches!(slow_peers.await, Some(Ok(7))), "and the peers' read goes on");
    }

    #[tokio::test(start_paused = true)]
    async fn peers_read_before_a_failed_licence_read_are_kept() {
        let start = Instant::now();
        let late_failure = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            failed()
        };
        let quick_peers = async { Some(Ok(1)) };
        tokio::pin!(quick_peers);
        let (_, peers) =
            read_side_by_side(start + Duration::from_millis(1500), late_failure, quick_peers.as_mut()).await;
        assert!(matches!(peers, PeersRead::Done(Some(Ok(1)))));
    }
}
