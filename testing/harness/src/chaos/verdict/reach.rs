//! What each node could do, read from the lab's timeline: when its agent could not renew its
//! licence (cut off from the API server and from a majority of its peers, or frozen), when it
//! was frozen, when it booted, and when its kubelet and peers could not see it. The false-fence
//! rule ([`super::fences`]) judges each fence against this.
//!
//! How each fault counts (docs/self-remediation-protocol.md, "The rules"):
//! * **Partition** (`partition a,b`, healed per node): the nodes listed reach each other and
//!   nothing else: no API, and as voters only each other. The plan partitions a minority only,
//!   so they are cut off; the rest keep a majority among themselves.
//! * **API isolation**: no API, but every peer answers: never cut off (a vote licence holds).
//! * **API server or etcd stopped** (`stop-apiserver`, `stop-etcd`, `restart-etcd`, until the
//!   runner notes that the API answers again): no node reaches the API. Only a node that also
//!   has no majority is cut off: every agent holds a licence from its peers' votes however long
//!   the outage lasts.
//! * **Freeze**: the agent's feeder stops at once, so the watchdog resets the node `W` after its
//!   last feed, licence or not: that is a fence of a node that is not live, and excused. A frozen
//!   node votes for no one.
//! * **Crash, power-off, removal**: nothing runs, nothing can be fenced; nor does it vote. A
//!   node powered on again (or joining) **boots**: its agent starts with no licence and must earn
//!   one within `W`.
//! * **An agent that started** (a boot, a join, the runner's agent restart) holds no
//!   configuration until it has read the API: it neither counts votes nor grants them. So an agent
//!   started while the API is away is cut off however many peers it reaches (the protocol's
//!   "a restarted agent process cannot earn a licence from votes before it has read the
//!   membership").
//! * **Slow links, a full disk, a starved agent or control plane, controller restarts, hung
//!   BMCs**: nothing is cut off. The plans count on it (nobody may be fenced), and a throttled
//!   agent still feeds from its own thread.
//!
//! The members are the lab's nodes (those it started with, joined and left); a node taken out
//! still counts, as a member that votes for no one, for [`MEMBERSHIP_SETTLES`] (the change that
//! drops it commits within seconds while the API answers).

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use nodemedic_lab::{
    NodeCondition,
    timeline::{Entry, Event},
};

use super::{AGENT_RESTART, CONTROL_PLANE_BACK, NODE_REMOVED};

/// How long a node taken out of the cluster still counts as a member: the manager proposes the
/// configuration without it at once, and it commits once a majority has acknowledged it (a
/// second or so while the API answers).
const MEMBERSHIP_SETTLES: SignedDuration = SignedDuration::from_secs(10);

/// A stretch of the timeline; `to` None: still so when the timeline ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub from: Timestamp,
    pub to: Option<Timestamp>,
}

impl Span {
    pub fn seconds(&self, end: Timestamp) -> f64 {
        self.to.unwrap_or(end).duration_since(self.from).as_secs_f64()
    }
}

/// One node's history, as the false-fence rule reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeHistory {
    /// When it was powered on or joined the lab: its agent starts with no licence.
    pub boots: Vec<Timestamp>,
    /// When its agent could renew its licence neither from the API nor from a majority of its
    /// peers' votes, or was frozen (powered on throughout).
    pub dark: Vec<Span>,
    pub frozen: Vec<Span>,
    /// When its kubelet could not report to the API server (off, frozen, partitioned or
    /// isolated from the API): what a health check can see.
    pub disconnected: Vec<Span>,
}

/// Which side of the partitions a node is on: voters reach only nodes on their own side.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side<'a> {
    Main,
    Group(usize),
    /// Partitioned with no partition fault recorded (a hand-made timeline): alone.
    Alone(&'a str),
}

#[derive(Default)]
struct World<'a> {
    /// Members by count: the nodes a timeline never names are running, connected voters.
    members: usize,
    conditions: BTreeMap<&'a str, NodeCondition>,
    groups: BTreeMap<&'a str, usize>,
    next_group: usize,
    /// Agents started since they last reached the API.
    unconfigured: BTreeSet<&'a str>,
    control_plane_down: bool,
    /// Nodes taken out, and when: still members, voting for no one, until the change settles.
    leaving: BTreeMap<&'a str, Timestamp>,
    removed: BTreeSet<&'a str>,
}

