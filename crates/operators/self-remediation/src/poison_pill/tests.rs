use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use nodemedic_api::{
    names::annotations,
    poison_pill::{PoisonPillRemediationSpec, PoisonPillStrategy},
    self_remediation::{RemediationStrategy, SelfNodeRemediationStatus},
};
use proptest::prelude::*;

use super::*;

fn ppr(strategy: PoisonPillStrategy, owners: Vec<OwnerReference>) -> PoisonPillRemediation {
    let mut ppr = PoisonPillRemediation::new(
        "worker-1",
        PoisonPillRemediationSpec {
            remediation_strategy: strategy,
        },
    );
    ppr.metadata.namespace = Some("workload-availability".into());
    ppr.metadata.uid = Some("uid-1".into());
    ppr.metadata.annotations = Some(BTreeMap::from([(annotations::NODE_NAME.into(), "worker-1".into())]));
    ppr.metadata.labels = Some(BTreeMap::from([("app".into(), "nhc".into())]));
    ppr.metadata.owner_references = Some(owners);
    ppr
}

fn owner(kind: &str, name: &str) -> OwnerReference {
    OwnerReference {
        api_version: "x/v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("{name}-uid"),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[test]
fn the_carrier_has_the_name_node_and_strategy_and_is_owned_by_the_poison_pill_remediation() {
    let ppr = ppr(
        PoisonPillStrategy::ResourceDeletion,
        vec![owner("NodeHealthCheck", "nhc")],
    );
    let snr = carrier(&ppr);
    assert_eq!(snr.metadata.name.as_deref(), Some("worker-1"));
    assert_eq!(snr.metadata.namespace.as_deref(), Some("workload-availability"));
    assert_eq!(
        snr.annotations().get(annotations::NODE_NAME).map(String::as_str),
        Some("worker-1")
    );
    assert_eq!(snr.spec.remediation_strategy, RemediationStrategy::ResourceDeletion);
    let owners = snr.owner_references();
    assert_eq!(
        owners.len(),
        1,
        "the health check owns the PoisonPillRemediation only: {owners:?}"
    );
    assert_eq!(owners[0].kind, "PoisonPillRemediation");
    assert_eq!(owners[0].controller, Some(true));
    assert!(carries(&snr, &ppr));
}

#[test]
fn a_machine_owner_is_kept_beside_it_so_the_manager_resolves_the_machines_node() {
    let ppr = ppr(PoisonPillStrategy::NodeDeletion, vec![owner("Machine", "m-1")]);
    let snr = carrier(&ppr);
    assert_eq!(snr.spec.remediation_strategy, RemediationStrategy::Automatic);
    let machine = snr
        .owner_references()
        .iter()
        .find(|o| o.kind == "Machine")
        .expect("the Machine owner");
    assert_eq!(
        machine.controller,
        Some(false),
        "one controller: the PoisonPillRemediation"
    );
    assert_eq!(machine.block_owner_deletion, None);
}

#[test]
fn a_carrier_of_an_earlier_remediation_of_the_same_name_does_not_count() {
    let earlier = carrier(&ppr(PoisonPillStrategy::NodeDeletion, vec![]));
    let mut later = ppr(PoisonPillStrategy::NodeDeletion, vec![]);
    later.metadata.uid = Some("uid-2".into());
    assert!(!carries(&earlier, &later));
    assert!(
        carried_for_another(&earlier, &later),
        "left behind: released before the later one starts"
    );
    let own = carrier(&later);
    assert!(!carried_for_another(&own, &later), "its own carrier is kept");
    let mut users_own = earlier.clone();
    users_own.metadata.owner_references = None;
    assert!(
        !carried_for_another(&users_own, &later),
        "a user's SelfNodeRemediation is never deleted"
    );
}

#[test]
fn the_health_checks_later_marks_reach_the_carrier_and_the_managers_own_stay() {
    let mut ppr = ppr(PoisonPillStrategy::NodeDeletion, vec![]);
    let mut snr = carrier(&ppr);
    assert_eq!(carrier_patch(&ppr, &snr), None);
    snr.annotations_mut().insert("recorded-by-manager".into(), "x".into());
    assert_eq!(carrier_patch(&ppr, &snr), None);
    ppr.annotations_mut()
        .insert(annotations::NHC_TIMED_OUT.into(), "now".into());
    let patch = carrier_patch(&ppr, &snr).expect("a patch");
    assert_eq!(patch["metadata"]["annotations"][annotations::NHC_TIMED_OUT], "now");
    assert!(patch["metadata"]["annotations"].get("recorded-by-manager").is_none());
}

#[test]
fn the_status_is_the_carriers() {
    let mut snr = carrier(&ppr(PoisonPillStrategy::NodeDeletion, vec![]));
    snr.status = Some(SelfNodeRemediationStatus {
        phase: Some("Fencing-Completed".into()),
        last_error: Some("none".into()),
        accepted_by: Some(vec!["node-2".into()]),
        ..Default::default()
    });
    let status = status_of(&snr);
    assert_eq!(status.phase.as_deref(), Some("Fencing-Completed"));
    assert_eq!(status.last_error.as_deref(), Some("none"));
}

#[test]
fn the_config_sets_its_three_fields_on_the_self_node_remediation_config() {
    let body = config_fields("self-node-remediation-config", &PoisonPillConfigSpec::default());
    assert_eq!(body["metadata"]["name"], "self-node-remediation-config");
    assert_eq!(
        body["spec"],
        json!({"watchdogFilePath": "/dev/watchdog", "safeTimeToAssumeNodeRebootedSeconds": 180, "isSoftwareRebootEnabled": true})
    );
}

proptest! {
    /// Whatever the health check wrote on the PoisonPillRemediation, its carrier holds it once
    /// the patch is applied, and then nothing is left to patch.
    #[test]
    fn after_the_patch_the_carrier_holds_every_mark(
        marks in proptest::collection::btree_map("[a-z]{1,4}", "[a-z]{0,3}", 0..6),
        own in proptest::collection::btree_map("[a-z]{1,4}", "[a-z]{0,3}", 0..6),
    ) {
        let mut ppr = ppr(PoisonPillStrategy::NodeDeletion, vec![]);
        let mut snr = carrier(&ppr);
        snr.annotations_mut().extend(own);
        ppr.annotations_mut().extend(marks);
        if let Some(patch) = carrier_patch(&ppr, &snr) {
            let added: BTreeMap<String, String> =
                serde_json::from_value(patch["metadata"]["annotations"].clone()).expect("string pairs");
            snr.annotations_mut().extend(added);
        }
        prop_assert_eq!(carrier_patch(&ppr, &snr), None);
        for (key, value) in ppr.annotations() {
            prop_assert_eq!(snr.annotations().get(key), Some(value));
        }
    }
}
