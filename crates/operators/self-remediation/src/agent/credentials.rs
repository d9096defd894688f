//! The agent's peer certificate: reused from its state directory while valid, otherwise requested
//! with a CertificateSigningRequest that nodemedic's signer approves after checking the caller's
//! node.

use std::{path::Path, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{
        certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
        core::v1::ConfigMap,
    },
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use nodemedic_kube::CallContext;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{
    Error, Result,
    identity::{CA_CONFIGMAP, CA_KEY, PeerIdentity, SIGNER_NAME, certificate_node, pem_der},
};

/// A cached certificate is renewed when it has less than this left.
const RENEW_BEFORE: Duration = Duration::from_secs(7 * 24 * 3600);

fn cached(dir: &Path, node: &str) -> Option<PeerIdentity> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let identity = PeerIdentity {
        node: node.to_owned(),
        cert_pem: read("peer.crt")?,
        key_pem: read("peer.key")?,
        ca_pem: read("ca.crt")?,
    };
    let der = pem_der(&identity.cert_pem)?;
    let (_, cert) = X509Certificate::from_der(&der).ok()?;
    let remaining = cert.validity().time_to_expiration()?;
    (certificate_node(&der).as_deref() == Some(node) && remaining.whole_seconds() > RENEW_BEFORE.as_secs() as i64)
        .then_some(identity)
}

fn store(dir: &Path, identity: &PeerIdentity) {
    let _ = std::fs::create_dir_all(dir);
    for (file, text) in [
        ("peer.crt", &identity.cert_pem),
        ("peer.key", &identity.key_pem),
        ("ca.crt", &identity.ca_pem),
    ] {
        if let Err(error) = std::fs::write(dir.join(file), text) {
            tracing::warn!(%error, file, "cannot cache the peer certificate");
        }
    }
}

/// The agent's identity; asks the signer when it has none (waits as long as it takes).
pub(super) async fn obtain(client: &Client, namespace: &str, node: &str, dir: &Path) -> PeerIdentity {
    if let Some(identity) = cached(dir, node) {
        tracing::info!("using the cached peer certificate");
        return identity;
    }
    loop {
        match request(client, namespace, node).await {
            Ok(identity) => {
                store(dir, &identity);
                return identity;
            }
            Err(error) => {
                tracing::warn!(%error, "no peer certificate yet; asking again in 5s");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

async fn request(client: &Client, namespace: &str, node: &str) -> Result<PeerIdentity> {
    let key = KeyPair::generate().map_err(|e| Error::Certificate(e.to_string()))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| Error::Certificate(e.to_string()))?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, node);
    params.subject_alt_names = vec![SanType::DnsName(
        node.try_into()
            .map_err(|e: rcgen::Error| Error::Certificate(e.to_string()))?,
    )];
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| Error::Certificate(e.to_string()))?;
    let name = format!("nodemedic-peer-{node}-{:08x}", rand::random::<u32>());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: SIGNER_NAME.into(),
            usages: Some(
                ["digital signature", "key encipherment", "client auth", "server auth"]
                    .map(String::from)
                    .to_vec(),
            ),
            expiration_seconds: Some(365 * 24 * 3600),
            ..Default::default()
        },
        status: None,
    };
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    api.create(&PostParams::default(), &csr)
        .await
        .with_context(|| format!("creating CertificateSigningRequest {name}"))?;
    tracing::info!(csr = %name, "asked nodemedic's signer for a peer certificate");
    let signed = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if let Ok(Some(csr)) = api.get_opt(&name).await {
                let status = csr.status.unwrap_or_default();
                if let Some(denied) = status
                    .conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
                {
                    return Err(Error::Certificate(format!(
                        "the signer refused: {}",
                        denied.message.clone().unwrap_or_default()
                    )));
                }
                if let Some(cert) = status.certificate {
                    return Ok(String::from_utf8_lossy(&cert.0).into_owned());
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .map_err(|_| {
        Error::Certificate("the signer did not answer within 2 minutes (is the nodemedic controller running?)".into())
    })??;
    let ca = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(CA_CONFIGMAP)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{CA_CONFIGMAP}"))?;
    let ca_pem = ca
        .data
        .and_then(|d| d.get(CA_KEY).cloned())
        .ok_or_else(|| Error::Certificate(format!("ConfigMap {CA_CONFIGMAP} has no {CA_KEY}")))?;
    Ok(PeerIdentity {
        node: node.to_owned(),
        cert_pem: signed,
        key_pem: key.serialize_pem(),
        ca_pem,
    })
}
