//! The agent DaemonSet, rendered from the SelfNodeRemediationConfig. The agent's command line is
//! rendered by the same function the lab uses to start its agents, so both run what the
//! configuration says.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    apps::v1::{DaemonSet, DaemonSetSpec},
    core::v1::{
        Affinity, Container, ContainerPort, EnvVar, EnvVarSource, HostPathVolumeSource, NodeAffinity, NodeSelector,
        NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, PodSpec, PodTemplateSpec, ResourceRequirements,
        SecurityContext, Toleration, Volume, VolumeMount,
    },
};
use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector};
use kube::api::ObjectMeta;
use nodemedic_api::{names::labels, self_remediation::SelfNodeRemediationConfigSpec};
use sha2::{Digest, Sha256};

use crate::{Error, Result, protocol::LicenceSettings};

pub const NAME: &str = "nodemedic-agent";
pub(crate) const SERVICE_ACCOUNT: &str = "nodemedic-agent";
pub(crate) const CONFIG_HASH: &str = "nodemedic.medik8s.io/config-hash";

fn duration(field: &str, value: &nodemedic_api::GoDuration) -> Result<std::time::Duration> {
    value.duration().map_err(|e| Error::InvalidConfig {
        name: nodemedic_api::self_remediation::CONFIG_NAME.into(),
        why: format!("{field}: {e}"),
    })
}

/// The licence settings a configuration gives its agents.
pub fn licence_settings(spec: &SelfNodeRemediationConfigSpec) -> Result<LicenceSettings> {
    Ok(LicenceSettings {
        api_check_interval: duration("apiCheckInterval", &spec.api_check_interval)?,
        api_server_timeout: duration("apiServerTimeout", &spec.api_server_timeout)?,
        max_api_error_threshold: spec.max_api_error_threshold.max(1) as u32,
        peer_dial_timeout: duration("peerDialTimeout", &spec.peer_dial_timeout)?,
        peer_request_timeout: duration("peerRequestTimeout", &spec.peer_request_timeout)?,
    })
}

/// The peer detector's settings a configuration gives its agents.
pub(crate) fn detector_settings(
    detection: &nodemedic_api::self_remediation::PeerDetection,
) -> Result<nodemedic_peer_detection::DetectorSettings> {
    Ok(nodemedic_peer_detection::DetectorSettings {
        probe_period: duration("peerDetection.probePeriod", &detection.probe_period)?,
        probe_rtt: duration("peerDetection.probeRtt", &detection.probe_rtt)?,
        indirect_probes: u8::try_from(detection.num_indirect_probes.clamp(0, 255)).unwrap_or(u8::MAX),
        suspect_to_down_after: duration("peerDetection.suspectToDownAfter", &detection.suspect_to_down_after)?,
    })
}

/// The agent flags a configuration implies (besides the node, its address and its watchdog,
/// which come from where the agent runs).
pub fn agent_flags(spec: &SelfNodeRemediationConfigSpec) -> Vec<String> {
    let mut flags = vec![
        format!("--host-port={}", spec.host_port),
        format!("--software-reboot={}", spec.is_software_reboot_enabled),
        format!("--api-check-interval={}", spec.api_check_interval),
        format!("--api-server-timeout={}", spec.api_server_timeout),
        format!("--max-api-error-threshold={}", spec.max_api_error_threshold),
        format!("--peer-dial-timeout={}", spec.peer_dial_timeout),
        format!("--peer-request-timeout={}", spec.peer_request_timeout),
        format!("--peer-update-interval={}", spec.peer_update_interval),
        format!("--peer-api-server-timeout={}", spec.peer_api_server_timeout),
    ];
    if let Some(timeout) = &spec.watchdog_timeout {
        flags.push(format!("--watchdog-timeout={timeout}"));
    }
    if let Some(url) = spec.endpoint_health_check_url.as_deref().filter(|u| !u.is_empty()) {
        flags.push(format!("--endpoint-health-check-url={url}"));
    }
    if let Some(detection) = &spec.peer_detection {
        flags.extend([
            format!("--probe-period={}", detection.probe_period),
            format!("--probe-rtt={}", detection.probe_rtt),
            format!("--num-indirect-probes={}", detection.num_indirect_probes),
            format!("--suspect-to-down-after={}", detection.suspect_to_down_after),
        ]);
    }
    flags
}

/// Kubernetes' default `--service-node-port-range`.
const NODE_PORTS: std::ops::RangeInclusive<i32> = 30000..=32767;

