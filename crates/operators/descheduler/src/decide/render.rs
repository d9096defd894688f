//! A KubeDescheduler's profiles and customizations, rendered into the upstream descheduler's
//! policy: OpenShift's mapping, written out in the descheduler's current (v0.36) vocabulary.

use nodemedic_api::descheduler::{
    DeviationThresholds, HighThresholds, KubeDeschedulerSpec, LowThresholds, Profile, ProfileCustomizations,
};
use serde_json::{Map, Value, json};

use super::policy::{
    DeschedulerPolicy, ExtensionPoint, MetricsProvider, PluginConfig, Plugins, PolicyProfile, PrometheusProvider,
    Thresholds,
};

/// Namespaces no profile ever touches, whatever the customizations say (OpenShift's list; the
/// controller adds its own namespace and every existing `openshift-*` one).
pub(crate) const ALWAYS_PROTECTED: [&str; 3] = ["kube-system", "hypershift", "openshift"];
/// Nodes the KubeVirt profile balances between.
pub(crate) const KUBEVIRT_NODE_SELECTOR: &str = "kubevirt.io/schedulable=true";
/// KubeVirt's defaults for parallel live migrations: per cluster and outbound per node.
const KUBEVIRT_MIGRATIONS_TOTAL: u32 = 5;
const KUBEVIRT_MIGRATIONS_PER_NODE: u32 = 2;
const DEFAULT_POD_LIFETIME_SECONDS: u64 = 86_400;
const POD_RESTART_THRESHOLD: u32 = 100;
/// The recording rule the KubeVirt profile balances on when no utilization profile is named.
pub(crate) const DEFAULT_KUBEVIRT_QUERY: &str =
    "descheduler:node:linear_amplified_ideal_point_positive_distance:k3:avg1m";
/// Prometheus-based utilization has one virtual resource.
const METRIC_RESOURCE: &str = "MetricResource";

/// What the cluster provides that the policy depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Environment {
    /// Namespaces never descheduled, [`ALWAYS_PROTECTED`] among them.
    pub protected_namespaces: Vec<String>,
    /// The Prometheus the utilization profiles query, when one is configured.
    pub prometheus: Option<PrometheusProvider>,
    /// Whether the descheduler has OpenShift's KubevirtMigrationAware plugin (the upstream one
    /// does not).
    pub kubevirt_migration_aware: bool,
    /// Nodes labelled `kubevirt.io/schedulable=true`, the only ones the KubeVirt profile balances.
    pub kubevirt_schedulable_nodes: usize,
}

/// The policy, and what a user should know about how it differs from what they asked.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub policy: DeschedulerPolicy,
    pub notes: Vec<String>,
}

/// A spec the descheduler cannot run: the field and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        field,
        message: message.into(),
    }
}

/// The Prometheus query an actual-utilization profile stands for.
pub(crate) fn utilization_query(profile: &str) -> Result<String, Invalid> {
    let query = match profile {
        "PrometheusCPUUsage" => "instance:node_cpu:rate:sum",
        "PrometheusCPUPSIPressure" => "rate(node_pressure_cpu_waiting_seconds_total[1m])",
        "PrometheusCPUPSIPressureByUtilization" => {
            "avg by (instance) (rate(node_pressure_cpu_waiting_seconds_total[1m])) and (1 - avg by (instance) (rate(node_cpu_seconds_total{mode=\"idle\"}[1m]))) > 0.7 or avg by (instance) (rate(node_pressure_cpu_waiting_seconds_total[1m])) * 0"
        }
        "PrometheusMemoryPSIPressure" => "rate(node_pressure_memory_waiting_seconds_total[1m])",
        "PrometheusIOPSIPressure" => "rate(node_pressure_io_waiting_seconds_total[1m])",
        "PrometheusCPUCombined" => "descheduler:combined_utilization_and_pressure:avg1m",
        "PrometheusCPUMemoryCombinedProfile" => DEFAULT_KUBEVIRT_QUERY,
        other => match other.strip_prefix("query:") {
            Some(query) if !query.trim().is_empty() => query,
            _ => {
                return Err(invalid(
                    "spec.profileCustomizations.devActualUtilizationProfile",
                    format!(
                        "{other:?} is not a utilization profile: name one of the documented profiles or write query:<PromQL>"
                    ),
                ));
            }
        },
    };
    Ok(query.to_owned())
}

