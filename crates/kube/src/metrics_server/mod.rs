//! The endpoints every nodemedic process serves: `/metrics` (OpenMetrics), `/healthz`,
//! `/readyz`. Either all three over plain HTTP on one port, or the probes over plain HTTP (the
//! kubelet needs no certificate for them, and they must answer while the API server, and so the
//! certificate, is out of reach) and `/metrics` over HTTPS to callers the API server
//! authenticates and authorizes ([`access`]).

mod access;
mod secure;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{encoding::text::encode, registry::Registry};

pub use secure::{ServingCertificate, spawn_secure};

use crate::{Error, Result};

/// Flipped to true once the process does its job (for a controller: it leads, or stands by).
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct Shared {
    registry: Arc<Registry>,
    readiness: Readiness,
}

/// Binds `addr` and serves `/metrics` and the probes over plain HTTP until the process ends.
/// Returns the bound address (port 0 picks one).
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>, readiness: Readiness) -> Result<SocketAddr> {
    let app = probes()
        .route("/metrics", get(metrics))
        .with_state(Shared { registry, readiness });
    serve_plain("metrics", addr, app).await
}

/// Binds `addr` and serves the probes alone over plain HTTP (metrics go over HTTPS, see
/// [`spawn_secure`]).
pub async fn serve_probes(addr: SocketAddr, readiness: Readiness) -> Result<SocketAddr> {
    let app = probes().with_state(Shared {
        registry: Arc::new(Registry::default()),
        readiness,
    });
    serve_plain("health probes", addr, app).await
}

fn probes() -> Router<Shared> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
}

async fn serve_plain(what: &'static str, addr: SocketAddr, app: Router) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve { what, source })?;
    let bound = listener.local_addr().map_err(|source| Error::Serve { what, source })?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "{what} endpoint stopped");
        }
    });
    Ok(bound)
}

async fn metrics(State(shared): State<Shared>) -> Response {
    encoded(&shared.registry)
}

fn encoded(registry: &Registry) -> Response {
    let mut body = String::new();
    match encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            "encoding failed",
        )
            .into_response(),
    }
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.readiness.get() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
