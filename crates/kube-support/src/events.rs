//! One shared event recorder per process, so kube can aggregate repeats into series.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
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

    async fn publish(&self, on: &ObjectReference, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note)),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, on).await {
            tracing::warn!(%error, reason, "could not record event");
        }
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
