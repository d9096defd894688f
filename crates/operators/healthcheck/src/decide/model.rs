//! Plain data the decision reads and writes. Nothing here knows the API server.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use kube::core::Selector;

/// A NodeHealthCheck's spec, validated and parsed.
#[derive(Clone, Debug)]
pub struct CheckSpec {
    pub name: String,
    pub selector: Selector,
    pub rules: Vec<UnhealthyRule>,
    pub budget: Budget,
    pub storm_cooldown: Option<Duration>,
    /// A classic template is one step without a timeout.
    pub steps: Vec<Step>,
    pub pause_requests: Vec<String>,
    pub healthy_delay: HealthyDelay,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnhealthyRule {
    pub type_: String,
    pub status: String,
    pub duration: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(u32),
    Percent(u32),
}

impl IntOrPercent {
    /// Scaled against `total`, percentages rounded up (medik8s / Kubernetes intstr).
    pub fn scaled(self, total: usize) -> usize {
        match self {
            Self::Int(n) => n as usize,
            Self::Percent(p) => (total * p as usize).div_ceil(100),
        }
    }
}

impl std::fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    MinHealthy(IntOrPercent),
    MaxUnhealthy(IntOrPercent),
    /// Neither set: minHealthy 51%, the seeds' documented default.
    DefaultMinHealthy,
}

impl Budget {
    pub(crate) const DEFAULT: IntOrPercent = IntOrPercent::Percent(51);

    /// The fewest healthy nodes that still allow remediation.
    pub fn min_healthy(self, observed: usize) -> usize {
        match self {
            Self::MinHealthy(v) => v.scaled(observed),
            Self::MaxUnhealthy(v) => observed.saturating_sub(v.scaled(observed)),
            Self::DefaultMinHealthy => Self::DEFAULT.scaled(observed),
        }
    }

