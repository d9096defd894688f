//! The episodes a trial is made of, each a fault (or a few) and its undoing, drawn one after
//! the other: node faults with disturbances on top, flapping, short and long control-plane
//! outages, controller restart loops and membership churn.

use nodemedic_lab::Fault;
use rand::{Rng, rngs::StdRng};

use super::{Action, PathKind, Shape, Slot, Step};

/// Node faults held at least this long should get a remediation (see the verdict's budget).
pub(super) const LONG_HOLD_MS: (u64, u64) = (26_000, 50_000);
const SHORT_HOLD_MS: (u64, u64) = (3_000, 9_000);
/// A long control-plane outage: longer than the 30 s bound agents once had on their view of the
/// peers (`peerUpdateInterval` in the lab's config), and than `L + W` (4 s + 5 s at the lab's
/// timings) by far, so an agent that needed the API to stay licensed would fence.
pub const LONG_OUTAGE_MS: (u64, u64) = (90_000, 300_000);
/// Watched after a long outage before anything else happens: the health check's detection
/// and duration (25 s in the lab) plus the controller's re-election (its 15 s lease) and then
/// some, so a healthy node wrongly remediated once the control plane is back is seen.
pub const AFTERMATH_MS: u64 = 60_000;
/// When a node crashes after a long control-plane outage, from the restart (version 5): while
/// the API may still be starting (etcd's can take two minutes), and while a watch asleep in a
/// 30 s backoff would not be back yet.
pub(super) const CRASH_AFTER_OUTAGE_MS: (u64, u64) = (5_000, 40_000);
/// The longest control-plane outage drawn while a node fault holds.
pub(super) const SHORT_OUTAGE_MAX_MS: u64 = 8_000;
/// A slow lossy network: the delay each way (its jitter half of it), the loss, how long it
/// lasts. Within what the lab's fast timings allow (500 ms API and peer timeouts: the
/// agents' own settings, not the detector's, bound how slow a network they stay licensed on);
/// `peer_detection`'s lab test holds 200 ms ± 100 ms and 5 % loss with the seed's timings.
pub(super) const SLOW_DELAY_MS: (u64, u64) = (30, 120);
pub(super) const SLOW_LOSS_PERMILLE_MAX: u32 = 30;
const SLOW_HOLD_MS: (u64, u64) = (30_000, 60_000);
/// Watched after the links are restored: a suspicion raised while they were slow that led to
/// a remediation would show by then (the lab's health check waits 25 s at most).
pub const SLOW_AFTERMATH_MS: u64 = 30_000;
/// How long a node's disk stays full, and how long after it is freed the trial watches: a
/// remediation of the full node would have started by then (the lab's check waits 25 s at most).
const DISK_HOLD_MS: (u64, u64) = (30_000, 60_000);
const DISK_AFTERMATH_MS: u64 = 30_000;
/// How long an agent or the control plane is starved, and how long after the trial watches.
const STARVED_HOLD_MS: (u64, u64) = (30_000, 90_000);
const STARVED_AFTERMATH_MS: u64 = 30_000;
/// A rolling upgrade's reboots: each node down longer than the lab's health check waits (25 s at
/// most), then up this long before the next goes down (its kubelet Ready, its agent licensed).
const REBOOT_DOWN_MS: (u64, u64) = (30_000, 45_000);
const REBOOT_UP_MS: (u64, u64) = (20_000, 30_000);
/// Watched after an upgrade is withdrawn: a node left unremediated by the upgrade, or remediated
/// once it is over though healthy, would show by then.
const UPGRADE_AFTERMATH_MS: u64 = 30_000;
/// How often the first episode of a self-remediation trial is membership churn.
const CHURN: f64 = 0.3;

pub(super) struct Builder {
    pub rng: StdRng,
    shape: Shape,
    /// The plan version (see [`super::PLAN_VERSION`]): which episodes there are to draw.
    version: u32,
    pub steps: Vec<Step>,
    /// Where the next episode starts.
    pub t: u64,
}

impl Builder {
    pub(super) fn new(rng: StdRng, shape: Shape, version: u32) -> Self {
        Self {
            rng,
            shape,
            version,
            steps: Vec::new(),
            t: 0,
        }
    }

    fn push(&mut self, at_ms: u64, action: Action) {
        self.steps.push(Step { at_ms, action });
    }

    /// The workload's node more often than any other.
    fn node(&mut self) -> Slot {
        if self.rng.random_bool(0.6) {
            0
        } else {
            self.rng.random_range(1..self.shape.nodes)
        }
    }