fn low_thresholds(level: Option<LowThresholds>) -> (u32, u32) {
    match level {
        Some(LowThresholds::Low) => (10, 30),
        Some(LowThresholds::High) => (40, 70),
        Some(LowThresholds::Medium | LowThresholds::Unset) | None => (20, 50),
    }
}

fn high_threshold(level: Option<HighThresholds>) -> u32 {
    match level {
        Some(HighThresholds::Minimal) => 10,
        Some(HighThresholds::Moderate) => 30,
        Some(HighThresholds::Modest | HighThresholds::Unset) | None => 20,
    }
}

/// Percentage points below and above the average, for deviation thresholds.
pub(crate) fn deviation(level: DeviationThresholds) -> Option<(u32, u32)> {
    match level {
        DeviationThresholds::Low => Some((10, 10)),
        DeviationThresholds::Medium => Some((20, 20)),
        DeviationThresholds::High => Some((30, 30)),
        DeviationThresholds::AsymmetricLow => Some((0, 10)),
        DeviationThresholds::AsymmetricMedium => Some((0, 20)),
        DeviationThresholds::AsymmetricHigh => Some((0, 30)),
        DeviationThresholds::Unset => None,
    }
}

/// Which namespaces the plugins see.
struct Scope {
    included: Vec<String>,
    /// The protected namespaces and the user's exclusions.
    excluded: Vec<String>,
}

impl Scope {
    fn new(custom: &ProfileCustomizations, env: &Environment) -> Self {
        let mut excluded: Vec<String> = ALWAYS_PROTECTED.iter().map(|n| (*n).to_owned()).collect();
        for namespace in &env.protected_namespaces {
            if !excluded.contains(namespace) {
                excluded.push(namespace.clone());
            }
        }
        let (included, user_excluded) = custom
            .namespaces
            .as_ref()
            .map(|n| (n.included.clone(), n.excluded.clone()))
            .unwrap_or_default();
        for namespace in user_excluded {
            if !excluded.contains(&namespace) {
                excluded.push(namespace);
            }
        }
        Self { included, excluded }
    }

    /// The `namespaces` argument: only the included ones, or all but the excluded ones.
    fn namespaces(&self) -> Value {
        if self.included.is_empty() {
            json!({"exclude": self.excluded})
        } else {
            json!({"include": self.included})
        }
    }

    /// The utilization plugins can only exclude: with an include list, the protected
    /// namespaces (and the user's excluded ones, none then) still stay out.
    fn evictable_namespaces(&self) -> Value {
        json!({"exclude": self.excluded})
    }
}

