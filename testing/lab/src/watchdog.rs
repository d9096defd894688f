//! A lab watchdog per node: the timer behind the node's emulated watchdog device
//! ([`crate::watchdog_device`]). It runs on the host, outside the node's namespace, so a network
//! partition does not stop the feed while a crash or a freeze does. The device arms, feeds,
//! disarms and programs it; when not fed within its timeout it asks the lab to power-cycle the
//! node.
//!
//! (The lab once served a unix socket per node as well, which agents opened as `lab:<socket>`;
//! the product no longer accepts such a path, and the agents open the emulated device with the
//! product's own Linux driver.)

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::mpsc, time::Instant};

use crate::watchdog_device::WatchdogDeviceStats;

/// A lab timer this late was stalled with the rest of the lab's process; its expiries wait this
/// long for the keep-alives queued meanwhile.
const STALL: Duration = Duration::from_millis(250);

/// How long past its deadline an expiry waits while the device's FUSE connection still holds
/// requests: the lab's device thread is behind, not the agent (see [`due`]).
const BACKLOG_GRACE: Duration = Duration::from_secs(5);

/// Whether a watchdog with `deadline` expires at `now`. On a lab that keeps up, the device's FUSE
/// queue is empty but for the microseconds a request takes, so a queue that still holds requests
/// at a deadline means the lab's device thread is behind (a CI run saturating the machine once
/// reset every node of a lab at the same instant while each agent fed): the keep-alive waiting in
/// it was written in time, and a hardware timer would have had it. The expiry waits for it to be
/// served, up to [`BACKLOG_GRACE`]; an agent that wrote nothing leaves the queue empty and its
/// node is reset at the deadline.
/// (`backlog` is asked only once the deadline has passed.)
fn due(deadline: Option<Instant>, now: Instant, backlog: impl FnOnce() -> bool) -> bool {
    deadline.is_some_and(|d| d <= now && (now >= d + BACKLOG_GRACE || !backlog()))
}

