//! Machine Deletion Remediation's Prometheus metrics (medik8s MDR had none).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub result: String,
}

#[derive(Clone)]
pub struct Metrics {
    remediations: Family<ResultLabels, Counter>,
    machines_deleted: Counter,
    workloads_released: Counter,
    errors: Family<ResultLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            remediations: Family::default(),
            machines_deleted: Counter::default(),
            workloads_released: Counter::default(),
            errors: Family::default(),
        };
        registry.register(
            "nodemedic_machine_deletion_remediations",
            "Machine deletion remediations finished, by result (the Succeeded condition's reason)",
            m.remediations.clone(),
        );
        registry.register(
            "nodemedic_machine_deletion_machines_deleted",
            "Machines deleted to replace an unhealthy node",
            m.machines_deleted.clone(),
        );
        registry.register(
            "nodemedic_machine_deletion_workloads_released",
            "Pods and VolumeAttachments of a deleted Machine's node released once the Machine was gone",
            m.workloads_released.clone(),
        );
        registry.register(
            "nodemedic_machine_deletion_reconcile_errors",
            "Machine deletion reconciles that failed and were retried, by kind of error",
            m.errors.clone(),
        );
        m
    }

    pub fn finished(&self, reason: &str) {
        self.remediations
            .get_or_create(&ResultLabels { result: reason.into() })
            .inc();
    }

    pub(crate) fn machine_deleted(&self) {
        self.machines_deleted.inc();
    }

    pub fn released(&self, count: usize) {
        self.workloads_released.inc_by(count as u64);
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&ResultLabels { result: kind.into() }).inc();
    }
}
