//! nodemedic in a lab: the controller on the host, an agent in every node's namespace, the seed
//! manifests with stated fast timings, and the StatefulSet stand-in for a VM. The demo and the
//! end-to-end tests run exactly these steps.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, Pod, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    self_remediation::{CONFIG_NAME, SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_lab::{Lab, ProcessSpec, Result, seeds, wait, workloads::STATEFULSET};
use nodemedic_self_remediation::registration;

/// The namespace nodemedic runs in (the seed documents' own, rewritten into).
pub const NS: &str = nodemedic_api::names::DEFAULT_NAMESPACE;

/// The fast self-remediation timings the lab states: `L` = 2 × (1 s + 0.5 s) + 0.5 s + 0.5 s =
/// 4 s; with the lab's 3 s watchdog, `T_safe` = (4 + 3 × 3) × 1.0202 + 1 ≈ 14.3 s (the seed's 180 s
/// and the 5 s set here are both overridden by the provable minimum or kept above it). Peers
/// are read again every 30 s (and at once on a membership change).
pub const FAST_CONFIG: &str = r#"{"spec": {
    "apiCheckInterval": "1s", "apiServerTimeout": "500ms", "maxApiErrorThreshold": 2,
    "peerDialTimeout": "500ms", "peerRequestTimeout": "500ms", "peerUpdateInterval": "30s",
    "peerApiServerTimeout": "500ms", "safeTimeToAssumeNodeRebootedSeconds": 5}}"#;

/// [`FAST_CONFIG`], with the peer failure detector on if `detector`.
pub fn fast_config(detector: bool) -> String {
    if detector {
        with_detector(FAST_CONFIG)
    } else {
        FAST_CONFIG.to_owned()
    }
}

/// A SelfNodeRemediationConfig patch (such as [`FAST_CONFIG`]) with the peer failure detector
/// on, at its defaults.
/// A patch that is not JSON is returned as it is, for the apply to reject with its reason.
pub fn with_detector(config: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(config) {
        Ok(mut patch) => {
            patch["spec"]["peerDetection"] = serde_json::json!({});
            patch.to_string()
        }
        Err(_) => config.to_owned(),
    }
}

/// The chart rendered with its defaults: its ServiceAccounts, ClusterRoles and bindings are what
/// the lab's controller and agents run with.
const RENDERED_CHART: &str = include_str!("../../../deploy/nodemedic.yaml");
pub const CONTROLLER_ACCOUNT: &str = "nodemedic-controller";
pub const AGENT_ACCOUNT: &str = "nodemedic-agent";

/// The lab's agents authenticate as their nodes (`system:node:<node>`, as a node-bound service
/// account token would name them to the signer), in this group; it gets the chart's agent role.
const LAB_AGENTS_BINDING: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nodemedic-lab-agents}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodemedic-agent}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "nodemedic:agents"}]
"#;

