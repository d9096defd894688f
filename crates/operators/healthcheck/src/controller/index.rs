//! The in-memory view the decisions read: compact facts extracted from watched objects (never
//! whole Node objects: at thousands of nodes that is where the memory would go).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Mutex, RwLock},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::api::DynamicObject;
use nodemedic_api::{
    machines::{self, MachineApi, NodeOf},
    names::{annotations, conditions, labels},
};

use crate::decide::{
    ConditionFacts, LeaseFacts, NodeFacts, RemediationFacts, RemediationId, TemplateRef, TemplateState,
    conflict::{MachineHealthCheckFacts, MachineKey},
    outage::ApiContact,
    upgrade,
};

/// A remediation object as stored: its facts (with `owned` false) and the uids of the
/// NodeHealthChecks that own it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct StoredRemediation {
    pub facts: RemediationFacts,
    pub owners: Vec<String>,
}

/// How long a remediation this process created counts before its watch delivers it.
const CREATED_UNTIL_WATCHED: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Default)]
pub(super) struct Index {
    pub nodes: RwLock<BTreeMap<String, NodeFacts>>,
    pub remediations: RwLock<BTreeMap<RemediationId, StoredRemediation>>,
    /// Remediations this process created that their watch has not delivered yet, with when:
    /// the status a reconcile writes after a creation wakes the next one, which must not find
    /// the node without its remediation and create a second (seen under load, 17 ms apart).
    pub created: Mutex<BTreeMap<RemediationId, (StoredRemediation, std::time::Instant)>>,
    pub templates: RwLock<BTreeMap<TemplateRef, TemplateState>>,
    pub leases: RwLock<BTreeMap<String, LeaseFacts>>,
    /// Each node's last kubelet lease renewal, by the API server's clock.
    pub kubelet_renewals: RwLock<BTreeMap<String, Timestamp>>,
    /// Whether the watches reach the API server, and when they last came back.
    pub api_contact: Mutex<ApiContact>,
    /// Per source kind, the upgrades its objects say are under way.
    pub upgrades: RwLock<BTreeMap<&'static str, Vec<upgrade::Upgrade>>>,
    /// Per machine API, its MachineHealthChecks.
    pub machine_health_checks: RwLock<BTreeMap<MachineApi, Vec<MachineHealthCheckFacts>>>,
    /// Every Machine's labels.
    pub machine_labels: RwLock<BTreeMap<MachineKey, BTreeMap<String, String>>>,
}

/// When the API server last recorded a write to the object: the newest time among its managed
/// fields (every renewal rewrites renewTime, so its manager's entry moves). The API server's
/// clock, not the writer's: a node whose clock is wrong cannot look alive.
pub(super) fn last_written(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.time.as_ref().map(|t| t.0))
        .max()
}

/// What one watch saw during a relist (between `Init` and `InitDone`). A watch that restarts
/// (the API server or etcd restarted, a timeout) lists again, and the list only names what
/// exists: anything deleted while the watch was down must be found by what the list left out.
#[derive(Debug)]
pub(super) struct Relist<K>(Option<BTreeSet<K>>);

impl<K: Ord + Clone> Default for Relist<K> {
    fn default() -> Self {
        Self(None)
    }
}

impl<K: Ord + Clone> Relist<K> {
    pub(super) fn start(&mut self) {
        self.0 = Some(BTreeSet::new());
    }

    pub(super) fn saw(&mut self, key: &K) {
        if let Some(seen) = self.0.as_mut() {
            seen.insert(key.clone());
        }
    }

    /// At `InitDone`: removes from `all` every entry this watch is responsible for (`mine`)
    /// that the list did not name, and returns them.
    pub(super) fn prune<V>(&mut self, all: &mut BTreeMap<K, V>, mine: impl Fn(&K) -> bool) -> Vec<(K, V)> {
        let Some(seen) = self.0.take() else {
            return Vec::new();
        };
        let stale: Vec<K> = all.keys().filter(|k| mine(k) && !seen.contains(*k)).cloned().collect();
        stale
            .into_iter()
            .filter_map(|k| all.remove(&k).map(|v| (k, v)))
            .collect()
    }
}

fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

pub(super) fn node_facts(node: &Node) -> Option<NodeFacts> {
    let meta = &node.metadata;
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| ConditionFacts {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    since: c
                        .last_transition_time
                        .as_ref()
                        .map(|t| t.0)
                        .unwrap_or(Timestamp::UNIX_EPOCH),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(NodeFacts {
        name: meta.name.clone()?,
        uid: meta.uid.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        conditions,
        confirmed_healthy: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::MANUALLY_CONFIRMED_HEALTHY)),
        upgrading: meta.annotations.as_ref().and_then(upgrade::node_upgrading),
        machine: machines::machine_of_node(meta).map(|m| (m.api, m.namespace, m.name)),
    })
}

fn condition_status(obj: &DynamicObject, type_: &str) -> Option<String> {
    obj.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(type_))
        .and_then(|c| c.get("status")?.as_str().map(str::to_owned))
}