    fn long_hold(&mut self) -> u64 {
        self.rng.random_range(LONG_HOLD_MS.0..=LONG_HOLD_MS.1)
    }

    fn hold(&mut self) -> u64 {
        if self.rng.random_bool(0.7) {
            self.long_hold()
        } else {
            self.rng.random_range(SHORT_HOLD_MS.0..=SHORT_HOLD_MS.1)
        }
    }

    /// Draws one episode from `self.t` on and moves `self.t` to its end. Churn comes only first:
    /// then slot 0 still runs the workload, so its removals never take the workload's node.
    pub(super) fn episode(&mut self, first: bool) {
        let start = self.t;
        if first && self.shape.churns() && self.rng.random_bool(CHURN) {
            self.t = self.churn(start);
            return;
        }
        // Only a fault held steadily gets disturbances on top (a flapping node has gaps).
        // Each version adds its kinds at the end: the draws of earlier versions stay as they
        // were.
        let kinds = match self.version {
            1 => 19,
            2 => 21,
            3 => 27,
            _ => 29,
        };
        let kind = self.rng.random_range(0..kinds);
        let kind = if self.shape.real_nodes {
            real_node_kind(kind)
        } else {
            kind
        };
        let (targets, end) = match kind {
            0..=2 => self.simple(
                start,
                |n| Action::Fault(Fault::Crash { node: n }),
                |n| Action::Fault(Fault::PowerOn { node: n }),
            ),
            3..=4 => self.simple(
                start,
                |n| Action::Fault(Fault::Freeze { node: n }),
                |n| Action::Fault(Fault::Thaw { node: n }),
            ),
            5..=7 => self.partition(start),
            8..=9 => self.simple(
                start,
                |n| Action::Fault(Fault::IsolateFromApi { node: n }),
                |n| Action::Fault(Fault::Heal { node: n }),
            ),
            10 => (Vec::new(), self.flap(start)),
            11 => (Vec::new(), self.control_plane(start)),
            12..=14 => (Vec::new(), self.long_outage(start)),
            15..=16 => (Vec::new(), self.slow_network(start)),
            17..=18 => (Vec::new(), self.restart_loop(start)),
            19..=20 => (Vec::new(), self.disk_full(start)),
            21..=23 => (Vec::new(), self.starved_agent(start)),
            24..=26 => (Vec::new(), self.slow_control_plane(start)),
            _ => (Vec::new(), self.rolling_upgrade(start)),
        };
        if !targets.is_empty() && end - start >= LONG_HOLD_MS.0 {
            self.disturb(start, end, &targets);
        }
        self.t = end;
    }

    fn simple(&mut self, start: u64, fault: fn(Slot) -> Action, heal: fn(Slot) -> Action) -> (Vec<Slot>, u64) {
        let node = self.node();
        let end = start + self.hold();
        self.push(start, fault(node));
        self.push(end, heal(node));
        (vec![node], end)
    }

    /// A minority only: a majority cut from the API server leaves no budget to remediate it.
    fn partition(&mut self, start: u64) -> (Vec<Slot>, u64) {
        let first = self.node();
        let mut nodes = vec![first];
        let max = (self.shape.nodes - 1) / 2;
        if max >= 2 && self.rng.random_bool(0.5) {
            let others: Vec<Slot> = (0..self.shape.nodes).filter(|n| *n != first).collect();
            nodes.push(others[self.rng.random_range(0..others.len())]);
        }
        let end = start + self.hold();
        self.push(start, Action::Fault(Fault::Partition { nodes: nodes.clone() }));
        for n in &nodes {
            self.push(end, Action::Fault(Fault::Heal { node: *n }));
        }
        (nodes, end)
    }

    /// A node dropping off the network and back, a few times.
    fn flap(&mut self, start: u64) -> u64 {
        let node = self.node();
        let mut t = start;
        for _ in 0..self.rng.random_range(2..=4) {
            self.push(t, Action::Fault(Fault::Partition { nodes: vec![node] }));
            t += self.rng.random_range(3_000..10_000);
            self.push(t, Action::Fault(Fault::Heal { node }));
            t += self.rng.random_range(3_000..8_000);
        }
        t
    }

    fn control_plane(&mut self, start: u64) -> u64 {
        let mut t = start;
        match self.rng.random_range(0..3) {
            0 => {
                self.push(t, Action::Fault(Fault::StopApiserver));
                t += self.rng.random_range(2_000..SHORT_OUTAGE_MAX_MS);
                self.push(t, Action::Fault(Fault::StartApiserver));
            }
            1 => self.push(t, Action::Fault(Fault::RestartEtcd)),
            _ => {
                self.push(t, Action::RestartController { mid_remediation: false });
                if self.shape.path == PathKind::SelfRemediation {
                    let node = self.rng.random_range(0..self.shape.nodes);
                    self.push(
                        t + 1_000,
                        Action::RestartAgent {
                            node,
                            mid_remediation: false,
                        },
                    );
                }
            }
        }
        t + 5_000
    }