/// The chart's ServiceAccounts, ClusterRoles and ClusterRoleBindings, and the admission policy
/// that confines the soft tainter, as YAML documents.
pub fn chart_rbac() -> String {
    RENDERED_CHART
        .split("\n---\n")
        .filter(|doc| {
            doc.lines().any(|l| {
                matches!(
                    l.trim_end(),
                    "kind: ServiceAccount"
                        | "kind: ClusterRole"
                        | "kind: ClusterRoleBinding"
                        | "kind: ValidatingAdmissionPolicy"
                        | "kind: ValidatingAdmissionPolicyBinding"
                )
            })
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Applies a seed manifest with its namespaces rewritten to [`NS`], after `edit`.
pub fn apply_seed(lab: &Lab, file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Result<()> {
    let mut manifest = seeds::in_namespace(seeds::load(file)?, NS);
    edit(&mut manifest);
    lab.apply_yaml(&seeds::yaml(&manifest)).map(|_| ())
}

/// How long a condition must last before a test's health check acts. The seeds' 10 s would be
/// added to every remediation a test waits for; the lab's node-monitor grace already makes a
/// node `Unknown` only after 5 s of silence, so a live node is not mistaken for a dead one by
/// shortening this. Tests of the durations themselves apply the seeds unchanged.
pub const TEST_CONDITION_DURATION: &str = "2s";

/// A seed health check (`002-nhc-*`) applied as [`apply_seed`] does, with every unhealthy
/// condition's duration set to [`TEST_CONDITION_DURATION`] before `edit`.
pub fn apply_seed_check(lab: &Lab, file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Result<()> {
    apply_seed(lab, file, |manifest| {
        shorten_durations(manifest);
        edit(manifest);
    })
}

/// `Ready` False or Unknown for [`TEST_CONDITION_DURATION`]: a test's `unhealthyConditions`.
pub fn test_conditions() -> serde_json::Value {
    serde_json::json!([
        {"type": "Ready", "status": "False", "duration": TEST_CONDITION_DURATION},
        {"type": "Ready", "status": "Unknown", "duration": TEST_CONDITION_DURATION}])
}

/// Sets every `spec.unhealthyConditions[].duration` of a health check to
/// [`TEST_CONDITION_DURATION`].
pub fn shorten_durations(check: &mut serde_json::Value) {
    if let Some(conditions) = check
        .pointer_mut("/spec/unhealthyConditions")
        .and_then(|c| c.as_array_mut())
    {
        for condition in conditions {
            condition["duration"] = serde_json::Value::from(TEST_CONDITION_DURATION);
        }
    }
}

pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::all(client.clone()).create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Starts `nodemedic-controller` (next to `exe`) on the host as lab process `name`, authenticated as the
/// chart's controller ServiceAccount with exactly the permissions the chart grants it;
/// metrics on `metrics_port`.
pub fn start_controller(lab: &Lab, exe: &Path, name: &str, metrics_port: u16, extra: &[&str], log: &str) -> Result<()> {
    lab.apply_yaml_once(&chart_rbac())?;
    let kubeconfig = lab.kubeconfig_for(
        &format!("system:serviceaccount:{NS}:{CONTROLLER_ACCOUNT}"),
        &["system:serviceaccounts", &format!("system:serviceaccounts:{NS}")],
    )?;
    let mut args = vec![
        format!("--metrics-bind=127.0.0.1:{metrics_port}"),
        format!("--identity={name}"),
        format!("--namespace={NS}"),
    ];
    // The admission webhook only where a test asks for it: on the chart's port every controller
    // of a lab would compete for one address, and no webhook configuration points at it.
    if !extra.iter().any(|flag| flag.starts_with("--webhook-bind")) {
        args.push("--webhook-bind=".into());
    }
    // The agents' peer-detection reports (used when the SelfNodeRemediationConfig turns the
    // detector on), on a port of its own for each controller, on the nodes' bridge.
    if !extra.iter().any(|flag| flag.starts_with("--peer-reports")) {
        let ip = lab.api_ip();
        args.push(format!("--peer-reports-bind={ip}:0"));
        args.push(format!("--peer-reports-advertise={ip}"));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let spec = ProcessSpec::new(sibling_executable(exe, "nodemedic-controller")?, args)
        .env("KUBECONFIG", kubeconfig.display().to_string())
        .env("RUST_LOG", log);
    lab.add_host_process(name, spec)
}

/// The fence-agents path's controller (self remediation off), metrics on `metrics_port`.
pub fn start_fence_agents_controller(lab: &Lab, exe: &Path, metrics_port: u16) -> Result<()> {
    start_controller(
        lab,
        exe,
        "controller",
        metrics_port,
        &["--disable=self-remediation"],
        "info,kube=warn",
    )
}

/// A SelfNodeRemediationTemplate `name` in [`NS`] with `strategy`.
pub fn self_remediation_template(name: &str, strategy: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {"remediationStrategy": strategy}}}
    })
}

/// A free local port (e.g. for the controller's metrics).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The seed SelfNodeRemediationConfig with [`FAST_CONFIG`] applied, as the manager reads it.
pub async fn configure(lab: &Lab) -> Result<SelfNodeRemediationConfig> {
    configure_with(lab, FAST_CONFIG).await
}

/// The seed's own timings, unchanged (safe time 180 s, API checks every 15 s).
pub const SEED_TIMINGS_CONFIG: &str = "{}";

/// The seed SelfNodeRemediationConfig with `patch` (a JSON merge patch) applied.
pub async fn configure_with(lab: &Lab, patch: &str) -> Result<SelfNodeRemediationConfig> {
    apply_seed(lab, "004-snr-config.yaml", |m| {
        if let Ok(patch) = serde_json::from_str::<serde_json::Value>(patch) {
            json_patch::merge(m, &patch);
        }
    })?;
    Ok(Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS)
        .get(CONFIG_NAME)
        .await?)
}

/// The self-remediation path installed: the SelfNodeRemediationConfig (the seed's with `patch`),
/// the controller without fence agents (metrics on `metrics_port`), an agent in every node.
pub async fn install_self_remediation(
    lab: &Lab,
    exe: &Path,
    patch: &str,
    metrics_port: u16,
) -> Result<SelfNodeRemediationConfig> {
    let config = configure_with(lab, patch).await?;
    start_controller(
        lab,
        exe,
        "controller",
        metrics_port,
        &["--disable=fence-agents"],
        "info,kube=warn",
    )?;
    start_agents(lab, exe, &config)?;
    Ok(config)
}

/// What `nodemedic-lab up` installs for a person to try: every operator in one controller
/// (metrics on `metrics_port`), an agent in every node, the seed SelfNodeRemediationConfig with
/// `patch` (the manager then creates the default templates), and, when the lab has BMCs, the
/// seed's fence-agents credentials and template with each node's BMC address; and the stateful
/// stand-in for a VM. No health check: that is the person's to write.
pub async fn install_playground(lab: &Lab, exe: &Path, patch: &str, metrics_port: u16) -> Result<()> {
    create_namespace(&lab.client(), NS).await?;
    let config = configure_with(lab, patch).await?;
    start_controller(lab, exe, "controller", metrics_port, &[], "info,kube=warn")?;
    start_agents(lab, exe, &config)?;
    if !bmc_ips(lab).is_empty() {
        apply_seed(lab, "002-far-credentials-secret.yaml", |_| {})?;
        apply_seed(lab, "002-far-template.yaml", |m| adapt_far_template(lab, m))?;
    }
    deploy_workload(lab).await?;
    agents_settled(lab).await
}

/// Starts an agent (`exe`) in every node, each with its own node identity and the node's emulated
/// watchdog device, with the flags the manager's DaemonSet would give it.
pub fn start_agents(lab: &Lab, exe: &Path, config: &SelfNodeRemediationConfig) -> Result<()> {
    start_agents_with(lab, exe, config, LabWatchdog::Device)
}

/// [`start_agents`], every agent with the given watchdog.
pub fn start_agents_with(
    lab: &Lab,
    exe: &Path,
    config: &SelfNodeRemediationConfig,
    watchdog: LabWatchdog,
) -> Result<()> {
    for node in lab.nodes() {
        start_node_agent(lab, exe, config, &node, watchdog)?;
    }
    Ok(())
}

/// Starts the agents exactly as the chart's DaemonSet pods authenticate: as the
/// `nodemedic-agent` ServiceAccount, with a token bound to the DaemonSet's pod on each node (the
/// token names the node, which the peer-certificate signer checks), and only the chart's RBAC.
pub async fn start_agents_as_daemonset_pods(lab: &Lab, exe: &Path, config: &SelfNodeRemediationConfig) -> Result<()> {
    lab.apply_yaml_once(&chart_rbac())?;
    for node in lab.nodes() {
        let token = daemonset_pod_token(lab, &node).await?;
        let kubeconfig = lab.kubeconfig_with_token(&format!("agent-{node}"), &token)?;
        start_agent_with(lab, exe, config, &node, &kubeconfig, LabWatchdog::Device)?;
    }
    Ok(())
}

/// A token of the `nodemedic-agent` ServiceAccount bound to the agent DaemonSet's pod on `node`,
/// as the kubelet projects into that pod.
pub async fn daemonset_pod_token(lab: &Lab, node: &str) -> Result<String> {
    let pods = Api::<Pod>::namespaced(lab.client(), NS);
    let pod = wait::until(
        &format!("the agent DaemonSet's pod on {node}"),
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            let on_node = ListParams::default()
                .labels("app.kubernetes.io/component=nodemedic-agent")
                .fields(&format!("spec.nodeName={node}"));
            async move { Ok(pods.list(&on_node).await?.items.into_iter().next()) }
        },
    )
    .await?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(24 * 3600),
        }),
        ..Default::default()
    };
    service_account_token(lab, AGENT_ACCOUNT, request).await
}