pub(super) fn remediation_facts(obj: &DynamicObject, api_version: &str, kind: &str) -> Option<StoredRemediation> {
    let meta = &obj.metadata;
    let name = meta.name.clone()?;
    let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key).cloned());
    let owners = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "NodeHealthCheck")
        .map(|o| o.uid.clone())
        .collect();
    // A MachineHealthCheck's remediation is named after its Machine; until a remediator records
    // the Machine's node, it stands for no node (least of all the one that shares the name).
    let node = match machines::node_of(meta) {
        NodeOf::Named(node) => node,
        NodeOf::Machine(_) => return None,
    };
    let facts = RemediationFacts {
        id: RemediationId {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: name.clone(),
        },
        uid: meta.uid.clone().unwrap_or_default(),
        node,
        template_name: annotation(annotations::TEMPLATE_NAME),
        owned: false,
        created: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH),
        timed_out: annotation(annotations::NHC_TIMED_OUT).and_then(|t| parse_time(&t)),
        healthy_since: annotation(annotations::HEALTHY_DELAY).and_then(|t| parse_time(&t)),
        succeeded: match condition_status(obj, conditions::SUCCEEDED).as_deref() {
            Some("True") => Some(true),
            Some("False") => Some(false),
            _ => None,
        },
        permanent_node_deletion_expected: condition_status(obj, conditions::PERMANENT_NODE_DELETION_EXPECTED)
            .as_deref()
            == Some("True"),
        control_plane: meta
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(labels::IS_CONTROL_PLANE_NODE)),
        deleting: meta.deletion_timestamp.is_some(),
        flagged_old: annotation(annotations::OLD_REMEDIATION_CR_FLAG).is_some(),
    };
    Some(StoredRemediation { facts, owners })
}

pub(super) fn template_state(obj: &DynamicObject) -> TemplateState {
    match obj.data.pointer("/spec/template/spec") {
        Some(spec) if spec.is_object() => TemplateState::Ready {
            spec: spec.clone(),
            multiple_templates: obj
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(annotations::MULTIPLE_TEMPLATES_SUPPORT)),
        },
        _ => TemplateState::Invalid("it has no spec.template.spec (the object a remediation is copied from)".into()),
    }
}

/// `medik8s-leases/node-<name>` -> (node, facts), when held by someone.
pub(super) fn lease_facts(lease: &Lease) -> Option<(String, LeaseFacts)> {
    let node = lease.metadata.name.as_deref()?.strip_prefix("node-")?.to_owned();
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    Some((
        node,
        LeaseFacts {
            holder,
            acquired: spec.acquire_time.as_ref().map(|t| t.0),
            renewed: spec.renew_time.as_ref().map(|t| t.0)?,
            duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
        },
    ))
}

impl Index {
    /// Stores the node's facts; returns the labels before the change when anything relevant
    /// changed (so both old and new selections can be told), `None` when nothing did.
    pub(super) fn upsert_node(&self, facts: NodeFacts) -> Option<BTreeMap<String, String>> {
        let mut nodes = self.nodes.write().ok()?;
        match nodes.get(&facts.name) {
            Some(old) if old == &facts => None,
            Some(old) => {
                let labels = old.labels.clone();
                nodes.insert(facts.name.clone(), facts);
                Some(labels)
            }
            None => {
                let labels = facts.labels.clone();
                nodes.insert(facts.name.clone(), facts);
                Some(labels)
            }
        }
    }

    pub(super) fn remove_node(&self, name: &str) -> Option<NodeFacts> {
        self.nodes.write().ok()?.remove(name)
    }