    /// The API server or etcd gone for minutes with every node healthy (no remediation can be
    /// created meanwhile anyway): nobody may fence, and nothing healthy may be remediated once
    /// it is back, which [`AFTERMATH_MS`] of quiet lets the verdict see. From version 5, half
    /// the time a node crashes [`CRASH_AFTER_OUTAGE_MS`] after the restart: it must be
    /// remediated as fast as at any other time (the verdict's `SlowRemediation`), while every
    /// other node stays unremediated.
    fn long_outage(&mut self, start: u64) -> u64 {
        let lasts = self.rng.random_range(LONG_OUTAGE_MS.0..=LONG_OUTAGE_MS.1);
        let (stop, back) = if self.rng.random_bool(0.5) {
            (
                Action::Fault(Fault::StopApiserver),
                Action::Fault(Fault::StartApiserver),
            )
        } else {
            (Action::Fault(Fault::StopEtcd), Action::Fault(Fault::StartEtcd))
        };
        self.push(start, stop);
        self.push(start + lasts, back);
        let mut end = start + lasts + AFTERMATH_MS;
        if self.version >= 5 && self.rng.random_bool(0.5) {
            let node = self.node();
            let at = start + lasts + self.rng.random_range(CRASH_AFTER_OUTAGE_MS.0..=CRASH_AFTER_OUTAGE_MS.1);
            let on = at + self.long_hold();
            self.push(at, Action::Fault(Fault::Crash { node }));
            self.push(on, Action::Fault(Fault::PowerOn { node }));
            end = end.max(on);
        }
        end
    }

    /// Every link slow and lossy for a while, every node healthy: nobody may be fenced or
    /// remediated, and the peer failure detector may not call a live node unreachable.
    fn slow_network(&mut self, start: u64) -> u64 {
        let delay_ms = self.rng.random_range(SLOW_DELAY_MS.0..=SLOW_DELAY_MS.1);
        let loss_permille = self.rng.random_range(0..=SLOW_LOSS_PERMILLE_MAX);
        let lasts = self.rng.random_range(SLOW_HOLD_MS.0..=SLOW_HOLD_MS.1);
        self.push(
            start,
            Action::Fault(Fault::SlowLinks {
                delay_ms,
                jitter_ms: delay_ms / 2,
                loss_permille,
                nodes: Vec::new(),
            }),
        );
        self.push(start + lasts, Action::Fault(Fault::RestoreLinks { nodes: Vec::new() }));
        start + lasts + SLOW_AFTERMATH_MS
    }

    /// A node's disk fills up (its kubelet reports DiskPressure, the node stays connected) for a
    /// while, half the time while another node crashes: the crashed node is remediated, the full
    /// one never, and the workload does not move to it.
    fn disk_full(&mut self, start: u64) -> u64 {
        let node = self.node();
        let freed = start + self.rng.random_range(DISK_HOLD_MS.0..=DISK_HOLD_MS.1);
        self.push(start, Action::Fault(Fault::FillDisk { node }));
        self.push(freed, Action::Fault(Fault::FreeDisk { node }));
        let mut end = freed;
        if self.rng.random_bool(0.5) {
            let others: Vec<Slot> = (0..self.shape.nodes).filter(|n| *n != node).collect();
            let crashed = others[self.rng.random_range(0..others.len())];
            let at = start + self.rng.random_range(2_000..5_000);
            let back = at + self.long_hold();
            self.push(at, Action::Fault(Fault::Crash { node: crashed }));
            self.push(back, Action::Fault(Fault::PowerOn { node: crashed }));
            end = end.max(back);
        }
        end + DISK_AFTERMATH_MS
    }

