//! Remediation and template kinds are whatever the health checks reference, third-party ones
//! included, so their watches start on demand: discovery finds the kind, a watch keeps the index
//! current and wakes the checks that use it. A kind the cluster does not serve is looked up again
//! at most every [`crate::decide::TEMPLATE_RETRY`]; a discovery that failed (the API server down
//! or starting) is no answer, and is asked again at the next reconcile.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    core::{GroupVersion, GroupVersionKind},
    discovery,
    error::DiscoveryError,
    runtime::{WatchStreamExt, watcher},
};

use super::index::{self, Index, Relist};
use crate::decide::{RemediationId, TEMPLATE_RETRY, TemplateRef};

/// Which role a watched kind plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Role {
    Template,
    Remediation,
}

/// (apiVersion, kind)
pub(super) type KindKey = (String, String);

enum Watch {
    Running {
        resource: ApiResource,
        task: tokio::task::JoinHandle<()>,
    },
    Missing {
        since: Instant,
    },
    /// Its discoveries have failed since its last answer: said once.
    Failing,
}

/// Called with the (apiVersion, kind) and, for a template, its reference, when watched objects
/// change.
pub(super) type OnChange = Arc<dyn Fn(Role, &KindKey, Option<&TemplateRef>) + Send + Sync>;

pub(super) struct Kinds {
    client: Client,
    index: Arc<Index>,
    on_change: OnChange,
    watches: Mutex<BTreeMap<(Role, KindKey), Watch>>,
}

impl Drop for Kinds {
    fn drop(&mut self) {
        if let Ok(watches) = self.watches.lock() {
            for watch in watches.values() {
                if let Watch::Running { task, .. } = watch {
                    task.abort();
                }
            }
        }
    }
}

impl Kinds {
    pub(super) fn new(client: Client, index: Arc<Index>, on_change: OnChange) -> Self {
        Self {
            client,
            index,
            on_change,
            watches: Mutex::new(BTreeMap::new()),
        }
    }

    /// Makes sure the kind is watched; says whether the cluster serves it. A kind not served is
    /// remembered for [`TEMPLATE_RETRY`]; a discovery that failed is not remembered at all: the
    /// next reconcile asks again.
    pub(super) async fn ensure(&self, role: Role, api_version: &str, kind: &str) -> Lookup {
        let key = (role, (api_version.to_owned(), kind.to_owned()));
        if let Ok(watches) = self.watches.lock() {
            match watches.get(&key) {
                Some(Watch::Running { resource, .. }) => return Lookup::Served(resource.clone()),
                Some(Watch::Missing { since }) if since.elapsed() < TEMPLATE_RETRY => return Lookup::NotServed,
                _ => {}
            }
        }
        let gvk = api_version
            .parse::<GroupVersion>()
            .ok()
            .map(|gv| gv.with_kind(kind))
            .unwrap_or_else(|| GroupVersionKind::gvk("", api_version, kind));
        let resource = match discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, _)) => resource,
            Err(error) if says_not_served(&error) => {
                tracing::info!(%api_version, %kind, %error, "kind not served by the cluster");
                if let Ok(mut watches) = self.watches.lock() {
                    watches.insert(key, Watch::Missing { since: Instant::now() });
                }
                return Lookup::NotServed;
            }
            Err(error) => {
                let first = self
                    .watches
                    .lock()
                    .map(|mut watches| !matches!(watches.insert(key, Watch::Failing), Some(Watch::Failing)))
                    .unwrap_or(true);
                if first {
                    tracing::warn!(%api_version, %kind, %error, "discovery of the kind failed: its checks decide nothing until it answers; asking again at every reconcile");
                }
                return Lookup::Unknown(format!("discovery of {kind} ({api_version}) failed: {error}"));
            }
        };
        let (listed, first_list) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(watch(
            self.client.clone(),
            resource.clone(),
            role,
            key.1.clone(),
            self.index.clone(),
            self.on_change.clone(),
            listed,
        ));
        if let Ok(mut watches) = self.watches.lock() {
            if let Some(Watch::Running { resource, .. }) = watches.get(&key) {
                task.abort();
                return Lookup::Served(resource.clone());
            }
            watches.insert(
                key,
                Watch::Running {
                    resource: resource.clone(),
                    task,
                },
            );
        }
        // Decide only once every existing object of the kind is known: a new leader that did not
        // know an object exists would create it again.
        if tokio::time::timeout(std::time::Duration::from_secs(30), first_list)
            .await
            .is_err()
        {
            tracing::warn!(%api_version, %kind, "initial list of the kind is slow; deciding with what is known");
        }
        Lookup::Served(resource)
    }
}

/// What the cluster's discovery said of a kind.
#[derive(Clone, Debug)]
pub(super) enum Lookup {
    Served(ApiResource),
    /// The API server answered, and does not serve it (its CRD is not installed).
    NotServed,
    /// No answer that says either: the API server is down or starting (a refused connection, a
    /// 403 while its RBAC catches up, a 503), or refuses this controller discovery.
    Unknown(String),
}

