//! Every profile and customization rendered, against expected policies written by hand from
//! OpenShift's documented mapping (tests/policies/*.yaml), and the specs that cannot run.

use nodemedic_api::descheduler::KubeDeschedulerSpec;
use nodemedic_descheduler::decide::{Environment, deployment, policy::PrometheusProvider, render};
use serde_json::Value;

fn environment() -> Environment {
    Environment {
        protected_namespaces: vec!["kube-system".into(), "nodemedic".into()],
        prometheus: Some(PrometheusProvider {
            url: "http://prometheus.monitoring.svc:9090".into(),
            auth_token: None,
        }),
        kubevirt_migration_aware: false,
        kubevirt_schedulable_nodes: 3,
    }
}

fn spec(yaml: &str) -> KubeDeschedulerSpec {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("test spec does not parse: {e}\n{yaml}"))
}

fn expected(file: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/policies")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check(file: &str, spec_yaml: &str, env: &Environment) -> Vec<String> {
    let rendered = render(&spec(spec_yaml), env).unwrap_or_else(|e| panic!("{file}: {e}"));
    let actual = serde_json::to_value(&rendered.policy).expect("serializes");
    let want = expected(file);
    assert_eq!(
        actual,
        want,
        "{file}: rendered\n{}\nexpected\n{}",
        serde_json::to_string_pretty(&actual).unwrap_or_default(),
        serde_json::to_string_pretty(&want).unwrap_or_default()
    );
    rendered.notes
}

#[test]
fn the_seed_002_descheduler_renders_both_profiles() {
    let seed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../fixtures/seed-manifests/002-kube-descheduler.yaml"),
    )
    .expect("seed");
    let manifest: Value = serde_saphyr::from_str(&seed).expect("seed parses");
    let spec_yaml = serde_saphyr::to_string(&manifest["spec"]).expect("spec");
    let notes = check("seed-002.yaml", &spec_yaml, &environment());
    assert!(
        notes
            .iter()
            .any(|n| n.contains("without the KubevirtMigrationAware plugin")),
        "{notes:?}"
    );
    let args = deployment::descheduler_args(&spec(&spec_yaml)).expect("runs");
    assert_eq!(
        args,
        [
            "--policy-config-file=/policy-dir/policy.yaml",
            "--logging-format=text",
            "--descheduling-interval=30s",
            "--feature-gates=EvictionsInBackground=true",
            "-v=2",
        ]
    );
}

