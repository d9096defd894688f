//! Judging a trial from the lab timeline (and a final snapshot of the cluster): the at-most-one
//! witness, false fences ([`fences`], over what [`reach`] reads of each node), healthy nodes
//! remediated, unremediated nodes, leftovers. Pure functions over plain data.

pub mod fences;
pub mod reach;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::{SignedDuration, Timestamp};
use nodemedic_api::names::taints;
use nodemedic_healthcheck::decide::{Budget, outage};
use nodemedic_lab::{
    NodeCondition, Timings,
    timeline::{Entry, Event},
    witness,
};
use serde::Serialize;

pub use fences::{AgentTimings, Detection, false_fences};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationKind {
    /// The at-most-one witness: a stateful pod ran while its predecessor may still have run.
    TwoWriters,
    /// A healthy node in the majority was powered off by fencing, its watchdog or a software
    /// reboot.
    FalseFence,
    /// A remediation was created for a node connected all along (e.g. once the control plane
    /// is back after an outage).
    HealthyRemediated,
    /// A node unhealthy long enough, within the budget, never got a remediation.
    Unremediated,
    /// A node owed a remediation got it later than `remediate_after` from when it could have
    /// (e.g. a crash right after a control-plane outage, while watches still slept: issue 60).
    SlowRemediation,
    /// Taints, cordons, remediations or leases left once every node is healthy.
    Leftover,
    /// The cluster did not come back (nodes Ready, workload Running, no remediation) in time.
    NotRecovered,
    /// Real nodes: the writer's volume shows two writers, a synced record lost, or a sequence
    /// skipped or repeated (see `nodemedic_lab::data_witness`).
    DataWitness,
    /// A node's first remediation was created while a cluster upgrade was announced.
    RemediatedDuringUpgrade,
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
    /// The lab's nodes when it started; nodes joining and leaving change it as they go.
    pub nodes: usize,
    /// The health check's budget, scaled against the nodes there are at each moment.
    pub budget: Budget,
    /// A node disconnected at least this long must get a remediation (detection + the health
    /// check's duration + slack for reconciles and the observer).
    pub remediate_after: Duration,
    /// A remediation excuses fences until this long after it is removed (a BMC request taken
    /// while it existed may land later); also how long before a remediation a node must have
    /// been connected for it to count as a healthy node remediated, on top of
    /// `remediate_after`.
    pub fence_grace: Duration,
    /// The agents' timings, where self remediation's agents run: whether a watchdog reset or a
    /// software reboot is a licence that ran out ([`fences`]).
    pub agents: Option<AgentTimings>,
    /// When a remediation can come from an outage of its node ([`fences`]).
    pub detection: Detection,
    /// The nodes are control-plane nodes, which the health check remediates one at a time: a
    /// node waits while another node's remediation is in flight.
    pub control_plane_one_at_a_time: bool,
    /// Once the API answers again after the API server or etcd was stopped, how long until
    /// remediations can be created again: the controller back in the lead (a leader that could
    /// not renew its 15 s lease meanwhile resigned and started afresh; it takes its own lease
    /// back at once), its watches resynced (within 2 s, `nodemedic_kube::backoff`), and the lease
    /// duration every node then gets to renew before an older Unknown counts.
    pub control_plane_settle: Duration,
}

impl Params {
    /// The lab's timings with a health check of `budget` over `nodes` nodes whose unhealthy
    /// conditions last `duration`, and no agents ([`Params::with_agents`]).
    pub fn new(nodes: usize, budget: Budget, timings: &Timings, duration: Duration) -> Self {
        // A node cut off at `c` renewed its kubelet lease last after `c` less a renewal period (a
        // quarter of the lease), so it is Unknown no sooner than that plus the grace.
        let renewal = Duration::from_secs(u64::from(timings.node_lease_seconds) / 4);
        Self {
            nodes,
            budget,
            remediate_after: timings.node_monitor_grace + duration + Duration::from_secs(10),
            fence_grace: timings.watchdog_timeout + Duration::from_secs(15),
            agents: None,
            detection: Detection {
                after: timings.node_monitor_grace.saturating_sub(renewal) + duration,
                lag: REPORT_LAG,
                renewal,
            },
            // Every lab node is control-plane and worker, as in the seed's compact clusters.
            control_plane_one_at_a_time: true,
            control_plane_settle: Duration::from_secs(15) + outage::RENEWAL_CHANCE,
        }
    }