fn args(pairs: Value, scope: Option<&Scope>) -> Value {
    let mut map = match pairs {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    if let Some(scope) = scope {
        map.insert("namespaces".into(), scope.namespaces());
    }
    Value::Object(map)
}

fn thresholds(resources: &[&'static str], value: u32) -> Thresholds {
    resources.iter().map(|r| (*r, value)).collect()
}

const NODE_RESOURCES: [&str; 3] = ["cpu", "memory", "pods"];

/// The DefaultEvictor's arguments: the protections v0.36 names (the deprecated booleans are
/// not mixed in).
fn default_evictor(spec: &KubeDeschedulerSpec, custom: &ProfileCustomizations, kubevirt: bool) -> Value {
    let mut protections = Map::new();
    let (evict_pvc, evict_local) = if kubevirt {
        // A VM's disks are PVCs and its launcher pod has local scratch space; both move with a
        // live migration.
        (true, true)
    } else {
        (
            spec.profiles.contains(&Profile::EvictPodsWithPVC),
            spec.profiles.contains(&Profile::EvictPodsWithLocalStorage),
        )
    };
    if !evict_pvc {
        protections.insert("extraEnabled".into(), json!(["PodsWithPVC"]));
    }
    if evict_local {
        protections.insert("defaultDisabled".into(), json!(["PodsWithLocalStorage"]));
    }
    let mut evictor = Map::new();
    if !protections.is_empty() {
        evictor.insert("podProtections".into(), Value::Object(protections));
    }
    if kubevirt {
        evictor.insert("noEvictionPolicy".into(), json!("Mandatory"));
    }
    match (&custom.threshold_priority, &custom.threshold_priority_class_name) {
        (Some(value), _) => {
            evictor.insert("priorityThreshold".into(), json!({"value": value}));
        }
        (None, Some(name)) if !name.is_empty() => {
            evictor.insert("priorityThreshold".into(), json!({"name": name}));
        }
        _ => {}
    }
    Value::Object(evictor)
}

fn profile(name: &str, plugin_config: Vec<PluginConfig>, plugins: Plugins) -> PolicyProfile {
    PolicyProfile {
        name: name.to_owned(),
        plugin_config,
        plugins,
    }
}

fn plugin(name: &'static str, args: Value) -> PluginConfig {
    PluginConfig { name, args }
}

/// Renders the policy, or says which field stops the descheduler from running.
pub fn render(spec: &KubeDeschedulerSpec, env: &Environment) -> Result<Rendered, Invalid> {
    validate(spec, env).map(|checked| build(&checked))
}

/// A spec checked against the environment, with what building every profile shares.
struct Checked<'a> {
    spec: &'a KubeDeschedulerSpec,
    env: &'a Environment,
    custom: ProfileCustomizations,
    scope: Scope,
    /// A KubeVirt profile is requested.
    kubevirt: bool,
    /// The actual-utilization query the utilization plugins use instead of requests.
    query: Option<String>,
    /// The per-node eviction limit the user set.
    node_limit: Option<u32>,
    /// The DefaultEvictor's arguments for the profiles other than KubeVirt's.
    evictor: Value,
}

/// Checks the spec against the environment: the first field the descheduler cannot run with.
fn validate<'a>(spec: &'a KubeDeschedulerSpec, env: &'a Environment) -> Result<Checked<'a>, Invalid> {
    if spec.profiles.is_empty() {
        return Err(invalid(
            "spec.profiles",
            "no profile is enabled: name at least one, e.g. AffinityAndTaints",
        ));
    }
    let custom = spec.profile_customizations.clone().unwrap_or_default();
    let scope = Scope::new(&custom, env);
    if let Some(protected) = scope.included.iter().find(|n| env.protected_namespaces.contains(n)) {
        return Err(invalid(
            "spec.profileCustomizations.namespaces.included",
            format!(
                "{protected} is never descheduled (nodemedic runs there, or it is a system namespace): take it out of the list"
            ),
        ));
    }
    let kubevirt = spec.profiles.iter().any(|p| p.is_kubevirt());
    let query = match custom.dev_actual_utilization_profile.as_deref() {
        Some(profile) if !profile.is_empty() => Some(utilization_query(profile)?),
        _ => None,
    };
    if kubevirt && env.prometheus.is_none() {
        return Err(invalid(
            "spec.profiles",
            "KubeVirtRelieveAndMigrate balances on actual utilization, which needs Prometheus: give the controller --descheduler-prometheus-url (chart value descheduler.prometheus.url)",
        ));
    }
    if query.is_some() && env.prometheus.is_none() {
        return Err(invalid(
            "spec.profileCustomizations.devActualUtilizationProfile",
            "devActualUtilizationProfile measures actual utilization, which needs Prometheus: give the controller --descheduler-prometheus-url (chart value descheduler.prometheus.url)",
        ));
    }
    if kubevirt && env.kubevirt_schedulable_nodes == 0 {
        return Err(invalid(
            "spec.profiles",
            format!(
                "KubeVirtRelieveAndMigrate balances only between nodes labelled {KUBEVIRT_NODE_SELECTOR} and there is none: label the nodes VMs run on (KubeVirt does it on its nodes)"
            ),
        ));
    }
    if spec.profiles.iter().all(only_adjusts) {
        return Err(invalid(
            "spec.profiles",
            "EvictPodsWithPVC and EvictPodsWithLocalStorage only adjust other profiles: add one that evicts, e.g. AffinityAndTaints",
        ));
    }
    let node_limit = spec
        .eviction_limits
        .as_ref()
        .and_then(|l| l.node)
        .map(|n| n.max(0) as u32);
    let evictor = default_evictor(spec, &custom, false);
    Ok(Checked {
        spec,
        env,
        custom,
        scope,
        kubevirt,
        query,
        node_limit,
        evictor,
    })
}

/// Profiles that only change what the others may evict.
fn only_adjusts(profile: &Profile) -> bool {
    matches!(profile, Profile::EvictPodsWithPVC | Profile::EvictPodsWithLocalStorage)
}

/// Builds the policy of a checked spec: its limits, then each requested profile once.
fn build(c: &Checked<'_>) -> Rendered {
    let mut notes = Vec::new();
    let mut policy = DeschedulerPolicy::new();
    if (c.kubevirt || c.query.is_some())
        && let Some(prometheus) = c.env.prometheus.clone()
    {
        policy.metrics_providers.push(MetricsProvider {
            source: "Prometheus",
            prometheus,
        });
    }
    if c.kubevirt {
        policy.node_selector = Some(KUBEVIRT_NODE_SELECTOR.to_owned());
        policy.max_no_of_pods_to_evict_total = Some(KUBEVIRT_MIGRATIONS_TOTAL);
        policy.max_no_of_pods_to_evict_per_node = Some(KUBEVIRT_MIGRATIONS_PER_NODE);
    }
    if let Some(total) = c.spec.eviction_limits.as_ref().and_then(|l| l.total) {
        policy.max_no_of_pods_to_evict_total = Some(total.max(0) as u32);
    }
    if let Some(node) = c.node_limit {
        policy.max_no_of_pods_to_evict_per_node = Some(node);
    }
    for requested in &c.spec.profiles {
        let rendered = match requested {
            Profile::AffinityAndTaints => affinity_and_taints(c),
            Profile::TopologyAndDuplicates | Profile::SoftTopologyAndDuplicates => {
                topology_and_duplicates(c, requested)
            }
            Profile::LifecycleAndUtilization | Profile::LongLifecycle | Profile::DevPreviewLongLifecycle => {
                lifecycle_and_utilization(c, requested)
            }
            Profile::CompactAndScale => compact_and_scale(c),
            Profile::KubeVirtRelieveAndMigrate | Profile::DevKubeVirtRelieveAndMigrate => {
                kubevirt_relieve_and_migrate(c, &mut notes)
            }
            Profile::EvictPodsWithPVC | Profile::EvictPodsWithLocalStorage => continue,
        };
        if policy.profiles.iter().any(|p| p.name == rendered.name) {
            notes.push(format!(
                "{} is the deprecated name of {}: it runs once",
                requested.name(),
                rendered.name
            ));
        } else {
            policy.profiles.push(rendered);
        }
    }
    if c.custom.dev_enable_soft_tainter && !c.kubevirt {
        notes.push(
            "devEnableSoftTainter is deprecated and ignored: the soft tainter runs with KubeVirtRelieveAndMigrate"
                .to_owned(),
        );
    }
    Rendered { policy, notes }
}

/// A profile's plugin configurations with the DefaultEvictor's, and its extension points with
/// the DefaultEvictor as the filter.
fn evicting_profile(c: &Checked<'_>, name: &str, mut configs: Vec<PluginConfig>, plugins: Plugins) -> PolicyProfile {
    configs.push(plugin("DefaultEvictor", c.evictor.clone()));
    profile(
        name,
        configs,
        Plugins {
            filter: ExtensionPoint::of(&["DefaultEvictor"]),
            ..plugins
        },
    )
}

fn affinity_and_taints(c: &Checked<'_>) -> PolicyProfile {
    let scope = Some(&c.scope);
    evicting_profile(
        c,
        "AffinityAndTaints",
        vec![
            plugin("RemovePodsViolatingInterPodAntiAffinity", args(json!({}), scope)),
            plugin("RemovePodsViolatingNodeTaints", args(json!({}), scope)),
            plugin(
                "RemovePodsViolatingNodeAffinity",
                args(
                    json!({"nodeAffinityType": ["requiredDuringSchedulingIgnoredDuringExecution"]}),
                    scope,
                ),
            ),
        ],
        Plugins {
            deschedule: ExtensionPoint::of(&[
                "RemovePodsViolatingInterPodAntiAffinity",
                "RemovePodsViolatingNodeTaints",
                "RemovePodsViolatingNodeAffinity",
            ]),
            ..Plugins::default()
        },
    )
}

fn topology_and_duplicates(c: &Checked<'_>, requested: &Profile) -> PolicyProfile {
    let constraints = if *requested == Profile::TopologyAndDuplicates {
        json!(["DoNotSchedule"])
    } else {
        json!(["DoNotSchedule", "ScheduleAnyway"])
    };
    let scope = Some(&c.scope);
    evicting_profile(
        c,
        requested.name(),
        vec![
            plugin(
                "RemovePodsViolatingTopologySpreadConstraint",
                args(json!({"constraints": constraints}), scope),
            ),
            plugin("RemoveDuplicates", args(json!({}), scope)),
        ],
        Plugins {
            balance: ExtensionPoint::of(&["RemovePodsViolatingTopologySpreadConstraint", "RemoveDuplicates"]),
            ..Plugins::default()
        },
    )
}

/// LifecycleAndUtilization, and LongLifecycle (its old names too), which leaves out PodLifeTime.
fn lifecycle_and_utilization(c: &Checked<'_>, requested: &Profile) -> PolicyProfile {
    let lifetime = *requested == Profile::LifecycleAndUtilization;
    let scope = Some(&c.scope);
    let mut configs = Vec::new();
    let mut deschedule = Vec::new();
    if lifetime {
        let seconds = c
            .custom
            .pod_lifetime
            .as_ref()
            .and_then(|d| d.duration().ok())
            .map_or(DEFAULT_POD_LIFETIME_SECONDS, |d| d.as_secs());
        configs.push(plugin(
            "PodLifeTime",
            args(json!({"maxPodLifeTimeSeconds": seconds}), scope),
        ));
        deschedule.push("PodLifeTime");
    }
    configs.push(plugin(
        "RemovePodsHavingTooManyRestarts",
        args(
            json!({"podRestartThreshold": POD_RESTART_THRESHOLD, "includingInitContainers": true}),
            scope,
        ),
    ));
    deschedule.push("RemovePodsHavingTooManyRestarts");
    let (low, high) = low_thresholds(c.custom.dev_low_node_utilization_thresholds);
    configs.push(plugin(
        "LowNodeUtilization",
        low_node_utilization(LowNodeUtilization {
            deviation: false,
            low,
            high,
            query: c.query.clone(),
            node_limit: c.node_limit,
            scope: &c.scope,
        }),
    ));
    evicting_profile(
        c,
        if lifetime {
            "LifecycleAndUtilization"
        } else {
            "LongLifecycle"
        },
        configs,
        Plugins {
            deschedule: ExtensionPoint { enabled: deschedule },
            balance: ExtensionPoint::of(&["LowNodeUtilization"]),
            ..Plugins::default()
        },
    )
}

fn compact_and_scale(c: &Checked<'_>) -> PolicyProfile {
    let level = high_threshold(c.custom.dev_high_node_utilization_thresholds);
    let hnu = json!({
        "thresholds": thresholds(&NODE_RESOURCES, level),
        "evictableNamespaces": c.scope.evictable_namespaces(),
    });
    evicting_profile(
        c,
        "CompactAndScale",
        vec![plugin("HighNodeUtilization", hnu)],
        Plugins {
            balance: ExtensionPoint::of(&["HighNodeUtilization"]),
            ..Plugins::default()
        },
    )
}

/// KubeVirtRelieveAndMigrate: balances VMs by actual utilization, by live migration.
fn kubevirt_relieve_and_migrate(c: &Checked<'_>, notes: &mut Vec<String>) -> PolicyProfile {
    let custom = &c.custom;
    let (deviation, low, high) = match (
        custom.dev_low_node_utilization_thresholds,
        custom.dev_deviation_thresholds.and_then(deviation),
    ) {
        (Some(level), None) if level != LowThresholds::Unset => {
            let (low, high) = low_thresholds(Some(level));
            (false, low, high)
        }
        (_, Some((low, high))) => (true, low, high),
        _ => (true, 0, 10),
    };
    let lnu = low_node_utilization(LowNodeUtilization {
        deviation,
        low,
        high,
        query: Some(c.query.clone().unwrap_or_else(|| DEFAULT_KUBEVIRT_QUERY.to_owned())),
        node_limit: Some(c.node_limit.unwrap_or(KUBEVIRT_MIGRATIONS_PER_NODE)),
        scope: &c.scope,
    });
    let mut configs = vec![
        plugin("LowNodeUtilization", lnu),
        plugin("DefaultEvictor", default_evictor(c.spec, custom, true)),
    ];
    let mut filters = vec!["DefaultEvictor"];
    let mut preeviction = Vec::new();
    if c.env.kubevirt_migration_aware {
        configs.push(plugin("KubevirtMigrationAware", migration_aware_args(custom)));
        filters.push("KubevirtMigrationAware");
        preeviction.push("KubevirtMigrationAware");
    } else {
        notes.push(
            "KubeVirtRelieveAndMigrate runs without the KubevirtMigrationAware plugin (OpenShift's descheduler only): a VM is not held back while its last live migration cools down; the per-node and total eviction limits still bound parallel migrations".to_owned(),
        );
    }
    profile(
        "KubeVirtRelieveAndMigrate",
        configs,
        Plugins {
            balance: ExtensionPoint::of(&["LowNodeUtilization"]),
            filter: ExtensionPoint { enabled: filters },
            preevictionfilter: ExtensionPoint { enabled: preeviction },
            ..Plugins::default()
        },
    )
}

struct LowNodeUtilization<'a> {
    deviation: bool,
    low: u32,
    high: u32,
    query: Option<String>,
    node_limit: Option<u32>,
    scope: &'a Scope,
}

