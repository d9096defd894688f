//! The peer protocol over mutual TLS: answering votes (and medik8s's IsHealthy), and asking for
//! them.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tonic::{
    Request, Response, Status,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig},
};

use crate::{
    identity::{PeerIdentity, certificate_node},
    protocol::{agent::Verdict, membership::Configuration},
};

// tonic's generated code says `pub` throughout.
#[allow(unreachable_pub)]
pub(crate) mod wire {
    pub(crate) mod health {
        tonic::include_proto!("selfnoderemediation.health");
    }
    pub(crate) mod licence {
        tonic::include_proto!("nodemedic.licence.v1");
    }
    pub(crate) mod detection {
        tonic::include_proto!("nodemedic.detection.v1");
    }
}

use wire::{
    health::{HealthRequest, HealthResponse, peer_health_server},
    licence::{self as proto, VoteRequest, VoteResponse, licence_client::LicenceClient, licence_server},
};

pub(crate) type Shared = Arc<super::shared::SharedState>;

/// Counts what the server did, for metrics.
pub(crate) type OnVote = Arc<dyn Fn(&Verdict) + Send + Sync>;

struct Voter {
    node: String,
    state: Shared,
    on_vote: OnVote,
}

fn to_wire(v: Verdict, voter: String) -> VoteResponse {
    let (verdict, configuration) = match v {
        Verdict::Granted => (proto::Verdict::Granted, None),
        Verdict::Remediating => (proto::Verdict::Remediating, None),
        Verdict::NotReady => (proto::Verdict::NotReady, None),
        Verdict::Stale(c) => (proto::Verdict::Stale, Some(c)),
    };
    let configuration = configuration.unwrap_or_default();
    VoteResponse {
        verdict: verdict as i32,
        voter,
        epoch: configuration.epoch,
        members: configuration.members.into_iter().collect(),
    }
}

fn from_wire(answer: VoteResponse) -> Option<Verdict> {
    match proto::Verdict::try_from(answer.verdict).ok()? {
        proto::Verdict::Granted => Some(Verdict::Granted),
        proto::Verdict::Remediating => Some(Verdict::Remediating),
        proto::Verdict::NotReady => Some(Verdict::NotReady),
        proto::Verdict::Stale => Some(Verdict::Stale(Configuration::new(answer.epoch, answer.members))),
        proto::Verdict::Unspecified => None,
    }
}

/// The node the caller's client certificate names.
pub(crate) fn caller<T>(request: &Request<T>) -> Result<String, Status> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
    certs
        .first()
        .and_then(|c| certificate_node(c.as_ref()))
        .ok_or_else(|| Status::unauthenticated("the client certificate names no single node"))
}

#[tonic::async_trait]
impl licence_server::Licence for Voter {
    async fn vote(&self, request: Request<VoteRequest>) -> Result<Response<VoteResponse>, Status> {
        let certified = caller(&request)?;
        let asker = &request.get_ref().node;
        if &certified != asker {
            return Err(Status::permission_denied(format!(
                "the client certificate names {certified}, not {asker}"
            )));
        }
        // A boot time that is no valid moment is an unknown one: the voter then answers as
        // for a boot before any remediation.
        let booted = request
            .get_ref()
            .booted_unix_ms
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok());
        let verdict = self
            .state
            .lock()
            .map_err(|_| Status::internal("state poisoned"))?
            .vote_for(asker, request.get_ref().epoch, booted);
        (self.on_vote)(&verdict);
        Ok(Response::new(to_wire(verdict, self.node.clone())))
    }
}

#[tonic::async_trait]
impl peer_health_server::PeerHealth for Voter {
    /// medik8s semantics: 1 Healthy, 2 Unhealthy (remediation seen), 3 ApiError (cannot tell).
    async fn is_healthy(&self, request: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        caller(&request)?;
        let node = &request.get_ref().node_name;
        if node.is_empty() {
            return Err(Status::invalid_argument("nodeName is empty"));
        }
        // medik8s's question has no epoch: whether this agent knows a remediation of the node.
        let status = match self
            .state
            .lock()
            .map_err(|_| Status::internal("state poisoned"))?
            .vote_for(node, u64::MAX, None)
        {
            Verdict::Granted | Verdict::Stale(_) => 1,
            Verdict::Remediating => 2,
            Verdict::NotReady => 3,
        };
        Ok(Response::new(HealthResponse { status }))
    }
}

