//! The peer failure detector (docs/peer-detection.md): foca (SWIM) among the agents, over their
//! mutual-TLS channels, and the agent's side of the reports: it confirms a suspicion of the
//! members it observes with its own probes, and reports only what those probes found.

mod reporter;
mod transport;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use jiff::Timestamp;
use nodemedic_peer_detection::{
    Cadence, DetectorSettings, DetectorState, Observer,
    swim::{self, ANNOUNCE_EVERY, Peer, Standing},
};
use rand::{SeedableRng, rngs::StdRng};
use tokio::sync::{mpsc, watch};

use crate::identity::PeerIdentity;

pub(super) use transport::{Inbound, Received};

/// Designated observers per member: the controller's 3, and 2 to spare.
const OBSERVERS_PER_MEMBER: usize = 5;
/// How often the observer looks at the detector's view while every member is alive and nothing
/// is reported; a change of that view (a message or a timer) brings its next look forward.
const CALM_LOOK_EVERY: Duration = Duration::from_secs(1);

/// When an observer reports, and how recent the probe under a report must be.
fn cadence(settings: &DetectorSettings) -> Cadence {
    Cadence {
        refresh: Duration::from_secs(1),
        evidence_ttl: Duration::from_millis(1500),
        probe_interval: settings.probe_period,
    }
}

/// What the detector needs from the rest of the agent.
pub(super) struct Wiring {
    pub identity: PeerIdentity,
    pub client: kube::Client,
    pub namespace: String,
    /// Every registered agent's `ip:port`, by node, as the licence loop last read them.
    pub addresses: watch::Receiver<BTreeMap<String, String>>,
    pub inbound: mpsc::Receiver<Received>,
    /// The sending end of `inbound`, for the answers that come back in responses.
    pub loopback: mpsc::Sender<Received>,
}

/// Runs the detector until the process ends.
pub(super) async fn run(settings: DetectorSettings, wiring: Wiring) {
    let Wiring {
        identity,
        client,
        namespace,
        mut addresses,
        mut inbound,
        loopback,
    } = wiring;
    let node = identity.node.clone();
    let generation = u64::try_from(Timestamp::now().as_millisecond()).unwrap_or(0);
    let config = swim::config(&settings);
    let me = Peer {
        node: node.clone(),
        generation,
    };
    let mut foca = Foca::new(me, config, StdRng::from_os_rng(), PostcardCodec);
    let mut transport = transport::Transport::new(&identity, settings, loopback);
    let reports = reporter::spawn(identity.clone(), client, namespace);
    let (timer_sender, mut timers) = mpsc::unbounded_channel::<Timer<Peer>>();
    let (probe_sender, mut probe_results) = mpsc::unbounded_channel::<(String, bool, Timestamp)>();
    let mut observer = Observer::designated(&node, OBSERVERS_PER_MEMBER);
    let cadence = cadence(&settings);
    let mut runtime = AccumulatingRuntime::new();
    let mut standing = Standing::default();
    // Every quarter period while something is under way, else every CALM_LOOK_EVERY: an
    // agent at rest wakes for the protocol's own messages and timers, not to find nothing due.
    let attentive_look = settings.probe_period / 4;
    let look = tokio::time::sleep(attentive_look);
    tokio::pin!(look);
    let mut announce = tokio::time::interval(ANNOUNCE_EVERY);
    transport.set_addresses(addresses.borrow_and_update().clone());
    tracing::info!(
        probe_period = ?settings.probe_period,
        probe_rtt = ?settings.probe_rtt,
        indirect_probes = settings.indirect_probes,
        suspect_to_down_after = ?settings.suspect_to_down_after,
        "peer failure detector running"
    );
    loop {
        let mut caller = None;
        tokio::select! {
            Some(received) = inbound.recv() => {
                if let Err(error) = foca.handle_data(&received.data, &mut runtime) {
                    tracing::debug!(%error, "a detector message was not taken");
                }
                caller = received.replies.map(|reply| (received.from, reply));
                look_soon_if_unsettled(&foca, look.as_mut(), attentive_look);
            }
            Some(timer) = timers.recv() => {
                if let Err(error) = foca.handle_timer(timer, &mut runtime) {
                    tracing::debug!(%error, "detector timer");
                }
                look_soon_if_unsettled(&foca, look.as_mut(), attentive_look);
            }
            Some((member, reached, at)) = probe_results.recv() => observer.probed(&member, reached, at),
            _ = announce.tick() => {
                // An announce gets an answer (or, from a member that declared this one down, the
                // news, and this one joins again).
                let registered: Vec<String> = transport.members().collect();
                let silent = swim::announce_to(
                    &node,
                    registered.iter().map(String::as_str),
                    foca.iter_membership_state().map(|m| (m.id(), m.state())),
                    standing,
                );
                for member in silent {
                    let _ = foca.announce(Peer { node: member, generation: 0 }, &mut runtime);
                }
            }
            _ = &mut look => {
                let now = Timestamp::now();
                for member in foca.iter_membership_state() {
                    observer.detector_says(&member.id().node, swim::detector_state(member.state()));
                }
                // A registered member the detector does not know (never heard from, or forgotten)
                // is unreachable as far as it can tell: only an own probe can make it a report.
                let known: BTreeSet<String> = foca.iter_membership_state().map(|m| m.id().node.clone()).collect();
                for member in transport.members().filter(|m| *m != node && !known.contains(m)) {
                    observer.detector_says(&member, DetectorState::Down);
                }
                for member in observer.probes_due(now, &cadence) {
                    observer.probe_sent(&member, now);
                    transport.probe(&member, now, probe_sender.clone());
                }
                let due = observer.reports_due(now, &cadence);
                if !due.is_empty() {
                    for report in &due {
                        tracing::info!(subject = %report.subject, since = ?report.since, "reporting a peer unreachable (or withdrawing)");
                    }
                    let _ = reports.send(due);
                }
                let unsettled = observer.attentive() || !settled(&foca);
                let next = if unsettled { attentive_look } else { CALM_LOOK_EVERY };
                look.as_mut().reset(tokio::time::Instant::now() + next);
            }
            Ok(()) = addresses.changed() => {
                let current = addresses.borrow_and_update().clone();
                let gone: Vec<String> = transport.members().filter(|m| !current.contains_key(m)).collect();
                for member in gone {
                    observer.forget(&member);
                }
                transport.set_addresses(current);
            }
        }
        let outbox = Outbox {
            transport: &mut transport,
            timers: &timer_sender,
            standing: &mut standing,
        };
        drain(&mut runtime, &foca, outbox, caller);
    }
}

