//! `/metrics` over HTTPS, for callers the API server vouches for ([`super::access`]).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use kube::Client;
use prometheus_client::registry::Registry;

use super::access::{Decision, Guard};
use crate::{
    Result,
    pki::Pem,
    tls,
    webhook::certs::{self, San},
};

/// How often the certificate is looked at again (the CA changed, renewal is due), and how long
/// to wait before trying again when it cannot be had.
const REFRESH: Duration = Duration::from_secs(60);
const PATH: &str = "/metrics";

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum ServingCertificate {
    /// Issued by nodemedic's CA (the Secret `nodemedic-webhook-ca` in `namespace`, which the
    /// admission webhook's certificates chain to as well) for the Service `service`'s in-cluster
    /// names and `extra`, and renewed like the webhook's.
    FromCa {
        namespace: String,
        service: String,
        extra: Vec<San>,
    },
    /// One the process already holds (an agent's peer certificate).
    Given(Pem),
}

#[derive(Clone)]
struct Shared {
    registry: Arc<Registry>,
    guard: Arc<Guard>,
}

/// Serves `/metrics` on `addr` over HTTPS in the background, once it has a certificate; says in
/// the log what keeps it from serving and tries again, never stopping the process.
pub fn spawn_secure(addr: SocketAddr, registry: Arc<Registry>, client: Client, certificate: ServingCertificate) {
    tokio::spawn(run(addr, registry, client, certificate));
}

async fn run(addr: SocketAddr, registry: Arc<Registry>, client: Client, source: ServingCertificate) {
    let certificate = Arc::new(tls::Certificate::default());
    let mut keeper = Keeper {
        client: client.clone(),
        source,
        certificate: certificate.clone(),
        issued: None,
    };
    while let Err(error) = keeper.refresh().await {
        tracing::warn!(%error, "metrics: no serving certificate yet; trying again");
        tokio::time::sleep(REFRESH).await;
    }
    let listener = loop {
        match tls::bind("metrics", addr, certificate.clone()).await {
            Ok(listener) => break listener,
            Err(error) => {
                tracing::error!(%error, bind = %addr, "metrics: cannot listen; trying again");
                tokio::time::sleep(REFRESH).await;
            }
        }
    };
    tracing::info!(bind = %addr, "metrics served over HTTPS to authorized callers");
    let app = Router::new().route(PATH, get(guarded)).with_state(Shared {
        registry,
        guard: Arc::new(Guard::new(client)),
    });
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics endpoint stopped");
        }
    });
    loop {
        tokio::time::sleep(REFRESH).await;
        if let Err(error) = keeper.refresh().await {
            tracing::warn!(%error, "metrics: keeping the serving certificate failed; trying again");
        }
    }
}

async fn guarded(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match shared.guard.decide(authorization, PATH).await {
        Decision::Allowed => super::encoded(&shared.registry),
        Decision::Unauthenticated(why) => {
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], why).into_response()
        }
        Decision::Forbidden(why) => (StatusCode::FORBIDDEN, why).into_response(),
        Decision::Unavailable(why) => {
            tracing::warn!(%why, "metrics: could not check a caller");
            (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
        }
    }
}

struct Keeper {
    client: Client,
    source: ServingCertificate,
    certificate: Arc<tls::Certificate>,
    /// The CA the current certificate was issued under, and when.
    issued: Option<(String, tokio::time::Instant)>,
}

impl Keeper {
    async fn refresh(&mut self) -> Result<()> {
        match &self.source {
            ServingCertificate::Given(pem) => {
                if self.issued.is_none() {
                    self.certificate.set(pem)?;
                    self.issued = Some((String::new(), tokio::time::Instant::now()));
                }
            }
            ServingCertificate::FromCa {
                namespace,
                service,
                extra,
            } => {
                let ca = certs::authority(&self.client, namespace).await?;
                let serving_ca = self.issued.as_ref().map(|(ca, _)| ca.as_str());
                let age = self.issued.as_ref().map(|(_, at)| at.elapsed());
                if certs::reissue(serving_ca, &ca.cert, age) {
                    let (dns, ips) = certs::serving_names(service, namespace, extra);
                    self.certificate.set(&certs::serving(&ca, &dns, &ips)?)?;
                    tracing::info!(?dns, ?ips, "metrics: issued a serving certificate");
                    self.issued = Some((ca.cert.clone(), tokio::time::Instant::now()));
                }
            }
        }
        Ok(())
    }
}