/// A token of ServiceAccount `account` in [`NS`], as `request` asks.
pub async fn service_account_token(lab: &Lab, account: &str, request: TokenRequest) -> Result<String> {
    Api::<ServiceAccount>::namespaced(lab.client(), NS)
        .create_token_request(account, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| nodemedic_lab::Error::Invalid(format!("the TokenRequest for {account} returned no token")))
}

/// One of the single-role executables (`nodemedic-controller`, `nodemedic-agent`), which are
/// built next to `exe` (the agent's size-optimised build preferred: see
/// [`crate::product::shipped_build`]): the labs run what a cluster runs.
pub fn sibling_executable(exe: &Path, name: &str) -> Result<PathBuf> {
    let sibling = exe.with_file_name(name);
    if sibling.is_file() {
        Ok(crate::product::shipped_build(&sibling))
    } else {
        Err(nodemedic_lab::Error::Invalid(format!(
            "the executable {} is missing: build it with the nodemedic binary (cargo build -p nodemedic --bins)",
            sibling.display()
        )))
    }
}

/// Which watchdog a lab agent opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabWatchdog {
    /// The node's emulated device ([`Lab::watchdog_device_path`]), driven by the product's Linux
    /// watchdog driver as a real device is.
    Device,
    /// No device at all (the path does not exist), and softdog cannot be loaded.
    Missing,
    /// No device at the configured path, and softdog can be loaded (the lab's stand-in for
    /// modprobe makes the node's softdog appear on its lab watchdog).
    Softdog,
}

