//! Sends an observer's reports to the leading controller, at the address it publishes in the
//! peer CA ConfigMap, over mutual TLS with the agent's own certificate.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use nodemedic_peer_detection::Report;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::{
    agent::peers::wire::detection::{ReportBatch, Unreachable, peer_reports_client::PeerReportsClient},
    identity::{CA_CONFIGMAP, PeerIdentity, REPORTS_ENDPOINT_KEY, REPORTS_SERVER_NAME},
};

/// How long one batch may take; a report is refreshed every second anyway.
const SEND_WITHIN: Duration = Duration::from_secs(1);
/// How often the controller's address is looked up again while sending fails.
const LOOKUP_EVERY: Duration = Duration::from_secs(2);

/// Starts the sender; batches queue on the returned channel.
pub(super) fn spawn(
    identity: PeerIdentity,
    client: kube::Client,
    namespace: String,
) -> mpsc::UnboundedSender<Vec<Report>> {
    let (sender, mut batches) = mpsc::unbounded_channel::<Vec<Report>>();
    tokio::spawn(async move {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&identity.ca_pem))
            .identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem))
            .domain_name(REPORTS_SERVER_NAME);
        let configmaps = Api::<ConfigMap>::namespaced(client, &namespace);
        let mut controller: Option<(String, PeerReportsClient<Channel>)> = None;
        let mut looked_up: Option<Instant> = None;
        while let Some(batch) = batches.recv().await {
            if controller.is_none() && looked_up.is_none_or(|at| at.elapsed() >= LOOKUP_EVERY) {
                looked_up = Some(Instant::now());
                controller = lookup(&configmaps, &tls).await;
            }
            let Some((address, client)) = controller.as_mut() else {
                tracing::warn!(
                    reports = batch.len(),
                    "no controller address for peer reports yet; dropped"
                );
                continue;
            };
            let batch = ReportBatch {
                reports: batch
                    .into_iter()
                    .map(|r| Unreachable {
                        subject: r.subject,
                        since_unix_ms: r.since.map(|t| t.as_millisecond()),
                    })
                    .collect(),
            };
            match tokio::time::timeout(SEND_WITHIN, client.report(batch)).await {
                Ok(Ok(_)) => {}
                outcome => {
                    let why = match outcome {
                        Ok(Err(status)) => status.to_string(),
                        _ => "timed out".into(),
                    };
                    tracing::warn!(controller = %address, %why, "peer report not delivered; looking the controller up again");
                    controller = None;
                }
            }
        }
    });
    sender
}

async fn lookup(configmaps: &Api<ConfigMap>, tls: &ClientTlsConfig) -> Option<(String, PeerReportsClient<Channel>)> {
    let published = configmaps.get(CA_CONFIGMAP).await.ok()?;
    let address = published.data?.get(REPORTS_ENDPOINT_KEY)?.clone();
    let endpoint = Endpoint::from_shared(format!("https://{address}"))
        .ok()?
        .tls_config(tls.clone())
        .ok()?
        .connect_timeout(SEND_WITHIN);
    Some((address, PeerReportsClient::new(endpoint.connect_lazy())))
}