    /// With self remediation's agents running on these timings.
    pub fn with_agents(self, agents: AgentTimings) -> Self {
        Self {
            agents: Some(agents),
            ..self
        }
    }

    /// With a health check that also acts on the peer failure detector's PeersReachable=False,
    /// which a silent node can get `after` it went silent.
    pub fn with_peer_detection(mut self, after: Duration) -> Self {
        self.detection.after = self.detection.after.min(after);
        self
    }

    /// The most nodes that may be unhealthy at once, of `nodes`, with remediation still allowed.
    pub fn max_unhealthy(&self, nodes: usize) -> usize {
        nodes.saturating_sub(self.budget.min_healthy(nodes))
    }
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// See [`Detection::lag`].
const REPORT_LAG: Duration = Duration::from_secs(10);

/// The power-off cause of a node taken out of the cluster ([`nodemedic_lab::Lab::remove_node`]).
const NODE_REMOVED: &str = "node-removed";

/// The fault the runner records on a node each time it restarts the node's agent: the new
/// process holds no configuration until it has read the API.
pub const AGENT_RESTART: &str = "restart-agent";

/// The fault the runner records each time it restarts the controller (the lab's
/// `restart_process` records nothing).
pub const CONTROLLER_RESTART: &str = "restart-controller";

/// The note the runner records once the API answers again after the API server or etcd was
/// started (or etcd restarted): after minutes without etcd the API server takes its time to reconnect (its own
/// backoff), so the lab's `start-etcd` fault says when it began, not when it was over.
pub const CONTROL_PLANE_BACK: &str = "the API server answers again";

/// The notes the runner records once every node carries the upgrade annotation, and just
/// before it removes it.
pub const UPGRADE_ANNOUNCED: &str = "a cluster upgrade is announced";
pub const UPGRADE_WITHDRAWN: &str = "the cluster upgrade is over";

/// How long after the announcement the health check may still start a remediation it decided
/// on before it saw the annotation (a watch event away).
const UPGRADE_SEEN: SignedDuration = SignedDuration::from_secs(3);

/// The witness's findings from `since` on (the whole timeline is read: instances started
/// earlier still count).
pub fn two_writers(entries: &[Entry], since: Timestamp) -> Vec<Violation> {
    witness::check(&with_joins(entries))
        .into_iter()
        .filter(|v| v.at >= since)
        .map(|v| {
            let node = v.started_on.clone();
            Violation::new(ViolationKind::TwoWriters, Some(&node), Some(v.at), v.to_string())
        })
        .collect()
}

/// The timeline with a node that joins running and connected from the moment it joined: the
/// lab records no condition for it, so the witness would go on reading the condition of a
/// node of that name that left (powered off), and keep the instances of a pod deleted there
/// later as if the node could not have seen the deletion.
fn with_joins(entries: &[Entry]) -> Vec<Entry> {
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        out.push(e.clone());
        if let Event::NodeAdded { node } = &e.event {
            out.push(Entry {
                at: e.at,
                revision: None,
                event: Event::NodeCondition {
                    node: node.clone(),
                    condition: NodeCondition::running(),
                },
            });
        }
    }
    out
}

/// Which nodes are connected, and when each last was not, as the timeline goes. A node removed
/// from the cluster is neither while it is gone (its power-off is no outage), and one that
/// joins is connected from then on (the lab records no condition for it).
#[derive(Default)]
struct Connectivity<'a> {
    condition: BTreeMap<&'a str, NodeCondition>,
    /// Last moment each node was disconnected (None: never).
    last_down: BTreeMap<&'a str, Timestamp>,
    removed: BTreeSet<&'a str>,
}

