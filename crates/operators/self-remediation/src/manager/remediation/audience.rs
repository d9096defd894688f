//! Where a remediation's events go: its SelfNodeRemediation and, when it carries out a
//! PoisonPillRemediation, that one too, so a user of the Poison Pill kinds reads the same events.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};
use nodemedic_api::{poison_pill::PoisonPillRemediation, self_remediation::SelfNodeRemediation};
use nodemedic_kube::events::reference;

pub(super) fn of(snr: &SelfNodeRemediation) -> Vec<ObjectReference> {
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
    on
}
