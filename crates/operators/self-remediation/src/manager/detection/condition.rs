//! Writes the `PeersReachable` node condition: only when its status or reason changes, so at
//! rest nothing is written, and a node whose suspicion ended gets `True` back.

use std::collections::BTreeMap;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use nodemedic_kube::{events::Events, paged};
use nodemedic_peer_detection::{CONDITION, Condition, MemberFacts, Verdict, condition};
use serde_json::json;

use crate::manager::Metrics;

/// The condition as last written (or found at start).
#[derive(Clone, Debug)]
struct Written {
    status: String,
    reason: String,
    transition: String,
}

impl Written {
    /// What a node no peer reports carries, and what is left as it is.
    fn plain(&self) -> bool {
        self.status == "True" && self.reason == "PeersReachable"
    }
}

/// The condition as `node` carries it.
fn found(node: &Node) -> Option<Written> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)?;
    Some(Written {
        status: c.status.clone(),
        reason: c.reason.clone().unwrap_or_default(),
        transition: c
            .last_transition_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    })
}

/// The verdict on a member no peer reports, among `members` members.
fn unreported(members: usize) -> Verdict {
    Verdict::Reachable {
        observers: 0,
        needed: usize::from(members > 1),
    }
}

pub(super) struct Writer {
    nodes: Api<Node>,
    events: Events,
    metrics: Metrics,
    written: BTreeMap<String, Written>,
}

impl Writer {
    /// Starts from the conditions the nodes carry, so a restarted controller clears what an
    /// earlier one set.
    pub(super) async fn start(client: Client, events: Events, metrics: Metrics) -> Self {
        let nodes = Api::<Node>::all(client);
        let mut written = BTreeMap::new();
        // A page at a time, keeping only the condition: at 5,000 nodes one list of every Node
        // was the controller's largest allocation (docs/memory.md).
        let mut pages = std::pin::pin!(paged::pages(&nodes, &ListParams::default()));
        while let Some(page) = pages.next().await {
            match page {
                Ok(page) => written.extend(page.iter().filter_map(|node| Some((node.name_any(), found(node)?)))),
                Err(error) => {
                    tracing::warn!(%error, "cannot list the nodes' PeersReachable conditions");
                    break;
                }
            }
        }
        let writer = Self {
            nodes,
            events,
            metrics,
            written,
        };
        writer.count();
        writer
    }

    /// Writes what the verdicts say where it changed; a node no peer reports any more, that had
    /// another condition, is reachable again.
    pub(super) async fn write(&mut self, decided: &[(String, Verdict)], members: &BTreeMap<String, MemberFacts>) {
        let mut wanted: BTreeMap<String, Condition> = decided
            .iter()
            .filter_map(|(node, verdict)| condition(verdict).map(|c| (node.clone(), c)))
            .collect();
        let unreported = unreported(members.len());
        for (node, written) in &self.written {
            let reported = decided.iter().any(|(n, _)| n == node);
            if !reported
                && !written.plain()
                && let Some(c) = condition(&unreported)
            {
                wanted.insert(node.clone(), c);
            }
        }
        for (node, c) in wanted {
            let same = self
                .written
                .get(&node)
                .is_some_and(|w| w.status == c.status && w.reason == c.reason);
            if !same {
                self.patch(&node, &c).await;
            }
        }
    }

    /// Whether a pass with no report held would write nothing: every node carries the
    /// condition of a member no peer reports (or none), among `members` members.
    pub(super) fn settled(&self, members: usize) -> bool {
        let unreported = condition(&unreported(members));
        self.written.values().all(|w| {
            w.plain()
                || unreported
                    .as_ref()
                    .is_some_and(|c| w.status == c.status && w.reason == c.reason)
        })
    }

    async fn patch(&mut self, node: &str, c: &Condition) {
        let now = Timestamp::from_second(Timestamp::now().as_second())
            .unwrap_or(Timestamp::UNIX_EPOCH)
            .to_string();
        let before = self.written.get(node).cloned();
        let transition = match &before {
            Some(w) if w.status == c.status && !w.transition.is_empty() => w.transition.clone(),
            _ => now.clone(),
        };
        let patch = json!({"status": {"conditions": [{
            "type": CONDITION,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }]}});
        #[allow(
            clippy::disallowed_methods,
            reason = "one condition in the Node's list, which the kubelet and the node controller share: only a strategic merge patch merges it in by type (the status writer's merge patch would replace the whole list), and a resourceVersion lock would race the kubelet's heartbeats"
        )]
        let written = self
            .nodes
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await;
        match written {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.written.remove(node);
                self.count();
                return;
            }
            Err(error) => {
                tracing::warn!(%node, %error, "cannot write the PeersReachable condition; trying again");
                return;
            }
        }
        tracing::info!(%node, status = c.status, reason = c.reason, message = %c.message, "PeersReachable");
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            ..Default::default()
        };
        let was_false = before.as_ref().is_some_and(|w| w.status == "False");
        if c.status == "False" {
            self.events
                .warning(&reference, "PeersUnreachable", c.message.clone())
                .await;
        } else if was_false {
            self.events
                .normal(&reference, "PeersReachable", c.message.clone())
                .await;
        }
        self.written.insert(
            node.to_owned(),
            Written {
                status: c.status.to_owned(),
                reason: c.reason.to_owned(),
                transition,
            },
        );
        self.count();
    }

    fn count(&self) {
        let unreachable = self.written.values().filter(|w| w.status == "False").count();
        self.metrics
            .unreachable_by_peers
            .set(i64::try_from(unreachable).unwrap_or(i64::MAX));
    }
}
