//! Where a remediation's events go: its SelfNodeRemediation and, when it carries out a
//! PoisonPillRemediation, that one too, so a user of the Poison Pill kinds reads the same events.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};
use nodemedic_api::{poison_pill::PoisonPillRemediation, self_remediation::SelfNodeRemediation};
use nodemedic_kube::events::{Events, reference};

pub struct Audience<'a> {
    events: &'a Events,
    on: Vec<ObjectReference>,
}

impl<'a> Audience<'a> {
    pub fn of(snr: &SelfNodeRemediation, events: &'a Events) -> Self {
        let mut on = vec![reference(snr)];
        on.extend(
            snr.owner_references()
                .iter()
                .filter(|o| o.controller == Some(true) && o.kind == PoisonPillRemediation::kind(&()))
                .map(|o| ObjectReference {
                    api_version: Some(o.api_version.clone()),
                    kind: Some(o.kind.clone()),
                    name: Some(o.name.clone()),
                    namespace: snr.namespace(),
                    uid: Some(o.uid.clone()),
                    ..Default::default()
                }),
        );
        Self { events, on }
    }

    pub async fn normal(&self, reason: &str, note: impl Into<String>) {
        let note = note.into();
        for on in &self.on {
            self.events.normal(on, reason, note.clone()).await;
        }
    }

    pub async fn warning(&self, reason: &str, note: impl Into<String>) {
        let note = note.into();
        for on in &self.on {
            self.events.warning(on, reason, note.clone()).await;
        }
    }
}
