//! The agent's metrics (served with `--metrics-bind`).

use std::{net::SocketAddr, sync::Arc};

use nodemedic_kube::{
    metrics_server::{self, ServingCertificate},
    pki::Pem,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{Result, protocol::agent::Verdict};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone)]
pub struct Metrics {
    pub(super) api_checks: Family<ResultLabels, Counter>,
    pub(super) vote_rounds: Family<ResultLabels, Counter>,
    votes_cast: Family<ResultLabels, Counter>,
    pub(super) endpoint_checks: Family<ResultLabels, Counter>,
    feeding: Gauge,
    fenced: Gauge,
    pub(super) epoch: Gauge,
    feed_gaps: Histogram,
}

/// Gaps between watchdog feeds, in seconds: the feed interval is at most 1 s and the shortest
/// timeout nodemedic programs is 2 s, so the upper buckets show how close a node came to a reset.
const FEED_GAP_BUCKETS: [f64; 9] = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0];

impl Default for Metrics {
    fn default() -> Self {
        Self {
            api_checks: Family::default(),
            vote_rounds: Family::default(),
            votes_cast: Family::default(),
            endpoint_checks: Family::default(),
            feeding: Gauge::default(),
            fenced: Gauge::default(),
            epoch: Gauge::default(),
            feed_gaps: Histogram::new(FEED_GAP_BUCKETS),
        }
    }
}

impl Metrics {
    pub(crate) fn set_feeding(&self, on: bool) {
        self.feeding.set(on as i64);
    }
    pub(crate) fn fed_after(&self, gap: std::time::Duration) {
        self.feed_gaps.observe(gap.as_secs_f64());
    }
    pub fn fenced(&self) {
        self.fenced.set(1);
    }
    pub(crate) fn vote_cast(&self, v: &Verdict) {
        let result = match v {
            Verdict::Granted => "granted",
            Verdict::Remediating => "remediating",
            Verdict::NotReady => "not_ready",
            Verdict::Stale(_) => "stale",
        };
        self.votes_cast.get_or_create(&ResultLabels { result }).inc();
    }
    pub(super) fn count(family: &Family<ResultLabels, Counter>, result: &'static str) {
        family.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn register(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "nodemedic_agent_api_checks",
            "Licence checks against the API server, by result",
            m.api_checks.clone(),
        );
        registry.register(
            "nodemedic_agent_vote_rounds",
            "Vote rounds asked of the peers, by result",
            m.vote_rounds.clone(),
        );
        registry.register(
            "nodemedic_agent_votes_cast",
            "Votes this agent gave its peers, by verdict",
            m.votes_cast.clone(),
        );
        registry.register(
            "nodemedic_agent_endpoint_checks",
            "Probes of endpointHealthCheckUrl after a failed API check (diagnostic only), by result",
            m.endpoint_checks.clone(),
        );
        registry.register(
            "nodemedic_agent_feeding",
            "1 while the agent holds a licence and feeds its watchdog",
            m.feeding.clone(),
        );
        registry.register(
            "nodemedic_agent_watchdog_feed_gap_seconds",
            "Time between consecutive watchdog feeds while the agent held its licence",
            m.feed_gaps.clone(),
        );
        registry.register(
            "nodemedic_agent_fenced",
            "1 once the agent fenced its node",
            m.fenced.clone(),
        );
        registry.register(
            "nodemedic_agent_membership_epoch",
            "The membership epoch this agent counts votes in",
            m.epoch.clone(),
        );
    }
}

/// Serves the metrics on `bind`: over plain HTTP, or (`secure`) over HTTPS with the agent's
/// peer certificate to callers the API server authorizes.
pub(super) async fn serve(bind: SocketAddr, m: &Metrics, secure: Option<(kube::Client, Pem)>) -> Result<()> {
    let mut registry = Registry::default();
    m.register(&mut registry);
    let registry = Arc::new(registry);
    match secure {
        Some((client, certificate)) => {
            metrics_server::spawn_secure(bind, registry, client, ServingCertificate::Given(certificate));
        }
        None => {
            let readiness = metrics_server::Readiness::default();
            readiness.set(true);
            metrics_server::serve(bind, registry, readiness).await?;
        }
    }
    Ok(())
}