/// Serves votes, and the detector's messages and probes, on `addr` until the process ends.
pub(crate) async fn serve(
    addr: SocketAddr,
    identity: &PeerIdentity,
    state: Shared,
    on_vote: OnVote,
    detector: super::detector::Inbound,
) -> Result<(), tonic::transport::Error> {
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem))
        .client_ca_root(Certificate::from_pem(&identity.ca_pem));
    let voter = Arc::new(Voter {
        node: identity.node.clone(),
        state,
        on_vote,
    });
    Server::builder()
        .tls_config(tls)?
        .timeout(Duration::from_secs(5))
        .add_service(licence_server::LicenceServer::from_arc(voter.clone()))
        .add_service(peer_health_server::PeerHealthServer::from_arc(voter))
        .add_service(wire::detection::swim_server::SwimServer::new(detector))
        .serve(addr)
        .await
}

/// Asks every peer `(node, "ip:port")` for its vote in `epoch`, each within `dial + request`;
/// peers that do not answer in time simply do not count. Each answer comes with the node whose
/// server certificate answered it.
pub(crate) async fn ask(
    me: &PeerIdentity,
    booted: Option<jiff::Timestamp>,
    peers: &[(String, String)],
    epoch: u64,
    dial: Duration,
    request: Duration,
) -> Vec<(String, Verdict)> {
    let asks = peers.iter().map(|(node, address)| async move {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&me.ca_pem))
            .identity(Identity::from_pem(&me.cert_pem, &me.key_pem))
            .domain_name(node.clone());
        let endpoint = Endpoint::from_shared(format!("https://{address}"))
            .ok()?
            .tls_config(tls)
            .ok()?
            .connect_timeout(dial)
            .timeout(request);
        let channel = tokio::time::timeout(dial, endpoint.connect()).await.ok()?.ok()?;
        let answer = LicenceClient::new(channel)
            .vote(VoteRequest {
                node: me.node.clone(),
                epoch,
                booted_unix_ms: booted.map(|b| b.as_millisecond()),
            })
            .await
            .ok()?;
        from_wire(answer.into_inner()).map(|v| (node.clone(), v))
    });
    gather(
        asks,
        tokio::time::Instant::now() + dial + request + Duration::from_millis(200),
    )
    .await
}

/// The answers that came by `deadline`: a peer still dialling or answering then costs its own
/// vote only, never the votes already in (on a loaded node one slow handshake would otherwise
/// make a round with a majority of grants count none, and lose a healthy node its licence).
async fn gather<T>(
    asks: impl IntoIterator<Item = impl std::future::Future<Output = Option<T>>>,
    deadline: tokio::time::Instant,
) -> Vec<T> {
    use futures::StreamExt;
    let mut pending: futures::stream::FuturesUnordered<_> = asks.into_iter().collect();
    let mut answers = Vec::new();
    while let Ok(Some(answer)) = tokio::time::timeout_at(deadline, pending.next()).await {
        answers.extend(answer);
    }
    answers
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::gather;

    #[tokio::test(start_paused = true)]
    async fn a_peer_still_answering_at_the_deadline_costs_only_its_own_vote() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(2700);
        let prompt = |vote: &'static str, after: u64| async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            Some(vote)
        };
        let asks = vec![
            Box::pin(prompt("granted by node-2", 300)) as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>,
            Box::pin(async { None }),
            Box::pin(prompt("too late from node-4", 60_000)),
            Box::pin(prompt("granted by node-3", 2600)),
        ];
        let started = tokio::time::Instant::now();
        let answers = gather(asks, deadline).await;
        assert_eq!(answers, ["granted by node-2", "granted by node-3"]);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(2700),
            "waited for the slow peer until the deadline only"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_ends_as_soon_as_every_peer_answered() {
        let started = tokio::time::Instant::now();
        let asks = [1u64, 2].map(|n| async move {
            tokio::time::sleep(Duration::from_millis(100 * n)).await;
            Some(n)
        });
        let answers = gather(asks, started + Duration::from_secs(3)).await;
        assert_eq!(answers, [1, 2]);
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }
}