impl<'a> Connectivity<'a> {
    fn observe(&mut self, e: &'a Entry) {
        match &e.event {
            Event::Power { node, on: false, cause } if cause == NODE_REMOVED => {
                self.removed.insert(node);
            }
            Event::NodeAdded { node } => {
                self.removed.remove(node.as_str());
                self.condition.insert(node, NodeCondition::running());
            }
            Event::NodeCondition { node, .. } if self.removed.contains(node.as_str()) => {}
            Event::NodeCondition { node, condition: c } => {
                if !self.connected(node) || !c.connected() {
                    self.last_down.insert(node, e.at);
                }
                self.condition.insert(node, *c);
            }
            _ => {}
        }
    }

    fn connected(&self, node: &str) -> bool {
        !self.removed.contains(node) && self.condition.get(node).is_none_or(NodeCondition::connected)
    }

    /// Whether the node was disconnected at `from` or later.
    fn down_since(&self, node: &str, from: Timestamp) -> bool {
        self.last_down.get(node).is_some_and(|d| *d >= from)
    }
}

/// Every remediation created from `since` on for a node in the lab and connected throughout the
/// `remediate_after + fence_grace` before it: a healthy node remediated, as a health check that
/// took every kubelet's stale lease after a control-plane outage for dead nodes would.
pub fn healthy_remediated(entries: &[Entry], since: Timestamp, params: &Params) -> Vec<Violation> {
    let window = signed(params.remediate_after + params.fence_grace);
    let mut nodes = Connectivity::default();
    let mut out = Vec::new();
    for e in entries {
        nodes.observe(e);
        if let Event::Remediation { kind, node, change, .. } = &e.event
            && change == "created"
            && e.at >= since
            && nodes.connected(node)
            && !nodes.down_since(node, e.at - window)
        {
            out.push(Violation::new(
                ViolationKind::HealthyRemediated,
                Some(node),
                Some(e.at),
                format!(
                    "{kind} created for {node}, connected for the {:.0}s before",
                    window.as_secs_f64()
                ),
            ));
        }
    }
    out
}

/// A node's disconnection.
struct Outage<'a> {
    node: &'a str,
    start: Timestamp,
    /// Where its deadline counts from: its start, or later while nothing could remediate it.
    base: Timestamp,
    end: Timestamp,
    over_budget: bool,
}

/// The outage of `node` from `down` (start, deadline base, over budget) to `end`. The part of it
/// while the control plane was still down, `stopped` on, does not count against its deadline.
fn ended(node: &str, down: (Timestamp, Timestamp, bool), end: Timestamp, stopped: Option<Timestamp>) -> Outage<'_> {
    let (start, base, over_budget) = down;
    let base = stopped.map_or(base, |stopped| base + end.duration_since(stopped.max(start)));
    Outage {
        node,
        start,
        base,
        end,
        over_budget,
    }
}

