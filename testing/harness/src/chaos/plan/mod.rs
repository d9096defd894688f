//! A trial's plan, drawn from `(seed, trial index)` alone: the lab's shape, the remediation
//! strategy, and timed fault steps, every fault healed and the lab's shape restored by the last
//! step. Pure and deterministic, so a violation is replayed from its seed and index.
//!
//! The episodes a plan is made of are drawn in [`episodes`], checked by [`validate()`] and
//! counted by [`summary`].

mod episodes;
pub mod summary;
mod validate;

use nodemedic_lab::Fault;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;

pub use episodes::{AFTERMATH_MS, LONG_OUTAGE_MS, SLOW_AFTERMATH_MS};
pub use summary::kind;
pub use validate::validate;

/// Consecutive trials share a lab shape in blocks of this many, so one lab serves a block.
pub const BLOCK: usize = 10;
/// The extra node a churn episode adds and removes again: slot `shape.nodes`.
pub const EXTRA_NODE: &str = "extra-1";

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
    /// Real nodes (kubelets, containerd, real pods) with nodemedic installed by Helm and the
    /// writer StatefulSet on the lab's CSI volumes, rather than kwok nodes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub real_nodes: bool,
}

impl Shape {
    /// Whether nodes can join and leave: a lab with BMCs cannot add nodes (its BMCs are made at
    /// start), so only self remediation's labs churn; nor do real nodes (their agents come
    /// from the DaemonSet, and a real node joining costs a boot and an image import).
    pub fn churns(&self) -> bool {
        self.path == PathKind::SelfRemediation && !self.real_nodes
    }

    /// The slot of [`EXTRA_NODE`].
    pub fn extra_slot(&self) -> Slot {
        self.nodes
    }
}

/// A node by slot: 0 is the node running the workload when the trial starts, the others follow
/// in name order, and slot `shape.nodes` is [`EXTRA_NODE`], in the lab only between its
/// `AddNode` and `RemoveNode`. Resolved when the trial runs, so faults hit the workload's node
/// often.
pub type Slot = usize;

/// A step's action: one of the lab's faults (its nodes by slot), or one of the campaign's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Action {
    /// `mid_remediation`: first wait (bounded) until a remediation is in flight.
    RestartController {
        mid_remediation: bool,
    },
    /// Kills and restarts the controller `restarts` times, `every_ms` apart, the first once a
    /// remediation is in flight (waited for as `mid_remediation` does).
    RestartControllerLoop {
        restarts: u32,
        every_ms: u64,
    },
    RestartAgent {
        node: Slot,
        mid_remediation: bool,
    },
    /// Takes the node out of the cluster for good: its machine off, its Node deleted (its
    /// registration goes with it), as when a machine is decommissioned.
    RemoveNode {
        node: Slot,
    },
    /// Adds the node (back, under its name) with its agent, as when a machine joins.
    AddNode {
        node: Slot,
    },
    /// An upgrade tool announces a cluster upgrade on every node (the annotation
    /// `nodemedic.medik8s.io/upgrade-in-progress`), or withdraws it.
    Upgrade {
        announced: bool,
    },
    /// Spelled as the lab spells it (`{"action": "crash", "node": 0}`).
    #[serde(untagged)]
    Fault(Fault<Slot>),
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
    /// Offset from the trial's start before which its recovery is not awaited, so what the last
    /// faults cause late (a healthy node remediated a while after a long control-plane outage)
    /// is still judged in this trial; at or after the last step.
    pub end_ms: u64,
    /// The plan version it was drawn under (in the report once, not in every plan).
    #[serde(skip)]
    pub version: u32,
}

/// The plan version a campaign draws by default. What a seed draws changes only with a new
/// version, so an old seed, run again under the version its report names, replays the same
/// plans:
/// 1. node, network, control-plane, process, BMC and membership faults;
/// 2. and a node's disk filling up (`fill-disk`), drawn among them (issue 44);
/// 3. and starvation: a node's agent short of CPU or memory, etcd or the API server slowed
///    (issue 46);
/// 4. and rolling upgrades: announced, every node rebooted in turn (issue 48);
/// 5. and, after half the long control-plane outages, a crash shortly after the API answers
///    again, which must be remediated as fast as any other (issue 60).
pub const PLAN_VERSION: u32 = 5;

/// Restrictions from the command line; part of what a plan is drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Only labs of this size (3 or 5).
    pub nodes: Option<usize>,
    /// 1 to [`PLAN_VERSION`].
    pub version: u32,
    /// Labs of real nodes (see [`Shape::real_nodes`]): three nodes unless `nodes` says
    /// otherwise, the paths in turn by block, and only the episodes a real node plays the same
    /// way as a kwok one (see [`episodes`]).
    pub real_nodes: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: None,
            version: PLAN_VERSION,
            real_nodes: false,
        }
    }
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
    let slow_bmc = rng.random_bool(0.3);
    if options.real_nodes {
        // Both paths in any campaign of two blocks or more, whatever the seed.
        let path = if block.is_multiple_of(2) {
            PathKind::SelfRemediation
        } else {
            PathKind::FenceRedfish
        };
        return Shape {
            nodes: options.nodes.unwrap_or(3),
            path,
            slow_bmc: path == PathKind::FenceRedfish && slow_bmc,
            real_nodes: true,
        };
    }
    Shape {
        nodes: options.nodes.unwrap_or(nodes),
        path,
        slow_bmc: path == PathKind::FenceRedfish && slow_bmc,
        real_nodes: false,
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
    let mut b = episodes::Builder::new(rng, shape, options.version);
    let episodes = b.rng.random_range(1..=2);
    for i in 0..episodes {
        if i > 0 {
            b.t += b.rng.random_range(2_000..6_000);
        }
        b.episode(i == 0);
    }
    let end_ms = b.t;
    let mut steps = b.steps;
    // Stable: steps drawn for one moment keep their order (a stop before its start).
    steps.sort_by_key(|s| s.at_ms);
    TrialPlan {
        seed,
        index,
        shape,
        strategy,
        steps,
        end_ms,
        version: options.version,
    }
}
