//! One reconcile of a NodeHealthCheck: gather the inputs from the index, decide, apply.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::{Api, Client, Resource, api::ApiResource, runtime::controller::Action};
use nodemedic_api::{healthcheck::NodeHealthCheck, names::leases};
use nodemedic_kube::{CallContext, events::Events, node_lease::NodeLeases};

use super::{
    apply::{self, Apply},
    index::{self, Index},
    kinds::{Kinds, Lookup, Role},
    status,
};
use crate::{
    Error, Result,
    decide::{self, Decision, Input, LeaseAction, NodeFacts, RemediationFacts, TemplateRef, TemplateState, liveness},
    metrics::{CheckLabels, Metrics, NodeLabels, TemplateLabels},
    spec,
};

pub(super) struct Context {
    pub client: Client,
    pub index: Arc<Index>,
    pub kinds: Arc<Kinds>,
    pub leases: NodeLeases,
    pub events: Events,
    pub metrics: Metrics,
    /// etcd members configured outside any pod (external etcd), asked for their health.
    pub etcd: Option<nodemedic_kube::etcd::External>,
    /// Per check: what metrics need between reconciles.
    pub memory: Mutex<BTreeMap<String, CheckMemory>>,
}

#[derive(Default)]
pub(super) struct CheckMemory {
    /// When each node entered the unhealthy list, and the last remediation kind it had.
    first_unhealthy: BTreeMap<String, (Timestamp, String)>,
    blocked: BTreeSet<String>,
    held_back_alive: BTreeSet<String>,
    deferred: BTreeSet<String>,
    ongoing: BTreeSet<NodeLabels>,
}

pub(super) async fn reconcile(nhc: Arc<NodeHealthCheck>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let name = nhc.metadata.name.clone().ok_or(Error::Unnamed("NodeHealthCheck"))?;
    let uid = nhc.metadata.uid.clone().unwrap_or_default();
    let check = match spec::parse(&nhc) {
        Ok(check) => check,
        Err(why) => return invalid(&ctx, &nhc, &name, why).await,
    };
    let templates = Templates::of(&ctx, &check).await;
    let memory = status::memory(nhc.status.as_ref());
    let remediations = ctx.index.remediations_of(&templates.kinds, &uid);
    let holder = leases::health_check_holder(&name);
    let now = Timestamp::now();
    let basis = Basis {
        check: &check,
        templates: &templates.states,
        remediations: &remediations,
        memory: &memory,
        holder: &holder,
        now,
    };
    let (mut decision, mut node_uids) = decide_now(&ctx, &basis, decide::EtcdView::NotRead)?;
    if let Some(why) = &decision.undecided {
        tracing::debug!(nhc = %name, %why, "nothing decided: a template's kind is not known to be served or not");
        return Ok(decision
            .requeue_after
            .map_or_else(Action::await_change, Action::requeue));
    }
    // A control-plane node is remediated only if etcd keeps its quorum: the members are read
    // (two small lists) only when one would be, and it is decided again with them.
    if decision.create.iter().any(|c| c.control_plane) {
        let members = nodemedic_kube::etcd::members(&ctx.client, ctx.etcd.as_ref())
            .await
            .map_err(|e| e.to_string());
        let view = match &members {
            Ok(members) => decide::EtcdView::Members(members),
            Err(why) => decide::EtcdView::Unreadable(why),
        };
        (decision, node_uids) = decide_now(&ctx, &basis, view)?;
    }

    // The watch cache can lag the API for minutes after etcd comes back (seed 47, trial 45: a
    // remediation created from a view of the node 111 s old, deleted 76 ms later when the node
    // read Ready). A remediation is created only when a fresh read of its node agrees with what
    // the decision was made from; otherwise the fresh facts are stored and it is decided again.
    if !decision.create.is_empty() && !cache_agrees(&ctx, &decision).await? {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let created = Apply {
        ctx: &ctx,
        nhc: &nhc,
        name: &name,
        holder: &holder,
        resources: &templates.resources,
        node_uids: &node_uids,
    }
    .decision(&decision)
    .await?;
    for removed in remediations.iter().filter(|r| decision.delete.contains(&r.id)) {
        let template = removed.template_name.clone().unwrap_or_default();
        ctx.metrics
            .finished
            .get_or_create(&TemplateLabels {
                nhc: name.clone(),
                template,
            })
            .inc();
    }
    let mut owned: Vec<RemediationFacts> = remediations
        .into_iter()
        .filter(|r| r.owned && !decision.delete.contains(&r.id))
        .chain(created)
        .collect();
    for r in owned.iter_mut().filter(|r| decision.mark_timed_out.contains(&r.id)) {
        r.timed_out = Some(now);
    }
    // A conflict: the status was computed from the watch's copy of an older version. The check's
    // own status writes do not wake it, so the requeue is what brings it back to compute it again.
    if let Err(error) = write_status(&ctx, &nhc, &check, &decision, &owned).await {
        return nodemedic_kube::status::requeue_on_conflict(nhc.as_ref(), error);
    }
    record_metrics(&ctx, &name, &decision, &owned, now);
    ctx.metrics.decision_seconds.observe(started.elapsed().as_secs_f64());
    Ok(decision
        .requeue_after
        .map(Action::requeue)
        .unwrap_or_else(Action::await_change))
}

/// The check's templates: whether each is usable, the API resource of its remediation kind, and
/// the remediation kinds the check owns objects of.
struct Templates {
    states: BTreeMap<TemplateRef, TemplateState>,
    resources: BTreeMap<TemplateRef, ApiResource>,
    kinds: BTreeSet<(String, String)>,
}

impl Templates {
    async fn of(ctx: &Context, check: &decide::CheckSpec) -> Self {
        let mut templates = Self {
            states: BTreeMap::new(),
            resources: BTreeMap::new(),
            kinds: BTreeSet::new(),
        };
        for step in &check.steps {
            let t = &step.template;
            let template_kind = ctx.kinds.ensure(Role::Template, &t.api_version, &t.kind).await;
            let remediation_kind = ctx
                .kinds
                .ensure(Role::Remediation, &t.api_version, t.remediation_kind())
                .await;
            let state = match (template_kind, remediation_kind) {
                (Lookup::Served(_), Lookup::Served(resource)) => {
                    templates.resources.insert(t.clone(), resource);
                    ctx.index
                        .templates
                        .read()
                        .ok()
                        .and_then(|all| all.get(t).cloned())
                        .unwrap_or(TemplateState::NotFound)
                }
                (Lookup::NotServed, _) | (_, Lookup::NotServed) => TemplateState::KindMissing,
                (Lookup::Unknown(why), _) | (_, Lookup::Unknown(why)) => TemplateState::KindUnknown(why),
            };
            templates.states.insert(t.clone(), state);
            templates
                .kinds
                .insert((t.api_version.clone(), t.remediation_kind().to_owned()));
        }
        templates
    }
}

/// What a reconcile decides from besides the index.
struct Basis<'a> {
    check: &'a decide::CheckSpec,
    templates: &'a BTreeMap<TemplateRef, TemplateState>,
    remediations: &'a [RemediationFacts],
    memory: &'a decide::Memory,
    holder: &'a str,
    now: Timestamp,
}

