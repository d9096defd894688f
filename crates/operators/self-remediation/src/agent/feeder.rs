//! The thread that feeds the watchdog while the agent holds a licence.
//!
//! It owns the watchdog: it is closed (the magic close) only when [`super::shutdown::stop`] asks,
//! so if the agent dies the timer runs out. It feeds on its own interval and at once when the
//! licence loop says the licence may have changed: a fresh agent's first licence often comes
//! close to the end of the watchdog's first period (the API read that grants it has its own
//! timeout), and waiting for the next tick would let the device reset a healthy node.
//!
//! Between two feeds it takes no lock another thread can hold: it reads the licence from the
//! permit [`SharedState`] publishes, and hands what it has to say (log lines, the feed-gap
//! histogram, whose lock a metrics scrape holds) to a reporter thread of ordinary priority.
//! Otherwise a descheduled thread holding one of those locks would hold back the feeds with it.

use std::{
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use super::{Metrics, describe, shared::SharedState, shutdown::DisarmRequest};
use crate::{
    protocol::agent::FenceReason,
    watchdog::{self, Watchdog, linux::FeederScheduling},
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

/// What the feeder has to say, said by the reporter thread.
#[derive(Debug)]
enum Note {
    Scheduled(FeederScheduling),
    LicenceHeld,
    LicenceRanOut,
    /// A feed, this long after the previous one while the licence was held.
    Fed {
        gap: Duration,
        timeout: Duration,
    },
    FeedFailed(String),
    Fencing(FenceReason),
    NoImmediateReset(String),
    SoftwareRebootFailed(String),
}

/// Notes waiting for the reporter; past this many, new ones are dropped rather than waited for.
const NOTES_WAITING: usize = 64;

/// Feeds the watchdog from a dedicated thread, so no async stall can feed it late; stops for good
/// when the agent fences, asking for an immediate reset. Without any means it only answers the
/// shutdown.
pub(super) fn spawn(
    wd: Option<Box<dyn Watchdog>>,
    state: Arc<SharedState>,
    metrics: Metrics,
    disarm_requests: mpsc::Receiver<DisarmRequest>,
) -> Kick {
    let interval = wd
        .as_ref()
        .map_or(Duration::from_secs(1), |w| watchdog::feed_interval(w.timeout()));
    let (kick, kicks) = mpsc::sync_channel(1);
    let (notes, reported) = mpsc::sync_channel(NOTES_WAITING);
    let reporter = metrics.clone();
    std::thread::spawn(move || reported.iter().for_each(|note| report(note, &reporter)));
    let feeder = Feeder {
        wd,
        state,
        metrics,
        disarm_requests,
        kicks,
        notes,
        interval,
        last_feed: None,
        feeding: false,
    };
    std::thread::spawn(move || feeder.run());
    Kick(kick)
}

struct Feeder {
    wd: Option<Box<dyn Watchdog>>,
    state: Arc<SharedState>,
    metrics: Metrics,
    disarm_requests: mpsc::Receiver<DisarmRequest>,
    kicks: mpsc::Receiver<()>,
    notes: mpsc::SyncSender<Note>,
    interval: Duration,
    /// The last feed while the licence has been held without a break.
    last_feed: Option<Instant>,
    /// Whether the licence allowed feeding at the last look.
    feeding: bool,
}

impl Feeder {
    fn run(mut self) {
        if self.wd.is_some() {
            self.note(Note::Scheduled(crate::watchdog::linux::raise_this_thread()));
        }
        // Stop feeding this long before the licence ends: a feed is a check, then a write.
        let margin = Duration::from_millis(50);
        let mut reset_asked = false;
        loop {
            let fenced = self.state.fenced();
            let feed = self.state.may_feed(Instant::now(), margin);
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
            if let Some(why) = fenced.filter(|_| !reset_asked) {
                reset_asked = true;
                self.fence(why);
            } else if feed && fenced.is_none() {
                self.feed();
            }
            if let Some(Err(error)) = self.wd.as_mut().map(|w| w.poll()) {
                self.note(Note::SoftwareRebootFailed(error.to_string()));
            }
            self.wait();
        }
    }

    /// Stops feeding for good, and asks the watchdog for an immediate reset. It logs here, not
    /// through the reporter: no feed is due any more, and the reason must be written before the
    /// node goes down.
    fn fence(&mut self, why: FenceReason) {
        self.metrics.fenced();
        let Some(w) = self.wd.as_mut() else {
            return;
        };
        report(Note::Fencing(why), &self.metrics);
        if let Err(error) = w.reboot_now() {
            report(Note::NoImmediateReset(error.to_string()), &self.metrics);
        }
    }

    fn feed(&mut self) {
        let Some(w) = self.wd.as_mut() else {
            return;
        };
        let note = match w.feed() {
            Ok(()) => {
                let now = Instant::now();
                let timeout = w.timeout();
                self.last_feed.replace(now).map(|last| Note::Fed {
                    gap: now - last,
                    timeout,
                })
            }
            Err(error) => Some(Note::FeedFailed(error.to_string())),
        };
        note.into_iter().for_each(|n| self.note(n));
    }

    /// Hands a note to the reporter without waiting: a full queue drops it.
    fn note(&self, note: Note) {
        let _ = self.notes.try_send(note);
    }

    /// Says when the licence starts or stops allowing feeds: a node that resets should have said
    /// why in its last lines.
    fn licence_held(&mut self, feed: bool, fenced: bool) {
        if feed == self.feeding || fenced {
            return;
        }
        self.feeding = feed;
        if feed {
            self.note(Note::LicenceHeld);
        } else {
            self.last_feed = None;
            self.note(Note::LicenceRanOut);
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

/// Logs a note and records it in the metrics, on the reporter thread.
fn report(note: Note, metrics: &Metrics) {
    match note {
        Note::Scheduled(scheduling) => say_how_scheduled(scheduling),
        Note::LicenceHeld => tracing::info!("licence held: feeding the watchdog"),
        Note::LicenceRanOut => tracing::warn!(
            "the licence ran out: the watchdog is no longer fed, and resets the node unless it is renewed"
        ),
        Note::Fed { gap, timeout } => fed_after(gap, timeout, metrics),
        Note::FeedFailed(error) => tracing::error!(%error, "cannot feed the watchdog"),
        Note::Fencing(why) => {
            tracing::warn!(reason = describe(why), "fencing: no more watchdog feeds; resetting now")
        }
        Note::NoImmediateReset(error) => {
            tracing::warn!(%error, "no immediate reset; the watchdog resets the node when it runs out")
        }
        Note::SoftwareRebootFailed(error) => {
            tracing::error!(%error, "the software watchdog could not reboot the node")
        }
    }
}

/// Says how the feeder thread runs: a node short of CPU resets unless it runs first.
fn say_how_scheduled(scheduling: FeederScheduling) {
    use FeederScheduling::{Nice, Ordinary, Realtime};
    match scheduling {
        Realtime => tracing::info!("the watchdog is fed from a real-time thread"),
        Nice => tracing::info!("the watchdog is fed from a thread at nice -20 (real time refused)"),
        Ordinary => tracing::warn!(
            "the watchdog is fed from an ordinary thread (no CAP_SYS_NICE): a node short of CPU may reset"
        ),
    }
}

/// Records the gap between two feeds, and warns when it came close to the timeout: a feeder
/// that does not get the CPU it needs resets a healthy node.
fn fed_after(gap: Duration, timeout: Duration, metrics: &Metrics) {
    metrics.fed_after(gap);
    if gap > timeout / 2 {
        tracing::warn!(
            gap_ms = gap.as_millis() as u64,
            timeout_ms = timeout.as_millis() as u64,
            "a watchdog feed came late: the agent got too little CPU"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{protocol::agent::AgentState, watchdog::WatchdogError};

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

    /// A feeder on a counting watchdog, with the ends the agent's tasks hold.
    struct Bench {
        feeds: Arc<AtomicUsize>,
        state: Arc<SharedState>,
        disarm: mpsc::Sender<DisarmRequest>,
        kick: Kick,
        /// Never read unless a test reads it: a reporter that does not keep up.
        notes: mpsc::Receiver<Note>,
    }

    fn feeder(interval: Duration, notes_waiting: usize) -> (Feeder, Bench) {
        let feeds = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(SharedState::new(AgentState::new("node-1", Duration::from_secs(4))));
        let (disarm, disarm_requests) = mpsc::channel();
        let (kick, kicks) = mpsc::sync_channel(1);
        let (notes, reported) = mpsc::sync_channel(notes_waiting);
        let feeder = Feeder {
            wd: Some(Box::new(Counting(feeds.clone()))),
            state: state.clone(),
            metrics: Metrics::default(),
            disarm_requests,
            kicks,
            notes,
            interval,
            last_feed: None,
            feeding: false,
        };
        let bench = Bench {
            feeds,
            state,
            disarm,
            kick: Kick(kick),
            notes: reported,
        };
        (feeder, bench)
    }

    impl Bench {
        fn license(&self) {
            self.state
                .lock()
                .expect("state")
                .inherit(Some(Instant::now() + Duration::from_secs(3600)));
            self.kick.licence_may_have_changed();
        }

        fn wait_for_feeds(&self, at_least: usize, why: &str) {
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.feeds.load(Ordering::SeqCst) < at_least {
                assert!(Instant::now() < deadline, "{why}");
                std::thread::yield_now();
            }
        }

        fn disarm(self, thread: std::thread::JoinHandle<()>) {
            let (reply, replied) = tokio::sync::oneshot::channel();
            self.disarm.send(reply).expect("the feeder listens");
            self.kick.licence_may_have_changed();
            assert_eq!(replied.blocking_recv().expect("a reply"), Ok(()));
            thread.join().expect("the feeder stops once disarmed");
        }
    }

    #[test]
    fn a_licence_granted_between_ticks_is_fed_at_the_kick_not_at_the_next_tick() {
        // Far past the test's deadline: only the kick can make it feed in time.
        let (feeder, bench) = feeder(Duration::from_secs(3600), NOTES_WAITING);
        let thread = std::thread::spawn(move || feeder.run());
        bench.license();
        bench.wait_for_feeds(1, "the kick fed the watchdog");
        bench.disarm(thread);
    }

    #[test]
    fn a_task_holding_the_state_lock_does_not_hold_back_the_feeds() {
        let (feeder, bench) = feeder(Duration::from_millis(1), NOTES_WAITING);
        bench.license();
        // As a licence-loop task descheduled while it holds the lock.
        let held = bench.state.lock().expect("state");
        let thread = std::thread::spawn(move || feeder.run());
        bench.wait_for_feeds(3, "the feeder fed while another thread held the state's lock");
        drop(held);
        bench.disarm(thread);
    }

    #[test]
    fn a_reporter_that_does_not_keep_up_does_not_hold_back_the_feeds() {
        let (feeder, bench) = feeder(Duration::from_millis(1), 1);
        bench.license();
        let thread = std::thread::spawn(move || feeder.run());
        // Every feed after the first has a gap to report; the one-place queue is full at once.
        bench.wait_for_feeds(20, "the feeder fed with its notes unread");
        assert!(bench.notes.try_iter().count() <= 1);
        bench.disarm(thread);
    }

    #[test]
    fn a_lapse_starts_a_new_count_of_the_gap_between_feeds() {
        let (mut feeder, bench) = feeder(Duration::from_secs(3600), NOTES_WAITING);
        feeder.licence_held(true, false);
        feeder.feed();
        feeder.feed();
        feeder.licence_held(false, false);
        feeder.licence_held(true, false);
        feeder.feed();
        let notes: Vec<Note> = bench.notes.try_iter().collect();
        let gaps = notes.iter().filter(|n| matches!(n, Note::Fed { .. })).count();
        assert_eq!(
            gaps, 1,
            "only the second feed of the first holding has a gap: {notes:?}"
        );
        assert!(matches!(notes.last(), Some(Note::LicenceHeld)), "{notes:?}");
    }

    #[test]
    fn the_gap_between_feeds_is_measured_and_a_late_one_counted() {
        let metrics = Metrics::default();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        fed_after(Duration::from_millis(1700), Duration::from_secs(2), &metrics);
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
