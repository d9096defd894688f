//! Judging a trial from the lab timeline (and a final snapshot of the cluster): the at-most-one
//! witness, false fences, unremediated nodes, leftovers. Pure functions over plain data.

use std::{collections::BTreeMap, time::Duration};

use jiff::{SignedDuration, Timestamp};
use nodemedic_api::names::taints;
use nodemedic_healthcheck::decide::Budget;
use nodemedic_lab::{
    NodeCondition, Timings,
    timeline::{Entry, Event},
    witness,
};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationKind {
    /// The at-most-one witness: a stateful pod ran while its predecessor may still have run.
    TwoWriters,
    /// A healthy node in the majority was powered off by fencing or its watchdog.
    FalseFence,
    /// A node unhealthy long enough, within the budget, never got a remediation.
    Unremediated,
    /// Taints, cordons, remediations or leases left once every node is healthy.
    Leftover,
    /// The cluster did not come back (nodes Ready, workload Running, no remediation) in time.
    NotRecovered,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub node: Option<String>,
    pub at: Option<Timestamp>,
    pub detail: String,
}

impl Violation {
    fn new(kind: ViolationKind, node: Option<&str>, at: Option<Timestamp>, detail: String) -> Self {
        Self {
            kind,
            node: node.map(str::to_owned),
            at,
            detail,
        }
    }
}

/// What the checks need to know about the lab and the health check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// The most nodes that may be unhealthy at once with remediation still allowed.
    pub max_unhealthy: usize,
    /// A node disconnected at least this long must get a remediation (detection + the health
    /// check's duration + slack for reconciles and the observer).
    pub remediate_after: Duration,
    /// A fence this soon after the node was disconnected or had a remediation is not false:
    /// an agent that lost its licence while cut off resets through its watchdog a little later.
    pub fence_grace: Duration,
    /// The nodes are control-plane nodes, which the health check remediates one at a time: a
    /// node waits while another node's remediation is in flight.
    pub control_plane_one_at_a_time: bool,
}

