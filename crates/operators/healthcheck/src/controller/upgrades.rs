//! Watches the kinds whose objects say a cluster upgrade is under way ([`upgrade::SOURCES`]):
//! what each kind's objects say is kept in the index, and every check is woken when it changes.
//! A kind the cluster does not serve (no OpenShift, no Cluster API) is looked for again every
//! [`LOOK_AGAIN`], so one installed later is seen; one that stops being served is forgotten.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    discovery,
    runtime::{WatchStreamExt, reflector, watcher},
};

use super::{Triggers, index::Index};
use crate::decide::upgrade::{self, Source};

/// How often a kind the cluster does not serve is looked for again.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

pub(super) fn spawn(client: &Client, index: &Arc<Index>, triggers: &Triggers) -> Vec<tokio::task::JoinHandle<()>> {
    upgrade::SOURCES
        .iter()
        .map(|source| tokio::spawn(watch_source(client.clone(), *source, index.clone(), triggers.clone())))
        .collect()
}

async fn watch_source(client: Client, source: Source, index: Arc<Index>, triggers: Triggers) {
    loop {
        if let Some(resource) = served(&client, source).await {
            follow(&client, source, &resource, &index, &triggers).await;
            record(&index, &triggers, source.kind, Vec::new());
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// The kind's resource in the version the cluster prefers, when it is served.
async fn served(client: &Client, source: Source) -> Option<ApiResource> {
    match discovery::group(client, source.group).await {
        Ok(group) => group.recommended_kind(source.kind).map(|(resource, _)| resource),
        Err(error) => {
            tracing::debug!(group = source.group, %error, "API group not served");
            None
        }
    }
}

/// Keeps what the kind's objects say in the index until the kind is no longer served.
async fn follow(client: &Client, source: Source, resource: &ApiResource, index: &Index, triggers: &Triggers) {
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    tracing::info!(kind = source.kind, version = %resource.version, "watching for cluster upgrades");
    while let Some(event) = stream.next().await {
        match event {
            // Said once the list is complete: a partial one could end an upgrade that goes on.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(kind = source.kind, %error, "upgrade watch error; retrying");
                if served(client, source).await.is_none() {
                    tracing::info!(kind = source.kind, "no longer served; looking for it again later");
                    return;
                }
                continue;
            }
        }
        let mut said: Vec<String> = reader
            .state()
            .iter()
            .filter_map(|object| upgrade::upgrading(source.kind, &serde_json::to_value(&**object).ok()?))
            .collect();
        said.sort();
        record(index, triggers, source.kind, said);
    }
}

/// Stores what a kind's objects say; on a change, logs it and wakes every check.
fn record(index: &Index, triggers: &Triggers, kind: &'static str, said: Vec<String>) {
    let changed = match index.upgrades.write() {
        Ok(all) if all.get(kind).map_or(said.is_empty(), |before| *before == said) => false,
        Ok(mut all) => {
            if said.is_empty() {
                all.remove(kind);
            } else {
                all.insert(kind, said.clone());
            }
            true
        }
        Err(_) => false,
    };
    if changed {
        if said.is_empty() {
            tracing::info!(kind, "no cluster upgrade under way any more");
        } else {
            tracing::info!(kind, upgrades = ?said, "cluster upgrade under way: new remediations wait");
        }
        triggers.wake_where(|_| true);
    }
}
