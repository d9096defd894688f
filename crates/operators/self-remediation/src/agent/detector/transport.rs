//! The detector's wire: each SWIM message is one unary call on the agents' mutual-TLS channel,
//! so only cluster members can speak, and a message must come from the node that sends it. The
//! receiver's answers to the caller (a ping's ack) ride back in the call's response: half the
//! calls at rest.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use foca::Codec;
use jiff::Timestamp;
use nodemedic_peer_detection::{DetectorSettings, swim::Peer};
use tokio::sync::{mpsc, oneshot};
use tonic::{
    Request, Response, Status,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use crate::{
    agent::peers::{
        caller,
        wire::detection::{Datagram, Delivered, ProbeReply, ProbeRequest, swim_client::SwimClient, swim_server},
    },
    identity::PeerIdentity,
};

/// How long a delivery waits for the detector's answers to its caller before it returns
/// without them (they then go by their own calls).
const REPLIES_WITHIN: Duration = Duration::from_millis(100);

/// A SWIM message received from `from`, and where the detector's answers to `from` go (`None`:
/// by their own calls).
pub(crate) struct Received {
    pub data: Vec<u8>,
    pub from: String,
    pub replies: Option<oneshot::Sender<Vec<Vec<u8>>>>,
}

/// The agent's end of the detector's messages (its peer server's `Swim` service).
pub(crate) struct Inbound {
    pub node: String,
    /// Where messages go; `None` when the detector is off (probes are still answered).
    pub messages: Option<mpsc::Sender<Received>>,
}

/// The sending node named in a SWIM message's header.
fn sender_of(data: &[u8]) -> Result<String, Status> {
    let header = foca::PostcardCodec
        .decode_header(data)
        .map_err(|e| Status::invalid_argument(format!("not a detector message: {e}")))?;
    let sender: Peer = header.src;
    Ok(sender.node)
}

#[tonic::async_trait]
impl swim_server::Swim for Inbound {
    async fn deliver(&self, request: Request<Datagram>) -> Result<Response<Delivered>, Status> {
        let certified = caller(&request)?;
        let data = request.into_inner().data;
        let sender = sender_of(&data)?;
        if sender != certified {
            return Err(Status::permission_denied(format!(
                "the client certificate names {certified}, the message {sender}"
            )));
        }
        let mut replies = Vec::new();
        if let Some(messages) = &self.messages {
            let (reply, answers) = oneshot::channel();
            let received = Received {
                data,
                from: sender,
                replies: Some(reply),
            };
            // A full queue drops the message, as a congested network would.
            if messages.try_send(received).is_ok()
                && let Ok(Ok(answers)) = tokio::time::timeout(REPLIES_WITHIN, answers).await
            {
                replies = answers;
            }
        }
        Ok(Response::new(Delivered { replies }))
    }

    async fn probe(&self, request: Request<ProbeRequest>) -> Result<Response<ProbeReply>, Status> {
        caller(&request)?;
        Ok(Response::new(ProbeReply {
            node: self.node.clone(),
        }))
    }
}

/// Clients to the other agents, one kept-alive channel each.
pub(super) struct Transport {
    /// The detector's own inbound queue, for the answers that come back in responses.
    local: mpsc::Sender<Received>,
    tls: ClientTlsConfig,
    settings: DetectorSettings,
    addresses: BTreeMap<String, String>,
    clients: HashMap<String, SwimClient<Channel>>,
}

impl Transport {
    pub(super) fn new(me: &PeerIdentity, settings: DetectorSettings, local: mpsc::Sender<Received>) -> Self {
        Self {
            local,
            tls: ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&me.ca_pem))
                .identity(Identity::from_pem(&me.cert_pem, &me.key_pem)),
            settings,
            addresses: BTreeMap::new(),
            clients: HashMap::new(),
        }
    }

    /// The registered agents; a member whose address changed gets a new channel.
    pub(super) fn set_addresses(&mut self, addresses: BTreeMap<String, String>) {
        self.clients
            .retain(|node, _| addresses.get(node) == self.addresses.get(node));
        self.addresses = addresses;
    }

    pub(super) fn members(&self) -> impl Iterator<Item = String> + '_ {
        self.addresses.keys().cloned()
    }

    fn client(&mut self, node: &str) -> Option<SwimClient<Channel>> {
        if let Some(client) = self.clients.get(node) {
            return Some(client.clone());
        }
        let address = self.addresses.get(node)?;
        let endpoint = Endpoint::from_shared(format!("https://{address}"))
            .ok()?
            .tls_config(self.tls.clone().domain_name(node.to_owned()))
            .ok()?
            .connect_timeout(self.settings.probe_period)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .tcp_nodelay(true);
        let client = SwimClient::new(endpoint.connect_lazy());
        self.clients.insert(node.to_owned(), client.clone());
        Some(client)
    }

    /// Sends one SWIM message; a message that does not arrive within a probe period is lost.
    /// The answers in the response are taken as messages from `node` (whose server certificate
    /// the channel checked) that say so themselves.
    pub(super) fn deliver(&mut self, node: &str, data: Vec<u8>) {
        let Some(mut client) = self.client(node) else {
            return;
        };
        let within = self.settings.probe_period;
        let (local, node) = (self.local.clone(), node.to_owned());
        tokio::spawn(async move {
            let Ok(Ok(response)) = tokio::time::timeout(within, client.deliver(Datagram { data })).await else {
                return;
            };
            for reply in response.into_inner().replies {
                if sender_of(&reply).is_ok_and(|sender| sender == node) {
                    let _ = local.try_send(Received {
                        data: reply,
                        from: node.clone(),
                        replies: None,
                    });
                }
            }
        });
    }

    /// Probes `node` itself, sent at `at`; the outcome goes to `results`. It has two round
    /// trips, and at least a probe period: a live agent answers within that, and a failure alone
    /// makes no condition (the controller still needs the lease and the host to agree).
    pub(super) fn probe(
        &mut self,
        node: &str,
        at: Timestamp,
        results: mpsc::UnboundedSender<(String, bool, Timestamp)>,
    ) {
        let within = (self.settings.probe_rtt * 2).max(self.settings.probe_period);
        let client = self.client(node);
        let node = node.to_owned();
        tokio::spawn(async move {
            let reached = match client {
                Some(mut client) => matches!(
                    tokio::time::timeout(within, client.probe(ProbeRequest {})).await,
                    Ok(Ok(answer)) if answer.get_ref().node == node
                ),
                None => false,
            };
            let _ = results.send((node, reached, at));
        });
    }
}