/// Whether a failed discovery is the API server saying it does not serve the kind: its group
/// version is not found, or is found without the kind. Anything else (forbidden, unavailable,
/// no connection) says nothing about the kind.
fn says_not_served(error: &kube::Error) -> bool {
    match error {
        kube::Error::Discovery(
            DiscoveryError::MissingKind(_)
            | DiscoveryError::MissingApiGroup(_)
            | DiscoveryError::MissingResource(_)
            | DiscoveryError::InvalidGroupVersion(_),
        ) => true,
        kube::Error::Api(status) => status.is_not_found(),
        _ => false,
    }
}

async fn watch(
    client: Client,
    resource: ApiResource,
    role: Role,
    key: KindKey,
    index: Arc<Index>,
    on_change: OnChange,
    listed: tokio::sync::oneshot::Sender<()>,
) {
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let mut stream = watcher(api, watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .boxed();
    let mut listed = Some(listed);
    let mut remediations_listed = Relist::<RemediationId>::default();
    let mut templates_listed = Relist::<TemplateRef>::default();
    let this_kind = |api_version: &str, kind: &str| api_version == key.0 && kind == key.1;
    while let Some(event) = stream.next().await {
        let (obj, gone, relisted) = match event {
            Ok(watcher::Event::Init) => {
                remediations_listed.start();
                templates_listed.start();
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => (o, false, true),
            Ok(watcher::Event::Apply(o)) => (o, false, false),
            Ok(watcher::Event::Delete(o)) => (o, true, false),
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
                match role {
                    Role::Remediation => {
                        let pruned = index.remediations.write().map_or(0, |mut all| {
                            remediations_listed
                                .prune(&mut all, |id| this_kind(&id.api_version, &id.kind))
                                .len()
                        });
                        if pruned > 0 {
                            tracing::info!(kind = %key.1, pruned, "forgot objects deleted while the watch was down");
                            on_change(role, &key, None);
                        }
                    }
                    Role::Template => {
                        let pruned = index.templates.write().map_or_else(
                            |_| Vec::new(),
                            |mut all| templates_listed.prune(&mut all, |t| this_kind(&t.api_version, &t.kind)),
                        );
                        for (template, _) in &pruned {
                            tracing::info!(%template, "forgot a template deleted while the watch was down");
                            on_change(role, &key, Some(template));
                        }
                    }
                }
                continue;
            }
            Err(error) => {
                tracing::debug!(%error, kind = %key.1, "watch error; retrying");
                continue;
            }
        };
        match role {
            Role::Remediation => {
                let Some(stored) = index::remediation_facts(&obj, &key.0, &key.1) else {
                    continue;
                };
                if relisted {
                    remediations_listed.saw(&stored.facts.id);
                }
                let changed = match index.remediations.write() {
                    Ok(mut all) if gone => all.remove(&stored.facts.id).is_some(),
                    Ok(mut all) => all.insert(stored.facts.id.clone(), stored.clone()).as_ref() != Some(&stored),
                    Err(_) => false,
                };
                // Delivered (present or gone): the watch's word replaces what creating it said,
                // and only now, so no reader finds it in neither place.
                index
                    .created
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&stored.facts.id);
                if changed {
                    on_change(role, &key, None);
                }
            }
            Role::Template => {
                let Some(name) = obj.metadata.name.clone() else {
                    continue;
                };
                let template = TemplateRef {
                    api_version: key.0.clone(),
                    kind: key.1.clone(),
                    namespace: obj.metadata.namespace.clone(),
                    name,
                };
                if relisted {
                    templates_listed.saw(&template);
                }
                let state = index::template_state(&obj);
                let changed = match index.templates.write() {
                    Ok(mut all) if gone => all.remove(&template).is_some(),
                    Ok(mut all) => all.insert(template.clone(), state.clone()).as_ref() != Some(&state),
                    Err(_) => false,
                };
                if changed {
                    on_change(role, &key, Some(&template));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("refused", reason).with_code(code).boxed())
    }

    #[test]
    fn only_the_api_servers_own_word_says_a_kind_is_not_served() {
        assert!(says_not_served(&api_error(404, "NotFound")));
        assert!(says_not_served(&kube::Error::Discovery(DiscoveryError::MissingKind(
            "SelfNodeRemediationTemplate".into()
        ))));
        assert!(says_not_served(&kube::Error::Discovery(
            DiscoveryError::MissingApiGroup("remediation.medik8s.io".into())
        )));
    }

    #[test]
    fn a_server_starting_or_refusing_says_nothing_of_the_kind() {
        for (code, reason) in [
            (403, "Forbidden"),
            (401, "Unauthorized"),
            (503, "ServiceUnavailable"),
            (429, "TooManyRequests"),
            (500, "InternalError"),
        ] {
            assert!(!says_not_served(&api_error(code, reason)), "{code} {reason}");
        }
        assert!(
            !says_not_served(&kube::Error::Service("connection refused".into())),
            "no connection"
        );
    }
}
