//! `nodemedic agent`: one per node. It keeps a licence (docs/self-remediation-protocol.md), feeds
//! its watchdog only while it holds one, votes for its peers, and fences at once when its node is
//! being remediated. It runs whatever fencing means the node has, none included, and says which
//! in its registration.

mod credentials;
mod detector;
mod endpoint;
mod feeder;
mod inherited;
mod licence;
mod metrics;
pub(crate) mod peers;
mod publisher;
mod register;
mod settings;
mod shared;
mod shutdown;
mod wake;

use std::{net::SocketAddr, sync::Arc, time::Instant};

pub use metrics::Metrics;
use nodemedic_kube::shutdown::StopSignal;
pub use settings::AgentArgs;

use crate::{
    Result,
    identity::PeerIdentity,
    protocol::{
        agent::{AgentState, FenceReason},
        manager::{self as rules, Registration},
    },
    registration::Published,
    watchdog,
};

/// Runs the agent until `stop` says the process is stopped.
pub async fn run(args: AgentArgs, mut stop: StopSignal) -> Result<()> {
    let settings = args.licence();
    let detector_settings = args.detector().map_err(crate::Error::InvalidDetector)?;
    let config = nodemedic_kube::client::infer_config().await?;
    let client = nodemedic_kube::client::client(config.clone())?;
    let fast = nodemedic_kube::client::fail_fast_client(config.clone(), args.api_server_timeout)?;
    let peer_reads = nodemedic_kube::client::fail_fast_client(config, args.peer_api_server_timeout)?;
    let (disarm, disarm_requests) = std::sync::mpsc::channel();
    // The identity comes first: a node whose agent cannot join the protocol is not armed (and is
    // not registered, so nothing will count on it fencing itself).
    let identity = tokio::select! {
        identity = credentials::obtain(&client, &args.namespace, &args.node, &args.state_dir) => identity,
        // Nothing is armed or registered yet (the pod deleted as it starts): nothing to undo.
        () = stop.received() => {
            tracing::info!("stopped before arming the watchdog");
            return Ok(());
        }
    };
    let mut fencing_settings = watchdog::Settings::new(&args.watchdog, args.watchdog_timeout, args.software_reboot);
    if args.software_reboot {
        fencing_settings.reboot = watchdog::Reboot::Sysrq(args.sysrq_trigger.clone());
    }
    fencing_settings.sysfs = args.watchdog_class_dir.clone();
    fencing_settings.dev = args.device_dir.clone();
    fencing_settings.modprobe = Some(args.modprobe.clone()).filter(|m| !m.as_os_str().is_empty());
    match watchdog::linux::lock_in_memory() {
        Ok(()) => tracing::info!("the agent's pages are locked in memory: reclaim cannot delay a watchdog feed"),
        Err(error) => {
            tracing::warn!(%error, "cannot lock the agent in memory (no CAP_IPC_LOCK?): under memory pressure a watchdog feed may come late")
        }
    }
    let fencing = watchdog::open(&fencing_settings);
    for why in &fencing.passed_over {
        tracing::warn!(%why, "watchdog passed over");
    }
    let published = Published {
        node: args.node.clone(),
        address: format!("{}:{}", args.address, args.host_port),
        means: fencing.means,
        watchdog: fencing.published_timeout(),
        licence: settings.licence(),
        software_reboot: args.software_reboot,
        certificate_sha256: identity.fingerprint(),
        boot_time: register::boot_time(args.boot_time_file.as_deref()),
        accepts: Default::default(),
        epoch: 0,
        // Registering says the watchdog is armed: it was opened before this runs.
        disarmed: false,
        incarnation: format!("{:016x}", rand::random::<u64>()),
        node_uid: None,
        fencing_note: fencing.passed_over.join("; "),
    };
    let timing = rules::timing(settings.licence(), &own_registration(&published));
    log_start(&args, &fencing, &timing);
    let mut published = published;
    published.node_uid = register::annotate_node(&client, &args.node, fencing.means, &timing).await;
    let mut initial = AgentState::<Instant>::new(&args.node, timing.licence).booted_at(published.boot_time);
    let boot = inherited::boot_key(args.boot_time_file.as_deref());
    take_over_licence(&args, boot.as_deref(), &mut initial);
    let state = Arc::new(shared::SharedState::new(initial));
    let metrics = Metrics::default();
    let feeder = feeder::spawn(fencing.watchdog, state.clone(), metrics.clone(), disarm_requests);
    if let Some(bind) = args.metrics_bind {
        let secure = args.metrics_secure.then(|| {
            let certificate = nodemedic_kube::pki::Pem {
                cert: identity.cert_pem.clone(),
                key: identity.key_pem.clone(),
            };
            (client.clone(), certificate)
        });
        metrics::serve(bind, &metrics, secure).await?;
    }
    let addresses_sender = serve_peers(&args, &identity, &fast, &state, &metrics, detector_settings);
    let (stop_licence, stopped) = tokio::sync::watch::channel(false);
    let incarnation = published.incarnation.clone();
    let publisher = publisher::Publisher::spawn(fast.clone(), args.namespace.clone());
    let finished = {
        let licence = licence::Loop {
            args: &args,
            clients: licence::Clients {
                client: client.clone(),
                fast: fast.clone(),
                peers: peer_reads,
            },
            identity,
            state: state.clone(),
            metrics,
            published,
            boot,
            publisher: &publisher,
            addresses: addresses_sender,
            feeder,
        }
        .run(stopped);
        tokio::pin!(licence);
        tokio::select! {
            result = &mut licence => Some(result),
            () = stop.received() => {
                // From the signal on it votes for no one (its registration may soon say disarmed).
                if let Ok(mut s) = state.lock() {
                    s.stop_voting();
                }
                let _ = stop_licence.send(true);
                // Let the current round finish, then the registration writes (each must land before
                // the disarm's, or fail).
                if tokio::time::timeout(shutdown::ROUND_GRACE, &mut licence).await.is_err() {
                    tracing::warn!("the licence round did not finish; the watchdog stays armed");
                    return Ok(());
                }
                None
            }
        }
    };
    if let Some(result) = finished {
        return result;
    }
    publisher.stop(args.api_server_timeout * 2).await;
    shutdown::stop(&args, &client, &fast, &state, &incarnation, &disarm).await;
    Ok(())
}

