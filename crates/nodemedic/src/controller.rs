//! `nodemedic-controller` (or `nodemedic controller`): every operator in one process, each can be switched off, behind
//! leader election so two replicas can run and exactly one acts.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};
use nodemedic_kube::{
    events::Events,
    leader, metrics_server,
    shutdown::StopSignal,
    webhook::{self, certs::San},
};
use prometheus_client::registry::Registry;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Operator {
    HealthCheck,
    SelfRemediation,
    FenceAgents,
    Maintenance,
    MachineDeletion,
    Descheduler,
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// The namespace nodemedic runs in (its leader-election lease lives there).
    #[arg(long, env = "POD_NAMESPACE", default_value = nodemedic_api::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Where /metrics is served, with /healthz and /readyz unless `--metrics-secure`.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind: SocketAddr,
    /// Serve /metrics over HTTPS (a certificate from nodemedic's CA, the Secret
    /// nodemedic-webhook-ca) to callers whose token the API server authenticates and who may
    /// `get` the path /metrics (the chart's ClusterRole nodemedic-metrics-reader); the probes
    /// then move to `--health-bind`.
    #[arg(long)]
    pub metrics_secure: bool,
    /// Where /healthz and /readyz are served (plain HTTP) with `--metrics-secure`.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_bind: SocketAddr,
    /// The Service Prometheus reaches the metrics through: its DNS names
    /// (<service>.<namespace>.svc) go into the metrics certificate, with the pod's IP.
    #[arg(long, default_value = "nodemedic-controller-metrics")]
    pub metrics_service: String,
    /// Each self-remediation agent serves its metrics over HTTPS (its peer certificate, callers
    /// authorized as for the controller's) on this port of its node; none when unset.
    #[arg(long)]
    pub agent_metrics_port: Option<u16>,
    /// Compete for the leader lease (turn off only for a single replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    #[arg(long, default_value = "nodemedic-controller")]
    pub lease_name: String,
    /// Seconds a leader's lease lasts without renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_seconds: u64,
    /// This replica's identity (defaults to the pod name or host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Operators not to run.
    #[arg(long = "disable", value_enum)]
    pub disabled: Vec<Operator>,
    /// The image the self-remediation agent DaemonSet runs.
    #[arg(
        long,
        env = "NODEMEDIC_AGENT_IMAGE",
        default_value = concat!("ghcr.io/nodemedic/nodemedic-agent:", env!("CARGO_PKG_VERSION"))
    )]
    pub agent_image: String,
    /// Where the fence agents (fence_redfish, fence_ipmilan, ...) are installed.
    #[arg(long, env = "NODEMEDIC_FENCE_AGENTS_DIR", default_value = nodemedic_fence_agents::agent::DEFAULT_DIR)]
    pub fence_agents_dir: std::path::PathBuf,
    /// The upstream descheduler image a KubeDescheduler runs.
    #[arg(
        long,
        env = "NODEMEDIC_DESCHEDULER_IMAGE",
        default_value = "registry.k8s.io/descheduler/descheduler:v0.36.0"
    )]
    pub descheduler_image: String,
    /// The Prometheus that KubeVirtRelieveAndMigrate and actual-utilization profiles query
    /// (with nodemedic's recording rules loaded), e.g. http://prometheus-operated.monitoring.svc:9090.
    #[arg(long)]
    pub descheduler_prometheus_url: Option<String>,
    /// PEM certificate authority of an https Prometheus, for the soft tainter.
    #[arg(long)]
    pub descheduler_prometheus_ca_file: Option<std::path::PathBuf>,
    /// An etcd member that runs outside the cluster's pods, on a node, as NODE=URL (its client
    /// URL, e.g. master-0=https://10.0.0.10:2379): the quorum guard asks it for its health
    /// before a control-plane node is remediated or maintained. Repeat, or separate with commas.
    /// Members kubeadm or OpenShift run as pods are found without it.
    #[arg(long, value_delimiter = ',')]
    pub etcd_member: Vec<nodemedic_kube::etcd::external::Endpoint>,
    /// A directory with etcd's CA (ca.crt) and a client certificate (tls.crt, tls.key), for
    /// https members.
    #[arg(long)]
    pub etcd_client_certificates: Option<std::path::PathBuf>,
    /// The descheduler image is OpenShift's build, with its KubevirtMigrationAware plugin.
    #[arg(long)]
    pub descheduler_kubevirt_migration_aware: bool,
    /// Where the agents' peer-detection reports are received (mutual TLS, leader only).
    #[arg(long, default_value = "0.0.0.0:9444")]
    pub peer_reports_bind: SocketAddr,
    /// The address the agents send their reports to (the pod IP); unset, no reports are
    /// received and the peer detector makes no node condition.
    #[arg(long, env = "POD_IP")]
    pub peer_reports_advertise: Option<std::net::IpAddr>,
    /// Label this namespace `pod-security.kubernetes.io/enforce=privileged` when nobody chose a
    /// Pod Security level for it: the self-remediation agents are privileged pods.
    #[arg(long)]
    pub label_namespace: bool,
    /// Logs as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Where the admission webhook listens (HTTPS, every replica); "" turns it off.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_bind: WebhookBind,
    /// The Service the API server calls the webhook through: its DNS names
    /// (<service>.<namespace>.svc) go into the serving certificate.
    #[arg(long, default_value = "nodemedic-controller-webhook")]
    pub webhook_service: String,
    /// The ValidatingWebhookConfiguration whose caBundle the controller keeps equal to its CA.
    #[arg(long, default_value = "nodemedic-admission")]
    pub webhook_configuration: String,
    /// More names (DNS or IP) for the serving certificate, e.g. 127.0.0.1 when the API server
    /// calls the webhook by URL on the same host. Repeat, or separate with commas.
    #[arg(long, value_delimiter = ',')]
    pub webhook_extra_san: Vec<San>,
    /// Serve the webhook with the certificate in this directory (tls.crt and tls.key, as OLM
    /// and cert-manager write them) and leave the configuration's caBundle to whoever writes
    /// it, instead of nodemedic's own CA.
    #[arg(long)]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
}