#[test]
fn kubevirt_relieve_and_migrate_variants() {
    check(
        "kubevirt-defaults.yaml",
        "profiles: [KubeVirtRelieveAndMigrate]",
        &environment(),
    );
    check(
        "kubevirt-defaults.yaml",
        "profiles: [DevKubeVirtRelieveAndMigrate]\nprofileCustomizations: {devActualUtilizationProfile: PrometheusCPUMemoryCombinedProfile}",
        &environment(),
    );
    check(
        "kubevirt-fixed-thresholds-and-limits.yaml",
        "profiles: [KubeVirtRelieveAndMigrate]\nevictionLimits: {total: 10, node: 3}\nprofileCustomizations: {devLowNodeUtilizationThresholds: High, thresholdPriorityClassName: vm-critical}",
        &environment(),
    );
    let openshift = Environment {
        kubevirt_migration_aware: true,
        ..environment()
    };
    let notes = check(
        "kubevirt-with-openshift-plugin.yaml",
        "profiles: [KubeVirtRelieveAndMigrate]\nprofileCustomizations: {devDeviationThresholds: Medium, devMigrationCooldown: 10m, devMaxMigrationCooldown: 2h}",
        &openshift,
    );
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn the_other_profiles() {
    check(
        "affinity-and-taints-included.yaml",
        "profiles: [AffinityAndTaints]\nprofileCustomizations: {namespaces: {included: [shop, payments]}}",
        &environment(),
    );
    check(
        "soft-topology-evicting-storage.yaml",
        "profiles: [EvictPodsWithPVC, SoftTopologyAndDuplicates, EvictPodsWithLocalStorage]",
        &environment(),
    );
    check(
        "lifecycle-and-utilization.yaml",
        "profiles: [LifecycleAndUtilization]\nprofileCustomizations: {podLifetime: 5m, thresholdPriority: 1000, devLowNodeUtilizationThresholds: Low}",
        &environment(),
    );
    let notes = check(
        "long-lifecycle-with-query.yaml",
        "profiles: [LongLifecycle, DevPreviewLongLifecycle]\nevictionLimits: {node: 1}\nprofileCustomizations: {devActualUtilizationProfile: 'query:avg by (instance) (node_load1) / 4'}",
        &environment(),
    );
    assert_eq!(
        notes,
        ["DevPreviewLongLifecycle is the deprecated name of LongLifecycle: it runs once"]
    );
    check(
        "compact-and-scale.yaml",
        "profiles: [CompactAndScale]\nprofileCustomizations: {devHighNodeUtilizationThresholds: Moderate, namespaces: {excluded: [batch, nodemedic]}}",
        &environment(),
    );
}

#[test]
fn predictive_mode_runs_dry_and_the_log_level_sets_verbosity() {
    let args = deployment::descheduler_args(&spec(
        "profiles: [AffinityAndTaints]\ndeschedulingIntervalSeconds: 3600\nlogLevel: TraceAll",
    ))
    .expect("runs");
    assert_eq!(
        args,
        [
            "--policy-config-file=/policy-dir/policy.yaml",
            "--logging-format=text",
            "--descheduling-interval=3600s",
            "--dry-run=true",
            "-v=8",
        ]
    );
    let background = deployment::descheduler_args(&spec(
        "profiles: [AffinityAndTaints]\nmode: Automatic\ndeschedulingIntervalSeconds: 60\nprofileCustomizations: {devEnableEvictionsInBackground: true}",
    ))
    .expect("runs");
    assert!(background.contains(&"--feature-gates=EvictionsInBackground=true".to_owned()));
    assert!(!background.iter().any(|a| a.starts_with("--dry-run")));
}

#[test]
fn specs_that_cannot_run_name_the_field_and_the_fix() {
    let env = environment();
    let field = |yaml: &str, env: &Environment| render(&spec(yaml), env).expect_err("refused").to_string();

    assert!(field("{}", &env).starts_with("spec.profiles: no profile is enabled"));
    assert!(field("profiles: [EvictPodsWithPVC]", &env).contains("only adjust other profiles"));
    let no_prometheus = Environment {
        prometheus: None,
        ..environment()
    };
    assert!(field("profiles: [KubeVirtRelieveAndMigrate]", &no_prometheus).contains("--descheduler-prometheus-url"));
    assert!(
        field(
            "profiles: [LongLifecycle]\nprofileCustomizations: {devActualUtilizationProfile: PrometheusCPUUsage}",
            &no_prometheus
        )
        .starts_with("spec.profileCustomizations.devActualUtilizationProfile:")
    );
    let no_kubevirt = Environment {
        kubevirt_schedulable_nodes: 0,
        ..environment()
    };
    assert!(field("profiles: [KubeVirtRelieveAndMigrate]", &no_kubevirt).contains("kubevirt.io/schedulable=true"));
    assert!(
        field(
            "profiles: [LongLifecycle]\nprofileCustomizations: {devActualUtilizationProfile: 'query: '}",
            &env
        )
        .contains("query:<PromQL>")
    );
    assert!(
        field(
            "profiles: [CompactAndScale]\nprofileCustomizations: {namespaces: {included: [shop, nodemedic]}}",
            &env
        )
        .starts_with("spec.profileCustomizations.namespaces.included: nodemedic is never descheduled")
    );
    let missing_interval = deployment::descheduler_args(&spec("profiles: [AffinityAndTaints]")).expect_err("refused");
    assert_eq!(missing_interval.field, "spec.deschedulingIntervalSeconds");
}

#[test]
fn the_soft_tainter_follows_the_kubevirt_profile_of_the_policy() {
    use nodemedic_descheduler::decide::{soft_taints::Thresholds, tainting};
    let seed = spec(
        "profiles: [KubeVirtRelieveAndMigrate, TopologyAndDuplicates]\nprofileCustomizations: {devDeviationThresholds: AsymmetricLow, devActualUtilizationProfile: PrometheusCPUCombined}",
    );
    let rendered = render(&seed, &environment()).expect("renders");
    let settings = tainting::settings(&rendered.policy).expect("a KubeVirt profile");
    assert_eq!(settings.query, "descheduler:combined_utilization_and_pressure:avg1m");
    assert_eq!(
        settings.thresholds,
        Thresholds::Deviation {
            below: 0.0,
            above: 10.0
        }
    );
    assert_eq!(
        settings.node_selector,
        Some(("kubevirt.io/schedulable".to_owned(), "true".to_owned()))
    );
    let fixed = render(
        &spec("profiles: [KubeVirtRelieveAndMigrate]\nprofileCustomizations: {devLowNodeUtilizationThresholds: Low}"),
        &environment(),
    )
    .expect("renders");
    assert_eq!(
        tainting::settings(&fixed.policy).map(|s| s.thresholds),
        Some(Thresholds::Fixed { low: 10.0, high: 30.0 })
    );
    let without = render(&spec("profiles: [LongLifecycle]"), &environment()).expect("renders");
    assert_eq!(
        tainting::settings(&without.policy),
        None,
        "no KubeVirt profile, no soft taints"
    );
}
