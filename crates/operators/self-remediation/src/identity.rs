//! Per-node peer identities: every agent holds a certificate naming its node, signed by
//! nodemedic's own signer after it checked that the requester really is that node. Peers
//! require and verify each other's certificates (mutual TLS 1.3).

use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The `signerName` of nodemedic's CertificateSigningRequests.
pub(crate) const SIGNER_NAME: &str = "nodemedic.medik8s.io/peer";
/// Secret (in nodemedic's namespace) holding the signer's CA certificate and key.
pub(crate) const CA_SECRET: &str = "nodemedic-peer-ca";
/// ConfigMap publishing the CA certificate to the agents.
pub(crate) const CA_CONFIGMAP: &str = "nodemedic-peer-ca";
pub(crate) const CA_KEY: &str = "ca.crt";
/// The key of [`CA_CONFIGMAP`] where the leading controller publishes the `ip:port` its agents
/// send peer-detection reports to.
pub(crate) const REPORTS_ENDPOINT_KEY: &str = "peer-reports";
/// The name in the controller's report-server certificate (signed by the same CA).
pub(crate) const REPORTS_SERVER_NAME: &str = "nodemedic-peer-reports";

/// An agent's credentials for the peer protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerIdentity {
    pub node: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl PeerIdentity {
    pub(crate) fn fingerprint(&self) -> String {
        pem_der(&self.cert_pem)
            .map(|der| hex::encode(Sha256::digest(der)))
            .unwrap_or_default()
    }
}

/// The first block of a PEM text, as DER.
pub(crate) fn pem_der(text: &str) -> Option<Vec<u8>> {
    pem::parse(text).ok().map(|p| p.into_contents())
}

/// The node a peer certificate names (its DNS subject alternative name), if it names exactly one.
pub(crate) fn certificate_node(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| {
            if let GeneralName::DNSName(d) = n {
                Some((*d).to_owned())
            } else {
                None
            }
        })
        .collect();
    match names.as_slice() {
        [only] => Some(only.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodemedic_kube::pki::{Authority, Leaf};

    #[test]
    fn a_certificate_names_its_node() {
        let ca = Authority::new("test", 1).expect("ca");
        let leaf = ca
            .issue(&Leaf {
                common_name: "node-1".into(),
                dns_names: vec!["node-1".into()],
                client: true,
                server: true,
                valid_days: 1,
                ..Leaf::default()
            })
            .expect("leaf");
        let der = pem_der(&leaf.cert).expect("der");
        assert_eq!(certificate_node(&der).as_deref(), Some("node-1"));
        let identity = PeerIdentity {
            node: "node-1".into(),
            cert_pem: leaf.cert,
            key_pem: leaf.key,
            ca_pem: ca.pem().cert.clone(),
        };
        assert_eq!(identity.fingerprint().len(), 64);
    }
}