/// `--webhook-bind`: an address, or nothing for no webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WebhookBind(pub Option<SocketAddr>);

impl std::str::FromStr for WebhookBind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Ok(Self(None));
        }
        s.parse().map(|a| Self(Some(a))).map_err(|_| {
            format!("{s:?} is not an address and port like 0.0.0.0:9443; give \"\" to turn the webhook off")
        })
    }
}

/// Every operator's metrics, registered in one registry (the controller's /metrics).
pub struct OperatorMetrics {
    pub health: nodemedic_healthcheck::metrics::Metrics,
    pub self_remediation: nodemedic_self_remediation::manager::Metrics,
    pub fence_agents: nodemedic_fence_agents::controller::Metrics,
    pub maintenance: nodemedic_maintenance::controller::Metrics,
    pub machine_deletion: nodemedic_machine_deletion::controller::Metrics,
    pub descheduler: nodemedic_descheduler::controller::Metrics,
}

impl OperatorMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            health: nodemedic_healthcheck::metrics::Metrics::register(registry),
            self_remediation: nodemedic_self_remediation::manager::Metrics::register(registry),
            fence_agents: nodemedic_fence_agents::controller::Metrics::register(registry),
            maintenance: nodemedic_maintenance::controller::Metrics::register(registry),
            machine_deletion: nodemedic_machine_deletion::controller::Metrics::register(registry),
            descheduler: nodemedic_descheduler::controller::Metrics::register(registry),
        }
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "nodemedic".into());
    format!("{host}-{}", std::process::id())
}

pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    crate::process::run(args.log_json, |stop| controller(args, stop))
}