/// Every node disconnected from `since` on for at least `remediate_after` (up to `until` when
/// still down) while the budget allowed remediation throughout, with no remediation for it
/// during its outage (or just after, for the observer's lag). The deadline counts from the
/// last moment nothing could remediate the node (for control-plane nodes, another node's
/// remediation in flight; the controller's last restart), and is moved on by the time the API
/// server or etcd was stopped during the outage and `control_plane_settle` (a node down
/// throughout a long control-plane outage is owed nothing until it is back, and no
/// remediation is expected during one).
///
/// The budget with the controller restarting (once, or in a loop every 5-8 s): `remediate_after`
/// after its last restart during the outage. A restarted controller reconciles afresh (it
/// takes the lead, lists the nodes, and then the unhealthy condition has long held its
/// duration), so it has as long as a node that just went down, no less; a loop's 3-8 restarts
/// together last up to 56 s, longer than the budget itself, so a budget counted from the
/// outage's start, or extended by a fixed allowance, would fail a trial for the loop's length
/// rather than for the controller's behaviour. The loop starts only once a remediation is in
/// flight, so it mostly stretches nothing.
pub fn unremediated(entries: &[Entry], since: Timestamp, until: Timestamp, params: &Params) -> Vec<Violation> {
    let mut down: BTreeMap<&str, (Timestamp, Timestamp, bool)> = BTreeMap::new();
    // The health check counts a node unhealthy also while the API shows it not Ready.
    let mut not_ready: BTreeMap<&str, bool> = BTreeMap::new();
    let mut removed: BTreeSet<&str> = BTreeSet::new();
    // The health check scales its budget against the nodes there are.
    let mut count = params.nodes;
    // Since when the API server or etcd is stopped, until the API answers again.
    let mut control_plane_down: Option<Timestamp> = None;
    // Since when a cluster upgrade is announced, until it is withdrawn: nothing is remediated
    // meanwhile, so that time does not count against a deadline either.
    let mut upgrading: Option<Timestamp> = None;
    let paused =
        |control_plane: Option<Timestamp>, upgrade: Option<Timestamp>| control_plane.into_iter().chain(upgrade).min();
    let settle = signed(params.control_plane_settle);
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
            // A node taken out of the cluster is not down: nothing will, or should, remediate
            // it. An outage it had (none in a sound plan) ends there.
            Event::Power { node, on: false, cause } if cause == NODE_REMOVED => {
                removed.insert(node);
                not_ready.remove(node.as_str());
                if let Some(d) = down.remove(node.as_str()) {
                    outages.push(ended(node, d, e.at, paused(control_plane_down, upgrading)));
                }
            }
            Event::NodeRemoved { node } => {
                removed.insert(node);
                count = count.saturating_sub(1);
            }
            Event::NodeAdded { node } => {
                removed.remove(node.as_str());
                count += 1;
            }
            Event::NodeCondition { node, .. } | Event::NodeReady { node, .. } if removed.contains(node.as_str()) => {}
            Event::NodeCondition { node, condition } => {
                if !condition.connected() {
                    down.entry(node).or_insert((e.at, e.at, false));
                } else if let Some(d) = down.remove(node.as_str()) {
                    outages.push(ended(node, d, e.at, paused(control_plane_down, upgrading)));
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
            Event::Fault { node: None, fault } => match fault.as_str() {
                // An etcd restart too: the API answers nothing until etcd is back.
                "stop-apiserver" | "stop-etcd" | "restart-etcd" => {
                    control_plane_down.get_or_insert(e.at);
                }
                f if f == CONTROLLER_RESTART => {
                    for d in down.values_mut() {
                        d.1 = d.1.max(e.at);
                    }
                }
                _ => {}
            },
            Event::Note { text } if text == UPGRADE_ANNOUNCED => {
                upgrading.get_or_insert(e.at);
            }
            Event::Note { text } if text == UPGRADE_WITHDRAWN => {
                if let Some(announced) = upgrading.take() {
                    for d in down.values_mut() {
                        d.1 = d.1 + e.at.duration_since(announced.max(d.0)) + UPGRADE_SEEN;
                    }
                }
            }
            Event::Note { text } if text == CONTROL_PLANE_BACK => {
                if let Some(stopped) = control_plane_down.take() {
                    for d in down.values_mut() {
                        d.1 = d.1 + e.at.duration_since(stopped.max(d.0)) + settle;
                    }
                }
            }
            _ => {}
        }
        let unhealthy = not_ready
            .iter()
            .filter(|(n, bad)| **bad && !down.contains_key(*n))
            .count()
            + down.len();
        if unhealthy > params.max_unhealthy(count) {
            down.values_mut().for_each(|d| d.2 = true);
        }
        // A control-plane node's turn comes only when no other node's remediation is in
        // flight: its deadline counts from then, so it starts again at every moment the node
        // was still waiting.
        for (node, d) in down.iter_mut() {
            if waited.contains(node) || waiting_turn(node, &remediations) {
                d.1 = d.1.max(e.at);
            }
        }
    }
    outages.extend(
        down.into_iter()
            .map(|(node, d)| ended(node, d, until, paused(control_plane_down, upgrading))),
    );
    owed_remediations(outages, &remediations, since, params)
}

