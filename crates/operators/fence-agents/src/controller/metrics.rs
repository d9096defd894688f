//! Fence Agents Remediation's Prometheus metrics (medik8s FAR had none).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub agent: String,
    pub action: String,
    /// success, failure or timeout.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub agent: String,
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub attempts: Family<AttemptLabels, Counter>,
    pub attempt_seconds: Family<ActionLabels, Histogram>,
    pub remediations: Family<ResultLabels, Counter>,
    pub recovery_seconds: Histogram,
    pub errors: Family<ResultLabels, Counter>,
}

fn attempt_histogram() -> Histogram {
    Histogram::new([0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0])
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            attempts: Family::default(),
            attempt_seconds: Family::new_with_constructor(attempt_histogram as fn() -> Histogram),
            remediations: Family::default(),
            recovery_seconds: Histogram::new([5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
            errors: Family::default(),
        };
        registry.register(
            "nodemedic_fence_agent_attempts",
            "Fence agent runs, by agent, action and result",
            m.attempts.clone(),
        );
        registry.register(
            "nodemedic_fence_agent_attempt_seconds",
            "How long each fence agent run took",
            m.attempt_seconds.clone(),
        );
        registry.register(
            "nodemedic_fence_remediations",
            "FenceAgentsRemediations finished, by result (succeeded or the failure reason)",
            m.remediations.clone(),
        );
        registry.register(
            "nodemedic_fence_recovery_seconds",
            "From a FenceAgentsRemediation's creation to its node's workloads being released",
            m.recovery_seconds.clone(),
        );
        registry.register(
            "nodemedic_fence_reconcile_errors",
            "Failed reconciles, by error kind",
            m.errors.clone(),
        );
        m
    }

    pub fn finished(&self, result: &str) {
        self.remediations
            .get_or_create(&ResultLabels { result: result.into() })
            .inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&ResultLabels { result: kind.into() }).inc();
    }
}
