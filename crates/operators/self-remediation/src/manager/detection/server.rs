//! The controller's end of the agents' reports: a mutual-TLS server whose certificate the peer
//! CA signs, so an agent knows it reports to nodemedic, and the controller knows from the
//! agent's own certificate which node a report comes from.

use std::{net::SocketAddr, sync::Arc};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use nodemedic_kube::{CallContext, pki::Authority};
use nodemedic_peer_detection::Report;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::{
    Request, Response, Status,
    transport::{Certificate, Identity, Server, ServerTlsConfig},
};

use crate::{
    Error, Result,
    agent::peers::{
        caller,
        wire::detection::{ReportAck, ReportBatch, peer_reports_server},
    },
    identity::{CA_CONFIGMAP, REPORTS_ENDPOINT_KEY, REPORTS_SERVER_NAME},
};

/// One batch, as received: from which observer, and when on the controller's clock.
pub(super) struct Received {
    pub observer: String,
    pub reports: Vec<Report>,
    pub at: Timestamp,
}

struct Receiver {
    batches: mpsc::Sender<Received>,
}

#[tonic::async_trait]
impl peer_reports_server::PeerReports for Receiver {
    async fn report(&self, request: Request<ReportBatch>) -> Result<Response<ReportAck>, Status> {
        let observer = caller(&request)?;
        let at = Timestamp::now();
        let mut reports = Vec::new();
        for report in request.into_inner().reports {
            let since = match report.since_unix_ms {
                Some(ms) => Some(
                    Timestamp::from_millisecond(ms)
                        .map_err(|e| Status::invalid_argument(format!("since_unix_ms: {e}")))?,
                ),
                None => None,
            };
            reports.push(Report {
                subject: report.subject,
                since,
            });
        }
        self.batches
            .send(Received { observer, reports, at })
            .await
            .map_err(|_| Status::unavailable("the controller is stopping"))?;
        Ok(Response::new(ReportAck {}))
    }
}

/// Listens on `bind`, publishes `advertise` (with the port bound) for the agents, and serves
/// until the process ends; batches go to `batches`.
pub(super) async fn serve(
    client: &Client,
    namespace: &str,
    authority: &Arc<Authority>,
    bind: SocketAddr,
    advertise: std::net::IpAddr,
    batches: mpsc::Sender<Received>,
) -> Result<()> {
    let leaf = authority
        .issue(&nodemedic_kube::pki::Leaf {
            common_name: REPORTS_SERVER_NAME.into(),
            dns_names: vec![REPORTS_SERVER_NAME.into()],
            server: true,
            valid_days: 365,
            ..Default::default()
        })
        .map_err(|e| Error::Certificate(e.to_string()))?;
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&leaf.cert, &leaf.key))
        .client_ca_root(Certificate::from_pem(&authority.pem().cert));
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|source| listen_error(bind, source))?;
    let port = listener
        .local_addr()
        .map_err(|source| listen_error(bind, source))?
        .port();
    let endpoint = SocketAddr::new(advertise, port).to_string();
    let patch = json!({"data": {REPORTS_ENDPOINT_KEY: endpoint}});
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(CA_CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("publishing the peer-report endpoint in ConfigMap {namespace}/{CA_CONFIGMAP}"))?;
    tracing::info!(%endpoint, "receiving peer-detection reports");
    Server::builder()
        .tls_config(tls)?
        .add_service(peer_reports_server::PeerReportsServer::new(Receiver { batches }))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await?;
    Ok(())
}

fn listen_error(address: SocketAddr, source: std::io::Error) -> Error {
    Error::Listen {
        what: "the peer-report server (--peer-reports-bind)",
        address,
        source,
    }
}
