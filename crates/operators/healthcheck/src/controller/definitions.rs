//! Which API groups' CustomResourceDefinitions changed, from a metadata-only watch that keeps
//! nothing: what tells the optional watches ([`super::optional`]) to look for their kind again,
//! so that none of them asks the API server's discovery anything while nothing changes.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use tokio::{sync::watch, time::Instant};

use super::optional::LOOK_AGAIN;

/// CustomResourceDefinitions listed at a time: a definition's metadata can be large (its
/// managed fields name every field of its schema, a client-side apply copies it whole into an
/// annotation), and none is kept.
const PAGE: u32 = 20;

/// How long the optional watches wait for the definitions' first list before their first look.
const FIRST_LIST_AT_MOST: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Listing: a change made meanwhile is seen only once the list is complete.
    #[default]
    Listing,
    /// Listed and watching: every change is seen.
    Watching,
    /// The list failed (not allowed, or no answer): changes may go unseen.
    Unwatched,
}

#[derive(Debug, Default)]
struct Seen {
    state: State,
    /// Complete lists so far: changes made while the watch was down are not told one by one.
    lists: u64,
    /// Changes seen by group.
    changes: BTreeMap<String, u64>,
}

/// What had been seen of a group's definitions at a time.
pub(super) type Mark = (u64, u64);

impl Seen {
    fn mark(&self, group: &str) -> Mark {
        (self.lists, self.changes.get(group).copied().unwrap_or(0))
    }
}

/// Tells waiting optional watches when their group's definitions change.
#[derive(Clone)]
pub(super) struct Definitions(watch::Receiver<Seen>);

impl Definitions {
    /// Starts watching the cluster's CustomResourceDefinitions.
    pub(super) fn spawn(client: Client) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = watch::channel(Seen::default());
        (Self(rx), tokio::spawn(follow(client, tx)))
    }

    /// Waits until the definitions are listed (or could not be, or for a while at most): a look
    /// for a kind after that misses no change made after it.
    pub(super) async fn listed(&self) {
        let mut rx = self.0.clone();
        let _ = tokio::time::timeout(FIRST_LIST_AT_MOST, rx.wait_for(|s| s.state != State::Listing)).await;
    }

    /// What has been seen of `group`'s definitions so far.
    pub(super) fn mark(&self, group: &str) -> Mark {
        self.0.borrow().mark(group)
    }

    /// Waits until `group`'s definitions changed since `since` (true), or, while they cannot be
    /// watched, [`LOOK_AGAIN`] at most (false).
    pub(super) async fn changed(&self, group: &str, since: Mark) -> bool {
        let mut rx = self.0.clone();
        let deadline = Instant::now() + LOOK_AGAIN;
        loop {
            let watching = {
                let seen = rx.borrow_and_update();
                if seen.mark(group) != since {
                    return true;
                }
                seen.state == State::Watching
            };
            let next = if watching {
                rx.changed().await
            } else {
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(next) => next,
                    Err(_) => return false,
                }
            };
            // The watch's task is gone (the process is stopping): look again now and then.
            if next.is_err() {
                tokio::time::sleep_until(deadline).await;
                return false;
            }
        }
    }
}

/// A CustomResourceDefinition's group: its name is `<plural>.<group>`.
fn group_of(name: &str) -> Option<&str> {
    name.split_once('.').map(|(_, group)| group)
}

async fn follow(client: Client, tx: watch::Sender<Seen>) {
    let api = Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client);
    let mut stream = watcher(api, watcher::Config::default().page_size(PAGE))
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    let mut told = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(crd) | watcher::Event::Delete(crd)) => {
                if let Some(group) = crd.metadata.name.as_deref().and_then(group_of) {
                    tracing::debug!(group, "a CustomResourceDefinition changed");
                    tx.send_modify(|seen| *seen.changes.entry(group.to_owned()).or_default() += 1);
                }
            }
            Ok(watcher::Event::Init) => {
                tx.send_if_modified(|seen| std::mem::replace(&mut seen.state, State::Listing) != State::Listing);
            }
            Ok(watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::InitDone) => {
                told = false;
                tx.send_modify(|seen| {
                    seen.state = State::Watching;
                    seen.lists += 1;
                });
            }
            // A watch that failed resumes where it was, or lists again: nothing goes unseen.
            Err(
                error @ (watcher::Error::WatchStartFailed(_)
                | watcher::Error::WatchError(_)
                | watcher::Error::WatchFailed(_)),
            ) => {
                tracing::debug!(%error, "CustomResourceDefinition watch error; retrying");
            }
            Err(error) => {
                if !std::mem::replace(&mut told, true) {
                    tracing::warn!(
                        %error,
                        look_again_seconds = LOOK_AGAIN.as_secs(),
                        "cannot list CustomResourceDefinitions: the optional kinds (upgrades, MachineHealthChecks, Machines) not served are looked for periodically until it can"
                    );
                }
                tx.send_if_modified(|seen| std::mem::replace(&mut seen.state, State::Unwatched) != State::Unwatched);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_s_group_is_its_name_after_the_plural() {
        assert_eq!(group_of("machines.cluster.x-k8s.io"), Some("cluster.x-k8s.io"));
        assert_eq!(
            group_of("clusterversions.config.openshift.io"),
            Some("config.openshift.io")
        );
        assert_eq!(group_of("nodots"), None);
    }

    #[test]
    fn a_mark_moves_with_its_group_s_changes_and_with_every_list() {
        let mut seen = Seen::default();
        let before = seen.mark("cluster.x-k8s.io");
        seen.changes.insert("config.openshift.io".into(), 1);
        assert_eq!(seen.mark("cluster.x-k8s.io"), before, "another group's change");
        seen.changes.insert("cluster.x-k8s.io".into(), 1);
        let after = seen.mark("cluster.x-k8s.io");
        assert_ne!(after, before);
        seen.lists += 1;
        assert_ne!(seen.mark("cluster.x-k8s.io"), after, "a list after the watch was down");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_the_group_wakes_at_once_and_an_unwatched_group_is_looked_at_again_later() {
        let (tx, rx) = watch::channel(Seen::default());
        let definitions = Definitions(rx);
        tx.send_modify(|s| s.state = State::Watching);
        let since = definitions.mark("cluster.x-k8s.io");
        let waiting = tokio::spawn({
            let definitions = definitions.clone();
            async move { definitions.changed("cluster.x-k8s.io", since).await }
        });
        tokio::time::sleep(LOOK_AGAIN * 10).await;
        assert!(!waiting.is_finished(), "watched: no look without a change");
        tx.send_modify(|s| *s.changes.entry("config.openshift.io".into()).or_default() += 1);
        tokio::time::sleep(LOOK_AGAIN).await;
        assert!(!waiting.is_finished(), "another group's change");
        tx.send_modify(|s| *s.changes.entry("cluster.x-k8s.io".into()).or_default() += 1);
        assert!(waiting.await.expect("joined"));

        tx.send_modify(|s| s.state = State::Unwatched);
        let since = definitions.mark("cluster.x-k8s.io");
        let started = Instant::now();
        assert!(!definitions.changed("cluster.x-k8s.io", since).await);
        assert_eq!(started.elapsed(), LOOK_AGAIN);
    }
}
