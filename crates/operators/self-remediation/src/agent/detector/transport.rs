//! The detector's wire: each SWIM message is one unary call on the agents' mutual-TLS channel,
//! so only cluster members can speak, and a message must come from the node that sends it.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use foca::Codec;
use jiff::Timestamp;
use nodemedic_peer_detection::{DetectorSettings, swim::Peer};
use tokio::sync::mpsc;
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

/// The agent's end of the detector's messages (its peer server's `Swim` service).
pub struct Inbound {
    pub node: String,
    /// Where messages go; `None` when the detector is off (probes are still answered).
    pub messages: Option<mpsc::Sender<Vec<u8>>>,
}

#[tonic::async_trait]
impl swim_server::Swim for Inbound {
    async fn deliver(&self, request: Request<Datagram>) -> Result<Response<Delivered>, Status> {
        let certified = caller(&request)?;
        let data = request.into_inner().data;
        let header = foca::PostcardCodec
            .decode_header(&data[..])
            .map_err(|e| Status::invalid_argument(format!("not a detector message: {e}")))?;
        let sender: Peer = header.src;
        if sender.node != certified {
            return Err(Status::permission_denied(format!(
                "the client certificate names {certified}, the message {}",
                sender.node
            )));
        }
        if let Some(messages) = &self.messages {
            // A full queue drops the message, as a congested network would.
            let _ = messages.try_send(data);
        }
        Ok(Response::new(Delivered {}))
    }

    async fn probe(&self, request: Request<ProbeRequest>) -> Result<Response<ProbeReply>, Status> {
        caller(&request)?;
        Ok(Response::new(ProbeReply {
            node: self.node.clone(),
        }))
    }
}

/// Clients to the other agents, one kept-alive channel each.
pub struct Transport {
    tls: ClientTlsConfig,
    settings: DetectorSettings,
    addresses: BTreeMap<String, String>,
    clients: HashMap<String, SwimClient<Channel>>,
}

impl Transport {
    pub fn new(me: &PeerIdentity, settings: DetectorSettings) -> Self {
        Self {
            tls: ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&me.ca_pem))
                .identity(Identity::from_pem(&me.cert_pem, &me.key_pem)),
            settings,
            addresses: BTreeMap::new(),
            clients: HashMap::new(),
        }
    }

    /// The registered agents; a member whose address changed gets a new channel.
    pub fn set_addresses(&mut self, addresses: BTreeMap<String, String>) {
        self.clients
            .retain(|node, _| addresses.get(node) == self.addresses.get(node));
        self.addresses = addresses;
    }

    pub fn members(&self) -> impl Iterator<Item = String> + '_ {
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
    pub fn deliver(&mut self, node: &str, data: Vec<u8>) {
        let Some(mut client) = self.client(node) else {
            return;
        };
        let within = self.settings.probe_period;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(within, client.deliver(Datagram { data })).await;
        });
    }

    /// Probes `node` itself, sent at `at`; the outcome goes to `results`. It has two round
    /// trips, and at least a probe period: a live agent answers within that, and a failure alone
    /// makes no condition (the controller still needs the lease and the host to agree).
    pub fn probe(&mut self, node: &str, at: Timestamp, results: mpsc::UnboundedSender<(String, bool, Timestamp)>) {
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