/// Says how this node fences itself, and when it cannot.
fn log_start(args: &AgentArgs, fencing: &watchdog::Fencing, timing: &crate::protocol::Timing) {
    tracing::info!(
        node = %args.node,
        means = fencing.means.as_str(),
        fencing = %fencing.describe(),
        licence_seconds = timing.licence.as_secs_f64(),
        safe_seconds = timing.safe_time().as_secs_f64(),
        "agent starting: fencing armed; no licence yet"
    );
    if fencing.means == rules::Means::None {
        tracing::error!(
            "no watchdog device and software reboot is disabled: this node cannot fence itself, so it cannot be \
             self-remediated (its agent still votes for its peers); configure watchdogFilePath, make softdog loadable, \
             or enable isSoftwareRebootEnabled"
        );
    }
}

/// Takes over the licence an earlier agent process of this boot recorded, or fences at once when
/// it let its licence lapse.
fn take_over_licence(args: &AgentArgs, boot: Option<&str>, agent: &mut AgentState<Instant>) {
    match boot.map(|b| inherited::load(&args.state_dir, b)) {
        Some(inherited::Inherited::Until(until)) => {
            tracing::info!("took over the licence of an earlier agent process of this boot");
            agent.inherit(Some(until));
        }
        Some(inherited::Inherited::Lapsed) => {
            tracing::warn!("an earlier agent process of this boot let its licence lapse: fencing now");
            agent.inherit(None);
        }
        Some(inherited::Inherited::Nothing) => {}
        None => tracing::warn!("cannot tell which boot this is: an earlier agent process's licence is not taken over"),
    }
}

/// Starts the peer side: the server answering votes (and the failure detector's messages) and,
/// when configured, the peer failure detector. Returns where the licence loop sends the peers'
/// addresses.
fn serve_peers(
    args: &AgentArgs,
    identity: &PeerIdentity,
    fast: &kube::Client,
    state: &Arc<shared::SharedState>,
    metrics: &Metrics,
    detector_settings: Option<nodemedic_peer_detection::DetectorSettings>,
) -> tokio::sync::watch::Sender<std::collections::BTreeMap<String, String>> {
    let address = SocketAddr::new(args.address, args.host_port);
    let server_state = state.clone();
    let votes = metrics.clone();
    let server_identity = identity.clone();
    let (addresses_sender, addresses) = tokio::sync::watch::channel(Default::default());
    let (messages, inbound) = tokio::sync::mpsc::channel(256);
    let loopback = messages.clone();
    let inbound_end = detector::Inbound {
        node: args.node.clone(),
        messages: detector_settings.map(|_| messages),
    };
    if let Some(settings) = detector_settings {
        let wiring = detector::Wiring {
            identity: identity.clone(),
            client: fast.clone(),
            namespace: args.namespace.clone(),
            addresses,
            inbound,
            loopback,
        };
        tokio::spawn(detector::run(settings, wiring));
    }
    tokio::spawn(async move {
        let on_vote = Arc::new(move |v: &crate::protocol::agent::Verdict| votes.vote_cast(v));
        if let Err(error) = peers::serve(address, &server_identity, server_state, on_vote, inbound_end).await {
            tracing::error!(%error, %address, "peer server stopped");
        }
    });
    addresses_sender
}

/// The protocol's view of what this agent publishes, for its own timing.
fn own_registration(published: &Published) -> Registration {
    Registration {
        node: published.node.clone(),
        means: published.means,
        watchdog: published.watchdog,
        licence: published.licence,
        accepts: Default::default(),
        acknowledged: 0,
        disarmed: false,
    }
}

pub(crate) fn describe(reason: FenceReason) -> &'static str {
    match reason {
        FenceReason::OwnRemediation => "its own remediation exists",
        FenceReason::PeerSaysRemediating => "a peer answered that it is being remediated",
        FenceReason::InheritedLapse => "an earlier agent process of this boot let its licence lapse",
    }
}