async fn controller(args: ControllerArgs, mut stop: StopSignal) -> anyhow::Result<()> {
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let config = nodemedic_kube::client::infer_config().await?;
    let client = nodemedic_kube::client::client(config.clone())?;

    let mut registry = Registry::default();
    let metrics = OperatorMetrics::register(&mut registry);
    let readiness = metrics_server::Readiness::default();
    let registry = Arc::new(registry);
    let bound = if args.metrics_secure {
        let certificate = metrics_server::ServingCertificate::FromCa {
            namespace: args.namespace.clone(),
            service: args.metrics_service.clone(),
            extra: args.peer_reports_advertise.map(San::Ip).into_iter().collect(),
        };
        metrics_server::spawn_secure(args.metrics_bind, registry, client.clone(), certificate);
        metrics_server::serve_probes(args.health_bind, readiness.clone()).await?
    } else {
        metrics_server::serve(args.metrics_bind, registry, readiness.clone()).await?
    };
    tracing::info!(%identity, probes = %bound, metrics = %args.metrics_bind, secure = args.metrics_secure, "nodemedic controller starting");
    // Before the election: admission must answer on every replica, also while leadership moves.
    if let Some(bind) = args.webhook_bind.0 {
        // Reads for a decision must end within the API server's webhook timeout (chart: 5 s).
        let reads = nodemedic_kube::client::fail_fast_client(config.clone(), Duration::from_secs(3))?;
        let settings = webhook::Settings {
            bind,
            namespace: args.namespace.clone(),
            service: args.webhook_service.clone(),
            configuration: args.webhook_configuration.clone(),
            extra_names: args.webhook_extra_san.clone(),
            certificate_dir: args.webhook_cert_dir.clone(),
        };
        webhook::spawn(
            client.clone(),
            settings,
            admission_routes(reads, &args.fence_agents_dir),
        );
    }
    // A standby may wait for the lease for as long as the leader lives; a stop ends the wait.
    let leadership = tokio::select! {
        leadership = lead(&args, &client, &identity, &readiness) => leadership?,
        () = shutdown(&mut stop) => return Ok(()),
    };
    let events = Events::new(client.clone(), "nodemedic-controller", Some(identity.clone()));
    let last_outage = leadership.as_ref().and_then(leader::Leadership::last_outage);
    let mut operators = spawn_operators(&args, &config, &client, metrics, &events, last_outage)?;
    match leadership {
        Some(mut leadership) => {
            tokio::select! {
                // A deposed leader that kept acting would be a second writer: stop at once.
                _ = async { leadership.is_leader.wait_for(|leads| !*leads).await.is_ok() } => {
                    let in_outage = leadership.last_outage().filter(|o| o.regained.is_none());
                    return Err(start_afresh(in_outage.map(|o| o.lost_after)));
                }
                done = operators.join_next() => anyhow::bail!("an operator stopped: {done:?}"),
                () = shutdown(&mut stop) => {}
            }
            // Hand the lease over now rather than a lease duration from now.
            operators.abort_all();
            leadership.step_down(Duration::from_secs(2)).await;
            Ok(())
        }
        None => tokio::select! {
            done = operators.join_next() => anyhow::bail!("an operator stopped: {done:?}"),
            () = shutdown(&mut stop) => Ok(()),
        },
    }
}

/// A deposed leader starts afresh in place: this program again, with the same arguments (and so
/// the same identity, which takes its own lease back at once), every task of the old run gone
/// with it. Exiting would leave the restart to the kubelet, whose back-off grows with each
/// restart: a leader that resigned in every long API outage would sit minutes in
/// CrashLoopBackOff once the server was back. `lost_after`: the outage it resigned in, handed to
/// the new run (see [`leader::LOST_AFTER_ENV`]). Returns only if it could not.
fn start_afresh(lost_after: Option<jiff::Timestamp>) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    tracing::warn!(
        ?lost_after,
        "lost the leader lease: starting afresh, so only the new leader acts"
    );
    let error = match std::env::current_exe() {
        Ok(program) => {
            let mut again = std::process::Command::new(program);
            again.args(std::env::args_os().skip(1));
            match lost_after {
                Some(t) => again.env(leader::LOST_AFTER_ENV, t.to_string()),
                None => again.env_remove(leader::LOST_AFTER_ENV),
            };
            again.exec()
        }
        Err(error) => error,
    };
    anyhow::anyhow!("lost the leader lease and could not start afresh ({error}); exiting so only the new leader acts")
}

/// Waits to lead when leader election is on (`None` when it is off); ready either way, since a
/// standby serves metrics and admission and waits its turn.
async fn lead(
    args: &ControllerArgs,
    client: &kube::Client,
    identity: &str,
    readiness: &metrics_server::Readiness,
) -> anyhow::Result<Option<leader::Leadership>> {
    if !args.leader_elect {
        readiness.set(true);
        return Ok(None);
    }
    // Set only by this program for its own next run (`start_afresh`).
    let lost_after = std::env::var(leader::LOST_AFTER_ENV)
        .ok()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let mut leadership = leader::elect(
        client.clone(),
        &args.namespace,
        &args.lease_name,
        identity,
        Duration::from_secs(args.lease_seconds),
        lost_after,
    );
    readiness.set(true);
    tracing::info!(lease = %args.lease_name, "waiting to lead");
    leadership
        .is_leader
        .wait_for(|leads| *leads)
        .await
        .context("leader election ended")?;
    tracing::info!("leading");
    Ok(Some(leadership))
}

type Operators = tokio::task::JoinSet<anyhow::Result<()>>;

