//! Lists that hold one page at a time, and watches that keep a small value per object instead of
//! the object. At 5,000 nodes one list of every Node is about 19 MiB of JSON and several times
//! that once parsed: the controller's start-up went from 51 to 152 MiB of heap when one such list
//! and one store of every kubelet Lease were added (docs/memory.md). Whatever reads many objects
//! of a kind that grows with the cluster goes through here, or through a paged watch of its own.

use std::{
    collections::BTreeMap,
    fmt::Debug,
    sync::{Arc, PoisonError, RwLock},
};

use futures::{Stream, StreamExt, stream};
use kube::{
    Api, Resource, ResourceExt,
    api::{ListParams, ObjectList, PartialObjectMeta},
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;

/// Objects per page, for lists and for a watch's initial list. A page of full Nodes is under
/// 1 MiB of JSON and about 3 MiB parsed; kube's watcher pages at 500 unless told.
pub(crate) const PAGE_SIZE: u32 = 200;

/// Every object `params` selects, a page at a time ([`PAGE_SIZE`] objects unless `params` sets
/// a limit). Only the page being read is held; a caller that keeps what it needs of each object
/// and drops the rest never holds the whole list.
pub fn pages<K>(api: &Api<K>, params: &ListParams) -> impl Stream<Item = kube::Result<Vec<K>>> + Send + use<K>
where
    K: Clone + DeserializeOwned + Debug + Send + 'static,
{
    paged_by(api, params, |api, params| async move { api.list(&params).await })
}

/// The metadata of every object `params` selects, a page at a time, as [`pages`].
pub fn metadata_pages<K>(
    api: &Api<K>,
    params: &ListParams,
) -> impl Stream<Item = kube::Result<Vec<PartialObjectMeta<K>>>> + Send + use<K>
where
    K: Clone + DeserializeOwned + Debug + Send + 'static,
{
    paged_by(
        api,
        params,
        |api, params| async move { api.list_metadata(&params).await },
    )
}

/// Pages of what `list` answers, following the continue token.
fn paged_by<K, T, F, Fut>(
    api: &Api<K>,
    params: &ListParams,
    list: F,
) -> impl Stream<Item = kube::Result<Vec<T>>> + Send + use<K, T, F, Fut>
where
    K: Clone + Send + 'static,
    T: Clone + Send + 'static,
    F: Fn(Api<K>, ListParams) -> Fut + Send + 'static,
    Fut: Future<Output = kube::Result<ObjectList<T>>> + Send,
{
    let first = ListParams {
        limit: params.limit.or(Some(PAGE_SIZE)),
        ..params.clone()
    };
    stream::try_unfold((api.clone(), Some(first), list), |(api, next, list)| async move {
        let Some(params) = next else {
            return Ok(None);
        };
        let page = list(api.clone(), params.clone()).await?;
        let next = page
            .metadata
            .continue_
            .filter(|token| !token.is_empty())
            .map(|token| params.continue_token(&token));
        Ok(Some((page.items, (api, next, list))))
    })
}

/// A watch of a kind that keeps `project(object)` per object name and drops the object: a
/// store of the whole objects (kube's reflector) holds every field of every object, twice while
/// it relists. Names are the key, so one namespace or a cluster-scoped kind. Objects the
/// projection has nothing for are left out. The watch runs until the projection is dropped.
pub struct Projection<V> {
    values: Arc<RwLock<BTreeMap<String, V>>>,
    watch: tokio::task::AbortHandle,
}

impl<V: Clone + Send + Sync + 'static> Projection<V> {
    /// Starts the watch (its initial list paged at [`PAGE_SIZE`]).
    pub fn spawn<K>(api: Api<K>, config: watcher::Config, project: impl Fn(&K) -> Option<V> + Send + 'static) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let config = config.page_size(PAGE_SIZE);
        let values: Arc<RwLock<BTreeMap<String, V>>> = Arc::default();
        let kept = values.clone();
        let watch = tokio::spawn(async move {
            let mut relisted: Option<BTreeMap<String, V>> = None;
            let mut events = watcher(api, config).backoff(crate::backoff::prompt()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => apply(&kept, &mut relisted, event, &project),
                    // Retried with backoff; a lasting error (RBAC, a removed kind) must be seen.
                    Err(error) => tracing::warn!(%error, "watch error; retrying"),
                }
            }
        });
        Self {
            values,
            watch: watch.abort_handle(),
        }
    }

    /// The values now, by object name.
    pub fn snapshot(&self) -> BTreeMap<String, V> {
        self.values.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the values in place (a snapshot of a few of many without copying the rest).
    pub fn read<R>(&self, read: impl FnOnce(&BTreeMap<String, V>) -> R) -> R {
        read(&self.values.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many objects have a value.
    pub fn len(&self) -> usize {
        self.values.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<V> Drop for Projection<V> {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// One watch event on the values. A relist builds its values apart and replaces the old ones
/// when it is complete: what was deleted while the watch was down is gone, and readers never see
/// a half-built list.
fn apply<K: Resource, V>(
    values: &RwLock<BTreeMap<String, V>>,
    relisted: &mut Option<BTreeMap<String, V>>,
    event: watcher::Event<K>,
    project: &impl Fn(&K) -> Option<V>,
) {
    let write = || values.write().unwrap_or_else(PoisonError::into_inner);
    match event {
        watcher::Event::Init => *relisted = Some(BTreeMap::new()),
        watcher::Event::InitApply(object) => {
            if let (Some(relisted), Some(value)) = (relisted.as_mut(), project(&object)) {
                relisted.insert(object.name_any(), value);
            }
        }
        watcher::Event::InitDone => {
            if let Some(relisted) = relisted.take() {
                *write() = relisted;
            }
        }
        watcher::Event::Apply(object) => match project(&object) {
            Some(value) => {
                write().insert(object.name_any(), value);
            }
            None => {
                write().remove(&object.name_any());
            }
        },
        watcher::Event::Delete(object) => {
            write().remove(&object.name_any());
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn config_map(name: &str, value: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: value.map(|v| [("key".to_owned(), v.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    fn value(object: &ConfigMap) -> Option<String> {
        object.data.as_ref()?.get("key").cloned()
    }

    fn run(events: Vec<watcher::Event<ConfigMap>>) -> BTreeMap<String, String> {
        let values = RwLock::new(BTreeMap::new());
        let mut relisted = None;
        for event in events {
            apply(&values, &mut relisted, event, &value);
        }
        values.into_inner().expect("not poisoned")
    }

    #[test]
    fn keeps_the_projection_of_each_object_and_forgets_deleted_ones() {
        use watcher::Event::*;
        let values = run(vec![
            Apply(config_map("a", Some("1"))),
            Apply(config_map("b", Some("2"))),
            Apply(config_map("a", Some("3"))),
            Delete(config_map("b", Some("2"))),
            Apply(config_map("c", None)),
        ]);
        assert_eq!(values, [("a".to_owned(), "3".to_owned())].into());
    }

    #[test]
    fn an_object_whose_projection_ends_is_forgotten() {
        use watcher::Event::*;
        let values = run(vec![Apply(config_map("a", Some("1"))), Apply(config_map("a", None))]);
        assert!(values.is_empty());
    }

    #[test]
    fn a_relist_replaces_everything_once_complete() {
        use watcher::Event::*;
        let values = RwLock::new(BTreeMap::new());
        let mut relisted = None;
        for event in [
            Apply(config_map("gone", Some("1"))),
            Init,
            InitApply(config_map("kept", Some("2"))),
        ] {
            apply(&values, &mut relisted, event, &value);
        }
        // Until the relist is complete, readers see what was there before it.
        assert_eq!(
            values.read().expect("not poisoned").keys().collect::<Vec<_>>(),
            ["gone"]
        );
        apply(&values, &mut relisted, InitDone, &value);
        assert_eq!(
            values.into_inner().expect("not poisoned"),
            [("kept".to_owned(), "2".to_owned())].into()
        );
    }
}
