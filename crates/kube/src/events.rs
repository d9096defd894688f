//! One shared event publisher per process. Repeats of an event (same object, type and reason)
//! within six minutes count into the first one's series instead of making new objects, as
//! client-go and kube's `Recorder` do.
//!
//! Not kube's `Recorder`: it keeps every event it published (the whole object) for six minutes
//! and publishes as many at once as it is asked to. When 500 nodes fail at once that is
//! thousands of events, megabytes held, and as many HTTP/1 connections (each a TLS handshake
//! on both sides) opened at once. Here the memory of recent events is a name and a count each,
//! bounded, and a few events are written at a time.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client, Resource,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::events::EventType,
};
use serde_json::json;
use tokio::sync::Semaphore;

/// How long a repeat joins the first event's series.
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// Events remembered for series at most; beyond, a new event is written but not remembered.
const REMEMBERED: usize = 4096;
/// Event writes in flight at most.
const WRITES_AT_ONCE: usize = 8;

#[derive(Clone)]
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    recent: Arc<Mutex<Recent>>,
    writes: Arc<Semaphore>,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance: instance.unwrap_or_else(|| controller.to_owned()),
            recent: Arc::default(),
            writes: Arc::new(Semaphore::new(WRITES_AT_ONCE)),
        }
    }

    /// Records a Normal event. A failure to record is logged, never fatal: events explain
    /// decisions, they do not make them.
    pub async fn normal(&self, on: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.publish(on, EventType::Normal, reason, note.into()).await;
    }

    pub async fn warning(&self, on: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.publish(on, EventType::Warning, reason, note.into()).await;
    }

    /// Records an event given as data (see [`Note`]).
    pub async fn record(&self, on: &ObjectReference, note: &Note) {
        let type_ = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.publish(on, type_, &note.reason, note.note.clone()).await;
    }

    async fn publish(&self, on: &ObjectReference, type_: EventType, reason: &str, note: String) {
        let Ok(_permit) = self.writes.acquire().await else {
            return;
        };
        let key = Key::of(on, type_, reason);
        let now = Timestamp::now();
        let repeat = self.with_recent(|recent| recent.repeat(key, now));
        let namespace = on.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let api = Api::<Event>::namespaced(self.client.clone(), &namespace);
        let written = match repeat {
            Some(series) => {
                // Only the series may change: the API server keeps an event's note as first
                // written. Two repeats in flight may land out of order, leaving the count one
                // behind until the next.
                let patch = json!({"series": {"count": series.count, "lastObservedTime": MicroTime(now)}});
                let written = api
                    .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                if matches!(&written, Err(kube::Error::Api(status)) if status.code == 404) {
                    // Expired or deleted: the next repeat starts a new event.
                    self.with_recent(|recent| recent.forget(key));
                }
                written.map(|_| ())
            }
            None => {
                let name = format!(
                    "{}.{:x}",
                    on.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                );
                let event = self.event(on, &name, type_, reason, truncate(note), now);
                let written = api.create(&PostParams::default(), &event).await;
                if written.is_ok() {
                    self.with_recent(|recent| recent.created(key, name, now));
                }
                written.map(|_| ())
            }
        };
        if let Err(error) = written {
            tracing::warn!(%error, reason, "could not record event");
        }
    }

    fn with_recent<T>(&self, f: impl FnOnce(&mut Recent) -> T) -> T {
        // A panic elsewhere while holding the lock leaves a map that is still whole.
        let mut recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut recent)
    }

    fn event(
        &self,
        on: &ObjectReference,
        name: &str,
        type_: EventType,
        reason: &str,
        note: String,
        now: Timestamp,
    ) -> Event {
        Event {
            action: Some(reason.to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(on.clone()),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: on.namespace.clone(),
                name: Some(name.to_owned()),
                ..Default::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(format!("{type_:?}")),
            ..Default::default()
        }
    }
}

/// An event as data: what a step returns for the step runner to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

impl Note {
    pub fn normal(reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason: reason.into(),
            note: note.into(),
        }
    }

    pub fn warning(reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, note)
        }
    }
}