/// Problems the schema cannot see: combinations of fields, and values that work but hurt.
pub fn validate(spec: &SelfNodeRemediationConfigSpec) -> Result<Vec<String>> {
    let settings = licence_settings(spec)?;
    let mut warnings = Vec::new();
    if settings.api_server_timeout > settings.api_check_interval {
        warnings.push(format!(
            "apiServerTimeout ({}) exceeds apiCheckInterval ({}): checks overlap; lower apiServerTimeout",
            spec.api_server_timeout, spec.api_check_interval
        ));
    }
    if NODE_PORTS.contains(&spec.host_port) {
        warnings.push(format!(
            "hostPort {} is in Kubernetes' default NodePort range ({}-{}): the agents listen on it on every node's own network, where a NodePort Service of that number would take their peers' traffic; set hostPort to a free port outside the range (nodemedic's default is {})",
            spec.host_port,
            NODE_PORTS.start(),
            NODE_PORTS.end(),
            SelfNodeRemediationConfigSpec::default().host_port
        ));
    }
    duration("peerUpdateInterval", &spec.peer_update_interval)?;
    duration("peerApiServerTimeout", &spec.peer_api_server_timeout)?;
    if let Some(timeout) = &spec.watchdog_timeout {
        duration("watchdogTimeout", timeout)?;
    }
    if let Some(detection) = &spec.peer_detection {
        for problem in detector_settings(detection)?.validate() {
            warnings.push(format!("peerDetection: {problem}"));
        }
    }
    if let Some(url) = spec.endpoint_health_check_url.as_deref().filter(|u| !u.is_empty())
        && url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_owned))
            .is_none()
    {
        warnings.push(format!(
            "endpointHealthCheckUrl {url:?} names no host: the agents cannot probe it; write it like https://10.0.0.1/healthz"
        ));
    }
    Ok(warnings)
}

fn env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The agent's requests: its busiest measured rate at rest (4 mCPU, 12 MiB with the detector,
/// `make bench ARGS="--suite footprint"`) with room for a peer storm and a larger membership.
pub(crate) const AGENT_CPU_REQUEST: &str = "10m";
pub(crate) const AGENT_MEMORY_REQUEST: &str = "32Mi";

/// Where the agent keeps its state (its `--state-dir` default), on its node and in its container.
const STATE: &str = "/var/lib/nodemedic";

/// Where a node keeps its kernel modules.
const MODULES: &str = "/lib/modules";

/// Where the image keeps the agent-only executable (see the Dockerfile).
pub(crate) const AGENT_EXECUTABLE: &str = "/usr/local/bin/nodemedic-agent";

/// What the agents run from that the controller's flags give, not the configuration.
#[derive(Clone, Debug, Default)]
pub struct Install {
    pub image: String,
    /// Each agent serves its metrics over HTTPS on this port of its node (authorized callers
    /// only, see `nodemedic_kube::metrics_server`); none when unset.
    pub metrics_port: Option<u16>,
}

impl Install {
    pub fn new(image: &str) -> Self {
        Self {
            image: image.to_owned(),
            metrics_port: None,
        }
    }
}

/// The DaemonSet for `spec`, labelled with a hash of itself so a change is noticed.
pub fn render(spec: &SelfNodeRemediationConfigSpec, namespace: &str, install: &Install) -> DaemonSet {
    let labels = agent_labels();
    let mut ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod(spec, install)),
            },
            ..Default::default()
        }),
        status: None,
    };
    let hash = serde_json::to_vec(&ds.spec)
        .map(|b| hex::encode(&Sha256::digest(b)[..8]))
        .unwrap_or_default();
    ds.metadata.annotations = Some(BTreeMap::from([(CONFIG_HASH.to_owned(), hash)]));
    ds
}

/// The agents' labels, which the DaemonSet also selects its pods by.
fn agent_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "nodemedic".to_owned()),
        ("app.kubernetes.io/component".to_owned(), NAME.to_owned()),
    ])
}

/// An agent's pod: on its node's network, as critical as a node's own pods, on every node but
/// the excluded ones.
fn pod(spec: &SelfNodeRemediationConfigSpec, install: &Install) -> PodSpec {
    PodSpec {
        service_account_name: Some(SERVICE_ACCOUNT.into()),
        host_network: Some(true),
        priority_class_name: Some("system-node-critical".into()),
        tolerations: Some(tolerations(spec)),
        affinity: Some(affinity(spec)),
        containers: vec![container(spec, install)],
        volumes: Some(volumes()),
        ..Default::default()
    }
}

/// Every NoSchedule taint, and the configuration's own tolerations.
fn tolerations(spec: &SelfNodeRemediationConfigSpec) -> Vec<Toleration> {
    let mut tolerations = vec![Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }];
    tolerations.extend(spec.custom_ds_tolerations.clone().unwrap_or_default());
    tolerations
}