    /// A node's agent starved of CPU (throttled to 1-5 % of a CPU) or under memory pressure, its
    /// node otherwise healthy, half the time while another node crashes: the crashed node is
    /// remediated, the starved one never (its watchdog is fed, its peers reach it).
    fn starved_agent(&mut self, start: u64) -> u64 {
        let node = self.node();
        let until = start + self.rng.random_range(STARVED_HOLD_MS.0..=STARVED_HOLD_MS.1);
        if self.rng.random_bool(0.5) {
            let percent = self.rng.random_range(1..=5);
            self.push(start, Action::Fault(Fault::StarveAgent { node, percent }));
            self.push(until, Action::Fault(Fault::FeedAgent { node }));
        } else {
            let headroom_mib = self.rng.random_range(16..=128);
            self.push(start, Action::Fault(Fault::SqueezeAgent { node, headroom_mib }));
            self.push(until, Action::Fault(Fault::RelieveAgent { node }));
        }
        let mut end = until;
        if self.rng.random_bool(0.5) {
            let others: Vec<Slot> = (0..self.shape.nodes).filter(|n| *n != node).collect();
            let crashed = others[self.rng.random_range(0..others.len())];
            let at = start + self.rng.random_range(2_000..5_000);
            let back = at + self.long_hold();
            self.push(at, Action::Fault(Fault::Crash { node: crashed }));
            self.push(back, Action::Fault(Fault::PowerOn { node: crashed }));
            end = end.max(back);
        }
        end + STARVED_AFTERMATH_MS
    }

    /// etcd (3-8 % of a CPU: at rest it uses less than a tenth of one) or the API server
    /// (10-25 %) starved of CPU, every node healthy: the control plane answers slowly, and nobody
    /// may be fenced or remediated, then or once it is back.
    fn slow_control_plane(&mut self, start: u64) -> u64 {
        let until = start + self.rng.random_range(STARVED_HOLD_MS.0..=STARVED_HOLD_MS.1);
        let percent = self.rng.random_range(10..=25);
        if self.rng.random_bool(0.5) {
            let percent = percent / 3;
            self.push(start, Action::Fault(Fault::SlowEtcd { percent }));
            self.push(until, Action::Fault(Fault::UnthrottleEtcd));
        } else {
            self.push(start, Action::Fault(Fault::SlowApiserver { percent }));
            self.push(until, Action::Fault(Fault::UnthrottleApiserver));
        }
        until + STARVED_AFTERMATH_MS
    }

    /// The workload's node crashes and, once its remediation is in flight, the controller is
    /// killed and restarted every 5-8 s, 3-8 times: each new leader must carry the remediation
    /// on (its safe-time wait included) rather than start it again, or the loop outlasts it.
    fn restart_loop(&mut self, start: u64) -> u64 {
        self.push(start, Action::Fault(Fault::Crash { node: 0 }));
        // Remediations start about 15 s into a fault; the loop waits (bounded) for one anyway.
        let at = start + self.rng.random_range(15_000..20_000);
        let restarts = self.rng.random_range(3..=8);
        let every_ms = self.rng.random_range(5_000..=8_000);
        self.push(at, Action::RestartControllerLoop { restarts, every_ms });
        let looped = at + u64::from(restarts - 1) * every_ms;
        let end = (looped + self.rng.random_range(5_000..15_000)).max(start + LONG_HOLD_MS.0);
        self.push(end, Action::Fault(Fault::PowerOn { node: 0 }));
        end
    }

    /// Nodes leaving and joining (self remediation only): some leave and rejoin under their
    /// names, the extra node joins and leaves, or both (a swap); half the time the workload's
    /// node crashes while the change is still being agreed, and the departed nodes rejoin and
    /// the extra node leaves while its remediation is in flight. Removals come before the
    /// crash, so the workload moves to a node that stays (the runner taints the extra node so
    /// it never runs it), and never take more than a minority of the lab, counting the crash.
    fn churn(&mut self, start: u64) -> u64 {
        let n = self.shape.nodes;
        let extra = self.shape.extra_slot();
        let crash = self.rng.random_bool(0.5);
        let (leave, join) = match self.rng.random_range(0..3) {
            0 => (true, false),
            1 => (false, true),
            _ => (true, true),
        };
        // Of three nodes, one gone and one crashed leave one: no majority to agree a change
        // with, and below the health check's 51 %. There the extra node's join meets the crash.
        let (leave, join) = if crash && n == 3 { (false, true) } else { (leave, join) };
        let mut t = start;
        if join {
            self.push(t, Action::AddNode { node: extra });
            t += self.rng.random_range(5_000..10_000);
        }
        let mut leaving = Vec::new();
        if leave {
            let count = if n >= 5 && !crash && self.rng.random_bool(0.5) {
                2
            } else {
                1
            };
            let mut others: Vec<Slot> = (1..n).collect();
            for _ in 0..count {
                leaving.push(others.remove(self.rng.random_range(0..others.len())));
            }
            for k in &leaving {
                self.push(t, Action::RemoveNode { node: *k });
                t += self.rng.random_range(2_000..5_000);
            }
        }
        let (mut back, crashed_until) = if crash {
            let at = t + self.rng.random_range(0..3_000);
            self.push(at, Action::Fault(Fault::Crash { node: 0 }));
            (at + self.rng.random_range(15_000..25_000), Some(at + self.long_hold()))
        } else {
            (t + self.rng.random_range(20_000..40_000), None)
        };
        for k in leaving {
            self.push(back, Action::AddNode { node: k });
            back += self.rng.random_range(3_000..8_000);
        }
        if join {
            self.push(back, Action::RemoveNode { node: extra });
            back += self.rng.random_range(3_000..8_000);
        }
        match crashed_until {
            Some(until) => {
                let end = until.max(back);
                self.push(end, Action::Fault(Fault::PowerOn { node: 0 }));
                end
            }
            None => back,
        }
    }

