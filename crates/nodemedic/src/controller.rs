//! `nodemedic-controller` (or `nodemedic controller`): every operator in one process, each can be switched off, behind
//! leader election so two replicas can run and exactly one acts.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};
use nodemedic_kube::{events::Events, leader, metrics_server};
use prometheus_client::registry::Registry;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Operator {
    HealthCheck,
    SelfRemediation,
    FenceAgents,
    Maintenance,
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// The namespace nodemedic runs in (its leader-election lease lives there).
    #[arg(long, env = "POD_NAMESPACE", default_value = nodemedic_api::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind: SocketAddr,
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
    /// Logs as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

/// Every operator's metrics, registered in one registry (the controller's /metrics).
pub struct OperatorMetrics {
    pub health: nodemedic_healthcheck::metrics::Metrics,
    pub self_remediation: nodemedic_self_remediation::manager::Metrics,
    pub fence_agents: nodemedic_fence_agents::controller::Metrics,
    pub maintenance: nodemedic_maintenance::controller::Metrics,
}

impl OperatorMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            health: nodemedic_healthcheck::metrics::Metrics::register(registry),
            self_remediation: nodemedic_self_remediation::manager::Metrics::register(registry),
            fence_agents: nodemedic_fence_agents::controller::Metrics::register(registry),
            maintenance: nodemedic_maintenance::controller::Metrics::register(registry),
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
    crate::process::run(args.log_json, controller(args))
}

async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let config = nodemedic_kube::client::infer_config().await?;
    // Evictions must see a budget's 429 at once, not after the default client's retries.
    let evictions = nodemedic_kube::client::fail_fast_client(config.clone(), Duration::from_secs(10))?;
    let client = nodemedic_kube::client::client(config)?;

    let mut registry = Registry::default();
    let OperatorMetrics {
        health: health_metrics,
        self_remediation: snr_metrics,
        fence_agents: far_metrics,
        maintenance: nm_metrics,
    } = OperatorMetrics::register(&mut registry);
    let readiness = metrics_server::Readiness::default();
    let bound = metrics_server::serve(args.metrics_bind, Arc::new(registry), readiness.clone()).await?;
    tracing::info!(%identity, metrics = %bound, "nodemedic controller starting");

    let leadership = if args.leader_elect {
        let mut leadership = leader::elect(
            client.clone(),
            &args.namespace,
            &args.lease_name,
            &identity,
            Duration::from_secs(args.lease_seconds),
        )
        .await
        .context("starting leader election")?;
        // A standby is ready too: it serves metrics and waits its turn.
        readiness.set(true);
        tracing::info!(lease = %args.lease_name, "waiting to lead");
        leadership
            .is_leader
            .wait_for(|leads| *leads)
            .await
            .context("leader election ended")?;
        tracing::info!("leading");
        Some(leadership)
    } else {
        readiness.set(true);
        None
    };

    let events = Events::new(client.clone(), "nodemedic-controller", Some(identity.clone()));
    let mut operators = tokio::task::JoinSet::new();
    if !args.disabled.contains(&Operator::HealthCheck) {
        let run = nodemedic_healthcheck::controller::run(client.clone(), health_metrics, events.clone());
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("health check: {e}")) });
    }
    if !args.disabled.contains(&Operator::SelfRemediation) {
        let settings = nodemedic_self_remediation::manager::Settings {
            namespace: args.namespace.clone(),
            agent_image: args.agent_image.clone(),
        };
        let client = client.clone();
        let events = events.clone();
        operators.spawn(async move {
            nodemedic_self_remediation::manager::run(client, settings, snr_metrics, events)
                .await
                .map_err(|e| anyhow::anyhow!("self remediation: {e}"))
        });
    }
    if !args.disabled.contains(&Operator::FenceAgents) {
        let agents = nodemedic_fence_agents::agent::Agents::new(&args.fence_agents_dir);
        let run = nodemedic_fence_agents::controller::run(client.clone(), agents, far_metrics, events.clone());
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("fence agents: {e}")) });
    }
    if !args.disabled.contains(&Operator::Maintenance) {
        let run = nodemedic_maintenance::controller::run(client.clone(), evictions, nm_metrics, events.clone());
        operators.spawn(async move { run.await.map_err(|e| anyhow::anyhow!("node maintenance: {e}")) });
    }
    match leadership {
        Some(mut leadership) => {
            tokio::select! {
                // A deposed leader that kept acting would be a second writer: stop at once.
                _ = leadership.is_leader.wait_for(|leads| !*leads) => anyhow::bail!("lost the leader lease; exiting so only the new leader acts"),
                done = operators.join_next() => anyhow::bail!("an operator stopped: {done:?}"),
                _ = shutdown() => Ok(()),
            }
        }
        None => tokio::select! {
            done = operators.join_next() => anyhow::bail!("an operator stopped: {done:?}"),
            _ = shutdown() => Ok(()),
        },
    }
}

async fn shutdown() {
    nodemedic_kube::shutdown::signal().await;
    tracing::info!("shutting down");
}
