//! What the doctor knows about a cluster: plain data, built from API objects without I/O, so the
//! checks can be tested on facts written by hand.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{ResourceExt, core::SelectorExt};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediationTemplate, healthcheck::NodeHealthCheck, names::conditions as types,
    self_remediation::SelfNodeRemediationConfigSpec,
};
use nodemedic_healthcheck::decide::{CheckSpec, TemplateRef};
use nodemedic_self_remediation::protocol::manager::Registration;

use super::rbac::Permission;

pub(super) const SELF_REMEDIATION_TEMPLATE: &str = "SelfNodeRemediationTemplate";
/// Self remediation under its former name: the same agents carry it out.
pub(super) const POISON_PILL_TEMPLATE: &str = "PoisonPillRemediationTemplate";
pub(super) const FENCE_AGENTS_TEMPLATE: &str = "FenceAgentsRemediationTemplate";

#[derive(Clone, Debug, Default)]
pub(super) struct Facts {
    /// Where nodemedic runs: its controller's lease, its agents' registrations, its templates.
    pub namespace: String,
    pub version: Option<Version>,
    pub nodes: Vec<NodeFacts>,
    pub namespaces: BTreeSet<String>,
    /// The agents' registrations in [`Facts::namespace`].
    pub registrations: Vec<Registration>,
    /// Node -> why its agent passed better means of fencing over (its registration's note).
    pub fencing_notes: BTreeMap<String, String>,
    /// Other namespaces holding agents' registrations or a controller lease: where nodemedic
    /// may really run.
    pub elsewhere: BTreeSet<String>,
    pub self_remediation: SelfRemediationSettings,
    pub controller: Option<ControllerLease>,
    pub checks: Vec<HealthCheck>,
    /// Every template a health check references, looked up.
    pub templates: BTreeMap<TemplateRef, TemplateLookup>,
    /// Templates (`Kind namespace/name`) whose strategy is OutOfServiceTaint.
    pub out_of_service_templates: Vec<String>,
    pub fence_templates: Vec<FenceTemplate>,
    pub access: Vec<AccountAccess>,
    /// Whether the namespace admits an agent's pod, by a server-side dry run of one.
    pub agent_admission: AgentAdmission,
}

/// What the API server answered a dry run of an agent's pod in nodemedic's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) enum AgentAdmission {
    /// Not tried (facts written by hand).
    #[default]
    NotTried,
    Admitted,
    /// Pod Security admission (or an OpenShift SecurityContextConstraint) refuses it: its words.
    Refused(String),
    /// The dry run failed for another reason (e.g. the caller may not create pods there).
    Unknown(String),
}