/// The outages from `since` on that were owed a remediation (within the budget, and down for
/// `remediate_after` from their deadline's base) and got none (no remediation of their node
/// created by their end and not removed before their start), or got it late: created more than
/// `remediate_after` after the base. The base already counts the control plane's outage and its
/// settling, so a late one is nodemedic's delay, not Kubernetes'.
fn owed_remediations(
    outages: Vec<Outage<'_>>,
    remediations: &[(&str, Timestamp, Option<Timestamp>)],
    since: Timestamp,
    params: &Params,
) -> Vec<Violation> {
    // The observer's lag: a remediation seen just after the outage ended still covers it.
    let lag = SignedDuration::from_secs(5);
    let owed = signed(params.remediate_after);
    outages
        .into_iter()
        .filter(|o| o.start >= since && !o.over_budget && o.end.duration_since(o.base) >= owed)
        .filter_map(|o| {
            let first = remediations
                .iter()
                .filter(|(n, created, removed)| {
                    *n == o.node && *created <= o.end + lag && removed.is_none_or(|r| r >= o.start)
                })
                .map(|(_, created, _)| *created)
                .min();
            let secs = o.end.duration_since(o.start).as_secs_f64();
            let possible = o.end.duration_since(o.base).as_secs_f64();
            match first {
                None => Some(Violation::new(
                    ViolationKind::Unremediated,
                    Some(o.node),
                    Some(o.start),
                    format!(
                        "{} was down {secs:.1}s within the budget ({possible:.1}s of it with remediation possible) and never remediated",
                        o.node
                    ),
                )),
                Some(created) if created > o.base + owed + lag => Some(Violation::new(
                    ViolationKind::SlowRemediation,
                    Some(o.node),
                    Some(created),
                    format!(
                        "{} was remediated {:.1}s after remediation was possible, over the {:.0}s allowed (+{}s for the observer)",
                        o.node,
                        created.duration_since(o.base).as_secs_f64(),
                        params.remediate_after.as_secs_f64(),
                        lag.as_secs()
                    ),
                )),
                Some(_) => None,
            }
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

/// Every remediation created from `since` on while a cluster upgrade was announced (from
/// [`UPGRADE_SEEN`] after the announcement until it was withdrawn) for a node that had none in
/// flight: the upgrade postpones new remediations, not the escalation of one under way.
pub fn remediated_during_upgrade(entries: &[Entry], since: Timestamp) -> Vec<Violation> {
    let mut announced: Option<Timestamp> = None;
    let mut in_flight: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        match &e.event {
            Event::Note { text } if text == UPGRADE_ANNOUNCED => announced = Some(e.at),
            Event::Note { text } if text == UPGRADE_WITHDRAWN => announced = None,
            Event::Remediation { kind, node, change, .. } if change == "created" => {
                let live = in_flight.entry(node).or_default();
                if e.at >= since && *live == 0 && announced.is_some_and(|a| e.at >= a + UPGRADE_SEEN) {
                    out.push(Violation::new(
                        ViolationKind::RemediatedDuringUpgrade,
                        Some(node),
                        Some(e.at),
                        format!("{kind} created for {node} while a cluster upgrade was announced"),
                    ));
                }
                *live += 1;
            }
            Event::Remediation { node, change, .. } if change == "removed" => {
                if let Some(live) = in_flight.get_mut(node.as_str()) {
                    *live = live.saturating_sub(1);
                }
            }
            _ => {}
        }
    }
    out
}

/// Every timeline check of one trial, from `since` (its first step) to `until` (recovered).
pub fn judge(entries: &[Entry], since: Timestamp, until: Timestamp, params: &Params) -> Vec<Violation> {
    let mut out = two_writers(entries, since);
    out.extend(remediated_during_upgrade(entries, since));
    out.extend(false_fences(entries, since, params));
    out.extend(healthy_remediated(entries, since, params));
    out.extend(unremediated(entries, since, until, params));
    out
}
