//! MachineHealthChecks (either machine API) and the labels of every Machine, kept in the index
//! for the conflict rule ([`crate::decide::conflict`]). Machines are watched metadata-only and
//! kept as labels alone: a cluster's Machines are as many as its nodes.

use std::sync::Arc;

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_api::machines::{MACHINE_KIND, MachineApi};

use super::{
    Triggers,
    definitions::Definitions,
    index::{Index, Relist},
    optional::{self, Lookout},
};
use crate::decide::conflict::{self, MachineKey};

const APIS: [MachineApi; 2] = [MachineApi::ClusterApi, MachineApi::OpenShift];

/// How many watches [`spawn`] starts.
pub(super) const WATCHES: usize = 2 * APIS.len();

pub(super) fn spawn(
    client: &Client,
    index: &Arc<Index>,
    triggers: &Triggers,
    definitions: &Definitions,
    settled: &optional::Settled,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for api in APIS {
        let (checks_index, checks_triggers) = (index.clone(), triggers.clone());
        tasks.push(tokio::spawn(optional::follow(
            client.clone(),
            definitions.clone(),
            api.group(),
            "MachineHealthCheck",
            settled.clone(),
            move |objects| {
                let checks: Vec<_> = objects
                    .iter()
                    .filter_map(|o| conflict::machine_health_check(api, &serde_json::to_value(&**o).ok()?))
                    .collect();
                let changed = checks_index.machine_health_checks.write().is_ok_and(|mut all| {
                    let before = all.insert(api, checks.clone());
                    before.unwrap_or_default() != checks
                });
                if changed {
                    tracing::info!(
                        group = api.group(),
                        checks = checks.len(),
                        "MachineHealthChecks changed"
                    );
                    checks_triggers.wake_where(|_| true);
                }
            },
        )));
        tasks.push(tokio::spawn(machine_labels(
            client.clone(),
            Lookout::new(definitions.clone(), api.group(), MACHINE_KIND),
            api,
            index.clone(),
            triggers.clone(),
            settled.clone(),
        )));
    }
    tasks
}

/// Keeps every Machine's labels of `api` in the index while the cluster serves Machines.
async fn machine_labels(
    client: Client,
    mut lookout: Lookout,
    api: MachineApi,
    index: Arc<Index>,
    triggers: Triggers,
    settled: optional::Settled,
) {
    let mut settled = Some(settled);
    loop {
        let resource = lookout.served(&client, &mut settled).await;
        follow_machines(&client, &lookout, api, &resource, &index, &triggers, &mut settled).await;
        if let Ok(mut all) = index.machine_labels.write() {
            all.retain(|(a, _, _), _| *a != api);
        }
    }
}

async fn follow_machines(
    client: &Client,
    lookout: &Lookout,
    api: MachineApi,
    resource: &ApiResource,
    index: &Index,
    triggers: &Triggers,
    settled: &mut Option<optional::Settled>,
) {
    let machines = Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), resource);
    let mut stream = watcher(machines, watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    let mut relist = Relist::<MachineKey>::default();
    let key = |m: &PartialObjectMeta<DynamicObject>| -> Option<MachineKey> {
        Some((api, m.metadata.namespace.clone()?, m.metadata.name.clone()?))
    };
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(watcher::Event::Init) => {
                relist.start();
                false
            }
            Ok(watcher::Event::InitApply(m) | watcher::Event::Apply(m)) => {
                let Some(k) = key(&m) else { continue };
                relist.saw(&k);
                let labels = m.metadata.labels.unwrap_or_default();
                index
                    .machine_labels
                    .write()
                    .is_ok_and(|mut all| all.insert(k, labels.clone()).is_none_or(|before| before != labels))
            }
            Ok(watcher::Event::Delete(m)) => {
                let Some(k) = key(&m) else { continue };
                index
                    .machine_labels
                    .write()
                    .is_ok_and(|mut all| all.remove(&k).is_some())
            }
            Ok(watcher::Event::InitDone) => {
                optional::settle(settled);
                index
                    .machine_labels
                    .write()
                    .is_ok_and(|mut all| !relist.prune(&mut all, |(a, _, _)| *a == api).is_empty())
            }
            Err(error) => {
                tracing::debug!(group = api.group(), %error, "Machine watch error; retrying");
                if !lookout.still_served(client).await {
                    return;
                }
                false
            }
        };
        // Only a MachineHealthCheck makes a Machine's labels matter.
        let checked = index
            .machine_health_checks
            .read()
            .is_ok_and(|all| all.values().any(|c| !c.is_empty()));
        if changed && checked {
            triggers.wake_where(|_| true);
        }
    }
}