/// [`node_requirements`], as one term: its requirements are all ANDed.
fn affinity(spec: &SelfNodeRemediationConfigSpec) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(node_requirements(spec)),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Where agents run: not on a node labelled exclude-from-remediation=true (as medik8s's
/// DaemonSet): such a node is never remediated, so an agent there could only fence it on its own
/// (an isolated agent resets its node), and a node in maintenance carries the label. The
/// DaemonSet controller stops an agent when its node gets the label; the agent closes its
/// watchdog only if no remediation of its node exists (`agent::shutdown`).
fn node_requirements(spec: &SelfNodeRemediationConfigSpec) -> Vec<NodeSelectorRequirement> {
    let excluded = NodeSelectorRequirement {
        key: labels::EXCLUDE_FROM_REMEDIATION.into(),
        operator: "NotIn".into(),
        values: Some(vec!["true".into()]),
    };
    std::iter::once(excluded)
        .chain(spec.custom_ds_node_selector_requirements.clone().unwrap_or_default())
        .collect()
}

/// The agent's container: its command line, ports, requests, privileges and host paths.
fn container(spec: &SelfNodeRemediationConfigSpec, install: &Install) -> Container {
    Container {
        name: "agent".into(),
        image: Some(install.image.clone()),
        // The agent-only executable of the image: a fraction of the all-in-one binary's memory.
        command: Some(vec![AGENT_EXECUTABLE.into()]),
        args: Some(args(spec, install)),
        env: Some(vec![
            env("MY_NODE_NAME", "spec.nodeName"),
            env("MY_POD_IP", "status.podIP"),
            env("DEPLOYMENT_NAMESPACE", "metadata.namespace"),
        ]),
        // On the node's network the container's ports are the node's: no hostPort mapping (the
        // API server fills it in as equal, which is what it is).
        ports: Some(ports(spec, install)),
        resources: Some(resources()),
        // Root and privileged: the agent opens /dev/watchdog (the image's default user is not
        // root, for the controller). It writes only its state directory, a host path.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            read_only_root_filesystem: Some(true),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts()),
        ..Default::default()
    }
}

/// The agent's flags: its watchdog, what the configuration says ([`agent_flags`]), and its
/// metrics endpoint when there is one.
fn args(spec: &SelfNodeRemediationConfigSpec, install: &Install) -> Vec<String> {
    let mut args = vec![format!("--watchdog={}", spec.watchdog_file_path)];
    args.extend(agent_flags(spec));
    if let Some(port) = install.metrics_port {
        args.extend([format!("--metrics-bind=0.0.0.0:{port}"), "--metrics-secure".into()]);
    }
    args
}

/// The peers' port, and the metrics port when there is one.
fn ports(spec: &SelfNodeRemediationConfigSpec, install: &Install) -> Vec<ContainerPort> {
    let peers = ContainerPort {
        name: Some("peers".into()),
        container_port: spec.host_port,
        ..Default::default()
    };
    let metrics = install.metrics_port.map(|port| ContainerPort {
        name: Some("metrics".into()),
        container_port: i32::from(port),
        ..Default::default()
    });
    std::iter::once(peers).chain(metrics).collect()
}

/// Requests only, measured (docs/defaults.md): at rest an agent uses about 4 mCPU and 12 MiB.
/// No CPU limit: a throttled agent could miss its watchdog and reset a healthy node. No memory
/// limit: an OOM kill would do the same; as a system-node-critical pod under its request it is
/// the last the kubelet evicts and the OOM killer spares it.
fn resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(AGENT_CPU_REQUEST.into())),
            ("memory".to_owned(), Quantity(AGENT_MEMORY_REQUEST.into())),
        ])),
        limits: None,
        ..Default::default()
    }
}

/// The host paths the agent uses: its state, the node's devices and the node's kernel modules.
fn volumes() -> Vec<Volume> {
    let host_path = |name: &str, path: &str, type_: &str| Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(type_.into()),
        }),
        ..Default::default()
    };
    vec![
        host_path("state", STATE, "DirectoryOrCreate"),
        // The node's devices, as medik8s's agent mounts them: a privileged container gets the
        // device nodes the runtime copies, and this makes the watchdog the node has at
        // watchdogFilePath the one the agent opens, whatever kind of file it is.
        host_path("dev", "/dev", "Directory"),
        // The node's kernel modules, read-only, for the agent's `modprobe softdog` on a node
        // without a watchdog device (as medik8s's agent loads it).
        host_path("modules", MODULES, "DirectoryOrCreate"),
    ]
}