/// Decides over the index as it is now; with the uid of every node whose lease is requested.
fn decide_now(
    ctx: &Context,
    basis: &Basis<'_>,
    etcd: decide::EtcdView<'_>,
) -> Result<(Decision, BTreeMap<String, String>)> {
    let Basis {
        check,
        templates,
        remediations,
        memory,
        holder,
        now,
    } = *basis;
    let lease_facts = ctx.index.leases.read().map(|l| l.clone()).unwrap_or_default();
    // Its updates cannot be left half done: a panic elsewhere leaves it usable.
    let outage = ctx
        .index
        .api_contact
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .window(now);
    let nodes = ctx.index.nodes.read().map_err(|_| Error::Poisoned("node index"))?;
    // Read once for both uses: a second read of the same lock on this thread could wait behind a
    // writer forever.
    let renewals = ctx
        .index
        .kubelet_renewals
        .read()
        .map_err(|_| Error::Poisoned("kubelet renewals"))?;
    let upgrades: Vec<decide::upgrade::Upgrade> = ctx
        .index
        .upgrades
        .read()
        .map_err(|_| Error::Poisoned("upgrades"))?
        .values()
        .flatten()
        .cloned()
        .collect();
    let machine_health_checks: Vec<decide::conflict::MachineHealthCheckFacts> = ctx
        .index
        .machine_health_checks
        .read()
        .map_err(|_| Error::Poisoned("machine health checks"))?
        .values()
        .flatten()
        .cloned()
        .collect();
    let machines = ctx
        .index
        .machine_labels
        .read()
        .map_err(|_| Error::Poisoned("machine labels"))?;
    let refs: Vec<&NodeFacts> = nodes.values().collect();
    let decide_with = |alive: &BTreeMap<String, liveness::Alive>| {
        decide::decide(&Input {
            now,
            check,
            nodes: &refs,
            remediations,
            templates,
            leases: &lease_facts,
            memory,
            lease_holder: holder,
            alive,
            outage,
            kubelet_renewals: &renewals,
            upgrades: &upgrades,
            machine_health_checks: &machine_health_checks,
            machines: &machines,
            etcd,
        })
    };
    let first = decide_with(&BTreeMap::new());
    // The Ready=Unknown nodes it would remediate: their kubelet renewals may show them alive.
    let unknown = first
        .create
        .iter()
        .filter_map(|new| Some((new.node.clone(), liveness::unknown_since(nodes.get(&new.node)?)?)));
    let alive = living(&renewals, unknown, now);
    // Decided again with the evidence, so everything that follows from a creation (its lease, the
    // one-control-plane-node rule, the phase) follows from what is created.
    let decision = if alive.is_empty() { first } else { decide_with(&alive) };
    let uids: BTreeMap<String, String> = decision
        .leases
        .iter()
        .filter_map(|a| match a {
            LeaseAction::Request { node, .. } => nodes.get(node).map(|n| (node.clone(), n.uid.clone())),
            LeaseAction::Release { .. } => None,
        })
        .collect();
    Ok((decision, uids))
}

