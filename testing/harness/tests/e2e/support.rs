//! What the end-to-end tests share: starting labs and nodemedic processes in them, applying seed
//! manifests, reading metrics, waiting for objects.

use std::{
    fmt::Debug,
    sync::{Arc, Mutex, Once},
    time::Duration,
};

use futures::StreamExt;
use kube::{
    Api, Client, Resource,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_lab::{Lab, LabConfig, wait};
use serde::de::DeserializeOwned;

pub use nodemedic_harness::{
    bench::sample,
    scenario::{self, NS, metrics},
};

pub fn logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A lab with nodemedic's namespace created.
pub async fn lab(config: LabConfig) -> Lab {
    logs();
    let lab = Lab::start(config).await.expect("lab starts");
    create_namespace(&lab.client(), NS).await;
    lab
}

pub async fn create_namespace(client: &Client, name: &str) {
    scenario::create_namespace(client, name)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

/// Applies a seed manifest with its namespaces rewritten to [`NS`], after `edit`.
pub fn apply_seed(lab: &Lab, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    scenario::apply_seed(lab, file, edit).unwrap_or_else(|e| panic!("{file}: {e}"));
}

/// Applies a seed health check with its durations shortened (see
/// [`scenario::apply_seed_check`]).
pub fn apply_seed_check(lab: &Lab, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    scenario::apply_seed_check(lab, file, edit).unwrap_or_else(|e| panic!("{file}: {e}"));
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Starts `nodemedic-controller` on the host as lab process `name` (see
/// [`scenario::start_controller`]); returns its metrics port.
pub fn start_controller(lab: &Lab, name: &str, extra: &[&str]) -> u16 {
    let port = free_port();
    scenario::start_controller(
        lab,
        &crate::nodemedic_exe(),
        name,
        port,
        extra,
        "info,nodemedic_healthcheck=debug,nodemedic_maintenance=debug,kube=warn",
    )
    .expect("controller starts");
    port
}

pub async fn list<K>(client: &Client, ns: &str) -> Vec<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Waits until `check` finds something, failing with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut check = check;
    wait::until(what, timeout, || {
        let fut = check();
        async move { Ok(fut.await) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// When the lab's observer saw `pod` Running. The observer learns it from its own watch, which
/// may deliver it after a test's read already found the pod Running: wait for the record.
pub async fn recorded_running(lab: &Lab, pod: &k8s_openapi::api::core::v1::Pod) -> jiff::Timestamp {
    let uid = pod.metadata.uid.clone().expect("a pod read from the API has a uid");
    eventually("the pod's Running in the lab's timeline", Duration::from_secs(30), || async {
        lab.timeline()
            .entries()
            .into_iter()
            .find(|e| {
                matches!(&e.event, nodemedic_lab::Event::PodPhase { pod, phase, .. } if pod.uid == uid && phase == "Running")
            })
            .map(|e| e.at)
    })
    .await
}

/// Waits for an event (events.k8s.io) with this reason whose note contains `text`. Events are
/// published after the change they report, so a test never reads them once: it waits.
pub async fn event_with(client: &Client, reason: &str, text: &str) -> k8s_openapi::api::events::v1::Event {
    let what = format!("a {reason} event whose note contains {text:?}");
    eventually(&what, EVENT_WAIT, || async {
        events_so_far(client, reason, text).await.into_iter().next()
    })
    .await
}

/// The events with this reason whose note contains `text`, read once: only for a test that
/// checks an event was never published.
pub async fn events_so_far(client: &Client, reason: &str, text: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    let Ok(events) = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return Vec::new();
    };
    events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.note.as_deref().is_some_and(|n| n.contains(text)))
        .collect()
}

/// How long a test waits for an event before it fails.
const EVENT_WAIT: Duration = Duration::from_secs(180);

/// Fails the test, with the timeline, if a stateful pod ever ran twice.
pub fn assert_witness(lab: &Lab) {
    let violations = nodemedic_lab::witness::check(&lab.timeline().entries());
    assert!(
        violations.is_empty(),
        "two writers: {violations:?}\n{}",
        lab.timeline().render()
    );
}

/// A node's taints as `key:effect`.
pub async fn taints(client: &Client, node: &str) -> Vec<String> {
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(node)
        .await
        .expect("node");
    node.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

/// Every version of every object of a kind the API server showed, so a test sees a state even
/// when the object is deleted a moment later (by the health check, or with its owner).
pub struct History<K> {
    seen: Arc<Mutex<Vec<K>>>,
    watch: tokio::task::AbortHandle,
}

impl<K> History<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    pub fn record(client: &Client) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let api = Api::<K>::all(client.clone());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .backoff(nodemedic_kube::backoff::prompt())
                    .touched_objects()
            );
            while let Some(item) = stream.next().await {
                if let (Ok(object), Ok(mut all)) = (item, into.lock()) {
                    all.push(object);
                }
            }
        });
        Self {
            seen,
            watch: task.abort_handle(),
        }
    }

    pub fn all(&self) -> Vec<K> {
        self.seen.lock().map(|all| all.clone()).unwrap_or_default()
    }

    pub fn find(&self, matches: impl Fn(&K) -> bool) -> Option<K> {
        self.seen.lock().ok()?.iter().find(|k| matches(k)).cloned()
    }

    /// The first version `matches` accepts, waiting up to `timeout` for it.
    pub async fn wait_for(&self, what: &str, timeout: Duration, matches: impl Fn(&K) -> bool) -> K {
        eventually(what, timeout, || async { self.find(&matches) }).await
    }
}

/// The watch ends with the test, before its lab goes away (a watch on a vanished API server
/// would retry forever).
impl<K> Drop for History<K> {
    fn drop(&mut self) {
        self.watch.abort();
    }
}
