//! A trial's plan, drawn from `(seed, trial index)` alone: the lab's shape, the remediation
//! strategy, and timed fault steps, every fault healed by the last step. Pure and deterministic,
//! so a violation is replayed from its seed and index.

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;

/// Consecutive trials share a lab shape in blocks of this many, so one lab serves a block.
pub const BLOCK: usize = 10;
/// Node faults held at least this long should get a remediation (see the verdict's budget).
const LONG_HOLD_MS: (u64, u64) = (26_000, 50_000);
const SHORT_HOLD_MS: (u64, u64) = (3_000, 9_000);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathKind {
    SelfRemediation,
    FenceRedfish,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Strategy {
    ResourceDeletion,
    OutOfServiceTaint,
}

/// What a lab must be for a trial; trials of one shape can share a lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    pub nodes: usize,
    pub path: PathKind,
    /// The BMCs' power transitions take the emulator's realistic 1-11 s (fence agents only).
    pub slow_bmc: bool,
}

/// A node by slot: 0 is the node running the workload when the trial starts, the others follow
/// in name order. Resolved when the trial runs, so faults hit the workload's node often.
pub type Slot = usize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Action {
    Crash {
        node: Slot,
    },
    PowerOn {
        node: Slot,
    },
    Freeze {
        node: Slot,
    },
    Thaw {
        node: Slot,
    },
    /// Cuts these nodes from the API server and every other node (not from each other).
    Partition {
        nodes: Vec<Slot>,
    },
    IsolateFromApi {
        node: Slot,
    },
    /// Undoes a partition or API isolation of the node.
    Heal {
        node: Slot,
    },
    StopApiserver,
    StartApiserver,
    RestartEtcd,
    /// `mid_remediation`: first wait (bounded) until a remediation is in flight.
    RestartController {
        mid_remediation: bool,
    },
    RestartAgent {
        node: Slot,
        mid_remediation: bool,
    },
    HangBmc {
        node: Slot,
    },
    ResumeBmc {
        node: Slot,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Offset from the trial's start; a step runs no earlier, and after the step before it.
    pub at_ms: u64,
    #[serde(flatten)]
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialPlan {
    pub seed: u64,
    pub index: usize,
    pub shape: Shape,
    pub strategy: Strategy,
    pub steps: Vec<Step>,
}

/// Restrictions from the command line; part of what a plan is drawn from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Only labs of this size (3 or 5).
    pub nodes: Option<usize>,
}

pub fn plan(seed: u64, index: usize) -> TrialPlan {
    plan_with(seed, index, Options::default())
}

/// SplitMix64 finaliser over the inputs: neighbouring seeds and indices get unrelated streams.
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// StdRng's algorithm may change between rand releases; Cargo.lock pins the release, so a seed
// replays the same plans as long as the lock does.
fn shape(seed: u64, block: usize, options: Options) -> Shape {
    let mut rng = StdRng::seed_from_u64(mix(seed, block as u64, 1));
    let nodes = if rng.random_bool(0.5) { 3 } else { 5 };
    let path = if rng.random_bool(0.6) {
        PathKind::SelfRemediation
    } else {
        PathKind::FenceRedfish
    };
    Shape {
        nodes: options.nodes.unwrap_or(nodes),
        path,
        slow_bmc: path == PathKind::FenceRedfish && rng.random_bool(0.3),
    }
}

pub fn plan_with(seed: u64, index: usize, options: Options) -> TrialPlan {
    let shape = shape(seed, index / BLOCK, options);
    let mut rng = StdRng::seed_from_u64(mix(seed, index as u64, 2));
    let strategy = if rng.random_bool(0.5) {
        Strategy::ResourceDeletion
    } else {
        Strategy::OutOfServiceTaint
    };
    let mut b = Builder {
        rng,
        shape,
        steps: Vec::new(),
        t: 0,
    };
    let episodes = b.rng.random_range(1..=2);
    for _ in 0..episodes {
        b.episode();
        b.t += b.rng.random_range(2_000..6_000);
    }
    // Stable: steps drawn for one moment keep their order (a stop before its start).
    b.steps.sort_by_key(|s| s.at_ms);
    TrialPlan {
        seed,
        index,
        shape,
        strategy,
        steps: b.steps,
    }
}

struct Builder {
    rng: StdRng,
    shape: Shape,
    steps: Vec<Step>,
    /// Where the next episode starts.
    t: u64,
}

impl Builder {
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

    fn hold(&mut self) -> u64 {
        let (lo, hi) = if self.rng.random_bool(0.7) {
            LONG_HOLD_MS
        } else {
            SHORT_HOLD_MS
        };
        self.rng.random_range(lo..=hi)
    }

    fn episode(&mut self) {
        let start = self.t;
        // Only a fault held steadily gets disturbances on top (a flapping node has gaps).
        let (targets, end) = match self.rng.random_range(0..12) {
            0..=2 => self.simple(start, |n| Action::Crash { node: n }, |n| Action::PowerOn { node: n }),
            3..=4 => self.simple(start, |n| Action::Freeze { node: n }, |n| Action::Thaw { node: n }),
            5..=7 => self.partition(start),
            8..=9 => self.simple(
                start,
                |n| Action::IsolateFromApi { node: n },
                |n| Action::Heal { node: n },
            ),
            10 => (Vec::new(), self.flap(start)),
            _ => (Vec::new(), self.control_plane(start)),
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
        self.push(start, Action::Partition { nodes: nodes.clone() });
        for n in &nodes {
            self.push(end, Action::Heal { node: *n });
        }
        (nodes, end)
    }

    /// A node dropping off the network and back, a few times.
    fn flap(&mut self, start: u64) -> u64 {
        let node = self.node();
        let mut t = start;
        for _ in 0..self.rng.random_range(2..=4) {
            self.push(t, Action::Partition { nodes: vec![node] });
            t += self.rng.random_range(3_000..10_000);
            self.push(t, Action::Heal { node });
            t += self.rng.random_range(3_000..8_000);
        }
        t
    }

    fn control_plane(&mut self, start: u64) -> u64 {
        let mut t = start;
        match self.rng.random_range(0..3) {
            0 => {
                self.push(t, Action::StopApiserver);
                t += self.rng.random_range(2_000..8_000);
                self.push(t, Action::StartApiserver);
            }
            1 => self.push(t, Action::RestartEtcd),
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

    /// Control-plane, process and BMC faults while the node fault holds, in disjoint windows.
    fn disturb(&mut self, start: u64, end: u64, targets: &[Slot]) {
        let fence_agents = self.shape.path == PathKind::FenceRedfish;
        if fence_agents && self.rng.random_bool(0.4) {
            // Hung from before the remediation starts; resumed before the fault is healed, so a
            // request the BMC took while hung lands while the remediation is still in flight.
            let node = targets[0];
            let hang = start + self.rng.random_range(0..4_000);
            let resume = (hang + self.rng.random_range(5_000..25_000)).min(end - 2_000);
            self.push(hang, Action::HangBmc { node });
            self.push(resume, Action::ResumeBmc { node });
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
                    self.push(t, Action::StopApiserver);
                    t += self.rng.random_range(2_000..6_000);
                    self.push(t, Action::StartApiserver);
                }
                _ => self.push(t, Action::RestartEtcd),
            }
            t += self.rng.random_range(2_000..5_000);
        }
    }
}

/// What a plan leaves each node in, step by step; a plan is sound when every step applies to
/// the state it finds and the end state is clean.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NodeState {
    off: bool,
    frozen: bool,
    cut: bool,
    bmc_hung: bool,
}

impl NodeState {
    fn faulted(&self) -> bool {
        self.off || self.frozen || self.cut
    }
}

/// Checks the plan's invariants: sorted steps, only existing nodes, minority partitions, BMC
/// faults only with BMCs and inside a fault of their node, agent restarts only on unfaulted
/// nodes, each fault undone by a later step, and everything healed at the end.
pub fn validate(plan: &TrialPlan) -> Result<(), String> {
    let n = plan.shape.nodes;
    let mut nodes = vec![NodeState::default(); n];
    let mut api_down = false;
    if plan.steps.windows(2).any(|w| w[0].at_ms > w[1].at_ms) {
        return Err("steps out of order".into());
    }
    for step in &plan.steps {
        let bad = |why: &str| Err(format!("{:?} at {} ms: {why}", step.action, step.at_ms));
        let node = |s: Slot| {
            if s < n {
                Ok(s)
            } else {
                Err(format!("slot {s} of {n} nodes"))
            }
        };
        match &step.action {
            Action::Crash { node: s } if !nodes[node(*s)?].off => nodes[*s].off = true,
            Action::PowerOn { node: s } if nodes[node(*s)?].off => nodes[*s].off = false,
            Action::Freeze { node: s } if !nodes[node(*s)?].faulted() => nodes[*s].frozen = true,
            Action::Thaw { node: s } if nodes[node(*s)?].frozen => nodes[*s].frozen = false,
            Action::Partition { nodes: set } => {
                if set.is_empty() || set.len() * 2 >= n {
                    return bad("not a minority");
                }
                for s in set {
                    if nodes[node(*s)?].cut {
                        return bad("already cut");
                    }
                    nodes[*s].cut = true;
                }
            }
            Action::IsolateFromApi { node: s } if !nodes[node(*s)?].cut => nodes[*s].cut = true,
            Action::Heal { node: s } if nodes[node(*s)?].cut => nodes[*s].cut = false,
            Action::StopApiserver if !api_down => api_down = true,
            Action::StartApiserver if api_down => api_down = false,
            Action::RestartEtcd | Action::RestartController { .. } if !api_down => {}
            Action::RestartAgent { node: s, .. }
                if plan.shape.path == PathKind::SelfRemediation && !nodes[node(*s)?].faulted() && !api_down => {}
            Action::HangBmc { node: s }
                if plan.shape.path == PathKind::FenceRedfish && nodes[node(*s)?].faulted() && !nodes[*s].bmc_hung =>
            {
                nodes[*s].bmc_hung = true
            }
            Action::ResumeBmc { node: s } if nodes[node(*s)?].bmc_hung && nodes[*s].faulted() => {
                nodes[*s].bmc_hung = false
            }
            _ => return bad("does not apply to the state before it"),
        }
    }
    if api_down || nodes.iter().any(|s| *s != NodeState::default()) {
        return Err("a fault is left in place at the end".into());
    }
    Ok(())
}
