//! Names that must match the medik8s operators byte for byte, so a cluster can mix nodemedic with
//! them and users' tooling keeps working: labels, annotations, condition types and reasons,
//! finalizers, taints and the node-lease convention.

/// The namespace nodemedic runs in unless told otherwise (seed document 004's name).
pub const DEFAULT_NAMESPACE: &str = "workload-availability";

pub mod labels {
    pub const EXCLUDE_FROM_REMEDIATION: &str = "remediation.medik8s.io/exclude-from-remediation";
    pub const DEFAULT_TEMPLATE: &str = "remediation.medik8s.io/default-template";
    /// Set (empty value) on remediation CRs whose node is a control-plane node.
    pub const IS_CONTROL_PLANE_NODE: &str = "remediation.medik8s.io/isControlPlaneNode";
    pub const PART_OF: &str = "app.kubernetes.io/part-of";
    pub const PART_OF_NHC: &str = "node-healthcheck-controller";
    pub const ROLE_WORKER: &str = "node-role.kubernetes.io/worker";
    pub const ROLE_MASTER: &str = "node-role.kubernetes.io/master";
    pub const ROLE_CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";
    pub const HOSTNAME: &str = "kubernetes.io/hostname";
    /// ClusterRoles carrying this label are aggregated into the role nodemedic's health check uses
    /// on remediation kinds, so third-party remediators can grant it access.
    pub const AGGREGATE_TO_EXT_REMEDIATION: &str = "rbac.ext-remediation/aggregate-to-ext-remediation";
}

pub mod annotations {
    pub const NHC_TIMED_OUT: &str = "remediation.medik8s.io/nhc-timed-out";
    pub const MULTIPLE_TEMPLATES_SUPPORT: &str = "remediation.medik8s.io/multiple-templates-support";
    pub const NODE_NAME: &str = "remediation.medik8s.io/node-name";
    pub const TEMPLATE_NAME: &str = "remediation.medik8s.io/template-name";
    pub const HEALTHY_DELAY: &str = "remediation.medik8s.io/healthy-delay";
    pub const MANUALLY_CONFIRMED_HEALTHY: &str = "remediation.medik8s.io/manually-confirmed-healthy";
    pub const OLD_REMEDIATION_CR_FLAG: &str = "nodehealthcheck.medik8s.io/old-remediation-cr-flag";
    pub const SNR_WATCHDOG_TIMEOUT: &str = "self-node-remediation.medik8s.io/watchdog-timeout";
    pub const SNR_IS_REBOOT_CAPABLE: &str = "is-reboot-capable.self-node-remediation.medik8s.io";
}

pub mod conditions {
    // Remediator -> health check signalling (External Remediation API as medik8s extends it).
    pub const PROCESSING: &str = "Processing";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const PERMANENT_NODE_DELETION_EXPECTED: &str = "PermanentNodeDeletionExpected";
    // NodeHealthCheck.
    pub const DISABLED: &str = "Disabled";
    pub const STORM_ACTIVE: &str = "StormActive";
    pub const STORM_COOLDOWN_ACTIVE: &str = "StormCooldownActive";
    /// nodemedic: whether the budget (minHealthy / maxUnhealthy) currently allows new remediation.
    pub const REMEDIATION_ALLOWED: &str = "RemediationAllowed";
    /// nodemedic: whether the selector matches any node (False: the check watches nothing).
    pub const NODES_SELECTED: &str = "NodesSelected";
    // FenceAgentsRemediation and its template.
    pub const FENCE_AGENT_ACTION_SUCCEEDED: &str = "FenceAgentActionSucceeded";
    pub const FENCE_AGENT_STATUS_VALIDATION_SUCCEEDED: &str = "FenceAgentStatusValidationSucceeded";
    /// nodemedic: the template's or CR's parameters were checked against the agent's metadata.
    pub const PARAMETERS_VALID: &str = "ParametersValid";
    /// nodemedic (SelfNodeRemediation): whether the node can fence itself safely.
    pub const FENCING_SAFE: &str = "FencingSafe";
    /// nodemedic (SelfNodeRemediation): which safe time is used and why.
    pub const SAFE_TIME_ADJUSTED: &str = "SafeTimeAdjusted";
    // NodeMaintenance (nodemedic adds conditions next to medik8s's phase).
    pub const DRAINED: &str = "Drained";
}

pub mod finalizers {
    pub const SNR: &str = "self-node-remediation.medik8s.io/snr-finalizer";
    pub const FAR: &str = "fence-agents-remediation.medik8s.io/far-finalizer";
    pub const NODE_MAINTENANCE: &str = "foregroundDeleteNodeMaintenance";
}

pub mod taints {
    pub const SNR_KEY: &str = "remediation.medik8s.io/self-node-remediation";
    pub const FAR_KEY: &str = "remediation.medik8s.io/fence-agents-remediation";
    pub const OUT_OF_SERVICE_KEY: &str = "node.kubernetes.io/out-of-service";
    pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
    pub const UNSCHEDULABLE_KEY: &str = "node.kubernetes.io/unschedulable";
    pub const DRAIN_KEY: &str = "medik8s.io/drain";
    pub const UNREACHABLE_KEY: &str = "node.kubernetes.io/unreachable";
    pub const NOT_READY_KEY: &str = "node.kubernetes.io/not-ready";
}

/// Node leases that keep the health check and maintenance off the same node at the same time.
pub mod leases {
    pub const NAMESPACE: &str = "medik8s-leases";
    pub const MAINTENANCE_HOLDER: &str = "node-maintenance";

    /// `node-<name>`, lowercased, as medik8s/common names it.
    pub fn node_lease_name(node: &str) -> String {
        format!("node-{node}").to_lowercase()
    }

    /// The holder identity a NodeHealthCheck uses.
    pub fn health_check_holder(nhc_name: &str) -> String {
        format!("NodeHealthCheck-{nhc_name}")
    }
}

/// Every event message medik8s remediators emit starts with this.
pub const EVENT_PREFIX: &str = "[remediation] ";
