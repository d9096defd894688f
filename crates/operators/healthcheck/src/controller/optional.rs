//! Kinds only some clusters serve (OpenShift's, Cluster API's), watched while the cluster serves
//! them. One not served is looked for again when a CustomResourceDefinition of its group changes
//! ([`Definitions`]), so one installed later is seen at once and nothing is asked at rest; one
//! that stops being served is forgotten (its callback gets an empty list). A discovery that
//! failed says nothing about the kind: it is tried again shortly, and does not settle the watch.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    discovery,
    error::DiscoveryError,
    runtime::{WatchStreamExt, reflector, watcher},
};

use super::definitions::Definitions;

/// How often a kind the cluster does not serve is looked for again while the
/// CustomResourceDefinitions cannot be watched.
pub(super) const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// The looks again after a change of the kind's group, while it is still not served: the API
/// server's discovery serves a new definition a moment after the change that establishes it.
const AFTER_A_CHANGE: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// The first wait after a failed discovery, doubled after each failure up to
/// [`AFTER_FAILURES`].
const AFTER_A_FAILURE: Duration = Duration::from_millis(500);

/// The longest wait after failed discoveries: a discovery fails while the API server is down or
/// starting, and the kind must be watched again within a couple of seconds of its return, however
/// long the outage (one request every two seconds from the one leading controller).
const AFTER_FAILURES: Duration = Duration::from_secs(2);

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

/// What the API server's discovery says of a kind.
#[derive(Debug)]
pub(super) enum Discovery {
    /// In the version the cluster prefers.
    Served(ApiResource),
    NotServed,
    /// It did not answer, or not as expected: nothing is known.
    Failed,
}

pub(super) async fn discover(client: &Client, group: &str, kind: &str) -> Discovery {
    match discovery::group(client, group).await {
        Ok(served) => served
            .recommended_kind(kind)
            .map_or(Discovery::NotServed, |(resource, _)| Discovery::Served(resource)),
        Err(kube::Error::Discovery(DiscoveryError::MissingApiGroup(_))) => Discovery::NotServed,
        Err(error) => {
            tracing::debug!(group, kind, %error, "discovery failed; trying again");
            Discovery::Failed
        }
    }
}

/// When to look for a kind again, from how the looks so far went. No I/O.
#[derive(Debug, Default)]
pub(super) struct Pace {
    failures: u32,
    /// The looks left after the last change of the kind's group.
    after_a_change: &'static [Duration],
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Look again after this long.
    After(Duration),
    /// Look again when the kind's group changes.
    OnAChange,
}

impl Pace {
    /// The kind's group changed.
    pub(super) fn changed(&mut self) {
        self.after_a_change = &AFTER_A_CHANGE;
    }

    /// When to look again after `look`.
    pub(super) fn after(&mut self, look: &Discovery) -> Next {
        match look {
            Discovery::Served(_) => {
                *self = Self::default();
                Next::OnAChange
            }
            Discovery::NotServed => {
                self.failures = 0;
                match self.after_a_change.split_first() {
                    Some((wait, rest)) => {
                        self.after_a_change = rest;
                        Next::After(*wait)
                    }
                    None => Next::OnAChange,
                }
            }
            Discovery::Failed => {
                let wait = AFTER_A_FAILURE.saturating_mul(1 << self.failures.min(6));
                self.failures += 1;
                Next::After(wait.min(AFTER_FAILURES))
            }
        }
    }
}

/// Looks for one kind until the cluster serves it.
pub(super) struct Lookout {
    definitions: Definitions,
    group: &'static str,
    kind: &'static str,
    pace: Pace,
}

impl Lookout {
    pub(super) fn new(definitions: Definitions, group: &'static str, kind: &'static str) -> Self {
        Self {
            definitions,
            group,
            kind,
            pace: Pace::default(),
        }
    }

