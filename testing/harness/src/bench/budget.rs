//! The memory the benchmarks' targets allow, and the ceilings CI checks that follow from them
//! (tests/e2e/footprint.rs). No I/O.
//!
//! The controller's target is a peak resident set at 5,000 nodes. Part of any controller's
//! memory does not depend on the cluster (its executable's pages, its runtime, its clients); the
//! rest grows with the nodes. The target's room above an idle controller on an empty cluster,
//! shared among its 5,000 nodes, is what each node may cost: CI checks that the controller grows
//! by no more than that per node from an empty cluster to a fleet, which holds for a debug build
//! as for a release one (their idle sizes differ, what each node adds does not).

/// The scale bench's target: the controller's peak resident memory with this many nodes, 10% of
/// them failing at once.
pub const CONTROLLER_PEAK_MIB: f64 = 64.0;
pub const CONTROLLER_TARGET_NODES: usize = 5000;
/// The release controller's resident memory on a cluster with no node, idle (the scale bench
/// with `--fleet 0`, 2026-11-28).
pub const CONTROLLER_IDLE_MIB: f64 = 23.6;

/// What each node may add to the controller's memory (KiB).
pub fn controller_per_node_kib() -> f64 {
    (CONTROLLER_PEAK_MIB - CONTROLLER_IDLE_MIB) * 1024.0 / CONTROLLER_TARGET_NODES as f64
}

/// What the controller may grow by from an empty cluster to `nodes` nodes (KiB).
pub fn controller_growth_kib(nodes: usize) -> f64 {
    controller_per_node_kib() * nodes as f64
}

/// What the release controller keeps resident besides what it allocates, at 5,000 nodes: its
/// executable's and libraries' pages (62.4 MiB resident, 39.7 MiB of it allocated:
/// `bench/results/scale-20261206T090603Z`).
pub const CONTROLLER_EXECUTABLE_RESIDENT_MIB: f64 = 22.7;

/// What the controller may allocate at its peak on any fleet up to the target's (KiB): the target
/// less its executable's resident pages. A debug build allocates about as much as a release one.
pub fn controller_allocated_kib() -> f64 {
    (CONTROLLER_PEAK_MIB - CONTROLLER_EXECUTABLE_RESIDENT_MIB) * 1024.0
}

/// The footprint bench's target: an agent's resident memory, at rest and in a peer storm.
pub const AGENT_TARGET_MIB: f64 = 15.0;
/// What the shipped agent (cargo profile `agent`) keeps resident besides what it allocates: the
/// pages of its executable and libraries it touches (11.5 MiB resident, 2.4 MiB of it allocated,
/// with the peer detector on: `bench/results/footprint-20261127T231304Z`).
pub const AGENT_EXECUTABLE_RESIDENT_MIB: f64 = 9.0;

/// What an agent may allocate (KiB): the target less its executable's resident pages. A debug
/// build's pages are many more, its allocations about the same.
pub fn agent_allocated_kib() -> f64 {
    (AGENT_TARGET_MIB - AGENT_EXECUTABLE_RESIDENT_MIB) * 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_ceiling_leaves_the_executable_its_pages() {
        let measured_at_target = 39.7 * 1024.0;
        assert!(measured_at_target <= controller_allocated_kib());
        assert!(controller_allocated_kib() < CONTROLLER_PEAK_MIB * 1024.0);
    }

    #[test]
    fn the_target_is_met_exactly_when_every_node_costs_its_share() {
        let at_target = CONTROLLER_IDLE_MIB * 1024.0 + controller_growth_kib(CONTROLLER_TARGET_NODES);
        assert!((at_target - CONTROLLER_PEAK_MIB * 1024.0).abs() < 1e-6);
        assert!(controller_growth_kib(1000) < controller_growth_kib(5000));
    }
}
