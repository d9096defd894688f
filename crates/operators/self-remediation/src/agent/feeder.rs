//! The thread that feeds the watchdog while the agent holds a licence.
//!
//! It owns the watchdog: it is closed (the magic close) only when [`super::shutdown::stop`] asks,
//! so if the agent dies the timer runs out. It feeds on its own interval and at once when the
//! licence loop says the licence may have changed: a fresh agent's first licence often comes
//! close to the end of the watchdog's first period (the API read that grants it has its own
//! timeout), and waiting for the next tick would let the device reset a healthy node.

use std::{
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use super::{Metrics, describe, shutdown::DisarmRequest};
use crate::{
    protocol::agent::AgentState,
    watchdog::{self, Watchdog},
};

/// Tells the feeder thread to look at the licence now, not at its next tick.
#[derive(Clone)]
pub(super) struct Kick(mpsc::SyncSender<()>);

impl Kick {
    pub(super) fn licence_may_have_changed(&self) {
        // A kick already waiting does the same: a full channel loses nothing.
        let _ = self.0.try_send(());
    }
}

/// Feeds the watchdog from a dedicated thread, so no async stall can feed it late; stops for good
/// when the agent fences, asking for an immediate reset. Without any means it only answers the
/// shutdown.
pub(super) fn spawn(
    wd: Option<Box<dyn Watchdog>>,
    state: Arc<Mutex<AgentState<Instant>>>,
    metrics: Metrics,
    disarm_requests: mpsc::Receiver<DisarmRequest>,
) -> Kick {
    let interval = wd
        .as_ref()
        .map_or(Duration::from_secs(1), |w| watchdog::feed_interval(w.timeout()));
    let (kick, kicks) = mpsc::sync_channel(1);
    let feeder = Feeder {
        wd,
        state,
        metrics,
        disarm_requests,
        kicks,
        interval,
        last_feed: None,
        feeding: false,
    };
    std::thread::spawn(move || feeder.run());
    Kick(kick)
}

struct Feeder {
    wd: Option<Box<dyn Watchdog>>,
    state: Arc<Mutex<AgentState<Instant>>>,
    metrics: Metrics,
    disarm_requests: mpsc::Receiver<DisarmRequest>,
    kicks: mpsc::Receiver<()>,
    interval: Duration,
    /// The last feed while the licence has been held without a break.
    last_feed: Option<Instant>,
    /// Whether the licence allowed feeding at the last look.
    feeding: bool,
}

impl Feeder {
    fn run(mut self) {
        if self.wd.is_some() {
            say_how_scheduled(crate::watchdog::linux::raise_this_thread());
        }
        // Stop feeding this long before the licence ends: a feed is a check, then a write.
        let margin = Duration::from_millis(50);
        let mut reset_asked = false;
        loop {
            let (feed, fenced) = match self.state.lock() {
                Ok(s) => (s.may_feed(Instant::now(), margin), s.fenced()),
                Err(_) => (false, None),
            };
            self.metrics.set_feeding(feed && self.wd.is_some());
            self.licence_held(feed, fenced.is_some());
            if let Ok(reply) = self.disarm_requests.try_recv() {
                let result = match (fenced, self.wd.as_mut()) {
                    (Some(why), _) => Err(format!("fencing: {}", describe(why))),
                    (None, Some(w)) => w.disarm().map_err(|e| e.to_string()),
                    (None, None) => Ok(()),
                };
                let closed = result.is_ok();
                let _ = reply.send(result);
                if closed {
                    self.metrics.set_feeding(false);
                    return;
                }
            }
            if self.wd.is_none() && fenced.is_some() && !reset_asked {
                reset_asked = true;
                self.metrics.fenced();
            }
            if let Some(w) = self.wd.as_mut() {
                if let Some(why) = fenced {
                    if !reset_asked {
                        reset_asked = true;
                        tracing::warn!(reason = describe(why), "fencing: no more watchdog feeds; resetting now");
                        self.metrics.fenced();
                        if let Err(error) = w.reboot_now() {
                            tracing::warn!(%error, "no immediate reset; the watchdog resets the node when it runs out");
                        }
                    }
                } else if feed {
                    match w.feed() {
                        Ok(()) => fed(&mut self.last_feed, &self.metrics, w.timeout()),
                        Err(error) => tracing::error!(%error, "cannot feed the watchdog"),
                    }
                }
                if let Err(error) = w.poll() {
                    tracing::error!(%error, "the software watchdog could not reboot the node");
                }
            }
            self.wait();
        }
    }

    /// Says when the licence starts or stops allowing feeds: a node that resets should have said
    /// why in its last lines.
    fn licence_held(&mut self, feed: bool, fenced: bool) {
        if feed == self.feeding || fenced {
            return;
        }
        self.feeding = feed;
        if feed {
            tracing::info!("licence held: feeding the watchdog");
        } else {
            self.last_feed = None;
            tracing::warn!(
                "the licence ran out: the watchdog is no longer fed, and resets the node unless it is renewed"
            );
        }
    }

    /// Until the next tick or a kick, whichever comes first.
    fn wait(&self) {
        if let Err(mpsc::RecvTimeoutError::Disconnected) = self.kicks.recv_timeout(self.interval) {
            // The licence loop is gone (the agent is stopping): ticks only.
            std::thread::sleep(self.interval);
        }
    }
}

/// Says how the feeder thread runs: a node short of CPU resets unless it runs first.
fn say_how_scheduled(scheduling: crate::watchdog::linux::FeederScheduling) {
    use crate::watchdog::linux::FeederScheduling::{Nice, Ordinary, Realtime};
    match scheduling {
        Realtime => tracing::info!("the watchdog is fed from a real-time thread"),
        Nice => tracing::info!("the watchdog is fed from a thread at nice -20 (real time refused)"),
        Ordinary => tracing::warn!(
            "the watchdog is fed from an ordinary thread (no CAP_SYS_NICE): a node short of CPU may reset"
        ),
    }
}

/// Records the gap since the last feed, and warns when it came close to the timeout: a feeder
/// that does not get the CPU it needs resets a healthy node.
fn fed(last_feed: &mut Option<Instant>, metrics: &Metrics, timeout: Duration) {
    let now = Instant::now();
    if let Some(last) = last_feed.replace(now) {
        let gap = now - last;
        metrics.fed_after(gap);
        if gap > timeout / 2 {
            tracing::warn!(
                gap_ms = gap.as_millis() as u64,
                timeout_ms = timeout.as_millis() as u64,
                "a watchdog feed came late: the agent got too little CPU"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::watchdog::WatchdogError;

    struct Counting(Arc<AtomicUsize>);

    impl Watchdog for Counting {
        fn timeout(&self) -> Duration {
            Duration::from_secs(3600)
        }
        fn feed(&mut self) -> Result<(), WatchdogError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn disarm(&mut self) -> Result<(), WatchdogError> {
            Ok(())
        }
        fn reboot_now(&mut self) -> Result<(), WatchdogError> {
            Ok(())
        }
        fn describe(&self) -> String {
            "counting".into()
        }
    }

    #[test]
    fn a_licence_granted_between_ticks_is_fed_at_the_kick_not_at_the_next_tick() {
        let feeds = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(Mutex::new(AgentState::new("node-1", Duration::from_secs(4))));
        let (disarm, disarm_requests) = mpsc::channel();
        let (kick, kicks) = mpsc::sync_channel(1);
        let feeder = Feeder {
            wd: Some(Box::new(Counting(feeds.clone()))),
            state: state.clone(),
            metrics: Metrics::default(),
            disarm_requests,
            kicks,
            // Far past the test's deadline: only the kick can make it feed in time.
            interval: Duration::from_secs(3600),
            last_feed: None,
            feeding: false,
        };
        let thread = std::thread::spawn(move || feeder.run());
        let kick = Kick(kick);

        state
            .lock()
            .expect("state")
            .inherit(Some(Instant::now() + Duration::from_secs(4)));
        kick.licence_may_have_changed();
        let deadline = Instant::now() + Duration::from_secs(30);
        while feeds.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the kick fed the watchdog");
            std::thread::yield_now();
        }

        let (reply, replied) = tokio::sync::oneshot::channel();
        disarm.send(reply).expect("the feeder listens");
        kick.licence_may_have_changed();
        assert_eq!(replied.blocking_recv().expect("a reply"), Ok(()));
        thread.join().expect("the feeder stops once disarmed");
    }

    #[test]
    fn the_gap_between_feeds_is_measured_and_a_lapse_starts_a_new_count() {
        let metrics = Metrics::default();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut last_feed = Some(Instant::now() - Duration::from_millis(1700));
        fed(&mut last_feed, &metrics, Duration::from_secs(2));
        // The first feed after a lapse (no last feed) has no gap to count.
        fed(&mut None, &metrics, Duration::from_secs(2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("nodemedic_agent_watchdog_feed_gap_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("nodemedic_agent_watchdog_feed_gap_seconds_bucket{le=\"1.5\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("nodemedic_agent_watchdog_feed_gap_seconds_bucket{le=\"2.0\"} 1"),
            "{text}"
        );
    }
}
