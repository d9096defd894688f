//! One timeline per lab: every fault, power change, watchdog expiry, node condition, pod phase,
//! attachment and remediation change, timestamped. Tests check it, the demo narrates it, the
//! witness judges it.

use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// What can be wrong with a node, as the lab made it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCondition {
    pub powered: bool,
    pub frozen: bool,
    /// Partitioned: cut from everything but its partition's members.
    pub partitioned: bool,
    /// Only its traffic to the API server is dropped.
    pub api_isolated: bool,
    /// Its disk is full: its kubelet reports DiskPressure (it stays connected).
    #[serde(default)]
    pub disk_full: bool,
}

impl NodeCondition {
    pub fn running() -> Self {
        Self {
            powered: true,
            ..Self::default()
        }
    }

    /// Its kubelet (kwok) sees the API server and acts: what it reports is true.
    pub fn connected(&self) -> bool {
        self.powered && !self.frozen && !self.partitioned && !self.api_isolated
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum Event {
    /// A fault the lab injected (or healed).
    Fault {
        node: Option<String>,
        fault: String,
    },
    /// A node's lab condition after a change.
    NodeCondition {
        node: String,
        condition: NodeCondition,
    },
    Power {
        node: String,
        on: bool,
        cause: String,
    },
    WatchdogExpired {
        node: String,
    },
    /// A node joined the running lab ([`crate::Lab::add_node`]).
    NodeAdded {
        node: String,
    },
    /// A node left the lab for good ([`crate::Lab::remove_node`]): machine and Node object gone.
    NodeRemoved {
        node: String,
    },
    /// A process of the node wrote `b` to its `/proc/sysrq-trigger` (the lab's file over it).
    SoftwareReboot {
        node: String,
    },
    /// The node's Ready condition as the API shows it.
    NodeReady {
        node: String,
        status: String,
        reason: String,
        /// The condition's lastTransitionTime (one-second resolution): what health checks
        /// measure durations from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<Timestamp>,
    },
    /// The node's PeersReachable condition (the peer failure detector's) as the API shows it.
    PeersReachable {
        node: String,
        status: String,
        reason: String,
    },
    NodeTaint {
        node: String,
        taint: String,
        added: bool,
    },
    PodPhase {
        pod: PodId,
        node: Option<String>,
        phase: String,
        claims: Vec<String>,
        stateful: bool,
    },
    PodDeleting {
        pod: PodId,
        node: Option<String>,
    },
    PodGone {
        pod: PodId,
        node: Option<String>,
    },
    Attachment {
        volume: String,
        node: String,
        state: String,
    },
    /// A remediation object created, progressing (`phase <p>` / `step <s>`), deleting, removed.
    Remediation {
        kind: String,
        name: String,
        node: String,
        change: String,
        /// With "created": the object's `creationTimestamp` (the API server's clock, in whole
        /// seconds). A watch relisting after an outage sees an object seconds after it was
        /// created, and what the object caused may come before the lab saw it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created_at: Option<Timestamp>,
    },
    /// A NodeHealthCheck starts or stops listing the node as unhealthy.
    HealthCheck {
        check: String,
        node: String,
        unhealthy: bool,
    },
    Note {
        text: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When the lab saw the change.
    pub at: Timestamp,
    /// The API server's revision of the change (its `resourceVersion`), for a change seen by a
    /// watch. Changes reach the lab through separate watches that keep no order between them, so
    /// "when the lab saw it" cannot order two of them; the revision can, because the lab's one
    /// etcd numbers every write of every resource in one sequence. (Kubernetes promises only
    /// that revisions of one resource compare, KEP-5504; across resources this is the lab's own
    /// fact.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    #[serde(flatten)]
    pub event: Event,
}

#[derive(Clone, Default)]
pub struct Timeline(Arc<Mutex<Vec<Entry>>>);

impl Timeline {
    pub fn record(&self, event: Event) {
        self.push(Entry {
            at: Timestamp::now(),
            revision: None,
            event,
        });
    }

    /// A change an API watch delivered, with the object's `resourceVersion` as it arrived.
    pub fn record_seen(&self, resource_version: Option<&str>, event: Event) {
        self.push(Entry {
            at: Timestamp::now(),
            revision: resource_version.and_then(|v| v.parse().ok()),
            event,
        });
    }

    fn push(&self, entry: Entry) {
        tracing::debug!(event = ?entry.event, "timeline");
        if let Ok(mut entries) = self.0.lock() {
            entries.push(entry);
        }
    }

    pub fn note(&self, text: impl Into<String>) {
        self.record(Event::Note { text: text.into() });
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.0.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// The first entry at or after `since` that matches.
    pub fn find_after(&self, since: Timestamp, matches: impl Fn(&Event) -> bool) -> Option<Entry> {
        self.entries().into_iter().find(|e| e.at >= since && matches(&e.event))
    }

    /// Human-readable, times relative to the first entry.
    pub fn render(&self) -> String {
        let entries = self.entries();
        let Some(start) = entries.first().map(|e| e.at) else {
            return String::new();
        };
        entries
            .iter()
            .map(|e| {
                format!(
                    "{:>8.2}s  {}\n",
                    (e.at - start).total(jiff::Unit::Second).unwrap_or(0.0),
                    describe(&e.event)
                )
            })
            .collect()
    }
}

pub fn describe(event: &Event) -> String {
    match event {
        Event::Fault { node: Some(n), fault } => format!("fault: {fault} {n}"),
        Event::Fault { node: None, fault } => format!("fault: {fault}"),
        Event::NodeCondition { node, condition } => format!("node {node}: {condition:?}"),
        Event::Power { node, on, cause } => format!("node {node} powered {} ({cause})", if *on { "on" } else { "off" }),
        Event::WatchdogExpired { node } => format!("node {node}: watchdog expired"),
        Event::NodeAdded { node } => format!("node {node} added to the lab"),
        Event::NodeRemoved { node } => format!("node {node} removed from the lab"),
        Event::SoftwareReboot { node } => format!("node {node}: software reboot (sysrq b)"),
        Event::NodeReady {
            node, status, reason, ..
        } => format!("node {node} Ready={status} ({reason})"),
        Event::PeersReachable { node, status, reason } => format!("node {node} PeersReachable={status} ({reason})"),
        Event::NodeTaint { node, taint, added } => {
            format!("node {node} taint {taint} {}", if *added { "added" } else { "removed" })
        }
        Event::PodPhase { pod, node, phase, .. } => format!("pod {pod} {phase} on {}", node.as_deref().unwrap_or("-")),
        Event::PodDeleting { pod, node } => format!("pod {pod} deleting on {}", node.as_deref().unwrap_or("-")),
        Event::PodGone { pod, node } => format!("pod {pod} gone from {}", node.as_deref().unwrap_or("-")),
        Event::Attachment { volume, node, state } => format!("volume {volume} {state} on {node}"),
        Event::Remediation {
            kind,
            name,
            node,
            change,
            ..
        } => format!("{kind} {name} for {node}: {change}"),
        Event::HealthCheck { check, node, unhealthy } => format!(
            "NodeHealthCheck {check}: node {node} {}",
            if *unhealthy { "unhealthy" } else { "healthy again" }
        ),
        Event::Note { text } => text.clone(),
    }
}