/// What makes two events one series: the object, the type and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key(u64);

impl Key {
    fn of(on: &ObjectReference, type_: EventType, reason: &str) -> Self {
        let mut hasher = DefaultHasher::new();
        (&on.kind, &on.namespace, &on.name, &on.uid, type_, reason).hash(&mut hasher);
        Self(hasher.finish())
    }
}

#[derive(Debug, PartialEq)]
struct Series {
    name: String,
    count: i32,
}

struct Seen {
    name: String,
    count: i32,
    last: Timestamp,
}

/// The events written in the last [`SERIES_WINDOW`], by key.
#[derive(Default)]
struct Recent(HashMap<Key, Seen>);

impl Recent {
    /// The series a new occurrence joins (counted in), or `None` when it is a new event.
    fn repeat(&mut self, key: Key, now: Timestamp) -> Option<Series> {
        self.0.retain(|_, seen| seen.last + SERIES_WINDOW > now);
        let seen = self.0.get_mut(&key)?;
        seen.count += 1;
        seen.last = now;
        Some(Series {
            name: seen.name.clone(),
            count: seen.count,
        })
    }

    fn created(&mut self, key: Key, name: String, now: Timestamp) {
        if self.0.len() < REMEMBERED {
            self.0.insert(
                key,
                Seen {
                    name,
                    count: 1,
                    last: now,
                },
            );
        }
    }

    fn forget(&mut self, key: Key) {
        self.0.remove(&key);
    }
}

/// The reference events need for any object.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    obj.object_ref(&())
}

// The Events API rejects notes over 1 kB.
fn truncate(mut note: String) -> String {
    const MAX: usize = 1000;
    if note.len() > MAX {
        let mut cut = MAX;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::constant(1_800_000_000 + seconds, 0)
    }

    #[test]
    fn repeats_within_the_window_join_the_first_events_series() {
        let mut recent = Recent::default();
        let key = Key::of(&node("a"), EventType::Warning, "RemediationSkipped");
        assert_eq!(recent.repeat(key, at(0)), None);
        recent.created(key, "a.1".into(), at(0));
        let second = recent.repeat(key, at(60));
        assert_eq!(
            second,
            Some(Series {
                name: "a.1".into(),
                count: 2
            })
        );
        let third = recent.repeat(key, at(400));
        assert_eq!(
            third,
            Some(Series {
                name: "a.1".into(),
                count: 3
            })
        );
    }

    #[test]
    fn a_repeat_after_the_window_is_a_new_event() {
        let mut recent = Recent::default();
        let key = Key::of(&node("a"), EventType::Normal, "RemediationCreated");
        recent.created(key, "a.1".into(), at(0));
        assert_eq!(recent.repeat(key, at(361)), None);
        assert!(recent.0.is_empty());
    }

    #[test]
    fn other_objects_types_and_reasons_are_other_series() {
        let mut recent = Recent::default();
        let key = Key::of(&node("a"), EventType::Normal, "RemediationCreated");
        recent.created(key, "a.1".into(), at(0));
        for other in [
            Key::of(&node("b"), EventType::Normal, "RemediationCreated"),
            Key::of(&node("a"), EventType::Warning, "RemediationCreated"),
            Key::of(&node("a"), EventType::Normal, "RemediationDeleted"),
        ] {
            assert_eq!(recent.repeat(other, at(1)), None);
        }
    }

    #[test]
    fn memory_is_bounded_and_a_failed_write_is_forgotten() {
        let mut recent = Recent::default();
        for i in 0..REMEMBERED + 10 {
            let key = Key::of(&node(&i.to_string()), EventType::Normal, "X");
            recent.created(key, i.to_string(), at(0));
        }
        assert_eq!(recent.0.len(), REMEMBERED);
        let key = Key::of(&node("0"), EventType::Normal, "X");
        recent.forget(key);
        assert_eq!(recent.repeat(key, at(1)), None);
    }

    #[test]
    fn long_notes_are_cut_at_a_character_boundary() {
        let note = "é".repeat(600);
        let cut = truncate(note);
        assert!(cut.len() <= 1000);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
