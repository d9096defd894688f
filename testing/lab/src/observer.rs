//! Feeds the timeline from the API: node Ready changes and remediation taints, pod phases and
//! deletions, and remediation objects coming and going.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation, healthcheck::NodeHealthCheck, names::taints,
    self_remediation::SelfNodeRemediation,
};

use crate::timeline::{Event, PodId, Timeline};

/// Taints worth a timeline line: the ones remediation and the node lifecycle controller set.
const WATCHED_TAINTS: &[&str] = &[
    taints::OUT_OF_SERVICE_KEY,
    taints::SNR_KEY,
    taints::FAR_KEY,
    taints::UNREACHABLE_KEY,
    taints::DRAIN_KEY,
];

pub(crate) fn spawn(client: &Client, timeline: &Timeline) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(nodes(client.clone(), timeline.clone())),
        tokio::spawn(pods(client.clone(), timeline.clone())),
        tokio::spawn(remediations::<SelfNodeRemediation>(
            client.clone(),
            timeline.clone(),
            |r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .map(|p| format!("phase {p}"))
            },
        )),
        tokio::spawn(remediations::<FenceAgentsRemediation>(
            client.clone(),
            timeline.clone(),
            |r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.step.clone())
                    .map(|s| format!("step {s}"))
            },
        )),
        tokio::spawn(health_checks(client.clone(), timeline.clone())),
    ]
}

async fn health_checks(client: Client, timeline: Timeline) {
    let mut listed: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut stream = watcher(Api::<NodeHealthCheck>::all(client), watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    while let Some(event) = stream.next().await {
        let Ok(watcher::Event::Apply(check) | watcher::Event::InitApply(check)) = event else {
            continue;
        };
        let Some(name) = check.metadata.name.clone() else {
            continue;
        };
        let revision = check.metadata.resource_version.as_deref();
        let now: std::collections::BTreeSet<String> = check
            .status
            .as_ref()
            .and_then(|s| s.unhealthy_nodes.as_ref())
            .map(|u| u.iter().map(|n| n.name.clone()).collect())
            .unwrap_or_default();
        let before = listed.insert(name.clone(), now.clone()).unwrap_or_default();
        for node in now.difference(&before) {
            timeline.record_seen(
                revision,
                Event::HealthCheck {
                    check: name.clone(),
                    node: node.clone(),
                    unhealthy: true,
                },
            );
        }
        for node in before.difference(&now) {
            timeline.record_seen(
                revision,
                Event::HealthCheck {
                    check: name.clone(),
                    node: node.clone(),
                    unhealthy: false,
                },
            );
        }
    }
}

async fn nodes(client: Client, timeline: Timeline) {
    let mut last: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut peers: BTreeMap<String, String> = BTreeMap::new();
    let mut stream = watcher(Api::<Node>::all(client), watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    while let Some(event) = stream.next().await {
        let node = match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => node,
            // A node of the same name joining later is a new machine: its first Ready counts.
            Ok(watcher::Event::Delete(node)) => {
                if let Some(name) = node.metadata.name {
                    last.remove(&name);
                    peers.remove(&name);
                }
                continue;
            }
            _ => continue,
        };
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let revision = node.metadata.resource_version.as_deref();
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| {
                (
                    c.status.clone(),
                    c.reason.clone().unwrap_or_default(),
                    c.last_transition_time.as_ref().map(|t| t.0),
                )
            });
        let node_taints: Vec<String> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| {
                ts.iter()
                    .filter(|t| WATCHED_TAINTS.contains(&t.key.as_str()))
                    .map(|t| format!("{}:{}", t.key, t.effect))
                    .collect()
            })
            .unwrap_or_default();
        let peers_reachable = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PeersReachable"));
        if let Some(c) = peers_reachable
            && peers.get(&name) != Some(&c.status)
        {
            peers.insert(name.clone(), c.status.clone());
            timeline.record_seen(
                revision,
                Event::PeersReachable {
                    node: name.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone().unwrap_or_default(),
                },
            );
        }
        let previous = last.get(&name).cloned();
        if let Some((status, reason, since)) = &ready
            && previous.as_ref().is_none_or(|(s, _)| s != status)
        {
            timeline.record_seen(
                revision,
                Event::NodeReady {
                    node: name.clone(),
                    status: status.clone(),
                    reason: reason.clone(),
                    since: *since,
                },
            );
        }
        let before = previous.map(|(_, t)| t).unwrap_or_default();
        for taint in node_taints.iter().filter(|t| !before.contains(t)) {
            timeline.record_seen(
                revision,
                Event::NodeTaint {
                    node: name.clone(),
                    taint: taint.clone(),
                    added: true,
                },
            );
        }
        for taint in before.iter().filter(|t| !node_taints.contains(t)) {
            timeline.record_seen(
                revision,
                Event::NodeTaint {
                    node: name.clone(),
                    taint: taint.clone(),
                    added: false,
                },
            );
        }
        last.insert(name, (ready.map(|r| r.0).unwrap_or_default(), node_taints));
    }
}

