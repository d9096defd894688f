//! Memory ceilings derived from the benchmarks' targets, so that a change which makes the
//! controller hold more per node, or the agent more at all, cannot land unnoticed (the benches
//! run by hand: the controller went from 57 to 194 MiB at 5,000 nodes over 62 commits nobody
//! measured). Memory, not time: what a process allocates does not depend on how busy the machine
//! is.
//!
//! The figure checked is the allocated memory (RssAnon), sampled every 100 ms: CI runs debug
//! builds, whose resident set is mostly their large executable's pages. How each ceiling follows
//! from its target: [`nodemedic_harness::bench::budget`]. What the controller holds per node:
//! docs/memory.md. The agents' ceiling is checked in the peer detection test (`peer_detection.rs`),
//! where they are busiest.
//!
//! The same fleets check a rule of the scale bench's: at rest the controller makes no request but
//! watches and lease renewals (a once-a-minute GET of discovery went unnoticed until a bench run).

use std::collections::BTreeSet;

use nodemedic_harness::{
    bench::{
        budget, decision, requests,
        usage::{Peak, PeakWatch},
    },
    fleet,
};
use nodemedic_lab::LabConfig;

use crate::support::{lab, scenario};

/// The two fleets the controller runs on. What it holds per node is the difference in its peak
/// over the difference in nodes: both fleets go through the same start-up (their lists a page at
/// a time, more than one page each) and lose the same share of their nodes, so what does not grow
/// with the fleet cancels out, and a copy of every node held anywhere does not.
const SMALL: usize = 400;
const LARGE: usize = 2000;
/// The share of a fleet failing at once, as in the scale bench's second round.
const FAILING_PERCENT: usize = 10;

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

/// Rest begins this long after every node is healthy and the failing nodes fall silent: the
/// controller's start-up may still be finishing (its last one-off lists, a few seconds after the
/// health check's first status).
const REST_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_secs(10);

/// What the controller did on one fleet.
struct OnFleet {
    peak: Peak,
    /// Its requests at rest: from [`REST_AFTER`] after the failing nodes fell silent (every node
    /// healthy, no remediation) until the first of them turned Unknown, it had nothing to do.
    at_rest: requests::Requests,
    rest_seconds: f64,
    /// Its reads of discovery from the rest's beginning until every failing node had its
    /// remediation: no CustomResourceDefinition changed, so none.
    discovery_after_start_up: u64,
}

/// The controller's peak memory on a fleet of `nodes` nodes, from its start through a failure of
/// 10% of them at once (until every one has its remediation), and its requests at rest before.
async fn on_fleet(nodes: usize) -> OnFleet {
    let exe = crate::nodemedic_exe();
    let controller = scenario::sibling_executable(&exe, "nodemedic-controller").expect("the controller is built");
    let lab = lab(LabConfig::fleet(nodes)).await;
    let watch = PeakWatch::start(&controller);
    fleet::start_controller(&lab, &exe, scenario::free_port().expect("a port"))
        .await
        .expect("the controller starts");
    fleet::all_healthy(&lab, nodes).await.expect("every node healthy");
    let failing = fleet::failing(&lab, FAILING_PERCENT);
    let since = jiff::Timestamp::now();
    lab.silence_fleet_nodes(&failing).await.expect("nodes silenced");
    let expected: BTreeSet<String> = failing.into_iter().collect();
    fleet::remediated(&lab, &expected, since)
        .await
        .expect("every silenced node remediated");
    let remediated = jiff::Timestamp::now();
    let peak = watch.stop();
    assert_eq!(
        peak.processes, 1,
        "one controller ran on the {nodes}-node fleet: {peak:?}"
    );
    let rest_ends = decision::first_unhealthy(&lab.timeline().entries(), &expected, since)
        .expect("the silenced nodes turned unhealthy");
    let rest_begins = since + REST_AFTER;
    let log = std::fs::read_to_string(lab.audit_log()).expect("the audit log");
    OnFleet {
        peak,
        at_rest: requests::count(&log, fleet::CONTROLLER_USER, rest_begins, rest_ends),
        rest_seconds: (rest_ends - rest_begins).total(jiff::Unit::Second).unwrap_or(0.0),
        discovery_after_start_up: requests::count(&log, fleet::CONTROLLER_USER, rest_begins, remediated).discovery,
    }
}

/// No request at rest but watches and lease renewals (the scale bench's target: a controller
/// that polls costs every cluster all the time). The health check's outage probe is asked only
/// after 5 s in which no watch said anything: kwok renews a few hundred nodes' leases in bursts,
/// with silences between them that a living cluster's kubelets do not leave.
fn quiet_at_rest(fleet: &OnFleet, nodes: usize) {
    let at_rest = &fleet.at_rest;
    println!(
        "controller at rest on {nodes} nodes for {:.0} s: {} requests, {} beyond watches and leases \
         ({} outage probes) {:?}",
        fleet.rest_seconds,
        at_rest.total(),
        at_rest.other,
        at_rest.probes,
        at_rest.other_by_kind
    );
    assert_eq!(
        at_rest.other - at_rest.probes,
        0,
        "the controller made requests beyond watches and lease renewals at rest on {nodes} nodes (the {:.0} s \
         until the first Unknown, from {REST_AFTER:#} after the failing nodes fell silent, every node healthy \
         before): {:?} ({} of them \
         outage probes, which are allowed). Find them in the lab's audit log (verb and requestURI) and make \
         them watches, or nothing",
        fleet.rest_seconds,
        at_rest.other_by_kind,
        at_rest.probes,
    );
    assert_eq!(
        fleet.discovery_after_start_up, 0,
        "the controller asked the API's discovery (GET /api or /apis) on {nodes} nodes after its start-up, at \
         rest and through the failure, with no CustomResourceDefinition changing: it polls. Look again when a \
         CRD changes (a watch), not on a timer"
    );
}