    /// The kind's resource once the cluster serves it; settles the watch when it is not served.
    pub(super) async fn served(&mut self, client: &Client, settled: &mut Option<Settled>) -> ApiResource {
        self.definitions.listed().await;
        loop {
            // Before the look: a change during it is not missed.
            let mark = self.definitions.mark(self.group);
            let look = discover(client, self.group, self.kind).await;
            let next = self.pace.after(&look);
            match look {
                Discovery::Served(resource) => return resource,
                Discovery::NotServed => settle(settled),
                Discovery::Failed => {}
            }
            match next {
                Next::After(wait) => tokio::time::sleep(wait).await,
                Next::OnAChange => {
                    if self.definitions.changed(self.group, mark).await {
                        self.pace.changed();
                    }
                }
            }
        }
    }

    /// Whether the kind may still be served after its watch failed: not when discovery says it
    /// is not.
    pub(super) async fn still_served(&self, client: &Client) -> bool {
        !matches!(discover(client, self.group, self.kind).await, Discovery::NotServed)
    }
}

/// Calls `on_list` with every object of the kind once the first list is complete and after
/// every change, for as long as the process runs.
pub(super) async fn follow(
    client: Client,
    definitions: Definitions,
    group: &'static str,
    kind: &'static str,
    settled: Settled,
    mut on_list: impl FnMut(&[Arc<DynamicObject>]) + Send,
) {
    let mut settled = Some(settled);
    let mut lookout = Lookout::new(definitions, group, kind);
    loop {
        let resource = lookout.served(&client, &mut settled).await;
        watch(&client, &lookout, &resource, &mut settled, &mut on_list).await;
        on_list(&[]);
    }
}

/// Until the kind is no longer served.
async fn watch(
    client: &Client,
    lookout: &Lookout,
    resource: &ApiResource,
    settled: &mut Option<Settled>,
    on_list: &mut (impl FnMut(&[Arc<DynamicObject>]) + Send),
) {
    let kind = lookout.kind;
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let mut stream = watcher(api, watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
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
                if !lookout.still_served(client).await {
                    tracing::info!(
                        kind,
                        "no longer served; looking for it again when its definitions change"
                    );
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Discovery {
        Discovery::Served(ApiResource {
            group: "cluster.x-k8s.io".into(),
            version: "v1beta2".into(),
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            plural: "machines".into(),
        })
    }

    #[test]
    fn a_kind_not_served_is_looked_for_again_only_on_a_change_then_a_few_times_shortly_after() {
        let mut pace = Pace::default();
        assert_eq!(pace.after(&Discovery::NotServed), Next::OnAChange);
        pace.changed();
        let waits: Vec<Next> = (0..5).map(|_| pace.after(&Discovery::NotServed)).collect();
        assert_eq!(
            waits,
            AFTER_A_CHANGE
                .iter()
                .map(|w| Next::After(*w))
                .chain([Next::OnAChange])
                .collect::<Vec<_>>()
        );
        pace.changed();
        assert_eq!(pace.after(&served()), Next::OnAChange);
        assert_eq!(
            pace.after(&Discovery::NotServed),
            Next::OnAChange,
            "served since the change: no more looks"
        );
    }

    #[test]
    fn a_failed_discovery_is_tried_again_after_doubling_waits_of_at_most_two_seconds() {
        let mut pace = Pace::default();
        let waits: Vec<Next> = (0..40).map(|_| pace.after(&Discovery::Failed)).collect();
        let millis = [500, 1_000].into_iter().chain([2_000; 38]);
        assert_eq!(
            waits,
            millis
                .map(|ms| Next::After(Duration::from_millis(ms)))
                .collect::<Vec<_>>(),
            "however long the API server is gone"
        );
        assert_eq!(pace.after(&Discovery::NotServed), Next::OnAChange);
        assert_eq!(
            pace.after(&Discovery::Failed),
            Next::After(AFTER_A_FAILURE),
            "an answer resets the failures"
        );
    }
}