    pub fn describe(self) -> String {
        match self {
            Self::MinHealthy(v) => format!("minHealthy {v}"),
            Self::MaxUnhealthy(v) => format!("maxUnhealthy {v}"),
            Self::DefaultMinHealthy => format!(
                "minHealthy {} (the default: neither minHealthy nor maxUnhealthy is set)",
                Self::DEFAULT
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TemplateRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl TemplateRef {
    /// The remediation object's kind: the template kind without `Template`.
    pub(crate) fn remediation_kind(&self) -> &str {
        self.kind.strip_suffix("Template").unwrap_or(&self.kind)
    }
}

impl std::fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{} ({})", self.kind, ns, self.name, self.api_version),
            None => write!(f, "{} {} ({})", self.kind, self.name, self.api_version),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub order: i32,
    pub template: TemplateRef,
    /// None for a classic (non-escalating) template.
    pub timeout: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthyDelay {
    None,
    After(Duration),
    /// Negative: never remove remediations automatically.
    Never,
}

/// What the decision needs to know about a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub conditions: Vec<ConditionFacts>,
    /// Annotated `remediation.medik8s.io/manually-confirmed-healthy`.
    pub confirmed_healthy: bool,
    /// What its annotations say of an upgrade under way on it ([`super::upgrade::node_upgrading`]).
    pub upgrading: Option<String>,
    /// Its Machine, from the annotations its machine controller sets.
    pub machine: Option<super::conflict::MachineKey>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionFacts {
    pub type_: String,
    pub status: String,
    pub since: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RemediationId {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for RemediationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// An existing remediation object of one of the kinds a check uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemediationFacts {
    pub id: RemediationId,
    pub uid: String,
    pub node: String,
    pub template_name: Option<String>,
    /// Owned by the check being decided.
    pub owned: bool,
    pub created: Timestamp,
    /// From the `nhc-timed-out` annotation.
    pub timed_out: Option<Timestamp>,
    /// From the `healthy-delay` annotation.
    pub healthy_since: Option<Timestamp>,
    /// The remediator's `Succeeded` condition: Some(true/false), None when unknown.
    pub succeeded: Option<bool>,
    pub permanent_node_deletion_expected: bool,
    pub control_plane: bool,
    pub deleting: bool,
    /// Annotated `nodehealthcheck.medik8s.io/old-remediation-cr-flag` ([`super::old`]).
    pub flagged_old: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TemplateState {
    Ready {
        spec: serde_json::Value,
        multiple_templates: bool,
    },
    /// No such kind is served (its CRD is not installed).
    KindMissing,
    /// Whether the kind is served is not known: discovery failed (the API server down or
    /// starting, a 403 while its RBAC catches up). Not a reason to disable the check.
    KindUnknown(String),
    NotFound,
    Invalid(String),
}

/// The node lease (`medik8s-leases/node-<name>`), when valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseFacts {
    pub holder: String,
    pub acquired: Option<Timestamp>,
    pub renewed: Timestamp,
    pub duration: Duration,
}

impl LeaseFacts {
    pub fn valid_at(&self, now: Timestamp) -> bool {
        self.renewed <= now && self.renewed + self.duration >= now
    }
}

/// What the previous status remembers that the objects themselves do not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    /// Nodes listed unhealthy last time, with when their conditions turned healthy (if they did).
    pub unhealthy: BTreeMap<String, Option<Timestamp>>,
    pub storm_since: Option<Timestamp>,
    pub cooldown_since: Option<Timestamp>,
    pub remediation_allowed: Option<bool>,
    /// The reason the `RemediationAllowed` condition gave.
    pub remediation_allowed_reason: Option<String>,
    pub disabled: Option<bool>,
    pub nodes_selected: Option<bool>,
}

pub struct Input<'a> {
    pub now: Timestamp,
    pub check: &'a CheckSpec,
    /// Every node that exists (the decision applies the selector).
    pub nodes: &'a [&'a NodeFacts],
    /// Remediation objects of the check's kinds, whoever owns them.
    pub remediations: &'a [RemediationFacts],
    pub templates: &'a BTreeMap<TemplateRef, TemplateState>,
    pub leases: &'a BTreeMap<String, LeaseFacts>,
    pub memory: &'a Memory,
    /// The identity the check uses on node leases.
    pub lease_holder: &'a str,
    /// Ready=Unknown nodes whose kubelet leases show them alive: their remediation is held back.
    pub alive: &'a BTreeMap<String, super::liveness::Alive>,
    /// The health check's last loss of the API server: the Unknown conditions it may explain
    /// wait before a new remediation (see [`super::outage`]).
    pub outage: Option<super::outage::Window>,
    /// Each node's last kubelet lease renewal (the API server's clock): a node that renewed
    /// after an outage is not excused by it (see [`super::outage::Window::for_node`]).
    pub kubelet_renewals: &'a BTreeMap<String, Timestamp>,
    /// Upgrades under way, as [`super::upgrade::upgrading`] reads them.
    pub upgrades: &'a [super::upgrade::Upgrade],
    pub machine_health_checks: &'a [super::conflict::MachineHealthCheckFacts],
    /// Every Machine's labels.
    pub machines: &'a BTreeMap<super::conflict::MachineKey, BTreeMap<String, String>>,
    /// The etcd members the cluster shows, when they were read (only for a decision that would
    /// remediate a control-plane node).
    pub etcd: EtcdView<'a>,
}

/// What the decision knows of etcd's members.
#[derive(Clone, Copy, Debug)]
pub enum EtcdView<'a> {
    /// Not read: no control-plane node would be remediated.
    NotRead,
    Members(&'a [nodemedic_kube::etcd::Member]),
    /// The read failed (why): a control-plane node waits, the rest of the decision goes on.
    Unreadable(&'a str),
}

/// A remediation object to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRemediation {
    pub node: String,
    pub template: TemplateRef,
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    /// Exact name, or `None` for `generateName: <node>-`.
    pub name: Option<String>,
    pub spec: serde_json::Value,
    pub control_plane: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// Take or extend the node's lease for this long.
    Request {
        node: String,
        duration: Duration,
    },
    Release {
        node: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The node the event is also recorded on, if any.
    pub node: Option<String>,
    pub severity: Severity,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusPlan {
    pub observed: usize,
    pub healthy: usize,
    pub min_healthy: usize,
    /// Unhealthy (or still-remediated) nodes with when their conditions turned healthy.
    pub unhealthy: BTreeMap<String, UnhealthyEntry>,
    pub phase: Phase,
    pub reason: String,
    pub disabled: Option<(bool, &'static str, String)>,
    pub remediation_allowed: (bool, &'static str, String),
    /// Whether the selector matches any node, and why not.
    pub nodes_selected: Option<(bool, &'static str, String)>,
    pub storm_since: Option<Timestamp>,
    pub cooldown_since: Option<Timestamp>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnhealthyEntry {
    pub conditions_healthy_since: Option<Timestamp>,
    pub healthy_delayed: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    Disabled,
    Paused,
    Remediating,
    #[default]
    Enabled,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub create: Vec<NewRemediation>,
    pub delete: Vec<RemediationId>,
    pub mark_timed_out: Vec<RemediationId>,
    pub mark_healthy_since: Vec<RemediationId>,
    /// Remediations to flag as old ([`super::old`]).
    pub flag_old: Vec<RemediationId>,
    /// Nodes whose manually-confirmed-healthy annotation has done its job.
    pub clear_confirmation: Vec<String>,
    pub leases: Vec<LeaseAction>,
    pub notices: Vec<Notice>,
    pub status: StatusPlan,
    pub requeue_after: Option<Duration>,
    /// Nodes a new remediation was held back from by the budget or a storm (for metrics).
    pub blocked_by_budget: BTreeSet<String>,
    /// Nodes a new remediation was held back from because their kubelet leases show them alive.
    pub held_back_alive: BTreeSet<String>,
    /// Nodes a new remediation waits for because an outage of the API may explain their Unknown.
    pub deferred: BTreeSet<String>,
    /// Nothing was decided, and nothing is to be written: the view is incomplete (why). The
    /// check is decided again after `requeue_after`.
    pub undecided: Option<String>,
}

impl Decision {
    pub(crate) fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |r| r.min(after)));
    }

    pub(crate) fn notice(&mut self, node: Option<&str>, severity: Severity, reason: &'static str, message: String) {
        self.notices.push(Notice {
            node: node.map(str::to_owned),
            severity,
            reason,
            message,
        });
    }
}