impl AgentAdmission {
    /// The dry run's outcome: `Err` holds the API server's status code and message.
    pub(super) fn from_dry_run(outcome: Result<(), (u16, String)>) -> Self {
        match outcome {
            Ok(()) => Self::Admitted,
            Err((403, message))
                if message.contains("violates PodSecurity") || message.contains("security context constraint") =>
            {
                Self::Refused(message)
            }
            Err((_, message)) => Self::Unknown(message),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Version {
    pub major: u32,
    pub minor: u32,
    /// As the API server says it, e.g. `v1.36.3`.
    pub text: String,
}

impl Version {
    /// Managed clusters report minors such as `28+`.
    pub(super) fn parse(major: &str, minor: &str, text: &str) -> Option<Self> {
        let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
        Some(Self {
            major: number(major)?,
            minor: number(minor)?,
            text: text.to_owned(),
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl NodeFacts {
    pub(super) fn from_node(node: &Node) -> Self {
        Self {
            name: node.name_any(),
            labels: node.labels().clone(),
        }
    }
}

/// What the self-remediation manager reads from the SelfNodeRemediationConfig when it decides
/// whether a node can be fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SelfRemediationSettings {
    pub software_reboot_enabled: bool,
    pub min_peers: usize,
}

impl SelfRemediationSettings {
    pub(super) fn from_spec(spec: &SelfNodeRemediationConfigSpec) -> Self {
        Self {
            software_reboot_enabled: spec.is_software_reboot_enabled,
            min_peers: spec.min_peers_for_remediation.max(0) as usize,
        }
    }
}

impl Default for SelfRemediationSettings {
    /// Without a config the manager creates one with the seed's defaults.
    fn default() -> Self {
        Self::from_spec(&SelfNodeRemediationConfigSpec::default())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ControllerLease {
    pub holder: String,
    /// Seconds since the last renewal, past the lease's duration: no controller renews it.
    pub stale_for: Option<i64>,
}

impl ControllerLease {
    pub(super) fn from_lease(lease: &Lease, now: Timestamp) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
        let age = spec
            .renew_time
            .or(spec.acquire_time)
            .map(|t| now.duration_since(t.0).as_secs());
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            stale_for: age.filter(|age| *age > 2 * duration),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct HealthCheck {
    pub name: String,
    /// Parsed as the health check's controller parses it; `Err` says why it refuses it.
    pub spec: Result<CheckSpec, String>,
    /// Every label key the selector mentions.
    pub selector_keys: BTreeSet<String>,
}

impl HealthCheck {
    pub(super) fn from_object(nhc: &NodeHealthCheck) -> Self {
        let selector = &nhc.spec.selector;
        let selector_keys = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .chain(selector.match_expressions.iter().flatten().map(|e| e.key.clone()))
            .collect();
        Self {
            name: nhc.name_any(),
            spec: nodemedic_healthcheck::spec::parse(nhc),
            selector_keys,
        }
    }

    /// The same selector semantics the health check's controller applies.
    pub(super) fn selects(&self, node: &NodeFacts) -> bool {
        self.spec.as_ref().is_ok_and(|s| s.selector.matches(&node.labels))
    }

    pub(super) fn templates(&self) -> Vec<&TemplateRef> {
        self.spec
            .as_ref()
            .map(|s| s.steps.iter().map(|step| &step.template).collect())
            .unwrap_or_default()
    }

    pub(super) fn uses(&self, kind: &str) -> bool {
        self.templates().iter().any(|t| t.kind == kind)
    }

    pub(super) fn references(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.templates()
            .iter()
            .any(|t| t.kind == kind && t.namespace.as_deref() == Some(namespace) && t.name == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TemplateLookup {
    Found,
    NotFound,
    /// No CRD serves the kind.
    KindNotServed,
}

/// What the fence-agents controller found when it checked something, as its condition says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Passed,
    Failed(String),
    /// No condition for the template's current generation.
    NotYet,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FenceTemplate {
    pub namespace: String,
    pub name: String,
    /// ParametersValid: the agent's metadata accepts every parameter, for every node named.
    pub parameters: Verdict,
    /// FenceAgentStatusValidationSucceeded: `--action=status` with the credentials.
    pub credentials: Verdict,
}

impl FenceTemplate {
    pub(super) fn from_object(template: &FenceAgentsRemediationTemplate) -> Self {
        let conditions = template
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let verdict = |type_: &str| match nodemedic_kube::conditions::find(&conditions, type_) {
            Some(c) if c.observed_generation != template.metadata.generation => Verdict::NotYet,
            Some(c) if c.status == "True" => Verdict::Passed,
            Some(c) if c.status == "False" => Verdict::Failed(c.message.clone()),
            _ => Verdict::NotYet,
        };
        Self {
            namespace: template.namespace().unwrap_or_default(),
            name: template.name_any(),
            parameters: verdict(types::PARAMETERS_VALID),
            credentials: verdict(types::FENCE_AGENT_STATUS_VALIDATION_SUCCEEDED),
        }
    }
}

/// Whom the permissions were asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Subject {
    /// The account itself (SubjectAccessReview).
    Account,
    /// Whoever runs the doctor (SelfSubjectAccessReview): it may not ask for others.
    Caller,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct AccountAccess {
    /// The ServiceAccount's name, in [`Facts::namespace`].
    pub account: String,
    /// The chart's ClusterRole that grants it.
    pub role: String,
    pub subject: Subject,
    pub checked: usize,
    pub denied: Vec<Permission>,
}
