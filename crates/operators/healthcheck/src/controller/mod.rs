//! The health-check controller: watches feed the index and wake exactly the checks a change
//! concerns; kube's applier runs their reconciles (one at a time per check, requeued at the
//! instant the next timer expires, never polled).

pub mod admission;
mod apply;
mod contact;
pub mod default_check;
mod definitions;
mod index;
mod kinds;
mod machine_checks;
mod optional;
mod reconcile;
mod status;
mod upgrades;

use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, PoisonError},
    time::Duration,
};

use futures::{StreamExt, channel::mpsc};
use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client,
    api::ListParams,
    core::{PartialObjectMeta, SelectorExt},
    runtime::{
        WatchStreamExt, applier,
        controller::Config,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use nodemedic_api::{healthcheck::NodeHealthCheck, names::leases};
use nodemedic_kube::{events::Events, node_lease::NodeLeases};
use tokio::sync::watch;

use self::{contact::Evidence, index::Index, kinds::Kinds, reconcile::Context};
use crate::{
    Result,
    decide::{
        self,
        outage::{self, ApiContact, Change},
    },
    metrics::Metrics,
    spec,
};

/// How long the first decisions wait for the upgrade and MachineHealthCheck watches.
const OPTIONAL_SETTLE: Duration = Duration::from_secs(30);

/// Wakes the checks a change concerns.
#[derive(Clone)]
struct Triggers {
    tx: mpsc::UnboundedSender<ObjectRef<NodeHealthCheck>>,
    store: Store<NodeHealthCheck>,
}

impl Triggers {
    fn wake_where(&self, concerns: impl Fn(&NodeHealthCheck) -> bool) {
        for nhc in self.store.state() {
            if concerns(&nhc) {
                let _ = self.tx.unbounded_send(ObjectRef::from_obj(&*nhc));
            }
        }
    }

    fn wake_selecting(&self, labels: &[&BTreeMap<String, String>]) {
        self.wake_where(|nhc| {
            let Ok(check) = spec::parse(nhc) else { return true };
            labels.iter().any(|l| check.selector.matches(l))
        });
    }
}

/// Runs until the process ends (it returns only if a watch could not start).
/// `etcd`: members configured outside any pod, for the quorum guard.
/// `outage`: an API outage (lost after, regained at) this process went through before it started
/// the health check, which its watches cannot have seen (a replica that starts leading after
/// one): remembered as if they had.
pub async fn run(
    client: Client,
    metrics: Metrics,
    events: Events,
    etcd: Option<nodemedic_kube::etcd::External>,
    outage: Option<(Timestamp, Option<Timestamp>)>,
) -> Result<()> {
    let index = Arc::new(Index::default());
    if let Some((lost_after, regained)) = outage {
        *index.api_contact.lock().unwrap_or_else(PoisonError::into_inner) = ApiContact::after(lost_after, regained);
    }
    let (tx, rx) = mpsc::unbounded();
    let (store, writer) = reflector::store();
    let triggers = Triggers {
        tx,
        store: store.clone(),
    };

    let wake = triggers.clone();
    let kinds = Arc::new(Kinds::new(
        client.clone(),
        index.clone(),
        Arc::new(move |role, key, template| {
            wake.wake_where(|nhc| {
                let Ok(check) = spec::parse(nhc) else { return false };
                check.steps.iter().any(|s| match (role, template) {
                    (kinds::Role::Template, Some(t)) => &s.template == t,
                    _ => s.template.api_version == key.0 && s.template.remediation_kind() == key.1,
                })
            })
        }),
    ));

    let (nodes_synced, mut nodes_ready) = watch::channel(false);
    let (leases_synced, mut leases_ready) = watch::channel(false);
    let (renewals_synced, mut renewals_ready) = watch::channel(false);
    let mut tasks = vec![
        tokio::spawn(watch_checks(client.clone(), writer, triggers.clone(), index.clone())),
        tokio::spawn(watch_nodes(
            client.clone(),
            index.clone(),
            triggers.clone(),
            nodes_synced,
        )),
        tokio::spawn(watch_leases(
            client.clone(),
            index.clone(),
            triggers.clone(),
            leases_synced,
        )),
        tokio::spawn(watch_kubelet_leases(client.clone(), index.clone(), renewals_synced)),
        tokio::spawn(probe_when_silent(client.clone(), index.clone())),
    ];
    let (settled, mut optional_settled) = watch::channel(0usize);
    let (definitions, definitions_task) = definitions::Definitions::spawn(client.clone());
    tasks.push(definitions_task);
    tasks.extend(upgrades::spawn(&client, &index, &triggers, &definitions, &settled));
    tasks.extend(machine_checks::spawn(
        &client,
        &index,
        &triggers,
        &definitions,
        &settled,
    ));
    // Deciding before every node is known would see the remediations of unknown nodes as
    // orphans: wait for the first complete lists.
    let _ = nodes_ready.wait_for(|ready| *ready).await;
    let _ = leases_ready.wait_for(|ready| *ready).await;
    // Without the kubelet renewals, a stale Ready=Unknown (a controller started right after a
    // control-plane outage) would look like a dead node.
    let _ = renewals_ready.wait_for(|ready| *ready).await;
    let _ = store.wait_until_ready().await;
    // Upgrades and MachineHealthChecks hold remediations back: known before the first decision
    // (discovery and a list each), or given up on after a while rather than decide nothing.
    let watches = decide::upgrade::SOURCES.len() + machine_checks::WATCHES;
    if tokio::time::timeout(OPTIONAL_SETTLE, optional_settled.wait_for(|n| *n >= watches))
        .await
        .is_err()
    {
        tracing::warn!(
            ?OPTIONAL_SETTLE,
            "the upgrade and MachineHealthCheck watches have not all listed yet; deciding with what they have"
        );
    }
    tracing::info!(nodes = index.node_names().len(), "health check ready");

    let leases = NodeLeases::new(client.clone());
    leases.ensure_namespace().await?;
    let ctx = Arc::new(Context {
        client,
        index,
        kinds,
        leases,
        events,
        metrics,
        etcd,
        memory: Default::default(),
    });
    applier(
        |nhc, ctx| Box::pin(reconcile::reconcile(nhc, ctx)),
        reconcile::error_policy,
        ctx,
        store,
        rx.map(Ok::<_, Infallible>),
        Config::default().concurrency(4),
    )
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::debug!(%error, "health check reconcile did not run");
        }
    })
    .await;
    for task in tasks.drain(..) {
        task.abort();
    }
    Ok(())
}

