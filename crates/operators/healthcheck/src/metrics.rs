//! The health check's Prometheus metrics. The `nodehealthcheck_*` names are medik8s's, so
//! existing dashboards keep working; `nodemedic_healthcheck_*` add what they lacked.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    pub nhc: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateLabels {
    pub nhc: String,
    pub template: String,
}

/// medik8s's per-node labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NodeLabels {
    pub name: String,
    pub namespace: String,
    pub remediation: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub ongoing_per_node: Family<NodeLabels, Gauge>,
    pub unhealthy_duration_per_node: Family<NodeLabels, Histogram>,
    pub ongoing: Family<CheckLabels, Gauge>,
    pub observed: Family<CheckLabels, Gauge>,
    pub healthy: Family<CheckLabels, Gauge>,
    pub unhealthy: Family<CheckLabels, Gauge>,
    pub started: Family<TemplateLabels, Counter>,
    pub finished: Family<TemplateLabels, Counter>,
    pub timed_out: Family<TemplateLabels, Counter>,
    pub budget_blocks: Family<CheckLabels, Counter>,
    pub held_back_alive: Family<CheckLabels, Counter>,
    pub deferred_after_outage: Family<CheckLabels, Counter>,
    pub unhealthy_duration: Family<CheckLabels, Histogram>,
    pub decision_seconds: Histogram,
    pub errors: Family<ErrorLabels, Counter>,
    pub old_remediations: Family<OldLabels, Counter>,
}

/// medik8s's labels for `nodehealthcheck_old_remediation_cr`: the node, the remediation's
/// namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OldLabels {
    pub name: String,
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
}

fn duration_buckets() -> Histogram {
    Histogram::new([30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 600.0, 1200.0, 2400.0, 3600.0])
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            ongoing_per_node: Family::default(),
            unhealthy_duration_per_node: Family::new_with_constructor(duration_buckets),
            ongoing: Family::default(),
            observed: Family::default(),
            healthy: Family::default(),
            unhealthy: Family::default(),
            started: Family::default(),
            finished: Family::default(),
            timed_out: Family::default(),
            budget_blocks: Family::default(),
            held_back_alive: Family::default(),
            deferred_after_outage: Family::default(),
            unhealthy_duration: Family::new_with_constructor(duration_buckets),
            decision_seconds: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            errors: Family::default(),
            old_remediations: Family::default(),
        };
        registry.register(
            "nodehealthcheck_ongoing_remediation",
            "1 while the node (name) has a remediation of this kind",
            m.ongoing_per_node.clone(),
        );
        registry.register(
            "nodehealthcheck_old_remediation_cr",
            "Remediations flagged for still existing 48 h after their creation (name: the node)",
            m.old_remediations.clone(),
        );
        registry.register(
            "nodehealthcheck_unhealthy_node_duration_seconds",
            "How long the node was unhealthy, observed when it recovers",
            m.unhealthy_duration_per_node.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_ongoing_remediations",
            "Nodes with a remediation in flight",
            m.ongoing.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_observed_nodes",
            "Nodes the check selects",
            m.observed.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_healthy_nodes",
            "Selected nodes that are healthy",
            m.healthy.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_unhealthy_nodes",
            "Selected nodes matching an unhealthy condition",
            m.unhealthy.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_remediations_started",
            "Remediation objects created",
            m.started.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_remediations_finished",
            "Remediation objects removed because the node is healthy again",
            m.finished.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_remediations_timed_out",
            "Remediation objects marked timed out (escalation or overdue)",
            m.timed_out.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_budget_blocks",
            "Times a node's remediation was held back by the budget or a storm",
            m.budget_blocks.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_held_back_alive",
            "Times a Ready=Unknown node's remediation was held back because its kubelet still renews its lease",
            m.held_back_alive.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_deferred_after_outage",
            "Times a node's new remediation waited because the health check's loss of the API server may explain its Unknown condition",
            m.deferred_after_outage.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_unhealthy_node_duration_seconds",
            "How long nodes were unhealthy, observed when they recover",
            m.unhealthy_duration.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_decision_duration_seconds",
            "Time to gather, decide and apply one reconcile",
            m.decision_seconds.clone(),
        );
        registry.register(
            "nodemedic_healthcheck_reconcile_errors",
            "Reconciles that failed, by cause",
            m.errors.clone(),
        );
        m
    }
}
