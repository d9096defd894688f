//! The KubeDescheduler's schema rules, each with an invalid variant (run by the validation test,
//! in its lab).

pub(crate) const SEED: &str = "002-kube-descheduler.yaml";
/// The seed's own namespace: the seed applies unchanged.
pub(crate) const SEED_NAMESPACE: &str = "openshift-kube-descheduler-operator";

fn descheduler(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: operator.openshift.io/v1\nkind: KubeDescheduler\nmetadata: {{name: {name}, namespace: {SEED_NAMESPACE}}}\nspec:\n{spec}"
    )
}

fn cluster(spec: &str) -> String {
    descheduler("cluster", spec)
}

/// (what is wrong, manifest, every fragment the rejection must contain)
pub(crate) fn invalid_variants() -> Vec<(&'static str, String, Vec<&'static str>)> {
    vec![
        (
            "descheduler name",
            descheduler("other", "  profiles: [AffinityAndTaints]\n"),
            vec!["metadata.name must be 'cluster'"],
        ),
        (
            "unknown profile",
            cluster("  profiles: [KubeVirtRelieveAndMigrat]\n"),
            vec!["spec.profiles[0]", "Unsupported value", "KubeVirtRelieveAndMigrate"],
        ),
        (
            "duplicate profile",
            cluster("  profiles: [AffinityAndTaints, AffinityAndTaints]\n"),
            vec!["spec.profiles", "duplicate profiles are not allowed"],
        ),
        (
            "conflicting profiles",
            cluster("  profiles: [LongLifecycle, KubeVirtRelieveAndMigrate]\n"),
            vec![
                "spec.profiles",
                "cannot declare LongLifecycle and KubeVirtRelieveAndMigrate profiles simultaneously",
            ],
        ),
        (
            "topology twice",
            cluster("  profiles: [SoftTopologyAndDuplicates, TopologyAndDuplicates]\n"),
            vec!["cannot declare SoftTopologyAndDuplicates and TopologyAndDuplicates"],
        ),
        (
            "interval",
            cluster("  deschedulingIntervalSeconds: 0\n  profiles: [AffinityAndTaints]\n"),
            vec!["spec.deschedulingIntervalSeconds", "greater than or equal to 1"],
        ),
        (
            "mode",
            cluster("  mode: automatic\n  profiles: [AffinityAndTaints]\n"),
            vec!["spec.mode", "Unsupported value", "Automatic", "Predictive"],
        ),
        (
            "management state",
            cluster("  managementState: Managd\n"),
            vec!["spec.managementState", "should match"],
        ),
        (
            "eviction limit",
            cluster("  evictionLimits: {total: -1}\n"),
            vec!["spec.evictionLimits.total", "greater than or equal to 0"],
        ),
        (
            "namespaces both ways",
            cluster("  profileCustomizations: {namespaces: {included: [a], excluded: [b]}}\n"),
            vec!["spec.profileCustomizations.namespaces", "not both"],
        ),
        (
            "protected namespace",
            cluster("  profileCustomizations: {namespaces: {included: [openshift-etcd]}}\n"),
            vec!["spec.profileCustomizations.namespaces.included", "protected namespace"],
        ),
        (
            "priority both ways",
            cluster("  profileCustomizations: {thresholdPriority: 1000, thresholdPriorityClassName: high}\n"),
            vec!["spec.profileCustomizations.thresholdPriority", "not both"],
        ),
        (
            "thresholds both ways",
            cluster(
                "  profileCustomizations: {devLowNodeUtilizationThresholds: Low, devDeviationThresholds: AsymmetricLow}\n",
            ),
            vec!["spec.profileCustomizations.devDeviationThresholds", "not both"],
        ),
        (
            "deviation value",
            cluster("  profileCustomizations: {devDeviationThresholds: VeryLow}\n"),
            vec!["spec.profileCustomizations.devDeviationThresholds", "Unsupported value"],
        ),
        (
            "utilization profile",
            cluster("  profileCustomizations: {devActualUtilizationProfile: PrometheusGPU}\n"),
            vec![
                "spec.profileCustomizations.devActualUtilizationProfile",
                "must be one of PrometheusCPUUsage",
            ],
        ),
        (
            "pod lifetime",
            cluster("  profileCustomizations: {podLifetime: 1day}\n"),
            vec!["spec.profileCustomizations.podLifetime", "should match"],
        ),
    ]
}