/// Starts every operator not disabled, each in its own task.
fn spawn_operators(
    args: &ControllerArgs,
    config: &kube::Config,
    client: &kube::Client,
    metrics: OperatorMetrics,
    events: &Events,
    last_outage: Option<leader::LastOutage>,
) -> anyhow::Result<Operators> {
    let OperatorMetrics {
        health: health_metrics,
        self_remediation: snr_metrics,
        fence_agents: far_metrics,
        maintenance: nm_metrics,
        machine_deletion: mdr_metrics,
        descheduler: descheduler_metrics,
    } = metrics;
    let etcd = external_etcd(args)?;
    let mut operators = Operators::new();
    if !args.disabled.contains(&Operator::HealthCheck) {
        // As leader only: a check created by every replica would be created once anyway, but
        // the events would repeat.
        tokio::spawn(nodemedic_healthcheck::controller::default_check::create_until_done(
            client.clone(),
            args.namespace.clone(),
            events.clone(),
            Duration::from_secs(10),
        ));
        // An outage the election went through before this replica led: the health check's
        // watches never saw it, and must still not take the Unknowns it caused for dead nodes.
        let outage = last_outage.map(|o| (o.lost_after, o.regained));
        let run = nodemedic_healthcheck::controller::run(
            client.clone(),
            health_metrics,
            events.clone(),
            etcd.clone(),
            outage,
        );
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("health check: {e}")) });
    }
    if !args.disabled.contains(&Operator::SelfRemediation) {
        let settings = nodemedic_self_remediation::manager::Settings {
            namespace: args.namespace.clone(),
            agent_image: args.agent_image.clone(),
            peer_reports: args.peer_reports_advertise.map(|advertise| {
                nodemedic_self_remediation::manager::detection::Settings {
                    bind: args.peer_reports_bind,
                    advertise,
                }
            }),
            label_namespace: args.label_namespace,
            agent_metrics_port: args.agent_metrics_port,
        };
        let run = nodemedic_self_remediation::manager::run(client.clone(), settings, snr_metrics, events.clone());
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("self remediation: {e}")) });
    }
    if !args.disabled.contains(&Operator::FenceAgents) {
        let agents = nodemedic_fence_agents::agent::Agents::new(&args.fence_agents_dir);
        let run = nodemedic_fence_agents::controller::run(client.clone(), agents, far_metrics, events.clone());
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("fence agents: {e}")) });
    }
    if !args.disabled.contains(&Operator::Maintenance) {
        // Evictions must see a budget's 429 at once, not after the default client's retries.
        let evictions = nodemedic_kube::client::fail_fast_client(config.clone(), Duration::from_secs(10))?;
        let run = nodemedic_maintenance::controller::run(client.clone(), evictions, nm_metrics, events.clone(), etcd);
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("node maintenance: {e}")) });
    }
    if !args.disabled.contains(&Operator::MachineDeletion) {
        let run = nodemedic_machine_deletion::controller::run(client.clone(), mdr_metrics, events.clone());
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("machine deletion: {e}")) });
    }
    if !args.disabled.contains(&Operator::Descheduler) {
        spawn_descheduler(args, config, client, descheduler_metrics, events, &mut operators)?;
    }
    Ok(operators)
}

/// The etcd members `--etcd-member` configures, if any.
fn external_etcd(args: &ControllerArgs) -> anyhow::Result<Option<nodemedic_kube::etcd::External>> {
    if args.etcd_member.is_empty() {
        return Ok(None);
    }
    let external =
        nodemedic_kube::etcd::External::new(args.etcd_member.clone(), args.etcd_client_certificates.as_deref())
            .context("the external etcd members (--etcd-member)")?;
    Ok(Some(external))
}

fn spawn_descheduler(
    args: &ControllerArgs,
    config: &kube::Config,
    client: &kube::Client,
    metrics: nodemedic_descheduler::controller::Metrics,
    events: &Events,
    operators: &mut Operators,
) -> anyhow::Result<()> {
    let prometheus_ca = match &args.descheduler_prometheus_ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("reading --descheduler-prometheus-ca-file {}", path.display()))?,
        ),
        None => None,
    };
    let settings = nodemedic_descheduler::controller::Settings {
        image: args.descheduler_image.clone(),
        own_namespace: args.namespace.clone(),
        prometheus_url: args.descheduler_prometheus_url.clone().filter(|u| !u.is_empty()),
        prometheus_ca,
        kubevirt_migration_aware: args.descheduler_kubevirt_migration_aware,
    };
    let mut as_tainter = config.clone();
    as_tainter.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{}:{}",
        args.namespace,
        nodemedic_descheduler::controller::SOFT_TAINTER_ACCOUNT
    ));
    let tainter = nodemedic_kube::client::client(as_tainter)?;
    let run = nodemedic_descheduler::controller::run(client.clone(), tainter, settings, metrics, events.clone());
    operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("descheduler: {e}")) });
    Ok(())
}

