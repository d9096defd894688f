//! Carries a decision out: leases, new remediation objects, annotations, deletions, events.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, ObjectReference},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use nodemedic_api::{
    healthcheck::NodeHealthCheck,
    machines,
    names::{annotations, labels},
};
use nodemedic_kube::{
    CallContext,
    events::Events,
    node_lease::{self, LeaseDecision, LeaseView},
    time::rfc3339,
};
use serde_json::json;

use super::reconcile::Context;
use crate::{
    Result,
    decide::{Decision, LeaseAction, NewRemediation, Notice, RemediationFacts, RemediationId, Severity, TemplateRef},
    metrics::OldLabels,
};

/// API requests in flight at once while carrying a decision out.
pub(crate) const PARALLEL_REQUESTS: usize = 32;

/// What every write of one decision needs to know.
pub(super) struct Apply<'a> {
    pub ctx: &'a Context,
    pub nhc: &'a NodeHealthCheck,
    pub name: &'a str,
    pub holder: &'a str,
    pub resources: &'a BTreeMap<TemplateRef, ApiResource>,
    pub node_uids: &'a BTreeMap<String, String>,
}

impl Apply<'_> {
    /// Carries the decision out; returns the facts of the objects it created.
    pub(super) async fn decision(&self, decision: &Decision) -> Result<Vec<RemediationFacts>> {
        // Each node's lease and remediation are independent of every other node's: when many
        // nodes fail at once, the API round trips overlap instead of queueing, and each node's
        // remediation follows its own lease at once rather than waiting for every other lease
        // (500 nodes at 10 ms a write would otherwise delay the last remediation by seconds).
        // The futures are built first, by named methods: borrowing closures inside the stream
        // would not be Send for every lifetime.
        let creating: BTreeSet<&str> = decision.create.iter().map(|n| n.node.as_str()).collect();
        let lease_for = |node: &str| {
            decision
                .leases
                .iter()
                .find(|a| matches!(a, LeaseAction::Request { node: n, .. } if n == node))
        };
        let creations: Vec<_> = decision
            .create
            .iter()
            .filter_map(|new| {
                let resource = self.resources.get(&new.template)?;
                Some(self.lease_then_create(lease_for(&new.node), resource, new))
            })
            .collect();
        let outcomes: Vec<(&str, Result<Option<RemediationFacts>>)> = stream::iter(creations)
            .buffer_unordered(PARALLEL_REQUESTS)
            .collect()
            .await;
        let other_leases: Vec<_> = decision
            .leases
            .iter()
            .filter(|a| !matches!(a, LeaseAction::Request { node, .. } if creating.contains(node.as_str())))
            .map(|action| self.lease(action))
            .collect();
        let other_leases: Vec<Result<bool>> = stream::iter(other_leases)
            .buffer_unordered(PARALLEL_REQUESTS)
            .collect()
            .await;
        // One failed write must not cost the round what the others did: the rest of the
        // decision is still carried out and its events still recorded (a remediation that was
        // created is never announced later), except those of the nodes whose creation failed,
        // which the next round decides again. The first error is returned at the end.
        let mut first_error = None;
        let mut failed: BTreeSet<&str> = BTreeSet::new();
        let mut created = Vec::new();
        for (node, outcome) in outcomes {
            match outcome {
                Ok(facts) => created.extend(facts),
                Err(error) => {
                    failed.insert(node);
                    first_error.get_or_insert(error);
                }
            }
        }
        for outcome in other_leases {
            if let Err(error) = outcome {
                first_error.get_or_insert(error);
            }
        }
        if let Err(error) = self.annotate(decision).await {
            first_error.get_or_insert(error);
        }
        if let Err(error) = self.delete(decision).await {
            first_error.get_or_insert(error);
        }
        let nodes = Api::<Node>::all(self.ctx.client.clone());
        for node in &decision.clear_confirmation {
            let patch = json!({ "metadata": { "annotations": { annotations::MANUALLY_CONFIRMED_HEALTHY: null } } });
            let _ = nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await;
        }
        let notices: Vec<Notice> = decision
            .notices
            .iter()
            .filter(|n| n.node.as_deref().is_none_or(|node| !failed.contains(node)))
            .cloned()
            .collect();
        self.publish_in_background(&notices);
        match first_error {
            Some(error) => Err(error),
            None => Ok(created),
        }
    }

    /// One node's new remediation: its lease first, then the object (none when another holder
    /// has the lease).
    async fn lease_then_create<'n>(
        &self,
        lease: Option<&LeaseAction>,
        resource: &ApiResource,
        new: &'n NewRemediation,
    ) -> (&'n str, Result<Option<RemediationFacts>>) {
        let outcome = match lease {
            Some(action) => match self.lease(action).await {
                Ok(true) => self.create(resource, new).await,
                Ok(false) => Ok(None),
                Err(error) => Err(error),
            },
            None => self.create(resource, new).await,
        };
        (new.node.as_str(), outcome)
    }

    /// Takes, extends or releases a node's lease; false when another holder has it.
    async fn lease(&self, action: &LeaseAction) -> Result<bool> {
        let ctx = self.ctx;
        match action {
            LeaseAction::Request { node, duration } => {
                if self.held_long_enough(node, *duration) {
                    return Ok(true);
                }
                let uid = self.node_uids.get(node).map(String::as_str).unwrap_or_default();
                let seen = ctx.index.leases.read().map_or(true, |leases| leases.contains_key(node));
                let requested = if seen {
                    ctx.leases.request(node, uid, self.holder, *duration).await
                } else {
                    ctx.leases.request_unseen(node, uid, self.holder, *duration).await
                };
                match requested {
                    Ok(()) => Ok(true),
                    Err(nodemedic_kube::Error::LeaseHeld { holder: other, .. }) => {
                        let message = format!(
                            "Skipped remediation of node {node} because node lease is already taken by {other}"
                        );
                        ctx.events
                            .warning(&self.nhc.object_ref(&()), "RemediationSkipped", message)
                            .await;
                        Ok(false)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            LeaseAction::Release { node } => match ctx.leases.invalidate(node, self.holder).await {
                Ok(()) | Err(nodemedic_kube::Error::LeaseHeld { .. }) => Ok(true),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Whether the lease's watch shows it held by this check with enough time left that a
    /// request would keep it as it is. Then there is nothing to write, and no need to read it
    /// again: every ongoing remediation asks for its lease in every reconcile, and at 500 of them
    /// those reads took most of each reconcile, which every newly failed node waited behind.
    /// Anything the watch has not shown yet (a lease deleted or taken over) wakes the check.
    fn held_long_enough(&self, node: &str, duration: Duration) -> bool {
        let Ok(leases) = self.ctx.index.leases.read() else {
            return false;
        };
        let Some(lease) = leases.get(node) else {
            return false;
        };
        let view = LeaseView {
            holder: Some(lease.holder.clone()),
            duration: lease.duration,
            renewed: Some(lease.renewed),
        };
        node_lease::decide_request(Some(&view), self.holder, duration, Timestamp::now()) == LeaseDecision::Keep
    }

    async fn create(&self, resource: &ApiResource, new: &NewRemediation) -> Result<Option<RemediationFacts>> {
        let nhc = self.nhc;
        let owner = OwnerReference {
            api_version: NodeHealthCheck::api_version(&()).into(),
            kind: NodeHealthCheck::kind(&()).into(),
            name: nhc.name_any(),
            uid: nhc.metadata.uid.clone().unwrap_or_default(),
            ..Default::default()
        };
        let mut object_labels = BTreeMap::from([(labels::PART_OF.to_owned(), labels::PART_OF_NHC.to_owned())]);
        if new.control_plane {
            object_labels.insert(labels::IS_CONTROL_PLANE_NODE.into(), String::new());
        }
        let mut obj = DynamicObject::new(new.name.as_deref().unwrap_or(""), resource);
        obj.metadata.name = new.name.clone();
        obj.metadata.generate_name = new.name.is_none().then(|| format!("{}-", new.node));
        obj.metadata.namespace = Some(new.namespace.clone()).filter(|n| !n.is_empty());
        obj.metadata.annotations = Some(BTreeMap::from([
            (annotations::NODE_NAME.to_owned(), new.node.clone()),
            (annotations::TEMPLATE_NAME.to_owned(), new.template.name.clone()),
        ]));
        obj.metadata.labels = Some(object_labels);
        let mut owners = vec![owner];
        owners.extend(self.machine_owner(new).await?);
        obj.metadata.owner_references = Some(owners);
        obj.data = json!({ "spec": new.spec });
        match dynamic_api(&self.ctx.client, resource, &new.namespace)
            .create(&PostParams::default(), &obj)
            .await
        {
            Ok(made) => {
                let stored = super::index::remediation_facts(&made, &new.api_version, &new.kind);
                // Known at once, not only when the watch delivers it (see Index::created).
                if let Some(stored) = &stored {
                    self.ctx
                        .index
                        .created
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(stored.facts.id.clone(), (stored.clone(), std::time::Instant::now()));
                }
                let facts = stored.map(|s| RemediationFacts { owned: true, ..s.facts });
                if let Some(facts) = &facts {
                    tracing::info!(nhc = %self.name, node = %new.node, object = %facts.id, "created remediation: node unhealthy for its condition's duration and within budget");
                }
                Ok(facts)
            }
            // Someone (a previous leader, another check) made it already; the watch will tell.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => {
                let call = format!("creating a {} for node {}", new.kind, new.node);
                Err(nodemedic_kube::Error::call(call, e).into())
            }
        }
    }

    /// The node's Machine (either machine layer) as an owner, so deleting the Machine takes the
    /// remediation with it. Owner references cannot cross namespaces: a Machine elsewhere than
    /// the remediation is left out, as medik8s does.
    async fn machine_owner(&self, new: &NewRemediation) -> Result<Option<OwnerReference>> {
        let node = Api::<Node>::all(self.ctx.client.clone())
            .get_opt(&new.node)
            .await
            .with_context(|| format!("reading node {}", new.node))?;
        let Some(machine) = node.as_ref().and_then(|n| machines::machine_of_node(&n.metadata)) else {
            return Ok(None);
        };
        if machine.namespace != new.namespace {
            tracing::info!(nhc = %self.name, node = %new.node, %machine, namespace = %new.namespace, "the node's Machine is in another namespace than the remediation: not its owner");
            return Ok(None);
        }
        let Some(found) = nodemedic_kube::machines::get_machine(&self.ctx.client, &machine).await? else {
            return Ok(None);
        };
        Ok(Some(OwnerReference {
            api_version: format!("{}/{}", machine.api.group(), machine.version),
            kind: machines::MACHINE_KIND.into(),
            name: machine.name.clone(),
            uid: found.metadata.uid.clone().unwrap_or_default(),
            ..Default::default()
        }))
    }

    async fn annotate(&self, decision: &Decision) -> Result<()> {
        let time = rfc3339(&Timestamp::now());
        for (ids, key, value) in [
            (&decision.mark_timed_out, annotations::NHC_TIMED_OUT, time.as_str()),
            (&decision.mark_healthy_since, annotations::HEALTHY_DELAY, time.as_str()),
            // medik8s's value.
            (&decision.flag_old, annotations::OLD_REMEDIATION_CR_FLAG, "flagon"),
        ] {
            for id in ids {
                let Some(resource) = self.resource_of(&id.kind, &id.api_version) else {
                    continue;
                };
                let api = dynamic_api(&self.ctx.client, resource, &id.namespace);
                let patch = json!({ "metadata": { "annotations": { key: value } } });
                match api
                    .patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(nhc = %self.name, object = %id, annotation = key, "annotated");
                        if key == annotations::OLD_REMEDIATION_CR_FLAG {
                            self.count_old(id);
                        }
                    }
                    // Gone, or refused: the next decision sees the object as it is then.
                    Err(kube::Error::Api(status)) => {
                        tracing::info!(nhc = %self.name, object = %id, annotation = key, reason = %status.message, "not annotated")
                    }
                    Err(e) => return Err(nodemedic_kube::Error::call(format!("annotating {id} with {key}"), e).into()),
                }
            }
        }
        Ok(())
    }

    /// `nodehealthcheck_old_remediation_cr`, once the flag is on the object (medik8s's labels:
    /// the node, the remediation's namespace).
    fn count_old(&self, id: &RemediationId) {
        let node = self
            .ctx
            .index
            .remediations
            .read()
            .ok()
            .and_then(|all| all.get(id).map(|r| r.facts.node.clone()))
            .unwrap_or_else(|| id.name.clone());
        self.ctx
            .metrics
            .old_remediations
            .get_or_create(&OldLabels {
                name: node,
                namespace: id.namespace.clone(),
            })
            .inc();
    }

    async fn delete(&self, decision: &Decision) -> Result<()> {
        for id in &decision.delete {
            let Some(resource) = self.resource_of(&id.kind, &id.api_version) else {
                continue;
            };
            match dynamic_api(&self.ctx.client, resource, &id.namespace)
                .delete(&id.name, &DeleteParams::background())
                .await
            {
                Ok(_) => {
                    self.ctx.index.forget_created(id);
                    tracing::info!(nhc = %self.name, object = %id, "deleted remediation");
                }
                Err(kube::Error::Api(s)) if s.code == 404 => self.ctx.index.forget_created(id),
                Err(e) => return Err(nodemedic_kube::Error::call(format!("deleting {id}"), e).into()),
            }
        }
        Ok(())
    }

    fn resource_of(&self, kind: &str, api_version: &str) -> Option<&ApiResource> {
        self.resources
            .values()
            .find(|r| r.kind == kind && r.api_version == api_version)
    }

    /// Logs the notices now and records them as events off the reconcile: with hundreds of nodes
    /// failing at once, two event writes a node would otherwise hold back the next reconcile,
    /// and with it the remediations of the nodes whose durations end meanwhile.
    fn publish_in_background(&self, notices: &[Notice]) {
        if notices.is_empty() {
            return;
        }
        for notice in notices {
            tracing::info!(nhc = %self.name, node = notice.node.as_deref().unwrap_or(""), reason = notice.reason, "{}", notice.message);
        }
        let events = self.ctx.events.clone();
        let nhc_ref = self.nhc.object_ref(&());
        let notices = notices.to_vec();
        tokio::spawn(async move {
            let records = notices
                .into_iter()
                .map(|notice| record(events.clone(), nhc_ref.clone(), notice));
            stream::iter(records)
                .buffer_unordered(PARALLEL_REQUESTS)
                .collect::<Vec<()>>()
                .await;
        });
    }
}

async fn record(events: Events, nhc_ref: ObjectReference, notice: Notice) {
    let (events, notice) = (&events, &notice);
    let on_each = |on: ObjectReference| async move {
        match notice.severity {
            Severity::Normal => events.normal(&on, notice.reason, notice.message.clone()).await,
            Severity::Warning => events.warning(&on, notice.reason, notice.message.clone()).await,
        }
    };
    on_each(nhc_ref).await;
    if let Some(node) = &notice.node {
        on_each(node_ref(node)).await;
    }
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        ..Default::default()
    }
}

fn dynamic_api(client: &Client, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    if namespace.is_empty() {
        Api::all_with(client.clone(), resource)
    } else {
        Api::namespaced_with(client.clone(), namespace, resource)
    }
}