impl<'a> World<'a> {
    fn observe(&mut self, e: &'a Entry, histories: &mut BTreeMap<&'a str, NodeHistory>) {
        match &e.event {
            Event::NodeCondition { node, .. } if self.removed.contains(node.as_str()) => {}
            Event::NodeCondition { node, condition } => {
                if !condition.partitioned {
                    self.groups.remove(node.as_str());
                }
                self.conditions.insert(node, *condition);
            }
            Event::Fault { node: None, fault } => {
                if let Some(nodes) = fault.strip_prefix("partition ") {
                    self.next_group += 1;
                    for n in nodes.split(',') {
                        self.groups.insert(n, self.next_group);
                    }
                } else if matches!(fault.as_str(), "stop-apiserver" | "stop-etcd" | "restart-etcd") {
                    self.control_plane_down = true;
                }
            }
            Event::Fault {
                node: Some(node),
                fault,
            } if fault == AGENT_RESTART => {
                self.unconfigured.insert(node);
            }
            Event::Note { text } if text == CONTROL_PLANE_BACK => self.control_plane_down = false,
            Event::Power { node, on: true, .. } => {
                self.unconfigured.insert(node);
                histories.entry(node).or_default().boots.push(e.at);
            }
            Event::Power { node, on: false, cause } if cause == NODE_REMOVED => {
                self.removed.insert(node);
                self.conditions.remove(node.as_str());
                self.groups.remove(node.as_str());
            }
            Event::NodeRemoved { node } => {
                self.members = self.members.saturating_sub(1);
                self.leaving.insert(node, e.at);
            }
            Event::NodeAdded { node } => {
                self.removed.remove(node.as_str());
                self.leaving.remove(node.as_str());
                self.members += 1;
                self.conditions.insert(node, NodeCondition::running());
                self.unconfigured.insert(node);
                histories.entry(node).or_default().boots.push(e.at);
            }
            _ => {}
        }
        self.leaving
            .retain(|_, left| e.at.duration_since(*left) < MEMBERSHIP_SETTLES);
        let reached: Vec<&str> = self
            .conditions
            .keys()
            .copied()
            .filter(|n| self.reaches_api(n))
            .collect();
        for n in reached {
            self.unconfigured.remove(n);
        }
    }

    fn condition(&self, node: &str) -> NodeCondition {
        self.conditions
            .get(node)
            .copied()
            .unwrap_or_else(NodeCondition::running)
    }

    fn reaches_api(&self, node: &str) -> bool {
        let c = self.condition(node);
        c.powered && !c.frozen && !c.partitioned && !c.api_isolated && !self.control_plane_down
    }

    fn side(&self, node: &'a str) -> Side<'a> {
        match (self.condition(node).partitioned, self.groups.get(node)) {
            (false, _) => Side::Main,
            (true, Some(group)) => Side::Group(*group),
            (true, None) => Side::Alone(node),
        }
    }

    /// Whether `node`'s agent counts a strict majority of the members, itself included.
    fn has_majority(&self, node: &'a str) -> bool {
        if self.unconfigured.contains(node) {
            return false;
        }
        let side = self.side(node);
        let votes = |m: &'a str, c: &NodeCondition| {
            m != node && c.powered && !c.frozen && !self.unconfigured.contains(m) && self.side(m) == side
        };
        let members = self.members.max(self.conditions.len()) + self.leaving.len();
        let voters = if side == Side::Main {
            // Nodes the timeline never named are running, connected voters on the main side.
            let silent = self
                .conditions
                .iter()
                .filter(|(m, c)| **m != node && !votes(m, c))
                .count()
                + self.leaving.len();
            members.saturating_sub(1 + silent)
        } else {
            self.conditions.iter().filter(|(m, c)| votes(m, c)).count()
        };
        voters + 1 > members / 2
    }

    fn dark(&self, node: &'a str) -> bool {
        let c = self.condition(node);
        c.powered && (c.frozen || (!self.reaches_api(node) && !self.has_majority(node)))
    }
}

/// Opens or closes the last span of `spans` as `on` says.
fn track(spans: &mut Vec<Span>, on: bool, at: Timestamp) {
    let open = spans.last().is_some_and(|s| s.to.is_none());
    if on && !open {
        spans.push(Span { from: at, to: None });
    } else if !on
        && open
        && let Some(last) = spans.last_mut()
    {
        last.to = Some(at);
    }
}

/// Every node's history over the whole timeline, of a lab that started with `nodes` nodes.
pub fn histories(entries: &[Entry], nodes: usize) -> BTreeMap<String, NodeHistory> {
    let mut world = World {
        members: nodes,
        ..World::default()
    };
    let mut out: BTreeMap<&str, NodeHistory> = BTreeMap::new();
    for e in entries {
        world.observe(e, &mut out);
        let known: Vec<&str> = world.conditions.keys().copied().collect();
        for node in known {
            let c = world.condition(node);
            let dark = world.dark(node);
            let history = out.entry(node).or_default();
            track(&mut history.dark, dark, e.at);
            track(&mut history.frozen, c.powered && c.frozen, e.at);
            track(&mut history.disconnected, !c.connected(), e.at);
        }
        for node in &world.removed {
            if let Some(history) = out.get_mut(node) {
                track(&mut history.dark, false, e.at);
                track(&mut history.frozen, false, e.at);
                track(&mut history.disconnected, false, e.at);
            }
        }
    }
    out.into_iter().map(|(n, h)| (n.to_owned(), h)).collect()
}