/// Whether foca calls every member it knows alive.
fn settled(foca: &Foca<Peer, PostcardCodec, StdRng, NoCustomBroadcast>) -> bool {
    foca.iter_membership_state().all(|m| m.state() == foca::State::Alive)
}

/// Brings the observer's next look forward to within `attentive_look` when foca distrusts a
/// member: a suspicion must be confirmed within the period, not at the next calm look.
fn look_soon_if_unsettled(
    foca: &Foca<Peer, PostcardCodec, StdRng, NoCustomBroadcast>,
    look: std::pin::Pin<&mut tokio::time::Sleep>,
    attentive_look: Duration,
) {
    let soon = tokio::time::Instant::now() + attentive_look;
    if look.deadline() > soon && !settled(foca) {
        look.reset(soon);
    }
}

/// A member whose call is waiting for its answers, and where they go.
type Caller = (String, tokio::sync::oneshot::Sender<Vec<Vec<u8>>>);

/// Where what foca asks for goes.
struct Outbox<'a> {
    transport: &'a mut transport::Transport,
    timers: &'a mpsc::UnboundedSender<Timer<Peer>>,
    standing: &'a mut Standing,
}

/// Carries out what foca asked for: messages to send (those for `caller` in the response to its
/// call, or by calls of their own if that call has gone; a false "you were declared down" notice
/// dropped, [`swim::may_send`]), timers to set, news to log and to keep its standing by.
fn drain(
    runtime: &mut AccumulatingRuntime<Peer>,
    foca: &Foca<Peer, PostcardCodec, StdRng, NoCustomBroadcast>,
    outbox: Outbox<'_>,
    caller: Option<Caller>,
) {
    let Outbox {
        transport,
        timers,
        standing,
    } = outbox;
    let mut answers = Vec::new();
    while let Some((to, bytes)) = runtime.to_send() {
        if !swim::may_send(&to, &bytes, foca.iter_membership_state().map(|m| (m.id(), m.state()))) {
            tracing::debug!(member = %to.node, "dropped foca's notice to a member it holds alive");
            continue;
        }
        match &caller {
            Some((from, _)) if to.node == *from => answers.push(bytes.to_vec()),
            _ => transport.deliver(&to.node, bytes.to_vec()),
        }
    }
    if let Some((from, reply)) = caller
        && let Err(answers) = reply.send(answers)
    {
        for bytes in answers {
            transport.deliver(&from, bytes);
        }
    }
    while let Some((after, timer)) = runtime.to_schedule() {
        let timers = timers.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = timers.send(timer);
        });
    }
    while let Some(notification) = runtime.to_notify() {
        standing.heard(&notification);
        match notification {
            OwnedNotification::MemberUp(peer) => tracing::info!(member = %peer.node, "detector: member up"),
            OwnedNotification::MemberDown(peer) => tracing::warn!(member = %peer.node, "detector: member down"),
            OwnedNotification::Rejoin(peer) => {
                tracing::warn!(
                    generation = peer.generation,
                    "detector: the others declared this agent down; joined again"
                )
            }
            OwnedNotification::Defunct => tracing::warn!("detector: the others declared this agent down"),
            OwnedNotification::Rename(_, peer) => {
                tracing::info!(member = %peer.node, generation = peer.generation, "detector: member back in a new life")
            }
            OwnedNotification::Active => tracing::info!("detector: in touch with the other members"),
            OwnedNotification::Idle => {
                tracing::warn!("detector: no member reachable; announcing to every registered one")
            }
        }
    }
}
