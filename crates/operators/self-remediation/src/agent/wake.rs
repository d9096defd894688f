//! Wakes the licence loop as soon as a remediation appears, changes or goes, instead of at its
//! next `apiCheckInterval`: the manager starts a remediation's safe time only once a majority of
//! the agents has recorded accepting it, so every interval an agent sleeps through is added to
//! the workload's downtime (up to 15 s at the seed configuration's interval).
//!
//! The wake-up only brings the next read forward: the licence still rests on that consistent
//! read, never on what the watch says.

use std::sync::Arc;

use futures::StreamExt;
use kube::{
    Api, Client,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_api::self_remediation::SelfNodeRemediation;
use tokio::sync::Notify;

/// Watches the remediations, metadata only (any write, status included, moves the metadata's
/// resource version, and the change is all the loop needs to know), and notifies on every change
/// after the first list.
pub fn watch_remediations(client: Client) -> Arc<Notify> {
    let wake = Arc::new(Notify::new());
    let notify = wake.clone();
    tokio::spawn(async move {
        let api = Api::<PartialObjectMeta<SelfNodeRemediation>>::all(client);
        let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                    notify.notify_one();
                }
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Err(error) => tracing::debug!(%error, "remediation watch error; retrying"),
            }
        }
    });
    wake
}
