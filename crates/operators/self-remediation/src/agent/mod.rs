//! `nodemedic agent`: one per node. It keeps a licence (docs/self-remediation-protocol.md), feeds
//! its watchdog only while it holds one, votes for its peers, and fences at once when its node is
//! being remediated.

mod credentials;
mod licence;
mod peers;
mod settings;
mod shutdown;
mod wake;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

pub use licence::Metrics;
pub use settings::AgentArgs;

use crate::{
    Result,
    protocol::{
        Timing,
        agent::{AgentState, FenceReason},
    },
    watchdog::{self, Watchdog},
};

/// Runs the agent until the process is stopped.
pub async fn run(args: AgentArgs) -> Result<()> {
    let settings = args.licence();
    let config = nodemedic_kube::client::infer_config().await?;
    let client = nodemedic_kube::client::client(config.clone())?;
    let fast = nodemedic_kube::client::fail_fast_client(config, args.api_server_timeout)?;
    let (disarm, disarm_requests) = std::sync::mpsc::channel();
    // The identity comes first: a node whose agent cannot join the protocol is not armed (and is
    // not registered, so nothing will count on it fencing itself).
    let identity = credentials::obtain(&client, &args.namespace, &args.node, &args.state_dir).await;
    let wd = watchdog::open(&args.watchdog, args.software_reboot, args.watchdog_timeout)?;
    let timing = Timing {
        licence: settings.licence(),
        watchdog: wd.timeout(),
    };
    tracing::info!(
        node = %args.node,
        watchdog = %wd.describe(),
        licence_seconds = timing.licence.as_secs_f64(),
        safe_seconds = timing.safe_time().as_secs_f64(),
        "agent starting: the watchdog is armed; no licence yet"
    );
    let state = Arc::new(Mutex::new(AgentState::<Instant>::new(
        &args.node,
        timing.licence,
        args.peer_update_interval,
    )));
    let metrics = licence::Metrics::default();
    spawn_feeder(wd, state.clone(), metrics.clone(), disarm_requests);
    if let Some(bind) = args.metrics_bind {
        licence::serve_metrics(bind, &metrics).await?;
    }
    let address = SocketAddr::new(args.address, args.host_port);
    let server_state = state.clone();
    let votes = metrics.clone();
    let server_identity = identity.clone();
    tokio::spawn(async move {
        let on_vote = Arc::new(move |v| votes.vote_cast(v));
        if let Err(error) = peers::serve(address, &server_identity, server_state, on_vote).await {
            tracing::error!(%error, %address, "peer server stopped");
        }
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let clients = licence::Clients {
        client: client.clone(),
        fast: fast.clone(),
    };
    let licence = licence::run(&args, clients, identity, timing, state, metrics, stopped);
    tokio::pin!(licence);
    tokio::select! {
        result = &mut licence => result,
        _ = shutdown::signal() => {
            let _ = stop.send(true);
            // Let the current round finish (its writes must land before the disarm's).
            match tokio::time::timeout(shutdown::ROUND_GRACE, &mut licence).await {
                Ok(_) => shutdown::stop(&args, &client, &fast, &disarm).await,
                Err(_) => tracing::warn!("the licence round did not finish; the watchdog stays armed"),
            }
            Ok(())
        }
    }
}

/// Feeds the watchdog from a dedicated thread, so no async stall can feed it late; stops for good
/// when the agent fences, asking for an immediate reset. The thread owns the watchdog: it is
/// closed (the magic close) only when [`shutdown::stop`] asks, so if the agent dies the timer
/// runs out.
fn spawn_feeder(
    mut wd: Box<dyn Watchdog>,
    state: Arc<Mutex<AgentState<Instant>>>,
    metrics: licence::Metrics,
    disarm_requests: std::sync::mpsc::Receiver<shutdown::DisarmRequest>,
) {
    std::thread::spawn(move || {
        let interval = watchdog::feed_interval(wd.timeout());
        // Stop feeding this long before the licence ends: a feed is a check, then a write.
        let margin = Duration::from_millis(50);
        let mut reset_asked = false;
        loop {
            let (feed, fenced) = match state.lock() {
                Ok(s) => (s.may_feed(Instant::now(), margin), s.fenced()),
                Err(_) => (false, None),
            };
            metrics.set_feeding(feed);
            if let Ok(reply) = disarm_requests.try_recv() {
                let result = match fenced {
                    Some(why) => Err(format!("fencing: {}", describe(why))),
                    None => wd.disarm().map_err(|e| e.to_string()),
                };
                let closed = result.is_ok();
                let _ = reply.send(result);
                if closed {
                    metrics.set_feeding(false);
                    return;
                }
            }
            if let Some(why) = fenced {
                if !reset_asked {
                    reset_asked = true;
                    tracing::warn!(reason = describe(why), "fencing: no more watchdog feeds; resetting now");
                    metrics.fenced();
                    if let Err(error) = wd.reboot_now() {
                        tracing::warn!(%error, "no immediate reset; the watchdog resets the node when it runs out");
                    }
                }
            } else if feed && let Err(error) = wd.feed() {
                tracing::error!(%error, "cannot feed the watchdog");
            }
            std::thread::sleep(interval);
        }
    });
}

pub(crate) fn describe(reason: FenceReason) -> &'static str {
    match reason {
        FenceReason::OwnRemediation => "its own remediation exists",
        FenceReason::PeerSaysRemediating => "a peer answered that it is being remediated",
    }
}