    pub(super) fn node_names(&self) -> BTreeSet<String> {
        self.nodes
            .read()
            .map(|n| n.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// A remediation this process deleted: gone (or going), whatever its watch delivers. A
    /// creation the watch never delivered (it was relisting: an API server restart) would
    /// otherwise count for a minute after the delete, and hold the node's lease, with nothing
    /// to wake the check when the minute is over (chaos-20261130T002415Z, trial 11).
    pub(super) fn forget_created(&self, id: &RemediationId) {
        self.created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }

    /// Remediation objects of these kinds, `owned` set for those `owner_uid` owns.
    pub(super) fn remediations_of(&self, kinds: &BTreeSet<(String, String)>, owner_uid: &str) -> Vec<RemediationFacts> {
        let Ok(all) = self.remediations.read() else {
            return Vec::new();
        };
        let mut created = self.created.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Past this, a creation the watch never delivered was deleted before it could be seen.
        created.retain(|_, (_, at)| at.elapsed() < CREATED_UNTIL_WATCHED);
        let unseen: Vec<&StoredRemediation> = created
            .values()
            .map(|(r, _)| r)
            .filter(|r| !all.contains_key(&r.facts.id))
            .collect();
        all.values()
            .chain(unseen)
            .filter(|r| kinds.contains(&(r.facts.id.api_version.clone(), r.facts.id.kind.clone())))
            .map(|r| RemediationFacts {
                owned: r.owners.iter().any(|o| o == owner_uid),
                ..r.facts.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    use super::*;

    #[test]
    fn a_lease_was_last_written_at_its_newest_managed_field_time() {
        let entry = |manager: &str, at: i64| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            time: Some(Time(Timestamp::from_second(at).expect("valid"))),
            ..Default::default()
        };
        let mut meta = ObjectMeta {
            managed_fields: Some(vec![entry("kube-controller-manager", 100), entry("kubelet", 250)]),
            ..Default::default()
        };
        assert_eq!(last_written(&meta), Timestamp::from_second(250).ok());
        meta.managed_fields = None;
        assert_eq!(last_written(&meta), None);
    }

    #[test]
    fn a_relist_forgets_what_was_deleted_while_the_watch_was_down() {
        let mut all: BTreeMap<(String, String), u32> = [
            (("SNR".into(), "a".into()), 1),
            (("SNR".into(), "b".into()), 2),
            (("FAR".into(), "c".into()), 3),
        ]
        .into();
        let mut relist = Relist::default();
        // Before any Init: nothing is pruned.
        assert!(relist.prune(&mut all, |_| true).is_empty());
        relist.start();
        relist.saw(&("SNR".to_owned(), "a".to_owned()));
        // Only this watch's kind: the FAR object belongs to another watch.
        let gone = relist.prune(&mut all, |k| k.0 == "SNR");
        assert_eq!(gone, vec![(("SNR".to_owned(), "b".to_owned()), 2)]);
        assert_eq!(all.len(), 2);
        // A prune ends the relist: a later one without a new start removes nothing.
        assert!(relist.prune(&mut all, |_| true).is_empty());
    }

    #[test]
    fn a_remediation_object_yields_its_facts() {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
            "kind": "SelfNodeRemediation",
            "metadata": {
                "name": "node-1", "namespace": "ns", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"remediation.medik8s.io/nhc-timed-out": "2026-01-01T00:05:00Z", "remediation.medik8s.io/template-name": "t"},
                "labels": {"remediation.medik8s.io/isControlPlaneNode": ""},
                "ownerReferences": [{"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "uid": "nhc-uid"}]
            },
            "status": {"conditions": [{"type": "Succeeded", "status": "False"}]}
        }))
        .expect("object");
        let stored =
            remediation_facts(&obj, "self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediation").expect("facts");
        assert_eq!(stored.owners, ["nhc-uid"]);
        let f = stored.facts;
        assert_eq!(
            (
                f.node.as_str(),
                f.template_name.as_deref(),
                f.succeeded,
                f.control_plane
            ),
            ("node-1", Some("t"), Some(false), true)
        );
        assert_eq!(f.timed_out, Some("2026-01-01T00:05:00Z".parse().expect("time")));
    }

    #[test]
    fn a_remediation_just_created_counts_before_its_watch_delivers_it_and_not_twice_after() {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
            "kind": "SelfNodeRemediation",
            "metadata": {
                "name": "node-1-abcde", "namespace": "ns", "uid": "u1",
                "annotations": {"remediation.medik8s.io/node-name": "node-1"},
                "ownerReferences": [{"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "name": "nhc", "uid": "nhc-uid"}]
            }
        }))
        .expect("object");
        let api_version = "self-node-remediation.medik8s.io/v1alpha1";
        let stored = remediation_facts(&obj, api_version, "SelfNodeRemediation").expect("facts");
        let kinds = BTreeSet::from([(api_version.to_owned(), "SelfNodeRemediation".to_owned())]);
        let index = Index::default();
        index
            .created
            .lock()
            .expect("lock")
            .insert(stored.facts.id.clone(), (stored.clone(), std::time::Instant::now()));
        let seen = index.remediations_of(&kinds, "nhc-uid");
        assert_eq!(seen.len(), 1);
        assert!(seen[0].owned && seen[0].node == "node-1");
        // Delivered by the watch, still in `created` for a moment: counted once.
        index
            .remediations
            .write()
            .expect("lock")
            .insert(stored.facts.id.clone(), stored.clone());
        assert_eq!(index.remediations_of(&kinds, "nhc-uid").len(), 1);
        // Deleted by this process before the watch delivered anything: gone at once.
        index.remediations.write().expect("lock").clear();
        index.forget_created(&stored.facts.id);
        assert!(index.remediations_of(&kinds, "nhc-uid").is_empty());
    }

    #[test]
    fn heartbeats_alone_change_nothing() {
        let index = Index::default();
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"a": "b"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:01:00Z"}]}
        }))
        .expect("node");
        assert!(index.upsert_node(node_facts(&node).expect("facts")).is_some());
        let mut beat = node.clone();
        if let Some(c) = beat.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:02:00Z".parse().expect("time"),
            ));
        }
        assert!(
            index.upsert_node(node_facts(&beat).expect("facts")).is_none(),
            "a heartbeat is no change"
        );
    }
}