/// Whether the FUSE connection whose `waiting` file is `queue` holds requests (none known when
/// it cannot be read).
fn backlog(queue: Option<&PathBuf>) -> bool {
    queue
        .and_then(|q| std::fs::read_to_string(q).ok())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// The expiry timer's own stalls. While the lab's process was stalled its device threads were
/// too: keep-alives the agents wrote in time wait in the kernel's queue for them. A hardware
/// timer would have had them, so expiries are judged only once they are served (the device
/// threads run first).
struct Stalls {
    period: Duration,
    last_tick: Instant,
    judge_from: Instant,
}

impl Stalls {
    fn new(now: Instant, period: Duration) -> Self {
        Self {
            period,
            last_tick: now,
            judge_from: now,
        }
    }

    /// Takes a tick at `now`; how long the timer was stalled before it, if that long.
    fn stalled(&mut self, now: Instant) -> Option<Duration> {
        let stalled = (now - self.last_tick).saturating_sub(self.period);
        self.last_tick = now;
        (stalled > STALL).then(|| {
            self.judge_from = now + STALL;
            stalled
        })
    }

    fn may_judge(&self, now: Instant) -> bool {
        now >= self.judge_from
    }
}

#[derive(Default)]
pub(crate) struct State {
    /// Armed with this deadline, or disarmed.
    deadline: Option<Instant>,
    /// When it was last armed or fed.
    fed_at: Option<Instant>,
    /// The gap before the last keep-alive, when it came more than half the timeout after the
    /// one before: taken by the device to say so (outside the lock).
    pub late_keepalive: Option<Duration>,
    /// Bumped on each arm so a stale handle's feeds do not re-arm a fired watchdog.
    generation: u64,
    /// How many times the node lost its power: an expiry's reset is moot once it did since.
    power_losses: u64,
    /// What the emulated device was programmed with since the node last booted (a driver
    /// starts again from its default at boot).
    pub device_timeout: Option<Duration>,
    pub device_stats: WatchdogDeviceStats,
    /// The `waiting` file of the device's FUSE connection, when the lab found it.
    pub device_queue: Option<PathBuf>,
}

impl State {
    pub(crate) fn arm(&mut self, timeout: Duration) -> u64 {
        self.generation += 1;
        let now = Instant::now();
        self.deadline = Some(now + timeout);
        self.fed_at = Some(now);
        self.generation
    }

    /// Whether a handle of `generation` still speaks for the armed watchdog.
    pub(crate) fn current(&self, generation: u64) -> bool {
        self.generation == generation && self.deadline.is_some()
    }

    pub(crate) fn feed(&mut self, generation: u64, timeout: Duration) -> bool {
        let current = self.current(generation);
        if current {
            let now = Instant::now();
            let gap = self.fed_at.map(|at| now - at);
            self.late_keepalive = gap.filter(|gap| *gap > timeout / 2);
            self.deadline = Some(now + timeout);
            self.fed_at = Some(now);
        }
        current
    }

    pub(crate) fn disarm(&mut self, generation: u64) -> bool {
        let current = self.generation == generation;
        if current {
            self.deadline = None;
        }
        current
    }
}

#[derive(Clone, Default)]
pub(crate) struct Watchdogs(Arc<Mutex<BTreeMap<String, State>>>);

impl Watchdogs {
    /// Disarms a node's watchdog (its machine lost power: the timer is gone with it).
    pub(crate) fn power_lost(&self, node: &str) {
        if let Ok(mut all) = self.0.lock()
            && let Some(state) = all.get_mut(node)
        {
            state.deadline = None;
            state.generation += 1;
            state.power_losses += 1;
            state.device_timeout = None;
        }
    }

    /// Gives the node a watchdog (disarmed until something opens it).
    pub(crate) fn register(&self, node: &str) {
        if let Ok(mut all) = self.0.lock() {
            all.entry(node.to_owned()).or_default();
        }
    }

    /// Drops the node's watchdog altogether (the node left the lab; its servers are stopped).
    pub(crate) fn forget(&self, node: &str) {
        if let Ok(mut all) = self.0.lock() {
            all.remove(node);
        }
    }

    /// Runs `f` on the node's state under the lock (none for a node without a watchdog).
    pub(crate) fn with_node<T>(&self, node: &str, f: impl FnOnce(&mut State) -> T) -> Option<T> {
        let mut all = self.0.lock().ok()?;
        all.get_mut(node).map(f)
    }

    /// Whether the node's watchdog is armed right now.
    pub(crate) fn armed(&self, node: &str) -> bool {
        self.0
            .lock()
            .map(|all| all.get(node).is_some_and(|s| s.deadline.is_some()))
            .unwrap_or(false)
    }

    /// Whether the node has lost no power since it had lost it `power_losses` times.
    pub(crate) fn powered_since(&self, node: &str, power_losses: u64) -> bool {
        self.0
            .lock()
            .map(|all| all.get(node).is_some_and(|s| s.power_losses == power_losses))
            .unwrap_or(false)
    }

    /// Sends every node whose watchdog expires, once per expiry, with how many times it had lost
    /// its power then ([`Watchdogs::powered_since`]).
    pub(crate) fn expiries(&self, tx: mpsc::UnboundedSender<(String, u64)>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let period = Duration::from_millis(50);
            let mut tick = tokio::time::interval(period);
            let mut stalls = Stalls::new(Instant::now(), period);
            loop {
                tick.tick().await;
                let now = Instant::now();
                if let Some(stalled) = stalls.stalled(now) {
                    tracing::warn!(
                        stalled_ms = stalled.as_millis() as u64,
                        "the lab's watchdog timer ran late (the lab process was stalled): expiries wait for queued keep-alives"
                    );
                }
                if !stalls.may_judge(now) {
                    continue;
                }
                let expired: Vec<(String, u64)> = match this.0.lock() {
                    Ok(mut all) => all
                        .iter_mut()
                        .filter(|(_, s)| due(s.deadline, now, || backlog(s.device_queue.as_ref())))
                        .map(|(node, s)| {
                            s.deadline = None;
                            s.generation += 1;
                            (node.clone(), s.power_losses)
                        })
                        .collect(),
                    Err(_) => Vec::new(),
                };
                for expiry in expired {
                    let _ = tx.send(expiry);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_expiry_is_moot_once_the_node_lost_its_power_since() {
        let watchdogs = Watchdogs::default();
        watchdogs.register("a");
        watchdogs.with_node("a", |s| s.arm(Duration::from_millis(10)));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _expiries = watchdogs.expiries(tx);
        let (node, power_losses) = rx.recv().await.expect("the watchdog expires");
        assert_eq!(node, "a");
        assert!(
            watchdogs.powered_since("a", power_losses),
            "nothing since: the reset is due"
        );
        // A crash that was already killing the node's processes when the watchdog fired.
        watchdogs.power_lost("a");
        assert!(
            !watchdogs.powered_since("a", power_losses),
            "the node is off: no reset boots it"
        );
        // Armed and expired again after its next boot: that expiry's reset is due.
        watchdogs.with_node("a", |s| s.arm(Duration::from_millis(10)));
        let (_, again) = rx.recv().await.expect("the watchdog expires again");
        assert!(watchdogs.powered_since("a", again));
    }

    #[test]
    fn a_keep_alive_after_more_than_half_the_timeout_is_told_late() {
        let mut state = State::default();
        let timeout = Duration::from_secs(3);
        let generation = state.arm(timeout);
        assert!(state.feed(generation, timeout));
        assert_eq!(state.late_keepalive, None, "at once");
        state.fed_at = Instant::now().checked_sub(Duration::from_millis(1600));
        assert!(state.feed(generation, timeout));
        assert!(
            state
                .late_keepalive
                .is_some_and(|gap| gap >= Duration::from_millis(1600)),
            "{:?}",
            state.late_keepalive
        );
    }

    #[test]
    fn an_expiry_waits_a_while_for_requests_queued_in_the_device_but_not_for_ever() {
        let deadline = Instant::now();
        let after = |ms| deadline + Duration::from_millis(ms);
        assert!(!due(None, after(0), || false), "disarmed");
        assert!(!due(Some(deadline), deadline - Duration::from_millis(1), || false));
        assert!(
            due(Some(deadline), after(0), || false),
            "nothing queued: at the deadline"
        );
        assert!(
            !due(Some(deadline), after(0), || true),
            "a keep-alive waits to be served"
        );
        assert!(!due(Some(deadline), after(4_999), || true));
        assert!(
            due(Some(deadline), after(5_000), || true),
            "a device thread that never serves"
        );
    }

    #[test]
    fn a_queue_is_known_only_from_a_readable_count_above_zero() {
        let dir = std::env::temp_dir().join(format!("nodemedic-lab-queue-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let waiting = dir.join("waiting");
        assert!(!backlog(None));
        assert!(!backlog(Some(&waiting)), "unreadable");
        std::fs::write(&waiting, "0\n").expect("write");
        assert!(!backlog(Some(&waiting)));
        std::fs::write(&waiting, "2\n").expect("write");
        assert!(backlog(Some(&waiting)));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn after_a_stall_of_the_lab_expiries_wait_for_the_queued_keep_alives() {
        let start = Instant::now();
        let period = Duration::from_millis(50);
        let mut stalls = Stalls::new(start, period);
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(stalls.stalled(at(50)), None);
        assert!(stalls.may_judge(at(50)), "on time: judged at once");
        assert_eq!(stalls.stalled(at(2050)), Some(Duration::from_millis(1950)));
        assert!(!stalls.may_judge(at(2050)), "right after a stall");
        assert_eq!(stalls.stalled(at(2100)), None);
        assert!(!stalls.may_judge(at(2250)));
        assert!(stalls.may_judge(at(2300)), "once the device threads had their turn");
    }
}
