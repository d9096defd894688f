//! The soft tainter: every descheduling interval, the KubeVirt profile's utilization per node
//! from Prometheus, classified as the descheduler will classify it, and `PreferNoSchedule`
//! taints that steer the scheduler to cooler nodes. Taints go when the node cools, the profile
//! or Automatic mode goes, or the KubeDescheduler does.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, reflector, watcher},
};
use nodemedic_api::descheduler::{KubeDescheduler, Mode, SoftTaintedNode};
use nodemedic_kube::{CallContext, paged, taints};

use super::{Context, observe, prometheus::Prometheus};
use crate::{
    Result,
    decide::{
        self,
        soft_taints::{self, Class, NodeFacts, Plan},
        tainting::{self, TainterSettings},
    },
};

const TICK: Duration = Duration::from_secs(2);
const EFFECT: &str = "PreferNoSchedule";

pub(super) async fn run(ctx: Arc<Context>) {
    // KubeDeschedulers from a watch: at rest the tainter makes no request at all.
    let (store, writer) = reflector::store::<KubeDescheduler>();
    let watch = reflector(
        writer,
        watcher(
            Api::<KubeDescheduler>::all(ctx.client.clone()),
            watcher::Config::default(),
        ),
    )
    .backoff(nodemedic_kube::backoff::prompt())
    .touched_objects()
    .for_each(|_| async {});
    tokio::spawn(watch);
    if store.wait_until_ready().await.is_err() {
        tracing::warn!("soft tainter: the KubeDescheduler watch ended before its first list; not running");
        return;
    }
    let mut last_round: Option<Instant> = None;
    let mut prometheus: Option<Prometheus> = None;
    // Whether the last inactive round found no soft taint left to remove.
    let mut clean = false;
    loop {
        tokio::time::sleep(TICK).await;
        let due = |interval: Duration| last_round.is_none_or(|at| at.elapsed() >= interval);
        let all: Vec<KubeDescheduler> = store.state().iter().map(|k| (**k).clone()).collect();
        match round(&ctx, &all, &mut prometheus, &mut clean, due).await {
            Ok(Some(outcome)) => {
                last_round = Some(Instant::now());
                ctx.metrics.round(outcome);
            }
            Ok(None) => {}
            Err(error) => {
                last_round = Some(Instant::now());
                ctx.metrics.round("failed");
                tracing::warn!(%error, "soft tainter round failed; trying again next interval");
            }
        }
    }
}

/// One round when due; `None` when not yet.
async fn round(
    ctx: &Context,
    all: &[KubeDescheduler],
    prometheus: &mut Option<Prometheus>,
    clean: &mut bool,
    due: impl Fn(Duration) -> bool,
) -> Result<Option<&'static str>> {
    let in_charge = observe::first(all).and_then(|(namespace, name)| {
        all.iter()
            .find(|k| k.namespace().as_deref() == Some(&namespace) && k.name_any() == name)
    });
    let interval = in_charge
        .and_then(|k| k.spec.descheduling_interval_seconds)
        .map_or(Duration::from_secs(60), |s| Duration::from_secs(s.max(1) as u64));
    if !due(interval) {
        return Ok(None);
    }
    let managed = in_charge.is_some_and(|k| {
        !matches!(k.spec.management_state.as_deref(), Some("Unmanaged" | "Removed"))
            && k.metadata.deletion_timestamp.is_none()
    });
    if in_charge.is_some_and(|k| k.spec.management_state.as_deref() == Some("Unmanaged")) {
        return Ok(Some("unmanaged"));
    }
    let settings = match in_charge.filter(|_| managed) {
        Some(kd) => {
            let environment = observe::environment(&ctx.client, &ctx.settings).await?;
            decide::render(&kd.spec, &environment)
                .ok()
                .and_then(|r| tainting::settings(&r.policy))
        }
        None => None,
    };
    let nodes = Api::<Node>::all(ctx.tainter.clone());
    let Some(settings) = settings else {
        // No KubeVirt profile runs: only clean up, once.
        if !*clean {
            super::apply::remove_soft_taints(ctx).await?;
            *clean = true;
        }
        return Ok(Some("inactive"));
    };
    *clean = false;
    let Some(kd) = in_charge else {
        return Ok(Some("inactive"));
    };
    let client = match prometheus.as_ref() {
        Some(client) if Some(client.url()) == ctx.settings.prometheus_url.as_deref() => client.clone(),
        _ => {
            let url = ctx.settings.prometheus_url.clone().unwrap_or_default();
            let client = Prometheus::new(&url, ctx.settings.prometheus_ca.as_deref())?;
            *prometheus = Some(client.clone());
            client
        }
    };
    let samples = client.per_instance(&settings.query).await?;
    let observed = observe_nodes(&nodes, &settings, &samples).await?;
    let active = kd.spec.mode == Mode::Automatic;
    let plan = soft_taints::plan(&observed.facts, settings.thresholds, active);
    for node in &observed.facts {
        match node.utilization {
            Some(value) => ctx.metrics.utilization(&node.name, value),
            None => ctx.metrics.forget_node(&node.name),
        }
    }
    if let Some(held) = &plan.held {
        tracing::info!(%held, "soft tainter holds its taints this round");
    } else {
        tracing::debug!(low = ?plan.low, high = ?plan.high, classes = ?plan.classes, "soft tainter classified the nodes");
    }
    apply(ctx, &nodes, &plan, &observed).await?;
    report(ctx, kd, &plan, &samples, active).await?;
    Ok(Some(if plan.held.is_some() { "held" } else { "applied" }))
}

