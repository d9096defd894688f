//! What says a cluster upgrade is under way ([`upgrade::SOURCES`]), kept in the index per kind:
//! every check is woken when it changes.

use std::sync::Arc;

use kube::Client;

use super::{Triggers, definitions::Definitions, index::Index, optional};
use crate::decide::upgrade;

pub(super) fn spawn(
    client: &Client,
    index: &Arc<Index>,
    triggers: &Triggers,
    definitions: &Definitions,
    settled: &optional::Settled,
) -> Vec<tokio::task::JoinHandle<()>> {
    upgrade::SOURCES
        .iter()
        .map(|source| {
            let (index, triggers) = (index.clone(), triggers.clone());
            let kind = source.kind;
            tokio::spawn(optional::follow(
                client.clone(),
                definitions.clone(),
                source.group,
                kind,
                settled.clone(),
                move |objects| {
                    let mut said: Vec<upgrade::Upgrade> = objects
                        .iter()
                        .filter_map(|object| upgrade::upgrading(kind, &serde_json::to_value(&**object).ok()?))
                        .collect();
                    said.sort();
                    record(&index, &triggers, kind, said);
                },
            ))
        })
        .collect()
}

/// Stores what a kind's objects say; on a change, logs it and wakes every check.
fn record(index: &Index, triggers: &Triggers, kind: &'static str, said: Vec<upgrade::Upgrade>) {
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
            let what: Vec<&str> = said.iter().map(|u| u.what.as_str()).collect();
            tracing::info!(kind, upgrades = ?what, "cluster upgrade under way: new remediations wait");
        }
        triggers.wake_where(|_| true);
    }
}