/// Where the container sees [`volumes`]: where the node has them.
fn volume_mounts() -> Vec<VolumeMount> {
    vec![
        VolumeMount {
            name: "state".into(),
            mount_path: STATE.into(),
            ..Default::default()
        },
        VolumeMount {
            name: "dev".into(),
            mount_path: "/dev".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "modules".into(),
            mount_path: MODULES.into(),
            read_only: Some(true),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_change_changes_the_hash_and_the_flags() {
        let spec = SelfNodeRemediationConfigSpec::default();
        let a = render(&spec, "ns", &Install::new("img"));
        let mut changed = spec.clone();
        changed.custom_ds_tolerations = Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        let b = render(&changed, "ns", &Install::new("img"));
        let hash = |d: &DaemonSet| {
            d.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONFIG_HASH))
                .cloned()
        };
        assert_ne!(hash(&a), hash(&b));
        assert!(agent_flags(&spec).contains(&"--api-check-interval=15s".to_owned()));
    }

    #[test]
    fn no_agent_runs_on_an_excluded_node_and_custom_requirements_come_after_that_rule() {
        let terms = |d: &DaemonSet| {
            let spec = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .expect("pod spec");
            let affinity = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
            let required = affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
            let terms = &required.expect("required node affinity").node_selector_terms;
            assert_eq!(terms.len(), 1, "one term: its requirements are all ANDed");
            terms[0].match_expressions.clone().unwrap_or_default()
        };
        let excluded = NodeSelectorRequirement {
            key: labels::EXCLUDE_FROM_REMEDIATION.into(),
            operator: "NotIn".into(),
            values: Some(vec!["true".into()]),
        };
        let mut spec = SelfNodeRemediationConfigSpec::default();
        assert_eq!(
            terms(&render(&spec, "ns", &Install::new("img"))),
            std::slice::from_ref(&excluded)
        );
        let workers = NodeSelectorRequirement {
            key: "node-role.kubernetes.io/worker".into(),
            operator: "Exists".into(),
            values: None,
        };
        spec.custom_ds_node_selector_requirements = Some(vec![workers.clone()]);
        assert_eq!(terms(&render(&spec, "ns", &Install::new("img"))), [excluded, workers]);
    }

    #[test]
    fn every_field_reaches_the_agents_or_is_warned_about() {
        let mut spec = SelfNodeRemediationConfigSpec::default();
        assert!(validate(&spec).expect("valid").is_empty());
        spec.watchdog_timeout = Some("10s".parse().expect("duration"));
        spec.endpoint_health_check_url = Some("https://10.0.0.1/healthz".into());
        let flags = agent_flags(&spec);
        for flag in [
            "--watchdog-timeout=10s",
            "--endpoint-health-check-url=https://10.0.0.1/healthz",
            "--peer-api-server-timeout=5s",
            "--peer-update-interval=15m",
        ] {
            assert!(flags.contains(&flag.to_owned()), "{flag} in {flags:?}");
        }
        spec.endpoint_health_check_url = Some("/healthz".into());
        assert!(
            validate(&spec)
                .expect("valid")
                .iter()
                .any(|w| w.contains("endpointHealthCheckUrl"))
        );
    }

    #[test]
    fn the_agent_runs_read_only_on_a_port_outside_the_node_port_range_and_medik8s_s_port_is_warned_about() {
        let mut spec = SelfNodeRemediationConfigSpec::default();
        let ds = render(&spec, "ns", &Install::new("img"));
        let pod = ds.spec.and_then(|s| s.template.spec).expect("pod spec");
        let container = &pod.containers[0];
        let security = container.security_context.as_ref().expect("security context");
        assert_eq!(security.read_only_root_filesystem, Some(true));
        let port = &container.ports.as_ref().expect("ports")[0];
        assert_eq!(port.host_port, None);
        assert!(!NODE_PORTS.contains(&port.container_port));
        assert!(validate(&spec).expect("valid").is_empty());
        spec.host_port = 30001;
        let warnings = validate(&spec).expect("valid");
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("hostPort 30001 is in Kubernetes' default NodePort range")),
            "{warnings:?}"
        );
    }

    #[test]
    fn peer_detection_reaches_the_agents_and_a_bad_combination_is_warned_about() {
        let mut spec = SelfNodeRemediationConfigSpec::default();
        assert!(!agent_flags(&spec).iter().any(|f| f.starts_with("--probe-period")));
        spec.peer_detection = Some(Default::default());
        let flags = agent_flags(&spec);
        for flag in [
            "--probe-period=400ms",
            "--probe-rtt=200ms",
            "--num-indirect-probes=3",
            "--suspect-to-down-after=1s",
        ] {
            assert!(flags.contains(&flag.to_owned()), "{flag} in {flags:?}");
        }
        assert!(validate(&spec).expect("valid").is_empty());
        spec.peer_detection = Some(nodemedic_api::self_remediation::PeerDetection {
            probe_rtt: "300ms".parse().expect("duration"),
            ..Default::default()
        });
        let warnings = validate(&spec).expect("valid");
        assert!(
            warnings.iter().any(|w| w.contains("more than half of probePeriod")),
            "{warnings:?}"
        );
    }
}