    /// A cluster upgrade as an upgrade tool runs one: announced on every node, then each node
    /// rebooted in turn (down longer than the health check waits), the next once it is back, and
    /// the announcement withdrawn. Nothing may be remediated meanwhile, nor fenced.
    fn rolling_upgrade(&mut self, start: u64) -> u64 {
        let mut order: Vec<Slot> = (0..self.shape.nodes).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, self.rng.random_range(0..=i));
        }
        self.push(start, Action::Upgrade { announced: true });
        let mut t = start + 2_000;
        for node in order {
            self.push(t, Action::Fault(Fault::Crash { node }));
            t += self.rng.random_range(REBOOT_DOWN_MS.0..=REBOOT_DOWN_MS.1);
            self.push(t, Action::Fault(Fault::PowerOn { node }));
            t += self.rng.random_range(REBOOT_UP_MS.0..=REBOOT_UP_MS.1);
        }
        self.push(t, Action::Upgrade { announced: false });
        t + UPGRADE_AFTERMATH_MS
    }

    /// Control-plane, process and BMC faults while the node fault holds, in disjoint windows.
    fn disturb(&mut self, start: u64, end: u64, targets: &[Slot]) {
        let fence_agents = self.shape.path == PathKind::FenceRedfish;
        if fence_agents && self.rng.random_bool(0.4) {
            // Hung from before the remediation starts; resumed before the fault is healed, so a
            // request the BMC took while hung lands while the remediation is still in flight.
            let node = targets[0];
            let hang = start + self.rng.random_range(0..4_000);
            let resume = (hang + self.rng.random_range(5_000..25_000)).min(end - 2_000);
            self.push(hang, Action::Fault(Fault::HangBmc { node }));
            self.push(resume, Action::Fault(Fault::ResumeBmc { node }));
        }
        // Remediations start about 15 s into a fault.
        let mut t = start + self.rng.random_range(15_000..20_000);
        for _ in 0..self.rng.random_range(0..=2) {
            if t + 8_000 >= end {
                break;
            }
            let healthy: Vec<Slot> = (0..self.shape.nodes).filter(|n| !targets.contains(n)).collect();
            match self.rng.random_range(0..4) {
                0 => self.push(t, Action::RestartController { mid_remediation: true }),
                1 if !fence_agents => {
                    let node = healthy[self.rng.random_range(0..healthy.len())];
                    self.push(
                        t,
                        Action::RestartAgent {
                            node,
                            mid_remediation: true,
                        },
                    );
                }
                2 => {
                    self.push(t, Action::Fault(Fault::StopApiserver));
                    t += self.rng.random_range(2_000..6_000);
                    self.push(t, Action::Fault(Fault::StartApiserver));
                }
                _ => self.push(t, Action::Fault(Fault::RestartEtcd)),
            }
            t += self.rng.random_range(2_000..5_000);
        }
    }
}

/// The episode kind a lab of real nodes plays for a drawn `kind`. Long control-plane outages
/// (minutes with every node healthy: nothing of a node's own is exercised, and the kwok
/// campaigns play them) and the disk filling up (a kwok stage, not a real kubelet's eviction
/// manager) become node faults, so real nodes' trials are spent on what differs there: power
/// lost and back, a hung node, cut links, slow links.
fn real_node_kind(kind: u32) -> u32 {
    match kind {
        // Long outages: crashes (a power cycle each), a freeze, a partition.
        12 => 0,
        13 => 3,
        14 => 5,
        // A full disk: API isolation, a crash.
        19 => 8,
        20 => 1,
        // A starved agent (a pod, not a lab process): a freeze, a crash, a partition. The
        // control plane is starved the same way on real nodes.
        21 => 4,
        22 => 2,
        23 => 6,
        other => other,
    }
}