fn admission_routes(reads: kube::Client, fence_agents_dir: &std::path::Path) -> Vec<webhook::Route> {
    use nodemedic_fence_agents::controller::admission as far;
    use nodemedic_healthcheck::controller::admission as nhc;
    use nodemedic_maintenance::controller::admission as nm;
    let agents = nodemedic_fence_agents::agent::Agents::new(fence_agents_dir);
    let far_reads = reads.clone();
    vec![
        webhook::Route::new(nm::PATH, move |request| nm::validate(reads.clone(), request)),
        webhook::Route::new(nhc::PATH, |request| std::future::ready(nhc::validate(&request))),
        webhook::Route::new(far::PATH, move |request| {
            far::validate(far_reads.clone(), agents.clone(), request)
        }),
    ]
}

async fn shutdown(stop: &mut StopSignal) {
    stop.received().await;
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        controller: ControllerArgs,
    }

    fn parse(args: &[&str]) -> Result<ControllerArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("nodemedic-controller").chain(args.iter().copied())).map(|c| c.controller)
    }

    #[test]
    fn the_webhook_serves_by_default_and_an_empty_bind_turns_it_off() {
        let defaults = parse(&[]).expect("defaults parse");
        assert_eq!(defaults.webhook_bind.0, Some("0.0.0.0:9443".parse().expect("addr")));
        assert_eq!(defaults.webhook_configuration, "nodemedic-admission");
        assert_eq!(parse(&["--webhook-bind", ""]).expect("parses").webhook_bind.0, None);
        let lab = parse(&[
            "--webhook-bind=127.0.0.1:0",
            "--webhook-extra-san=127.0.0.1,webhook.lab",
        ])
        .expect("parses");
        assert_eq!(lab.webhook_extra_san.len(), 2);
    }

    #[test]
    fn a_bad_webhook_flag_says_what_it_expects() {
        let error = parse(&["--webhook-bind", "9443"]).expect_err("refused").to_string();
        assert!(error.contains("like 0.0.0.0:9443"), "{error}");
        let error = parse(&["--webhook-extra-san", "Web_Hook"])
            .expect_err("refused")
            .to_string();
        assert!(error.contains("neither an IP address nor a DNS name"), "{error}");
    }

    /// The chart and the flags' defaults name the same objects and paths, so a default install
    /// serves what its configuration calls.
    #[test]
    fn the_chart_calls_what_the_controller_serves() {
        let rendered: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(include_str!("../../../deploy/nodemedic.yaml")).expect("the rendered chart");
        let defaults = parse(&[]).expect("defaults parse");
        let find = |kind: &str| {
            rendered
                .iter()
                .find(|d| d["kind"] == kind)
                .unwrap_or_else(|| panic!("the chart renders a {kind}"))
        };
        let configuration = find("ValidatingWebhookConfiguration");
        assert_eq!(
            configuration["metadata"]["name"],
            defaults.webhook_configuration.as_str()
        );
        let paths: Vec<&str> = configuration["webhooks"]
            .as_array()
            .expect("webhooks")
            .iter()
            .map(|w| {
                assert_eq!(w["clientConfig"]["service"]["name"], defaults.webhook_service.as_str());
                assert_eq!(
                    w["failurePolicy"], "Ignore",
                    "a down controller must not block a delete"
                );
                w["clientConfig"]["service"]["path"].as_str().expect("a path")
            })
            .collect();
        assert_eq!(
            paths,
            [
                nodemedic_maintenance::controller::admission::PATH,
                nodemedic_healthcheck::controller::admission::PATH,
                nodemedic_fence_agents::controller::admission::PATH
            ]
        );
        let role = rendered
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "nodemedic-controller")
            .expect("the controller's ClusterRole");
        let may_patch = role["rules"].as_array().expect("rules").iter().any(|r| {
            r["resources"] == serde_json::json!(["validatingwebhookconfigurations"])
                && r["resourceNames"] == serde_json::json!([defaults.webhook_configuration])
                && r["verbs"].as_array().is_some_and(|v| v.contains(&"patch".into()))
        });
        assert!(may_patch, "the controller may patch its ValidatingWebhookConfiguration");
    }
}