fn low_node_utilization(lnu: LowNodeUtilization<'_>) -> Value {
    let resources: &[&'static str] = if lnu.query.is_some() {
        &[METRIC_RESOURCE]
    } else {
        &NODE_RESOURCES
    };
    let mut args = json!({
        "thresholds": thresholds(resources, lnu.low),
        "targetThresholds": thresholds(resources, lnu.high),
        "evictableNamespaces": lnu.scope.evictable_namespaces(),
    });
    if lnu.deviation {
        args["useDeviationThresholds"] = json!(true);
    }
    if let Some(query) = lnu.query {
        args["metricsUtilization"] = json!({"source": "Prometheus", "prometheus": {"query": query}});
    }
    if let Some(node) = lnu.node_limit {
        args["evictionLimits"] = json!({"node": node});
    }
    args
}

fn migration_aware_args(custom: &ProfileCustomizations) -> Value {
    let mut args = Map::new();
    for (key, value) in [
        ("migrationCooldown", &custom.dev_migration_cooldown),
        ("maxMigrationCooldown", &custom.dev_max_migration_cooldown),
        ("migrationHistoryWindow", &custom.dev_migration_history_window),
    ] {
        if let Some(duration) = value {
            args.insert(key.into(), json!(duration.as_str()));
        }
    }
    Value::Object(args)
}
