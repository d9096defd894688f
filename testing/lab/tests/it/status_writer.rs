//! The one status writer (`nodemedic_kube::status`) against the real API server: a status
//! computed from an outdated version is refused with a conflict and overwrites nothing; an
//! update is applied again to the fresh version; a field and a nested map key the edit dropped
//! are removed on the server; an edit that changes nothing writes nothing.

use std::collections::BTreeMap;

use kube::{Api, ResourceExt};
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig, SelfNodeRemediationConfigStatus};
use nodemedic_kube::status;
use nodemedic_lab::{Lab, LabConfig};

const NS: &str = "nodemedic-test";

fn means(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(pairs.iter().map(|(n, m)| ((*n).to_owned(), (*m).to_owned())).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_from_an_outdated_read_is_refused_and_an_update_lands_on_the_fresh_version() {
    crate::support::logs();
    // No nodes and no storage: only the API server and its CRDs are needed.
    let config = LabConfig {
        persistent_volumes: 0,
        storage: false,
        ..LabConfig::new(Vec::new())
    };
    let lab = Lab::start(config).await.expect("lab starts");
    lab.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: self-node-remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediationConfig\nmetadata: {{name: {CONFIG_NAME}, namespace: {NS}}}\nspec: {{}}\n"
    ))
    .expect("a config");
    let api = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS);
    let read = || async { api.get(CONFIG_NAME).await.expect("the config") };
    let status_now = || async { read().await.status.unwrap_or_default() };

    let first = read().await;
    let wrote = status::write(&api, &first, |s, _| {
        s.registered_agents = Some(2);
        s.members = Some(vec!["w1".into(), "w2".into()]);
        s.fencing_means = means(&[("w1", "Softdog"), ("w2", "None")]);
        true
    })
    .await
    .expect("written");
    assert!(wrote);

    // The same read again is outdated now: refused, and nothing of it lands.
    let refused = status::write(&api, &first, |s, _| {
        s.registered_agents = Some(9);
        true
    })
    .await
    .expect_err("a conflict");
    assert!(refused.is_conflict(), "{refused}");
    assert_eq!(status_now().await.registered_agents, Some(2));

    // An update from the outdated read is applied again to the fresh version, over what it holds.
    let updated = status::update(&api, &first, |s, _| {
        let changed = s.registered_agents != Some(3);
        s.registered_agents = Some(3);
        changed
    })
    .await
    .expect("updated");
    assert!(updated);
    let after_update = status_now().await;
    assert_eq!(after_update.registered_agents, Some(3));
    assert_eq!(after_update.members, Some(vec!["w1".into(), "w2".into()]));
    assert_eq!(after_update.fencing_means, means(&[("w1", "Softdog"), ("w2", "None")]));

    // A status computed as a whole: the dropped field and the dropped key of the map are gone.
    let whole = SelfNodeRemediationConfigStatus {
        registered_agents: Some(1),
        fencing_means: means(&[("w1", "Softdog")]),
        ..SelfNodeRemediationConfigStatus::default()
    };
    assert!(
        status::replace(&api, &read().await, whole.clone())
            .await
            .expect("replaced")
    );
    assert_eq!(status_now().await, whole);

    // The same status again writes nothing: the object keeps its version.
    let settled = read().await;
    assert!(!status::replace(&api, &settled, whole).await.expect("nothing to write"));
    assert_eq!(read().await.resource_version(), settled.resource_version());
}
