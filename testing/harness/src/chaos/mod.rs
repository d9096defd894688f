//! The fault campaign (`nodemedic-lab chaos`, `make chaos`): randomized trials, reproducible from a
//! seed, that mix node, network, control-plane (down to minutes-long API server and etcd
//! outages), process (down to controller restart loops), BMC and membership faults (nodes
//! leaving and joining) on 3- and 5-node labs, and judge each trial from the lab timeline.
//!
//! [`plan`] draws a trial's plan and [`verdict`] judges a timeline; both are pure, so they are
//! tested without a lab. [`run`] executes plans in labs.

pub mod plan;
pub mod run;
pub mod verdict;

#[cfg(test)]
mod tests;

pub use plan::{Action, Options, PathKind, Shape, Step, Strategy, TrialPlan, plan, plan_with};
pub use verdict::{Snapshot, Violation, ViolationKind};

/// The command that replays one trial, printed with every violation.
pub fn replay(plan: &TrialPlan, nodes: Option<usize>, peer_detection: bool, chart_defaults: bool) -> String {
    let nodes = nodes.map(|n| format!(" --nodes {n}")).unwrap_or_default();
    let detection = match (peer_detection, chart_defaults) {
        (_, true) => " --chart-defaults",
        (true, false) => " --peer-detection",
        (false, false) => "",
    };
    let real = if plan.shape.real_nodes { " --real-nodes" } else { "" };
    format!(
        "make chaos SEED={} TRIALS={} ARGS=\"--only-trial {}{nodes}{detection}{real} --plan-version {}\"",
        plan.seed,
        plan.index + 1,
        plan.index,
        plan.version
    )
}
