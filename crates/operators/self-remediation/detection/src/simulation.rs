//! The detector in simulation: members running foca (SWIM) in one process, on a virtual clock,
//! over a network that loses and delays packets. It measures what the settings' bounds promise
//! (how soon a crashed member is declared down) and what they must not cause (live members
//! declared down on a slow, lossy network), for clusters larger than a lab holds.

use std::{cmp::Reverse, collections::BinaryHeap, time::Duration};

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use crate::DetectorSettings;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Id(pub u16);

impl foca::Identity for Id {
    type Addr = u16;

    fn renew(&self) -> Option<Self> {
        None
    }

    fn addr(&self) -> u16 {
        self.0
    }

    fn win_addr_conflict(&self, _adversary: &Self) -> bool {
        false
    }
}

/// One-way delay `base ± jitter` (uniform) and the chance of losing each packet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Network {
    pub base: Duration,
    pub jitter: Duration,
    pub loss: f64,
}

impl Network {
    pub(crate) const LAN: Network = Network {
        base: Duration::from_micros(200),
        jitter: Duration::from_micros(100),
        loss: 0.0,
    };
}

enum Event {
    Data { to: usize, bytes: Vec<u8> },
    Timer { member: usize, timer: Timer<Id> },
}

/// An event due at `at`; `sequence` keeps events due at once in the order they were scheduled.
struct Scheduled {
    at: Duration,
    sequence: u64,
    event: Event,
}

impl Scheduled {
    fn key(&self) -> (Duration, u64) {
        (self.at, self.sequence)
    }
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

pub(crate) struct Simulation {
    now: Duration,
    sequence: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    members: Vec<Foca<Id, PostcardCodec, StdRng, NoCustomBroadcast>>,
    alive: Vec<bool>,
    network: Network,
    rng: StdRng,
    /// (when, observer, subject) of every "member down" notification.
    pub downs: Vec<(Duration, usize, usize)>,
}

impl Simulation {
    /// `size` members, every one announced to member 0 at time zero.
    pub(crate) fn new(size: usize, settings: &DetectorSettings, network: Network, seed: u64) -> Self {
        let members = (0..size)
            .map(|i| {
                let id = Id(u16::try_from(i).unwrap_or(u16::MAX));
                Foca::new(
                    id,
                    crate::swim::config(settings),
                    StdRng::seed_from_u64(seed ^ (i as u64) << 32),
                    PostcardCodec,
                )
            })
            .collect();
        let mut simulation = Self {
            now: Duration::ZERO,
            sequence: 0,
            queue: BinaryHeap::new(),
            members,
            alive: vec![true; size],
            network,
            rng: StdRng::seed_from_u64(seed),
            downs: Vec::new(),
        };
        for member in 1..size {
            let mut runtime = AccumulatingRuntime::new();
            let _ = simulation.members[member].announce(Id(0), &mut runtime);
            simulation.drain(member, &mut runtime);
        }
        simulation
    }

    pub(crate) fn now(&self) -> Duration {
        self.now
    }

    /// Every member alive sees every other alive member as active.
    pub(crate) fn converged(&self) -> bool {
        let alive = self.alive.iter().filter(|a| **a).count();
        self.members
            .iter()
            .zip(&self.alive)
            .filter(|(_, a)| **a)
            .all(|(m, _)| m.num_members() + 1 == alive)
    }

    /// The member stops: no packet reaches it, none leaves it, its timers never fire.
    pub(crate) fn crash(&mut self, member: usize) {
        self.alive[member] = false;
    }

    pub(crate) fn run_until(&mut self, until: Duration) {
        while self.queue.peek().is_some_and(|Reverse(next)| next.at <= until) {
            let Some(Reverse(Scheduled { at, event, .. })) = self.queue.pop() else {
                break;
            };
            self.now = at;
            let member = match &event {
                Event::Data { to, .. } => *to,
                Event::Timer { member, .. } => *member,
            };
            if !self.alive[member] {
                continue;
            }
            let mut runtime = AccumulatingRuntime::new();
            let _ = match event {
                Event::Data { bytes, .. } => self.members[member].handle_data(&bytes, &mut runtime),
                Event::Timer { timer, .. } => self.members[member].handle_timer(timer, &mut runtime),
            };
            self.drain(member, &mut runtime);
        }
        self.now = until;
    }

    fn drain(&mut self, member: usize, runtime: &mut AccumulatingRuntime<Id>) {
        while let Some((to, bytes)) = runtime.to_send() {
            if self.rng.random_bool(self.network.loss) {
                continue;
            }
            let jitter = self.network.jitter.as_secs_f64() * (self.rng.random::<f64>() * 2.0 - 1.0);
            let delay = Duration::from_secs_f64((self.network.base.as_secs_f64() + jitter).max(0.0));
            self.schedule(
                delay,
                Event::Data {
                    to: usize::from(to.0),
                    bytes: bytes.to_vec(),
                },
            );
        }
        while let Some((after, timer)) = runtime.to_schedule() {
            self.schedule(after, Event::Timer { member, timer });
        }
        while let Some(notification) = runtime.to_notify() {
            if let OwnedNotification::MemberDown(subject) = notification {
                self.downs.push((self.now, member, usize::from(subject.0)));
            }
        }
    }

    fn schedule(&mut self, after: Duration, event: Event) {
        self.sequence += 1;
        self.queue.push(Reverse(Scheduled {
            at: self.now + after,
            sequence: self.sequence,
            event,
        }));
    }

    pub(crate) fn is_alive(&self, member: usize) -> bool {
        self.alive[member]
    }
}

#[cfg(test)]
mod tests;
