//! A slow, lossy link for a node, as netem would make it (this machine's kernel has no netem):
//! an iptables rule in the node's namespace queues every packet its interface sends to user
//! space, where a thread of the lab, in that namespace, holds each for the delay (uniform in
//! `delay ± jitter`) or drops it. With `--queue-bypass`, packets pass untouched once the thread
//! is gone.
//!
//! Queue numbers are per namespace, and a queue stays bound while any process holds the socket
//! that bound it. The `nfq` crate opens that socket without close-on-exec and does not expose
//! it, so a process the lab starts in a slow window (an agent after a power cycle) inherits it
//! and keeps the queue bound long after the link is restored. Each slowed link therefore takes
//! a queue number this process has not used before: a stale binding neither blocks the next
//! slow link nor receives its packets.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU16, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use rand::Rng;

use crate::{Error, Result, cmd};

/// The next packet queue number to hand out (wrapping: 65,536 slow links per lab process).
static NEXT_QUEUE: AtomicU16 = AtomicU16::new(0);

/// How the link misbehaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Impairment {
    pub delay: Duration,
    pub jitter: Duration,
    pub loss_percent: f64,
}

/// One node's slowed link; dropping it restores the link.
pub(crate) struct SlowLink {
    netns: String,
    queue: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn rule(netns: &str, queue: u16, action: &str) -> Result<String> {
    let queue = queue.to_string();
    cmd::run(
        "ip",
        &[
            "netns",
            "exec",
            netns,
            "iptables",
            action,
            "OUTPUT",
            "-o",
            "eth0",
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue,
            "--queue-bypass",
        ],
    )
}

impl SlowLink {
    pub(crate) fn start(netns: &str, impairment: Impairment) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let queue = NEXT_QUEUE.fetch_add(1, Ordering::Relaxed);
        let (ready, bound) = std::sync::mpsc::channel();
        let thread = {
            let (netns, stop) = (netns.to_owned(), stop.clone());
            std::thread::spawn(move || {
                if let Err(error) = hold_packets(&netns, queue, impairment, &stop, &ready) {
                    let _ = ready.send(Err(error));
                }
            })
        };
        let link = Self {
            netns: netns.to_owned(),
            queue,
            stop,
            thread: Some(thread),
        };
        bound
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| Error::Invalid(format!("{netns}: the slow link's queue did not start")))?
            .map_err(Error::Invalid)?;
        rule(netns, queue, "-A")?;
        Ok(link)
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        let _ = rule(&self.netns, self.queue, "-D");
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs in the node's namespace: binds the queue, then releases each packet when it is due.
fn hold_packets(
    netns: &str,
    queue_number: u16,
    impairment: Impairment,
    stop: &AtomicBool,
    ready: &std::sync::mpsc::Sender<std::result::Result<(), String>>,
) -> std::result::Result<(), String> {
    let namespace = std::fs::File::open(format!("/run/netns/{netns}")).map_err(|e| format!("{netns}: {e}"))?;
    nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns {netns}: {e}"))?;
    let mut queue = nfq::Queue::open().map_err(|e| format!("opening the packet queue: {e}"))?;
    queue
        .bind(queue_number)
        .map_err(|e| format!("binding packet queue {queue_number}: {e}"))?;
    queue.set_nonblocking(true);
    let _ = ready.send(Ok(()));
    let mut rng = rand::rng();
    let mut held: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut packets = std::collections::HashMap::new();
    let mut sequence = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        while let Ok(mut packet) = queue.recv() {
            idle = false;
            if rng.random_bool((impairment.loss_percent / 100.0).clamp(0.0, 1.0)) {
                packet.set_verdict(nfq::Verdict::Drop);
                let _ = queue.verdict(packet);
                continue;
            }
            let jitter = impairment.jitter.as_secs_f64() * (rng.random::<f64>() * 2.0 - 1.0);
            let delay = Duration::from_secs_f64((impairment.delay.as_secs_f64() + jitter).max(0.0));
            sequence += 1;
            held.push(Reverse((Instant::now() + delay, sequence)));
            packets.insert(sequence, packet);
        }
        let now = Instant::now();
        while held.peek().is_some_and(|Reverse((due, _))| *due <= now) {
            let Some(Reverse((_, id))) = held.pop() else { break };
            if let Some(mut packet) = packets.remove(&id) {
                packet.set_verdict(nfq::Verdict::Accept);
                let _ = queue.verdict(packet);
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for (_, mut packet) in packets {
        packet.set_verdict(nfq::Verdict::Accept);
        let _ = queue.verdict(packet);
    }
    Ok(())
}
