//! Node Maintenance's Prometheus metrics (medik8s NMO had none).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub started: Counter,
    pub finished: Family<ResultLabels, Counter>,
    pub evictions: Family<ResultLabels, Counter>,
    pub drain_seconds: Histogram,
    pub blocked_pods: Family<NodeLabels, Gauge>,
    pub errors: Family<ResultLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            started: Counter::default(),
            finished: Family::default(),
            evictions: Family::default(),
            drain_seconds: Histogram::new([5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]),
            blocked_pods: Family::default(),
            errors: Family::default(),
        };
        registry.register(
            "nodemedic_maintenance_started",
            "NodeMaintenances that started draining their node",
            m.started.clone(),
        );
        registry.register(
            "nodemedic_maintenance_finished",
            "NodeMaintenances that reached a final phase, by result (succeeded or failed)",
            m.finished.clone(),
        );
        registry.register(
            "nodemedic_maintenance_evictions",
            "Drain requests per pod, by result (evicted, deleted, blocked, gone)",
            m.evictions.clone(),
        );
        registry.register(
            "nodemedic_maintenance_drain_seconds",
            "From a NodeMaintenance's start to its node being drained",
            m.drain_seconds.clone(),
        );
        registry.register(
            "nodemedic_maintenance_blocked_pods",
            "Pods a drain cannot evict right now (a PodDisruptionBudget allows no disruption), by node",
            m.blocked_pods.clone(),
        );
        registry.register(
            "nodemedic_maintenance_reconcile_errors",
            "Failed reconciles, by error kind",
            m.errors.clone(),
        );
        m
    }

    pub fn count(family: &Family<ResultLabels, Counter>, result: &str) {
        family.get_or_create(&ResultLabels { result: result.into() }).inc();
    }
}
