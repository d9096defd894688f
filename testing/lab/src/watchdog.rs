//! A lab watchdog per node. It runs on the host, outside the node's namespace, so a network
//! partition does not stop the feed while a crash or a freeze does. The node's agent opens its
//! socket as it would open `/dev/watchdog`:
//!
//! - on connect the watchdog sends `timeout <milliseconds>\n` (the WDIOC_GETTIMEOUT answer) and is
//!   armed;
//! - each `k\n` the agent writes is a keep-alive;
//! - `V\n` (the magic close) disarms it; a connection closed without it leaves it armed, as with a
//!   real device;
//! - `R\n` resets the node now (what a real agent's software reboot does).
//!
//! When not fed within the timeout it asks the lab to power-cycle the node.
//!
//! The emulated watchdog device ([`crate::watchdog_device`]) keeps its state here too, so both
//! arm, feed and expire the same per-node timer.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixListener,
    sync::mpsc,
    time::Instant,
};

use crate::{Result, error::io, watchdog_device::WatchdogDeviceStats};

#[derive(Default)]
pub(crate) struct State {
    /// Armed with this deadline, or disarmed.
    deadline: Option<Instant>,
    /// Bumped on each arm so a stale connection's feeds do not re-arm a fired watchdog.
    generation: u64,
    /// What the emulated device was programmed with since the node last booted (a driver
    /// starts again from its default at boot).
    pub device_timeout: Option<Duration>,
    pub device_stats: WatchdogDeviceStats,
}

impl State {
    pub(crate) fn arm(&mut self, timeout: Duration) -> u64 {
        self.generation += 1;
        self.deadline = Some(Instant::now() + timeout);
        self.generation
    }

    /// Whether a handle of `generation` still speaks for the armed watchdog.
    pub(crate) fn current(&self, generation: u64) -> bool {
        self.generation == generation && self.deadline.is_some()
    }

    pub(crate) fn feed(&mut self, generation: u64, timeout: Duration) -> bool {
        let current = self.current(generation);
        if current {
            self.deadline = Some(Instant::now() + timeout);
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

    /// Serves the node's watchdog socket at `path`.
    pub(crate) fn serve(&self, node: &str, path: PathBuf, timeout: Duration) -> Result<tokio::task::JoinHandle<()>> {
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(io(format!("binding watchdog socket {}", path.display())))?;
        let this = self.clone();
        let node = node.to_owned();
        self.register(&node);
        Ok(tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let generation = this.arm(&node, timeout);
                let this = this.clone();
                let node = node.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    if write
                        .write_all(format!("timeout {}\n", timeout.as_millis()).as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    let mut lines = BufReader::new(read).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        match line.trim() {
                            "k" => this.feed(&node, generation, timeout),
                            "V" => {
                                this.disarm(&node, generation);
                                break;
                            }
                            "R" => this.expire_now(&node, generation),
                            _ => {}
                        }
                    }
                });
            }
        }))
    }

    fn arm(&self, node: &str, timeout: Duration) -> u64 {
        let Ok(mut all) = self.0.lock() else { return 0 };
        all.entry(node.to_owned()).or_default().arm(timeout)
    }

    fn feed(&self, node: &str, generation: u64, timeout: Duration) {
        self.with_node(node, |state| state.feed(generation, timeout));
    }

    fn expire_now(&self, node: &str, generation: u64) {
        if let Ok(mut all) = self.0.lock()
            && let Some(state) = all.get_mut(node)
            && state.generation == generation
        {
            state.deadline = Some(Instant::now());
        }
    }

    fn disarm(&self, node: &str, generation: u64) {
        self.with_node(node, |state| state.disarm(generation));
    }

    /// Sends the name of every node whose watchdog expires, once per expiry.
    pub(crate) fn expiries(&self, tx: mpsc::UnboundedSender<String>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                let now = Instant::now();
                let expired: Vec<String> = match this.0.lock() {
                    Ok(mut all) => all
                        .iter_mut()
                        .filter(|(_, s)| s.deadline.is_some_and(|d| d <= now))
                        .map(|(node, s)| {
                            s.deadline = None;
                            s.generation += 1;
                            node.clone()
                        })
                        .collect(),
                    Err(_) => Vec::new(),
                };
                for node in expired {
                    let _ = tx.send(node);
                }
            }
        })
    }
}