/// What each node costs the controller, start-up and a 10% failure included, stays within its
/// share of the scale bench's target, and its peak on the larger fleet within what the target
/// allows at all; and at rest on either fleet it asks nothing but watches and
/// lease renewals (a rule, no timing: the rest is the minute the fleet lab's failure takes anyway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_each_node_costs_the_controller_stays_within_its_share_of_the_scale_target() {
    let small_fleet = on_fleet(SMALL).await;
    let large_fleet = on_fleet(LARGE).await;
    let (small, large) = (small_fleet.peak, large_fleet.peak);
    let per_node = (large.anon_kib as f64 - small.anon_kib as f64) / (LARGE - SMALL) as f64;
    let allowed = budget::controller_per_node_kib();
    println!(
        "controller: at its peak {:.1} MiB allocated on {SMALL} nodes (resident {:.1} MiB), {:.1} MiB on \
         {LARGE} (resident {:.1} MiB): {per_node:.1} KiB a node; each node's share of the target {allowed:.1} KiB",
        mib(small.anon_kib as f64),
        mib(small.rss_kib as f64),
        mib(large.anon_kib as f64),
        mib(large.rss_kib as f64),
    );
    quiet_at_rest(&small_fleet, SMALL);
    quiet_at_rest(&large_fleet, LARGE);
    let ceiling = budget::controller_allocated_kib();
    assert!(
        large.anon_kib as f64 <= ceiling,
        "the controller allocated {:.1} MiB (RssAnon) at its peak on {LARGE} nodes, over what the scale \
         bench's target allows at {} nodes ({} MiB resident less the {} MiB its executable keeps resident: \
         {:.1} MiB): it cannot meet the target. Measure with `make bench ARGS=\"--suite scale --fleet 5000\"` \
         and find what with heaptrack on the controller (docs/memory.md says how)",
        mib(large.anon_kib as f64),
        budget::CONTROLLER_TARGET_NODES,
        budget::CONTROLLER_PEAK_MIB,
        budget::CONTROLLER_EXECUTABLE_RESIDENT_MIB,
        mib(ceiling),
    );
    assert!(
        per_node <= allowed,
        "the controller's peak allocated memory (RssAnon) grew by {per_node:.1} KiB a node from {SMALL} \
         nodes ({:.1} MiB) to {LARGE} ({:.1} MiB), each fleet through its start and {FAILING_PERCENT}% of its \
         nodes failing at once: over each node's share of the scale bench's target, {allowed:.1} KiB (its \
         {} MiB at {} nodes, less the {} MiB an idle controller holds on an empty cluster). Something now \
         holds more per node. Measure with `make bench ARGS=\"--suite scale --fleet 5000\"` (peak RSS) \
         and find what with heaptrack on the controller (docs/memory.md says how)",
        mib(small.anon_kib as f64),
        mib(large.anon_kib as f64),
        budget::CONTROLLER_PEAK_MIB,
        budget::CONTROLLER_TARGET_NODES,
        budget::CONTROLLER_IDLE_MIB,
    );
}

/// The agents' peak allocated memory, watched through a test's faults, against the footprint
/// bench's target less what the shipped agent's executable keeps resident.
pub(crate) fn agents_within_their_ceiling(peak: Peak, through: &str) {
    let allowed = budget::agent_allocated_kib();
    println!(
        "agents {through}: at most {:.1} MiB allocated (resident {:.1} MiB) in {} processes; ceiling {:.1} MiB",
        mib(peak.anon_kib as f64),
        mib(peak.rss_kib as f64),
        peak.processes,
        mib(allowed)
    );
    assert!(peak.processes > 0, "no agent ran while watched: {peak:?}");
    assert!(
        peak.anon_kib as f64 <= allowed,
        "an agent {through} had {:.1} MiB allocated (RssAnon), over its ceiling of {:.1} MiB: the footprint \
         bench's target of {} MiB resident, less the {} MiB the shipped agent's executable keeps resident. \
         Measure with `make bench ARGS=\"--suite footprint\"` (resident and allocated, at rest and in a peer \
         storm), and find what with heaptrack on the agent (docs/memory.md says how)",
        mib(peak.anon_kib as f64),
        mib(allowed),
        budget::AGENT_TARGET_MIB,
        budget::AGENT_EXECUTABLE_RESIDENT_MIB,
    );
}
