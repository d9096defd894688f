//! The descheduler operator's Prometheus metrics (the descheduler's own evictions are in its
//! `descheduler_pods_evicted_total`).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TaintLabels {
    pub taint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeLabels {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub kind: String,
}

#[derive(Clone)]
pub struct Metrics {
    taints_applied: Family<TaintLabels, Counter>,
    taints_removed: Family<TaintLabels, Counter>,
    utilization: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    tainter_rounds: Family<KindLabels, Counter>,
    errors: Family<KindLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            taints_applied: Family::default(),
            taints_removed: Family::default(),
            utilization: Family::default(),
            tainter_rounds: Family::default(),
            errors: Family::default(),
        };
        registry.register(
            "nodemedic_descheduler_soft_taints_applied",
            "PreferNoSchedule soft taints the soft tainter put on nodes, by taint key",
            m.taints_applied.clone(),
        );
        registry.register(
            "nodemedic_descheduler_soft_taints_removed",
            "Soft taints the soft tainter took off nodes, by taint key",
            m.taints_removed.clone(),
        );
        registry.register(
            "nodemedic_descheduler_node_utilization_ratio",
            "The utilization the soft tainter last read from Prometheus for each node (0 to 1)",
            m.utilization.clone(),
        );
        registry.register(
            "nodemedic_descheduler_tainter_rounds",
            "Soft tainter rounds, by outcome (applied, held, inactive, failed)",
            m.tainter_rounds.clone(),
        );
        registry.register(
            "nodemedic_descheduler_reconcile_errors",
            "Descheduler operator reconciles that failed and were retried, by kind of error",
            m.errors.clone(),
        );
        m
    }

    pub(crate) fn taint_applied(&self, key: &str) {
        self.taints_applied
            .get_or_create(&TaintLabels { taint: key.into() })
            .inc();
    }

    pub(crate) fn taint_removed(&self, key: &str) {
        self.taints_removed
            .get_or_create(&TaintLabels { taint: key.into() })
            .inc();
    }

    pub fn utilization(&self, node: &str, value: f64) {
        self.utilization
            .get_or_create(&NodeLabels { node: node.into() })
            .set(value);
    }

    pub(crate) fn forget_node(&self, node: &str) {
        self.utilization.remove(&NodeLabels { node: node.into() });
    }

    pub fn round(&self, outcome: &str) {
        self.tainter_rounds
            .get_or_create(&KindLabels { kind: outcome.into() })
            .inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&KindLabels { kind: kind.into() }).inc();
    }
}