async fn invalid(ctx: &Context, nhc: &NodeHealthCheck, name: &str, why: String) -> Result<Action> {
    tracing::warn!(nhc = %name, %why, "NodeHealthCheck disabled: invalid spec");
    let mut decision = Decision::default();
    decision.status.phase = decide::Phase::Disabled;
    decision.status.reason = format!("NHC is disabled: InvalidSpec: {why}");
    decision.status.disabled = Some((true, "InvalidSpec", why.clone()));
    decision.status.remediation_allowed = (false, "Disabled", "the health check is disabled".into());
    if status::memory(nhc.status.as_ref()).disabled != Some(true) {
        ctx.events.warning(&nhc.object_ref(&()), "Disabled", why).await;
    }
    let api = Api::<NodeHealthCheck>::all(ctx.client.clone());
    let now = nodemedic_kube::time::now();
    let mut new = status::build(
        &decision.status,
        nhc.status.as_ref(),
        &[],
        false,
        nhc.metadata.generation,
        &now,
    );
    new.observed_nodes = Some(0);
    new.healthy_nodes = Some(0);
    match write_if_changed(&api, nhc, new, now).await {
        Ok(_) => Ok(Action::await_change()),
        Err(error) => nodemedic_kube::status::requeue_on_conflict(nhc, error),
    }
}

/// Whether a consistent read of every node the decision creates a remediation for shows what
/// the index holds; where it does not, the index takes the fresh facts.
async fn cache_agrees(ctx: &Context, decision: &Decision) -> Result<bool> {
    let api = Api::<Node>::all(ctx.client.clone());
    // Read side by side: when hundreds of nodes fail at once, one read after another would
    // delay the last remediation by hundreds of round trips. The futures are built first (a
    // closure borrowing the decision inside the stream would not be Send for every lifetime).
    let reads: Vec<_> = decision
        .create
        .iter()
        .map(|new| fresh_facts(api.clone(), new.node.clone()))
        .collect();
    let mut reads = stream::iter(reads).buffer_unordered(apply::PARALLEL_REQUESTS);
    let mut agrees = true;
    // Each read is compared as it arrives: a watch update to the index after the read would
    // otherwise be overwritten by the older facts.
    while let Some((node, fresh)) = reads.next().await {
        let fresh = fresh?;
        let cached = ctx
            .index
            .nodes
            .read()
            .map_err(|_| Error::Poisoned("node index"))?
            .get(&node)
            .cloned();
        if fresh == cached {
            continue;
        }
        agrees = false;
        tracing::info!(%node, "the node's facts in the API differ from the health check's cache: deciding again before remediating it");
        match fresh {
            Some(facts) => {
                ctx.index.upsert_node(facts);
            }
            None => {
                ctx.index.remove_node(&node);
            }
        }
    }
    Ok(agrees)
}

/// The node's facts as etcd has them now: no resourceVersion, so not from the API server's
/// watch cache.
async fn fresh_facts(api: Api<Node>, node: String) -> (String, Result<Option<NodeFacts>>) {
    let fresh = api
        .get_opt(&node)
        .await
        .with_context(|| format!("reading Node {node} before remediating it"));
    let facts = fresh
        .map(|n| n.as_ref().and_then(index::node_facts))
        .map_err(Error::from);
    (node, facts)
}

/// The nodes (mapped to when they turned Unknown) whose kubelet lease renewals show them alive.
fn living(
    renewals: &BTreeMap<String, Timestamp>,
    unknown: impl Iterator<Item = (String, Timestamp)>,
    now: Timestamp,
) -> BTreeMap<String, liveness::Alive> {
    unknown
        .filter_map(|(node, since)| {
            let renewed = *renewals.get(&node)?;
            Some((node, liveness::alive(since, renewed, now)?))
        })
        .collect()
}

async fn write_status(
    ctx: &Context,
    nhc: &NodeHealthCheck,
    check: &decide::CheckSpec,
    decision: &Decision,
    owned: &[RemediationFacts],
) -> nodemedic_kube::Result<bool> {
    let api = Api::<NodeHealthCheck>::all(ctx.client.clone());
    let now = nodemedic_kube::time::now();
    let new = status::build(
        &decision.status,
        nhc.status.as_ref(),
        owned,
        check.storm_cooldown.is_some(),
        nhc.metadata.generation,
        &now,
    );
    write_if_changed(&api, nhc, new, now).await
}

