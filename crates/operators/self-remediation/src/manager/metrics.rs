//! The manager's Prometheus metrics (medik8s SNR had none).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub steps: Family<StepLabels, Counter>,
    pub fenced_seconds: Histogram,
    pub registered_agents: Gauge,
    pub minimum_safe_seconds: Gauge,
    pub certificates: Family<ResultLabels, Counter>,
    pub errors: Family<ResultLabels, Counter>,
    pub membership_epoch: Gauge,
    pub members: Gauge,
    pub proposal_pending: Gauge,
    pub membership_changes: Family<ChangeLabels, Counter>,
    /// Registered agents by fencing means.
    pub means: Family<MeansLabels, Gauge>,
    /// Peer-detection reports received, by kind (unreachable, withdrawn).
    pub peer_reports: Family<ResultLabels, Counter>,
    /// Nodes whose PeersReachable condition is False.
    pub unreachable_by_peers: Gauge,
    /// The controller's probes of suspected hosts, by result (answered, silent).
    pub host_probes: Family<ResultLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    pub change: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MeansLabels {
    pub means: &'static str,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            steps: Family::default(),
            fenced_seconds: Histogram::new([5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0]),
            registered_agents: Gauge::default(),
            minimum_safe_seconds: Gauge::default(),
            certificates: Family::default(),
            errors: Family::default(),
            membership_epoch: Gauge::default(),
            members: Gauge::default(),
            proposal_pending: Gauge::default(),
            membership_changes: Family::default(),
            means: Family::default(),
            peer_reports: Family::default(),
            unreachable_by_peers: Gauge::default(),
            host_probes: Family::default(),
        };
        registry.register(
            "nodemedic_self_remediation_steps",
            "Steps the self-remediation manager took, by step",
            m.steps.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_recovery_seconds",
            "From a SelfNodeRemediation's creation to its workloads being released to other nodes",
            m.fenced_seconds.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_registered_agents",
            "Agents registered (the membership the licence protocol counts)",
            m.registered_agents.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_minimum_safe_seconds",
            "The provable minimum wait before workloads are recovered, for the slowest registered agent",
            m.minimum_safe_seconds.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_certificates",
            "Peer certificate requests settled, by result",
            m.certificates.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_reconcile_errors",
            "Failed reconciles, by error kind",
            m.errors.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_membership_epoch",
            "The committed membership epoch of the licence protocol",
            m.membership_epoch.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_members",
            "Members of the committed membership (the agents whose votes count)",
            m.members.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_membership_proposal_pending",
            "1 while a membership change waits for acknowledgements from a majority of the members",
            m.proposal_pending.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_membership_changes",
            "Membership changes, by kind (bootstrapped, proposed, committed)",
            m.membership_changes.clone(),
        );
        registry.register(
            "nodemedic_self_remediation_agents_by_means",
            "Registered agents by fencing means (hardware-watchdog, softdog, software-reboot, none)",
            m.means.clone(),
        );
        registry.register(
            "nodemedic_peer_detection_reports",
            "Reports from the agents' peer failure detectors, by kind (unreachable, withdrawn)",
            m.peer_reports.clone(),
        );
        registry.register(
            "nodemedic_peer_detection_unreachable_nodes",
            "Nodes whose PeersReachable condition is False",
            m.unreachable_by_peers.clone(),
        );
        registry.register(
            "nodemedic_peer_detection_host_probes",
            "The controller's probes of hosts its peers lost, by result (answered, silent)",
            m.host_probes.clone(),
        );
        m
    }

    pub fn count(family: &Family<ResultLabels, Counter>, result: &str) {
        family
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    pub(crate) fn membership_change(&self, change: &'static str) {
        self.membership_changes.get_or_create(&ChangeLabels { change }).inc();
    }

    pub fn step(&self, step: &str) {
        self.steps.get_or_create(&StepLabels { step: step.to_owned() }).inc();
    }

    pub fn csr(&self, signed: bool) {
        let result = if signed { "signed" } else { "denied" };
        self.certificates
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }
}