/// Starts `node`'s agent (authenticated as the node) with the given watchdog.
pub fn start_node_agent(
    lab: &Lab,
    exe: &Path,
    config: &SelfNodeRemediationConfig,
    node: &str,
    watchdog: LabWatchdog,
) -> Result<()> {
    lab.apply_yaml_once(&chart_rbac())?;
    lab.apply_yaml_once(LAB_AGENTS_BINDING)?;
    let kubeconfig = lab.kubeconfig_for(&format!("system:node:{node}"), &["nodemedic:agents"])?;
    start_agent_with(lab, exe, config, node, &kubeconfig, watchdog)
}

fn start_agent_with(
    lab: &Lab,
    exe: &Path,
    config: &SelfNodeRemediationConfig,
    node: &str,
    kubeconfig: &Path,
    watchdog: LabWatchdog,
) -> Result<()> {
    let args = agent_args(lab, config, node, watchdog)?;
    let spec = ProcessSpec::new(sibling_executable(exe, "nodemedic-agent")?, args)
        .env("KUBECONFIG", kubeconfig.display().to_string())
        .env("RUST_LOG", agent_log_filter());
    lab.add_node_process(node, "agent", spec)
}

/// The lab agents' log filter: `NODEMEDIC_AGENT_LOG` when set (e.g. `debug,kube=warn` to see
/// their vote rounds), else info.
fn agent_log_filter() -> String {
    std::env::var("NODEMEDIC_AGENT_LOG").unwrap_or_else(|_| "info,kube=warn".into())
}

/// The agent's flags on `node`: the lab's paths for what a node has (watchdog, boot time, sysrq
/// trigger, state) and the flags the manager's DaemonSet derives from `config`.
pub fn agent_args(
    lab: &Lab,
    config: &SelfNodeRemediationConfig,
    node: &str,
    watchdog: LabWatchdog,
) -> Result<Vec<String>> {
    let device = match watchdog {
        LabWatchdog::Device => lab.watchdog_device_path(node).display().to_string(),
        LabWatchdog::Missing | LabWatchdog::Softdog => lab
            .dir()
            .join("nodes")
            .join(format!("{node}-no-watchdog"))
            .display()
            .to_string(),
    };
    let mut args = vec![
        format!("--node={node}"),
        format!("--namespace={NS}"),
        format!("--address={}", lab.node_ip(node)?),
        format!("--watchdog={device}"),
        format!("--boot-time-file={}", lab.boot_file(node).display()),
        format!("--sysrq-trigger={}", lab.sysrq_trigger_path(node).display()),
        format!(
            "--state-dir={}",
            lab.dir().join("nodes").join(format!("{node}-agent")).display()
        ),
    ];
    // Never the machine's modprobe: a lab agent loads no kernel module.
    let modprobe = lab.modprobe_stand_in(node, watchdog == LabWatchdog::Softdog)?;
    args.extend([
        format!("--modprobe={}", modprobe.program.display()),
        format!("--watchdog-class-dir={}", modprobe.class_dir.display()),
        format!("--device-dir={}", modprobe.device_dir.display()),
    ]);
    args.extend(nodemedic_self_remediation::manager::daemonset::agent_flags(
        &config.spec,
    ));
    Ok(args)
}