/// Writes only a real change (stamped with its time), so status writes never trigger reconciles
/// of their own; locked to the version `new` was computed from, as every status write.
async fn write_if_changed(
    api: &Api<NodeHealthCheck>,
    nhc: &NodeHealthCheck,
    new: nodemedic_api::healthcheck::NodeHealthCheckStatus,
    now: Time,
) -> nodemedic_kube::Result<bool> {
    nodemedic_kube::status::write(api, nhc, |current, _| {
        if *current == new {
            return false;
        }
        *current = new;
        current.last_update_time = Some(now);
        true
    })
    .await
}

fn record_metrics(ctx: &Context, name: &str, decision: &Decision, owned: &[RemediationFacts], now: Timestamp) {
    let m = &ctx.metrics;
    let check = CheckLabels { nhc: name.to_owned() };
    let plan = &decision.status;
    m.observed.get_or_create(&check).set(plan.observed as i64);
    m.healthy.get_or_create(&check).set(plan.healthy as i64);
    let with_remediation: BTreeSet<&str> = owned.iter().map(|r| r.node.as_str()).collect();
    m.ongoing.get_or_create(&check).set(with_remediation.len() as i64);
    m.unhealthy.get_or_create(&check).set(plan.unhealthy.len() as i64);
    for new in &decision.create {
        m.started
            .get_or_create(&TemplateLabels {
                nhc: name.to_owned(),
                template: new.template.name.clone(),
            })
            .inc();
    }
    for id in &decision.mark_timed_out {
        let template = owned
            .iter()
            .find(|r| &r.id == id)
            .and_then(|r| r.template_name.clone())
            .unwrap_or_default();
        m.timed_out
            .get_or_create(&TemplateLabels {
                nhc: name.to_owned(),
                template,
            })
            .inc();
    }
    let Ok(mut all) = ctx.memory.lock() else { return };
    let memory = all.entry(name.to_owned()).or_default();
    for node in decision.blocked_by_budget.difference(&memory.blocked) {
        tracing::info!(nhc = %name, %node, "remediation held back by the budget");
        m.budget_blocks.get_or_create(&check).inc();
    }
    memory.blocked = decision.blocked_by_budget.clone();
    for node in decision.held_back_alive.difference(&memory.held_back_alive) {
        tracing::info!(nhc = %name, %node, "remediation held back: the node's kubelet still renews its lease");
        m.held_back_alive.get_or_create(&check).inc();
    }
    memory.held_back_alive = decision.held_back_alive.clone();
    for node in decision.deferred.difference(&memory.deferred) {
        tracing::info!(nhc = %name, %node, "remediation deferred: the health check's loss of the API server may explain the node's Unknown condition");
        m.deferred_after_outage.get_or_create(&check).inc();
    }
    memory.deferred = decision.deferred.clone();
    for node in plan.unhealthy.keys() {
        let entry = memory
            .first_unhealthy
            .entry(node.clone())
            .or_insert((now, String::new()));
        if let Some(r) = owned.iter().find(|r| &r.node == node) {
            entry.1 = r.id.kind.clone();
        }
    }
    let recovered: Vec<String> = memory
        .first_unhealthy
        .keys()
        .filter(|n| !plan.unhealthy.contains_key(*n))
        .cloned()
        .collect();
    for node in recovered {
        if let Some((since, kind)) = memory.first_unhealthy.remove(&node) {
            let seconds = (now - since).total(jiff::Unit::Second).unwrap_or(0.0);
            m.unhealthy_duration.get_or_create(&check).observe(seconds);
            m.unhealthy_duration_per_node
                .get_or_create(&NodeLabels {
                    name: node.clone(),
                    namespace: String::new(),
                    remediation: kind,
                })
                .observe(seconds);
        }
    }
    let ongoing: BTreeSet<NodeLabels> = owned
        .iter()
        .map(|r| NodeLabels {
            name: r.node.clone(),
            namespace: r.id.namespace.clone(),
            remediation: r.id.kind.clone(),
        })
        .collect();
    for gone in memory.ongoing.difference(&ongoing) {
        m.ongoing_per_node.remove(gone);
    }
    for labels in &ongoing {
        m.ongoing_per_node.get_or_create(labels).set(1);
    }
    memory.ongoing = ongoing;
}

pub(super) fn error_policy(nhc: Arc<NodeHealthCheck>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&crate::metrics::ErrorLabels {
            kind: error.kind().into(),
        })
        .inc();
    nodemedic_kube::steps::retry(nhc.as_ref(), error, Duration::from_secs(5))
}