/// What a round needs of the nodes.
struct Observed {
    facts: Vec<NodeFacts>,
    /// The nodes carrying a soft taint key with another effect, to be replaced or removed.
    repair: Vec<String>,
}

/// Every node, read a page at a time and kept only as what the round needs of it: at thousands
/// of nodes, the whole list of Nodes every interval would be the controller's largest allocation
/// (see nodemedic_kube::paged).
async fn observe_nodes(
    nodes: &Api<Node>,
    settings: &TainterSettings,
    samples: &BTreeMap<String, f64>,
) -> Result<Observed> {
    let mut observed = Observed {
        facts: Vec::new(),
        repair: Vec::new(),
    };
    let mut pages = std::pin::pin!(paged::pages(nodes, &ListParams::default()));
    while let Some(page) = pages.next().await {
        for node in page.context("listing nodes")? {
            let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
            if taints.is_some_and(|t| t.iter().any(misplaced)) {
                observed.repair.push(node.name_any());
            }
            observed.facts.push(facts(&node, settings, samples));
        }
    }
    Ok(observed)
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn facts(node: &Node, settings: &TainterSettings, samples: &BTreeMap<String, f64>) -> NodeFacts {
    let name = node.name_any();
    let selected = settings
        .node_selector
        .as_ref()
        .is_none_or(|(key, value)| node.labels().get(key) == Some(value));
    NodeFacts {
        in_scope: selected && ready(node),
        schedulable: !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
        taints: current(node),
        utilization: samples.get(&name).copied(),
        name,
    }
}

fn current(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| soft_taints::KEYS.contains(&t.key.as_str()) && t.effect == EFFECT)
        .map(|t| t.key.clone())
        .collect()
}

/// A soft taint key with another effect than PreferNoSchedule (not the tainter's doing): it is
/// replaced, or removed.
fn misplaced(taint: &Taint) -> bool {
    soft_taints::KEYS.contains(&taint.key.as_str()) && taint.effect != EFFECT
}

/// Carries the plan out node by node (one node's failure does not stop the others; the first
/// error is returned), and takes off soft taint keys someone set with another effect.
async fn apply(ctx: &Context, nodes: &Api<Node>, plan: &Plan, observed: &Observed) -> Result<()> {
    let mut changes: Vec<(String, Vec<&'static str>, Vec<&'static str>)> = plan
        .changes
        .iter()
        .map(|c| (c.node.clone(), c.add.clone(), c.remove.clone()))
        .collect();
    for node in &observed.repair {
        if !changes.iter().any(|(n, _, _)| n == node) {
            changes.push((node.clone(), Vec::new(), Vec::new()));
        }
    }
    let mut first_error = None;
    for (node, add, remove) in changes {
        let wanted: Vec<Taint> = add.iter().map(|key| taints::taint(key, Some("true"), EFFECT)).collect();
        let written = taints::update(nodes, &node, |current| {
            let kept: Vec<Taint> = current
                .iter()
                .filter(|t| !misplaced(t) && !remove.contains(&t.key.as_str()))
                .cloned()
                .collect();
            let missing = wanted.iter().filter(|w| !kept.iter().any(|t| t.key == w.key)).cloned();
            let next: Vec<Taint> = kept.iter().cloned().chain(missing).collect();
            let same = next.len() == current.len()
                && next
                    .iter()
                    .zip(current)
                    .all(|(a, b)| a.key == b.key && a.effect == b.effect);
            (!same).then_some(next)
        })
        .await;
        match written {
            Ok(true) => {
                add.iter().for_each(|key| ctx.metrics.taint_applied(key));
                remove.iter().for_each(|key| ctx.metrics.taint_removed(key));
                tracing::info!(%node, ?add, ?remove, "soft taints changed");
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%node, %error, "soft taints could not be written");
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(()), |e| Err(e.into()))
}

/// The tainted nodes (or, in Predictive mode, those it would taint) in the status.
async fn report(
    ctx: &Context,
    kd: &KubeDescheduler,
    plan: &Plan,
    samples: &BTreeMap<String, f64>,
    active: bool,
) -> Result<()> {
    let mut tainted: Vec<SoftTaintedNode> = plan
        .classes
        .iter()
        .filter(|(_, class)| **class != Class::Under)
        .map(|(node, class)| SoftTaintedNode {
            node: node.clone(),
            taints: match class {
                Class::Over => vec![
                    soft_taints::APPROPRIATE.to_owned(),
                    soft_taints::OVERUTILIZED.to_owned(),
                ],
                _ => vec![soft_taints::APPROPRIATE.to_owned()],
            },
            utilization_percent: samples.get(node).map(|v| (v * 100.0).round() as i32),
        })
        .collect();
    if plan.held.is_some() {
        return Ok(());
    }
    if !active {
        tainted
            .iter_mut()
            .for_each(|n| n.taints.iter_mut().for_each(|t| t.insert_str(0, "would be: ")));
    }
    // Edited on the watch's copy first (nothing to write, no request at all), and on a conflict
    // on fresh reads: the list is this round's, whatever else the status says.
    let api = Api::<KubeDescheduler>::namespaced(ctx.client.clone(), &kd.namespace().unwrap_or_default());
    nodemedic_kube::status::update(&api, kd, |status, _| {
        if status.soft_tainted_nodes.as_ref() == Some(&tainted) {
            return false;
        }
        status.soft_tainted_nodes = Some(tainted.clone());
        true
    })
    .await?;
    Ok(())
}