fn pod_id(pod: &Pod) -> Option<PodId> {
    Some(PodId {
        namespace: pod.metadata.namespace.clone()?,
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
    })
}

async fn pods(client: Client, timeline: Timeline) {
    // uid -> (phase, node, deleting)
    let mut last: BTreeMap<String, (String, Option<String>, bool)> = BTreeMap::new();
    let mut stream = watcher(Api::<Pod>::all(client), watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                let Some(id) = pod_id(&pod) else { continue };
                let revision = pod.metadata.resource_version.as_deref();
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into());
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let deleting = pod.metadata.deletion_timestamp.is_some();
                let before = last.get(&id.uid).cloned();
                if before.as_ref().is_none_or(|(p, n, _)| p != &phase || n != &node) {
                    let claims = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.volumes.as_ref())
                        .map(|vs| {
                            vs.iter()
                                .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
                                .collect()
                        })
                        .unwrap_or_default();
                    let stateful = pod
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.kind == "StatefulSet");
                    timeline.record_seen(
                        revision,
                        Event::PodPhase {
                            pod: id.clone(),
                            node: node.clone(),
                            phase: phase.clone(),
                            claims,
                            stateful,
                        },
                    );
                }
                if deleting && !before.as_ref().is_some_and(|b| b.2) {
                    timeline.record_seen(
                        revision,
                        Event::PodDeleting {
                            pod: id.clone(),
                            node: node.clone(),
                        },
                    );
                }
                last.insert(id.uid, (phase, node, deleting));
            }
            Ok(watcher::Event::Delete(pod)) => {
                let Some(id) = pod_id(&pod) else { continue };
                let revision = pod.metadata.resource_version.as_deref();
                last.remove(&id.uid);
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                timeline.record_seen(revision, Event::PodGone { pod: id, node });
            }
            _ => {}
        }
    }
}

/// Remediation objects coming, progressing (what `progress` reads from one) and going.
async fn remediations<K>(client: Client, timeline: Timeline, progress: fn(&K) -> Option<String>)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&()).to_string();
    let mut known: BTreeMap<String, (bool, Option<String>)> = BTreeMap::new();
    let mut stream = watcher(Api::<K>::all(client), watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    while let Some(event) = stream.next().await {
        let (obj, gone) = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
            Ok(watcher::Event::Delete(o)) => (o, true),
            _ => continue,
        };
        let meta = obj.meta();
        let Some(name) = meta.name.clone() else { continue };
        let revision = meta.resource_version.as_deref();
        let node = match nodemedic_api::machines::node_of(meta) {
            nodemedic_api::machines::NodeOf::Named(node) => node,
            nodemedic_api::machines::NodeOf::Machine(machine) => format!("(the node of Machine {})", machine.name),
        };
        let key = format!("{}/{name}", meta.namespace.clone().unwrap_or_default());
        let deleting = meta.deletion_timestamp.is_some();
        let step = progress(&obj);
        let before = known.get(&key).cloned();
        let mut changes: Vec<String> = Vec::new();
        match (&before, gone, deleting) {
            (_, true, _) => changes.push("removed".into()),
            (None, false, _) => changes.push("created".into()),
            (Some((false, _)), false, true) => changes.push("deleting".into()),
            _ => {}
        }
        if !gone && step.is_some() && before.as_ref().map(|(_, s)| s) != Some(&step) {
            changes.extend(step.clone());
        }
        for change in changes {
            timeline.record_seen(
                revision,
                Event::Remediation {
                    kind: kind.clone(),
                    name: name.clone(),
                    node: node.clone(),
                    created_at: (change == "created")
                        .then(|| meta.creation_timestamp.as_ref().map(|t| t.0))
                        .flatten(),
                    change,
                },
            );
        }
        if gone {
            known.remove(&key);
        } else {
            known.insert(key, (deleting, step));
        }
    }
}
