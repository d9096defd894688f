//! Wakes the licence loop as soon as a remediation appears or goes, instead of at its next
//! `apiCheckInterval`: the manager starts a remediation's safe time only once a majority of the
//! agents has recorded accepting it, so every interval an agent sleeps through is added to the
//! workload's downtime (up to 15 s at the seed configuration's interval).
//!
//! The wake-up only brings the next read forward: the licence still rests on that consistent
//! read, never on what the watch says. Only what changes an agent's intents wakes it (a new
//! remediation, a deletion, the timed-out mark), not every status write: each wake-up is a read
//! by every agent at once.

use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_api::{names::annotations, self_remediation::SelfNodeRemediation};
use tokio::sync::Notify;

/// What of a remediation's metadata the agent's intents depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Relevant {
    deleting: bool,
    timed_out: bool,
}

fn relevant(meta: &PartialObjectMeta<SelfNodeRemediation>) -> Relevant {
    Relevant {
        deleting: meta.metadata.deletion_timestamp.is_some(),
        timed_out: meta.annotations().contains_key(annotations::NHC_TIMED_OUT),
    }
}

/// Whether a change from `before` (None: not seen) to `now` is worth a read.
fn matters(before: Option<Relevant>, now: Relevant) -> bool {
    before != Some(now)
}

/// Watches the remediations, metadata only, and notifies on every change that matters.
pub(super) fn watch_remediations(client: Client) -> Arc<Notify> {
    let wake = Arc::new(Notify::new());
    let notify = wake.clone();
    tokio::spawn(async move {
        let api = Api::<PartialObjectMeta<SelfNodeRemediation>>::all(client);
        let mut stream = watcher(api, watcher::Config::default())
            .backoff(nodemedic_kube::backoff::prompt())
            .boxed();
        let mut seen: BTreeMap<String, Relevant> = BTreeMap::new();
        let mut relisted: BTreeMap<String, Relevant> = BTreeMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(meta)) => {
                    let now = relevant(&meta);
                    if matters(seen.insert(meta.uid().unwrap_or_default(), now), now) {
                        notify.notify_one();
                    }
                }
                Ok(watcher::Event::Delete(meta)) => {
                    seen.remove(&meta.uid().unwrap_or_default());
                    notify.notify_one();
                }
                Ok(watcher::Event::Init) => relisted.clear(),
                Ok(watcher::Event::InitApply(meta)) => {
                    relisted.insert(meta.uid().unwrap_or_default(), relevant(&meta));
                }
                Ok(watcher::Event::InitDone) => {
                    if relisted != seen {
                        notify.notify_one();
                    }
                    seen = std::mem::take(&mut relisted);
                }
                Err(error) => tracing::debug!(%error, "remediation watch error; retrying"),
            }
        }
    });
    wake
}

/// Watches the membership Lease, metadata only, and notifies on every change: each one may be a
/// proposal the agent must acknowledge before the change can commit. It changes only when a
/// node joins or leaves.
pub(super) fn watch_membership(client: Client, namespace: &str) -> Arc<Notify> {
    let wake = Arc::new(Notify::new());
    let notify = wake.clone();
    let api = Api::<PartialObjectMeta<Lease>>::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", crate::registration::MEMBERSHIP_LEASE));
    tokio::spawn(async move {
        let mut stream = watcher(api, config).backoff(nodemedic_kube::backoff::prompt()).boxed();
        let mut seen: Option<String> = None;
        while let Some(event) = stream.next().await {
            let version = match event {
                Ok(watcher::Event::Apply(meta) | watcher::Event::InitApply(meta)) => meta.resource_version(),
                Ok(watcher::Event::Delete(_)) => None,
                Ok(_) => continue,
                Err(error) => {
                    tracing::debug!(%error, "membership watch error; retrying");
                    continue;
                }
            };
            if version != seen {
                seen = version;
                notify.notify_one();
            }
        }
    });
    wake
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Relevant = Relevant {
        deleting: false,
        timed_out: false,
    };

    #[test]
    fn a_new_remediation_matters_and_a_status_write_does_not() {
        assert!(matters(None, PLAIN));
        assert!(!matters(Some(PLAIN), PLAIN));
    }

    #[test]
    fn a_deletion_or_the_timed_out_mark_matters() {
        assert!(matters(
            Some(PLAIN),
            Relevant {
                deleting: true,
                ..PLAIN
            }
        ));
        assert!(matters(
            Some(PLAIN),
            Relevant {
                timed_out: true,
                ..PLAIN
            }
        ));
    }
}