async fn watch_checks(
    client: Client,
    writer: reflector::store::Writer<NodeHealthCheck>,
    triggers: Triggers,
    index: Arc<Index>,
) {
    let mut generations: BTreeMap<String, Option<i64>> = BTreeMap::new();
    let stream = reflector::reflector(
        writer,
        watcher(Api::<NodeHealthCheck>::all(client), watcher::Config::default()),
    )
    .backoff(nodemedic_kube::backoff::prompt());
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        report(&index, "NodeHealthChecks", &event);
        match event {
            Ok(watcher::Event::Apply(nhc) | watcher::Event::InitApply(nhc)) => {
                let name = nhc.metadata.name.clone().unwrap_or_default();
                // Our own status writes do not bump the generation: only spec changes wake it.
                if generations.insert(name, nhc.metadata.generation) != Some(nhc.metadata.generation) {
                    let _ = triggers.tx.unbounded_send(ObjectRef::from_obj(&nhc));
                }
            }
            Ok(watcher::Event::Delete(nhc)) => {
                generations.remove(&nhc.metadata.name.clone().unwrap_or_default());
            }
            // A relist names only what exists: a check deleted and created again while the
            // watch was down has the same name and generation, so start afresh and wake all.
            Ok(watcher::Event::Init) => generations.clear(),
            _ => {}
        }
    }
}

