//! The HTTP endpoint every nodemedic process serves: `/metrics` (OpenMetrics), `/healthz`,
//! `/readyz`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{encoding::text::encode, registry::Registry};

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

/// Binds `addr` and serves until the process ends. Returns the bound address (port 0 picks one).
pub async fn serve(addr: SocketAddr, registry: Arc<Registry>, readiness: Readiness) -> Result<SocketAddr> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Shared { registry, readiness });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve {
            what: "metrics",
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| Error::Serve {
        what: "metrics",
        source,
    })?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics endpoint stopped");
        }
    });
    Ok(bound)
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &shared.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            "encoding failed".into(),
        ),
    }
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.readiness.get() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