/// The seed FenceAgentsRemediationTemplate adapted to the lab, as the seed README allows: each
/// node's BMC address (`--ip` per node, instead of `--hostname` on a DNS name the lab does not
/// have) and TLS trust of the emulator's lab certificate (`--ssl-insecure`).
pub fn adapt_far_template(lab: &Lab, manifest: &mut serde_json::Value) {
    let ips = bmc_ips(lab);
    let spec = &mut manifest["spec"]["template"]["spec"];
    if let Some(shared) = spec["sharedparameters"].as_object_mut() {
        shared.remove("--hostname");
        shared.insert("--ssl-insecure".into(), serde_json::json!(""));
    }
    spec["nodeparameters"] = serde_json::json!({ "--ip": ips });
}

/// The shipped example health check on the peer failure detector's condition
/// (examples/peer-detection): fences through the seed's fence-agents template.
pub const PEER_DETECTION_CHECK: &str = include_str!("../../../examples/peer-detection/nodehealthcheck.yaml");

/// Fence agents with failure detection in seconds: the SelfNodeRemediationConfig (the seed's with
/// `patch`, which should turn `peerDetection` on), the controller with every operator (metrics on
/// `metrics_port`), an agent in every node for the detector, the seed fence-agents credentials and
/// template (Redfish, the lab's BMCs); returns once every agent is a member.
pub async fn install_fence_agents_with_detection(lab: &Lab, exe: &Path, patch: &str, metrics_port: u16) -> Result<()> {
    let config = configure_with(lab, patch).await?;
    apply_seed(lab, "002-far-credentials-secret.yaml", |_| {})?;
    apply_seed(lab, "002-far-template.yaml", |m| adapt_far_template(lab, m))?;
    start_controller(lab, exe, "controller", metrics_port, &[], "info,kube=warn")?;
    start_agents(lab, exe, &config)?;
    agents_settled(lab).await
}

/// Applies the example health check on the detector's condition, with `edit`.
pub fn apply_peer_detection_check(lab: &Lab, edit: impl FnOnce(&mut serde_json::Value)) -> Result<()> {
    let mut manifest: serde_json::Value = serde_saphyr::from_str(PEER_DETECTION_CHECK)
        .map_err(|e| nodemedic_lab::Error::Invalid(format!("examples/peer-detection/nodehealthcheck.yaml: {e}")))?;
    edit(&mut manifest);
    lab.apply_yaml(&seeds::yaml(&manifest)).map(|_| ())
}

/// A fence_ipmilan template for the lab's ipmi_sim BMCs (lanplus, cipher 3), as users write one.
pub fn ipmi_far_template(lab: &Lab, name: &str, secret: &str, strategy: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
        "kind": "FenceAgentsRemediationTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {
            "agent": "fence_ipmilan",
            "sharedparameters": {"--username": "ansible", "--lanplus": "", "--cipher": "3", "--ipport": "623"},
            "nodeparameters": {"--ip": bmc_ips(lab)},
            "sharedSecretName": secret,
            "retrycount": 2,
            "retryinterval": "1s",
            "timeout": "20s",
            "remediationStrategy": strategy
        }}}
    })
}

/// Node -> its BMC's address, as a template's `nodeparameters` wants it.
pub fn bmc_ips(lab: &Lab) -> serde_json::Map<String, serde_json::Value> {
    lab.nodes()
        .into_iter()
        .filter_map(|n| Some((n.clone(), serde_json::json!(lab.bmc(&n).ok()?.ip.to_string()))))
        .collect()
}

/// Waits until every agent is registered, the committed membership has every node, and every
/// agent has acknowledged that membership: from then on a remediation of any of them can gather
/// its acceptances, and every agent knows its peers, so it can ask them when the API goes away
/// (an agent that lost the API before its first read of the peers has no one to ask, and fences
/// when its licence ends). Seconds after the agents start; nothing has to age.
pub async fn agents_settled(lab: &Lab) -> Result<()> {
    let nodes: Vec<String> = lab.nodes();
    members_are(lab, &nodes).await?;
    every_agent_acknowledged(lab, &nodes).await
}