impl Params {
    /// The lab's timings with a health check of `budget` over `nodes` nodes whose unhealthy
    /// conditions last `duration`.
    pub fn new(nodes: usize, budget: Budget, timings: &Timings, duration: Duration) -> Self {
        Self {
            max_unhealthy: nodes.saturating_sub(budget.min_healthy(nodes)),
            remediate_after: timings.node_monitor_grace + duration + Duration::from_secs(10),
            fence_grace: timings.watchdog_timeout + Duration::from_secs(15),
            // Every lab node is control-plane and worker, as in the seed's compact clusters.
            control_plane_one_at_a_time: true,
        }
    }
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// The witness's findings from `since` on (the whole timeline is read: instances started
/// earlier still count).
pub fn two_writers(entries: &[Entry], since: Timestamp) -> Vec<Violation> {
    witness::check(entries)
        .into_iter()
        .filter(|v| v.at >= since)
        .map(|v| {
            let node = v.started_on.clone();
            Violation::new(ViolationKind::TwoWriters, Some(&node), Some(v.at), v.to_string())
        })
        .collect()
}

/// Fencing causes: a watchdog reset (self remediation) or a BMC power-off (fence agents). The
/// plan's own crashes and resets have their own causes.
fn is_fence(cause: &str) -> bool {
    matches!(cause, "watchdog" | "bmc")
}

/// Every fencing power-off from `since` on of a node that was connected (powered, not frozen,
/// not cut off, not isolated from the API) for the whole grace period before it, unless a
/// remediation for it was in flight (or just removed) that began during, or within the grace
/// after, an outage of that node. A remediation created for a node that was healthy excuses
/// nothing: that is the false fence's cause, not its reason.
pub fn false_fences(entries: &[Entry], since: Timestamp, params: &Params) -> Vec<Violation> {
    let grace = signed(params.fence_grace);
    let mut condition: BTreeMap<&str, NodeCondition> = BTreeMap::new();
    // Last moment each node was disconnected (None: never).
    let mut last_down: BTreeMap<&str, Timestamp> = BTreeMap::new();
    // Remediations by (kind, name): node, created, removed.
    let mut remediations: BTreeMap<(&str, &str), (&str, Timestamp, Option<Timestamp>)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        match &e.event {
            Event::NodeCondition { node, condition: c } => {
                if !condition.get(node.as_str()).is_none_or(NodeCondition::connected) || !c.connected() {
                    last_down.insert(node, e.at);
                }
                condition.insert(node, *c);
            }
            Event::Remediation {
                kind,
                name,
                node,
                change,
            } => {
                let entry = remediations.entry((kind, name)).or_insert((node, e.at, None));
                if change == "removed" {
                    entry.2 = Some(e.at);
                }
            }
            Event::Power { node, on: false, cause } if e.at >= since && is_fence(cause) => {
                let n = node.as_str();
                let connected = condition.get(n).is_none_or(NodeCondition::connected);
                let down = last_down.get(n).copied();
                let recently_down = down.is_some_and(|d| d >= e.at - grace);
                let excused = remediations.values().any(|(r, created, removed)| {
                    *r == n
                        && removed.is_none_or(|gone| gone >= e.at - grace)
                        && down.is_some_and(|d| *created <= d + grace)
                });
                if connected && !recently_down && !excused {
                    out.push(Violation::new(
                        ViolationKind::FalseFence,
                        Some(n),
                        Some(e.at),
                        format!("{n} powered off ({cause}) while connected, with no remediation from an outage of it"),
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

struct Outage<'a> {
    node: &'a str,
    start: Timestamp,
    end: Timestamp,
    over_budget: bool,
}

/// Every node disconnected from `since` on for at least `remediate_after` (up to `until` when
/// still down; for control-plane nodes, counted from the last moment another node's remediation
/// was in flight) while the budget allowed remediation throughout, with no remediation for it
/// during its outage (or just after, for the observer's lag).
pub fn unremediated(entries: &[Entry], since: Timestamp, until: Timestamp, params: &Params) -> Vec<Violation> {
    let mut down: BTreeMap<&str, (Timestamp, bool)> = BTreeMap::new();
    // The health check counts a node unhealthy also while the API shows it not Ready.
    let mut not_ready: BTreeMap<&str, bool> = BTreeMap::new();
    let mut outages = Vec::new();
    let mut remediations: Vec<(&str, Timestamp, Option<Timestamp>)> = Vec::new();
    let waiting_turn = |node: &str, remediations: &[(&str, Timestamp, Option<Timestamp>)]| {
        params.control_plane_one_at_a_time
            && remediations
                .iter()
                .any(|(n, _, removed)| *n != node && removed.is_none())
    };
    for e in entries {
        let waited: Vec<&str> = down
            .keys()
            .copied()
            .filter(|node| waiting_turn(node, &remediations))
            .collect();
        match &e.event {
            Event::NodeCondition { node, condition } => {
                if !condition.connected() {
                    down.entry(node).or_insert((e.at, false));
                } else if let Some((start, over_budget)) = down.remove(node.as_str()) {
                    outages.push(Outage {
                        node,
                        start,
                        end: e.at,
                        over_budget,
                    });
                }
            }
            Event::NodeReady { node, status, .. } => {
                not_ready.insert(node, status != "True");
            }
            Event::Remediation { node, change, .. } if change == "created" => remediations.push((node, e.at, None)),
            Event::Remediation { node, change, .. } if change == "removed" => {
                if let Some(r) = remediations.iter_mut().rev().find(|r| r.0 == node && r.2.is_none()) {
                    r.2 = Some(e.at);
                }
            }
            _ => {}
        }
        let unhealthy = not_ready
            .iter()
            .filter(|(n, bad)| **bad && !down.contains_key(*n))
            .count()
            + down.len();
        if unhealthy > params.max_unhealthy {
            down.values_mut().for_each(|d| d.1 = true);
        }
        // A control-plane node's turn comes only when no other node's remediation is in
        // flight: its deadline counts from then, so its outage starts again at every moment it
        // was still waiting.
        for (node, d) in down.iter_mut() {
            if waited.contains(node) || waiting_turn(node, &remediations) {
                d.0 = e.at;
            }
        }
    }
    outages.extend(down.into_iter().map(|(node, (start, over_budget))| Outage {
        node,
        start,
        end: until,
        over_budget,
    }));
    let lag = SignedDuration::from_secs(5);
    outages
        .into_iter()
        .filter(|o| {
            o.start >= since && !o.over_budget && o.end.duration_since(o.start) >= signed(params.remediate_after)
        })
        .filter(|o| {
            !remediations.iter().any(|(n, created, removed)| {
                *n == o.node && *created <= o.end + lag && removed.is_none_or(|r| r >= o.start)
            })
        })
        .map(|o| {
            let secs = o.end.duration_since(o.start).as_secs_f64();
            Violation::new(
                ViolationKind::Unremediated,
                Some(o.node),
                Some(o.start),
                format!("{} was down {secs:.1}s within the budget and never remediated", o.node),
            )
        })
        .collect()
}

/// Whether a remediation was created from `since` on and is not removed yet.
pub fn remediation_in_flight(entries: &[Entry], since: Timestamp) -> bool {
    let mut live = BTreeMap::new();
    for e in entries.iter().filter(|e| e.at >= since) {
        if let Event::Remediation { kind, name, change, .. } = &e.event {
            if change == "removed" {
                live.remove(&(kind, name));
            } else {
                live.insert((kind, name), ());
            }
        }
    }
    !live.is_empty()
}

/// The last time from `since` on that the pod (`namespace/name`) was seen Running, if it was.
pub fn last_running(entries: &[Entry], since: Timestamp, pod: &str) -> Option<Timestamp> {
    entries
        .iter()
        .filter(|e| e.at >= since)
        .filter(
            |e| matches!(&e.event, Event::PodPhase { pod: p, phase, .. } if p.to_string() == pod && phase == "Running"),
        )
        .map(|e| e.at)
        .next_back()
}

/// The cluster once every node is healthy again.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Snapshot {
    pub nodes: Vec<NodeSnapshot>,
    /// Remediation objects still present, as `Kind/name`.
    pub remediations: Vec<String>,
    /// Node leases (`medik8s-leases`) still validly held, as `name (holder)`.
    pub leases: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeSnapshot {
    pub name: String,
    /// Taint keys.
    pub taints: Vec<String>,
    pub unschedulable: bool,
}

/// Everything remediation adds that should be gone.
pub fn leftovers(snapshot: &Snapshot) -> Vec<Violation> {
    let ours =
        |t: &str| t.starts_with("remediation.medik8s.io/") || t == taints::OUT_OF_SERVICE_KEY || t == taints::DRAIN_KEY;
    let mut out = Vec::new();
    for node in &snapshot.nodes {
        for t in node.taints.iter().filter(|t| ours(t)) {
            out.push(Violation::new(
                ViolationKind::Leftover,
                Some(&node.name),
                None,
                format!("taint {t} left on {}", node.name),
            ));
        }
        if node.unschedulable {
            out.push(Violation::new(
                ViolationKind::Leftover,
                Some(&node.name),
                None,
                format!("{} left cordoned", node.name),
            ));
        }
    }
    for r in &snapshot.remediations {
        out.push(Violation::new(ViolationKind::Leftover, None, None, format!("{r} left")));
    }
    for l in &snapshot.leases {
        out.push(Violation::new(
            ViolationKind::Leftover,
            None,
            None,
            format!("lease {l} still held"),
        ));
    }
    out
}

/// Every timeline check of one trial, from `since` (its first step) to `until` (recovered).
pub fn judge(entries: &[Entry], since: Timestamp, until: Timestamp, params: &Params) -> Vec<Violation> {
    let mut out = two_writers(entries, since);
    out.extend(false_fences(entries, since, params));
    out.extend(unremediated(entries, since, until, params));
    out
}