async fn watch_nodes(client: Client, index: Arc<Index>, triggers: Triggers, synced: watch::Sender<bool>) {
    // Paged lists (not the API server's cache, which answers in one response): at thousands of
    // nodes one whole list of full Node objects is most of this process's peak memory.
    let mut stream = watcher(Api::<Node>::all(client), watcher::Config::default().page_size(200))
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    let mut relist = index::Relist::<String>::default();
    while let Some(event) = stream.next().await {
        report(&index, "nodes", &event);
        if let Ok(watcher::Event::InitApply(node)) = &event
            && let Some(name) = &node.metadata.name
        {
            relist.saw(name);
        }
        match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                let Some(facts) = index::node_facts(&node) else {
                    continue;
                };
                let labels = facts.labels.clone();
                // Heartbeats change nothing the decisions read: they stop here, at the cost of
                // one comparison.
                if let Some(before) = index.upsert_node(facts)
                    && *synced.borrow()
                {
                    triggers.wake_selecting(&[&before, &labels]);
                }
            }
            Ok(watcher::Event::Delete(node)) => {
                if let Some(gone) = node.metadata.name.as_deref().and_then(|n| index.remove_node(n)) {
                    triggers.wake_selecting(&[&gone.labels]);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let gone = index
                    .nodes
                    .write()
                    .map_or_else(|_| Vec::new(), |mut all| relist.prune(&mut all, |_| true));
                if !gone.is_empty() {
                    tracing::info!(nodes = gone.len(), "forgot nodes deleted while the watch was down");
                }
                let _ = synced.send(true);
                triggers.wake_where(|_| true);
            }
            Ok(watcher::Event::Init) => relist.start(),
            Err(error) => tracing::debug!(%error, "node watch error; retrying"),
        }
    }
}

