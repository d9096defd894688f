use k8s_openapi::api::core::v1::Secret;
use nodemedic_api::{
    descheduler::KubeDescheduler,
    fence_agents::FenceAgentsRemediationTemplate,
    healthcheck::NodeHealthCheck,
    maintenance::NodeMaintenance,
    self_remediation::{SelfNodeRemediationConfig, SelfNodeRemediationTemplate},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// Every path in `original` is in `roundtrip` with the same value (the types may add defaults).
fn assert_nothing_lost(original: &Value, roundtrip: &Value, path: &str) {
    match (original, roundtrip) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let inner = format!("{path}.{key}");
                let Some(other) = b.get(key) else {
                    panic!("{inner} was lost in the round trip")
                };
                assert_nothing_lost(value, other, &inner);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path} changed length");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_nothing_lost(x, y, &format!("{path}[{i}]"));
            }
        }
        (a, b) => assert_eq!(a, b, "{path} changed"),
    }
}

fn roundtrip<T: DeserializeOwned + Serialize>(original: &Value) -> Value {
    let typed: T = serde_json::from_value(original.clone()).expect("deserializes into the typed API");
    serde_json::to_value(&typed).expect("serializes")
}

#[test]
fn every_seed_manifest_round_trips_without_losing_a_field() {
    let mut seen = 0;
    for entry in std::fs::read_dir(crate::seed_manifest_dir()).expect("readable") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        let original: Value = serde_saphyr::from_str(&text).expect("valid YAML");
        let kind = original["kind"].as_str().expect("has a kind");
        let back = match kind {
            "NodeHealthCheck" => roundtrip::<NodeHealthCheck>(&original),
            "SelfNodeRemediationConfig" => roundtrip::<SelfNodeRemediationConfig>(&original),
            "SelfNodeRemediationTemplate" => roundtrip::<SelfNodeRemediationTemplate>(&original),
            "FenceAgentsRemediationTemplate" => roundtrip::<FenceAgentsRemediationTemplate>(&original),
            "NodeMaintenance" => roundtrip::<NodeMaintenance>(&original),
            "KubeDescheduler" => roundtrip::<KubeDescheduler>(&original),
            "Secret" => roundtrip::<Secret>(&original),
            other => panic!("{}: no typed API for kind {other}", path.display()),
        };
        assert_nothing_lost(
            &original,
            &back,
            &path.file_name().unwrap_or_default().to_string_lossy(),
        );
        seen += 1;
    }
    assert_eq!(seen, 10, "all ten seed manifests were checked");
}

#[test]
fn seed_values_arrive_in_the_typed_fields() {
    let text = std::fs::read_to_string(crate::seed_manifest_dir().join("002-far-template.yaml")).expect("readable");
    let template: FenceAgentsRemediationTemplate = serde_saphyr::from_str(&text).expect("parses");
    let spec = &template.spec.template.spec;
    assert_eq!(spec.agent, "fence_redfish");
    assert_eq!(spec.retrycount, 5);
    assert_eq!(spec.retryinterval.as_str(), "5s");
    assert_eq!(spec.sharedparameters["--hostname"], "{{.NodeName}}.mgmt.kemo.labs");
    assert_eq!(
        spec.shared_secret_name.as_deref(),
        Some("fence-agents-credentials-shared-sm-bmc")
    );

    let text =
        std::fs::read_to_string(crate::seed_manifest_dir().join("001-nhc-worker-default.yaml")).expect("readable");
    let nhc: NodeHealthCheck = serde_saphyr::from_str(&text).expect("parses");
    assert_eq!(nhc.spec.pause_requests, Some(vec![]), "an explicit empty list is kept");
    assert_eq!(nhc.spec.unhealthy_conditions.len(), 2);

    let text = std::fs::read_to_string(crate::seed_manifest_dir().join("004-snr-config.yaml")).expect("readable");
    let config: SelfNodeRemediationConfig = serde_saphyr::from_str(&text).expect("parses");
    assert_eq!(config.spec.safe_time_to_assume_node_rebooted_seconds, Some(180));
    assert_eq!(config.spec.peer_update_interval.as_str(), "15m");
}

/// The repository's copy of the seed manifests is the shared originals, byte for byte (checked
/// wherever the shared folder sits beside the repository).
#[test]
fn the_repository_copy_of_the_seeds_is_the_shared_original() {
    let shared = crate::repo_root().join("../shared/fixtures/seed-manifests");
    let Ok(entries) = std::fs::read_dir(&shared) else {
        eprintln!("no {} beside the repository: nothing to compare", shared.display());
        return;
    };
    let copy = crate::repo_root().join("fixtures/seed-manifests");
    for entry in entries {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name");
        assert_eq!(
            std::fs::read(&path).expect("original"),
            std::fs::read(copy.join(name)).unwrap_or_default(),
            "fixtures/seed-manifests/{} differs from {}: copy it again",
            name.to_string_lossy(),
            path.display()
        );
    }
}
