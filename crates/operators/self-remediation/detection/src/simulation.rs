//! The detector in simulation: members running foca (SWIM) in one process, on a virtual clock,
//! over a network that loses and delays packets. It measures what the settings' bounds promise
//! (how soon a crashed member is declared down) and what they must not cause (live members
//! declared down on a slow, lossy network), for clusters larger than a lab holds. Members are the
//! agents' own: their identity ([`Peer`], a new generation on each rejoin), foca's configuration
//! and their periodic announces ([`swim::announce_to`]).

use std::{cmp::Reverse, collections::BinaryHeap, time::Duration};

use foca::{AccumulatingRuntime, Codec, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::{
    DetectorSettings,
    swim::{self, ANNOUNCE_EVERY, Peer, Standing},
};

/// Member `index`'s node name.
fn node(index: usize) -> String {
    format!("m{index}")
}

/// The index of the member `peer` is a life of.
fn index(peer: &Peer) -> usize {
    peer.node
        .strip_prefix('m')
        .and_then(|i| i.parse().ok())
        .unwrap_or(usize::MAX)
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
    Timer { member: usize, timer: Timer<Peer> },
    Announce { member: usize },
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
    members: Vec<Foca<Peer, PostcardCodec, StdRng, NoCustomBroadcast>>,
    standings: Vec<Standing>,
    alive: Vec<bool>,
    /// Until when each member's process is stalled: what reaches it waits, its timers fire late.
    stalled_until: Vec<Duration>,
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
                let id = Peer {
                    node: node(i),
                    generation: 1,
                };
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
            standings: vec![Standing::default(); size],
            alive: vec![true; size],
            stalled_until: vec![Duration::ZERO; size],
            network,
            rng: StdRng::seed_from_u64(seed),
            downs: Vec::new(),
        };
        let first = simulation.members[0].identity().clone();
        for member in 1..size {
            let mut runtime = AccumulatingRuntime::new();
            let _ = simulation.members[member].announce(first.clone(), &mut runtime);
            simulation.drain(member, &mut runtime);
        }
        for member in 0..size {
            simulation.schedule(ANNOUNCE_EVERY, Event::Announce { member });
        }
        simulation
    }

    pub(crate) fn now(&self) -> Duration {
        self.now
    }

    /// Every member alive sees every other alive member, in its current life, as active.
    pub(crate) fn converged(&self) -> bool {
        let alive: Vec<&Foca<Peer, PostcardCodec, StdRng, NoCustomBroadcast>> = self
            .members
            .iter()
            .zip(&self.alive)
            .filter_map(|(m, a)| a.then_some(m))
            .collect();
        alive.iter().all(|m| {
            alive
                .iter()
                .filter(|other| other.identity() != m.identity())
                .all(|other| m.iter_members().any(|known| known.id() == other.identity()))
        })
    }

    /// Every member receives, at this instant, a peer's notice that it was declared down (what a
    /// stall makes foca 1.0 send after refuted suspicions, [`swim::may_send`]): each joins again
    /// under a new generation before any other's news of it arrives.
    pub(crate) fn tell_every_member_it_is_down(&mut self) {
        let size = self.members.len();
        let notices: Vec<Vec<u8>> = (0..size)
            .map(|member| {
                let header = foca::Header {
                    src: self.members[(member + 1) % size].identity().clone(),
                    src_incarnation: 0,
                    dst: self.members[member].identity().clone(),
                    message: foca::Message::TurnUndead,
                };
                let mut bytes = Vec::new();
                let _ = PostcardCodec.encode_header(&header, &mut bytes);
                bytes
            })
            .collect();
        for (member, notice) in notices.iter().enumerate() {
            let mut runtime = AccumulatingRuntime::new();
            let _ = self.members[member].handle_data(notice, &mut runtime);
            self.drain(member, &mut runtime);
        }
    }

    /// Stalls `member`'s process from `from` (at or after now) for `length`.
    pub(crate) fn stall(&mut self, member: usize, from: Duration, length: Duration) {
        self.run_until(from);
        self.stalled_until[member] = self.stalled_until[member].max(from + length);
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
                Event::Announce { member } => *member,
            };
            if !self.alive[member] {
                continue;
            }
            if self.stalled_until[member] > at {
                let wait = self.stalled_until[member] - at;
                self.schedule(wait, event);
                continue;
            }
            let mut runtime = AccumulatingRuntime::new();
            let _ = match event {
                Event::Data { bytes, .. } => self.members[member].handle_data(&bytes, &mut runtime),
                Event::Timer { timer, .. } => self.members[member].handle_timer(timer, &mut runtime),
                Event::Announce { .. } => {
                    self.schedule(ANNOUNCE_EVERY, Event::Announce { member });
                    self.announce(member, &mut runtime)
                }
            };
            self.drain(member, &mut runtime);
        }
        self.now = until;
    }

    /// The member's periodic announce, as the agents make it.
    fn announce(&mut self, member: usize, runtime: &mut AccumulatingRuntime<Peer>) -> Result<(), foca::Error> {
        let registered: Vec<String> = (0..self.members.len()).map(node).collect();
        let foca = &self.members[member];
        let to = swim::announce_to(
            &foca.identity().node,
            registered.iter().map(String::as_str),
            foca.iter_membership_state().map(|m| (m.id(), m.state())),
            self.standings[member],
        );
        for node in to {
            self.members[member].announce(Peer { node, generation: 0 }, &mut *runtime)?;
        }
        Ok(())
    }

    fn drain(&mut self, member: usize, runtime: &mut AccumulatingRuntime<Peer>) {
        while let Some((to, bytes)) = runtime.to_send() {
            let members = self.members[member]
                .iter_membership_state()
                .map(|m| (m.id(), m.state()));
            if !swim::may_send(&to, &bytes, members) {
                continue;
            }
            if self.rng.random_bool(self.network.loss) {
                continue;
            }
            let jitter = self.network.jitter.as_secs_f64() * (self.rng.random::<f64>() * 2.0 - 1.0);
            let delay = Duration::from_secs_f64((self.network.base.as_secs_f64() + jitter).max(0.0));
            self.schedule(
                delay,
                Event::Data {
                    to: index(&to),
                    bytes: bytes.to_vec(),
                },
            );
        }
        while let Some((after, timer)) = runtime.to_schedule() {
            self.schedule(after, Event::Timer { member, timer });
        }
        while let Some(notification) = runtime.to_notify() {
            self.standings[member].heard(&notification);
            if let OwnedNotification::MemberDown(subject) = notification {
                self.downs.push((self.now, member, index(&subject)));
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