async fn watch_leases(client: Client, index: Arc<Index>, triggers: Triggers, synced: watch::Sender<bool>) {
    let api = Api::<Lease>::namespaced(client, leases::NAMESPACE);
    let mut stream = watcher(api, watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    let mut relist = index::Relist::<String>::default();
    let node_of = |lease: &Lease| {
        lease
            .metadata
            .name
            .as_deref()
            .and_then(|n| n.strip_prefix("node-"))
            .map(str::to_owned)
    };
    while let Some(event) = stream.next().await {
        report(&index, "node leases", &event);
        let (lease, gone) = match event {
            Ok(watcher::Event::Init) => {
                relist.start();
                continue;
            }
            Ok(watcher::Event::InitApply(l)) => {
                if let Some(node) = node_of(&l) {
                    relist.saw(&node);
                }
                (l, false)
            }
            Ok(watcher::Event::Apply(l)) => (l, false),
            Ok(watcher::Event::Delete(l)) => (l, true),
            Ok(watcher::Event::InitDone) => {
                let gone = index
                    .leases
                    .write()
                    .map_or_else(|_| Vec::new(), |mut all| relist.prune(&mut all, |_| true));
                if !gone.is_empty() {
                    tracing::info!(
                        leases = gone.len(),
                        "forgot node leases deleted while the watch was down"
                    );
                    triggers.wake_where(|_| true);
                }
                let _ = synced.send(true);
                continue;
            }
            _ => continue,
        };
        let Some(node) = node_of(&lease) else {
            continue;
        };
        let facts = if gone {
            None
        } else {
            index::lease_facts(&lease).map(|(_, f)| f)
        };
        let changed = match index.leases.write() {
            Ok(mut all) => match facts {
                Some(f) => all.insert(node.clone(), f.clone()) != Some(f),
                None => all.remove(&node).is_some(),
            },
            Err(_) => false,
        };
        if changed && *synced.borrow() {
            let labels = index
                .nodes
                .read()
                .ok()
                .and_then(|n| n.get(&node).map(|f| f.labels.clone()));
            if let Some(labels) = labels {
                triggers.wake_selecting(&[&labels]);
            }
        }
    }
}

/// The kubelets' node leases, metadata only (the renewal time is read from the API server's
/// record of the write): evidence that a Ready=Unknown node is alive. No wake-ups: a node held
/// back is looked at again shortly anyway.
async fn watch_kubelet_leases(client: Client, index: Arc<Index>, synced: watch::Sender<bool>) {
    // Api of PartialObjectMeta: metadata-only lists and watches.
    let api = Api::<PartialObjectMeta<Lease>>::namespaced(client, KUBELET_LEASES);
    // Paged, like the nodes' list: one response with every lease would add to the peak memory.
    let mut stream = watcher(api, watcher::Config::default().page_size(200))
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    let mut relist = index::Relist::<String>::default();
    while let Some(event) = stream.next().await {
        report(&index, "kubelet leases", &event);
        let Ok(mut renewals) = index.kubelet_renewals.write() else {
            return;
        };
        match event {
            Ok(watcher::Event::Init) => relist.start(),
            Ok(watcher::Event::InitApply(lease) | watcher::Event::Apply(lease)) => {
                let Some(node) = lease.metadata.name.clone() else {
                    continue;
                };
                relist.saw(&node);
                match index::last_written(&lease.metadata) {
                    Some(at) => renewals.insert(node, at),
                    None => renewals.remove(&node),
                };
            }
            Ok(watcher::Event::Delete(lease)) => {
                if let Some(node) = &lease.metadata.name {
                    renewals.remove(node);
                }
            }
            Ok(watcher::Event::InitDone) => {
                relist.prune(&mut renewals, |_| true);
                let _ = synced.send(true);
            }
            Err(error) => tracing::debug!(%error, "kubelet lease watch error; retrying"),
        }
    }
}

/// Tells the index what a watch event says about the contact with the API server.
fn report<K>(index: &Index, watch: &'static str, event: &Result<watcher::Event<K>, watcher::Error>) {
    record(index, watch, contact::evidence(event));
}

fn record(index: &Index, source: &'static str, evidence: Evidence) {
    let now = Timestamp::now();
    // Its updates cannot be left half done: a panic elsewhere leaves it usable.
    let mut contact = index.api_contact.lock().unwrap_or_else(PoisonError::into_inner);
    let change = match evidence {
        Evidence::Answered => contact.answered(now),
        Evidence::Lost => contact.failed(now),
        Evidence::Nothing => return,
    };
    drop(contact);
    match change {
        Change::Lost => tracing::warn!(
            source,
            "lost the API server: a node that turned Unknown since it last answered is remediated only if the condition lasts its duration from a lease duration after the API answers again"
        ),
        Change::Regained => tracing::info!(
            source,
            renewal_chance_seconds = outage::RENEWAL_CHANCE.as_secs(),
            "the API server answers again"
        ),
        Change::Unchanged => {}
    }
}

/// While nothing arrives, asks the API with a read etcd must answer (see decide::outage).
async fn probe_when_silent(client: Client, index: Arc<Index>) {
    let api = Api::<Lease>::namespaced(client, KUBELET_LEASES);
    // No resourceVersion: a consistent read, which needs etcd.
    let params = ListParams::default().limit(1);
    loop {
        tokio::time::sleep(PROBE_TICK).await;
        let silent = index
            .api_contact
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .silent(Timestamp::now());
        if !silent {
            continue;
        }
        let evidence = match tokio::time::timeout(outage::PROBE_TIMEOUT, api.list_metadata(&params)).await {
            Ok(Ok(_)) => Evidence::Answered,
            Ok(Err(error)) => contact::of_error(&error),
            Err(_) => Evidence::Lost,
        };
        record(&index, "read", evidence);
    }
}

/// How often to look whether the API has been silent.
const PROBE_TICK: Duration = Duration::from_secs(1);

/// Where kubelets keep their node leases.
const KUBELET_LEASES: &str = "kube-node-lease";
