//! Kinds only some clusters serve (OpenShift's, Cluster API's), watched while the cluster serves
//! them: one not served is looked for again every [`LOOK_AGAIN`], so one installed later is
//! seen; one that stops being served is forgotten (its callback gets an empty list).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    discovery,
    runtime::{WatchStreamExt, reflector, watcher},
};

/// How often a kind the cluster does not serve is looked for again.
pub(super) const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// How many optional watches have settled (listed once, or found not served): the first
/// decisions wait for them, so a controller started mid-upgrade (upgrades drain nodes, and so
/// restart it) does not remediate the nodes the upgrade reboots before it knows of the upgrade.
pub(super) type Settled = tokio::sync::watch::Sender<usize>;

/// Says a watch settled, once.
pub(super) fn settle(once: &mut Option<Settled>) {
    if let Some(settled) = once.take() {
        settled.send_modify(|n| *n += 1);
    }
}

/// Calls `on_list` with every object of the kind once the first list is complete and after
/// every change, for as long as the process runs.
pub(super) async fn follow(
    client: Client,
    group: &'static str,
    kind: &'static str,
    settled: Settled,
    mut on_list: impl FnMut(&[Arc<DynamicObject>]) + Send,
) {
    let mut settled = Some(settled);
    loop {
        if let Some(resource) = served(&client, group, kind).await {
            watch(&client, group, kind, &resource, &mut settled, &mut on_list).await;
            on_list(&[]);
        }
        settle(&mut settled);
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// The kind's resource in the version the cluster prefers, when it is served.
pub(super) async fn served(client: &Client, group: &str, kind: &str) -> Option<ApiResource> {
    match discovery::group(client, group).await {
        Ok(served) => served.recommended_kind(kind).map(|(resource, _)| resource),
        Err(error) => {
            tracing::debug!(group, %error, "API group not served");
            None
        }
    }
}

/// Until the kind is no longer served.
async fn watch(
    client: &Client,
    group: &str,
    kind: &'static str,
    resource: &ApiResource,
    settled: &mut Option<Settled>,
    on_list: &mut (impl FnMut(&[Arc<DynamicObject>]) + Send),
) {
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    tracing::info!(kind, version = %resource.version, "watching");
    while let Some(event) = stream.next().await {
        match event {
            // Only a complete list is passed on: a partial one would look like objects gone.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {
                on_list(&reader.state());
                settle(settled);
            }
            Err(error) => {
                tracing::debug!(kind, %error, "watch error; retrying");
                if served(client, group, kind).await.is_none() {
                    tracing::info!(kind, "no longer served; looking for it again later");
                    return;
                }
            }
        }
    }
}