/// Waits until the registration of every one of `nodes` acknowledges the committed membership
/// epoch: each agent has read its peers and the membership since it registered.
async fn every_agent_acknowledged(lab: &Lab, nodes: &[String]) -> Result<()> {
    let client = lab.client();
    wait::until(
        &format!("the agents of {nodes:?} to acknowledge the committed membership"),
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                // One list: a consistent snapshot of the registrations and the membership.
                let leases = registration::list(&client, NS).await?;
                let Some(committed) = leases.iter().find_map(registration::membership) else {
                    return Ok(None);
                };
                let acknowledged: Vec<String> = leases
                    .iter()
                    .filter_map(registration::Published::from_lease)
                    .filter(|p| p.epoch >= committed.committed.epoch)
                    .map(|p| p.node)
                    .collect();
                Ok(nodes.iter().all(|n| acknowledged.contains(n)).then_some(()))
            }
        },
    )
    .await
}

/// Waits until the committed membership is exactly `nodes`, with no change pending.
pub async fn members_are(lab: &Lab, nodes: &[String]) -> Result<()> {
    let api = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS);
    let mut want: Vec<String> = nodes.to_vec();
    want.sort();
    wait::until(
        &format!("the membership to be {want:?}"),
        Duration::from_secs(120),
        || {
            let (api, want) = (api.clone(), want.clone());
            async move {
                let status = api.get_opt(CONFIG_NAME).await?.and_then(|c| c.status);
                Ok(status
                    .filter(|s| s.members.as_ref() == Some(&want) && s.proposed_members.is_none())
                    .map(|_| ()))
            }
        },
    )
    .await
}

/// Waits until no remediation (self remediation's or fence agents') is left in nodemedic's
/// namespace: each was removed once its node came back healthy.
pub async fn every_remediation_removed(lab: &Lab, timeout: Duration) -> Result<()> {
    let snrs = Api::<SelfNodeRemediation>::namespaced(lab.client(), NS);
    let fars = Api::<FenceAgentsRemediation>::namespaced(lab.client(), NS);
    wait::until("every remediation removed", timeout, || {
        let (snrs, fars) = (snrs.clone(), fars.clone());
        async move {
            let left = snrs.list(&ListParams::default()).await?.items.len()
                + fars.list(&ListParams::default()).await?.items.len();
            Ok((left == 0).then_some(()))
        }
    })
    .await
}

/// The StatefulSet stand-in for a VM (namespace `vm`, pod `db-0`, a ReadWriteOnce volume).
pub async fn deploy_workload(lab: &Lab) -> Result<()> {
    create_namespace(&lab.client(), "vm").await?;
    lab.apply_yaml(STATEFULSET).map(|_| ())
}

/// Waits for `db-0` Running on a node not in `not_on`.
pub async fn running_pod(client: &Client, not_on: &[&str], timeout: Duration) -> Result<Pod> {
    running_pod_named(client, "db-0", not_on, timeout).await
}

/// Waits for pod `name` of namespace `vm` Running on a node not in `not_on`.
pub async fn running_pod_named(client: &Client, name: &str, not_on: &[&str], timeout: Duration) -> Result<Pod> {
    let pods = Api::<Pod>::namespaced(client.clone(), "vm");
    wait::until(&format!("{name} Running, not on {not_on:?}"), timeout, || {
        let pods = pods.clone();
        async move {
            let Some(pod) = pods.get_opt(name).await? else {
                return Ok(None);
            };
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && pod.metadata.deletion_timestamp.is_none();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            Ok((running && !node.is_empty() && !not_on.contains(&node.as_str())).then_some(pod))
        }
    })
    .await
}

pub fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

/// GET http://127.0.0.1:<port>/metrics (None while it does not answer).
pub fn metrics(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    body.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_detector_keeps_the_patch_and_turns_the_detector_on() {
        let fast: serde_json::Value = serde_json::from_str(&with_detector(FAST_CONFIG)).expect("json");
        assert_eq!(fast["spec"]["peerDetection"], serde_json::json!({}));
        assert_eq!(fast["spec"]["apiCheckInterval"], "1s");
        assert_eq!(with_detector(SEED_TIMINGS_CONFIG), r#"{"spec":{"peerDetection":{}}}"#);
        assert_eq!(with_detector("not json"), "not json");
    }
}
