//! etcd members the cluster does not show as pods (external etcd, or members the hosts' service
//! manager runs on the control-plane nodes): configured as `node=client URL`, and each asked for
//! its health the way `etcdctl endpoint health` does (`GET /health`), with etcd's client
//! certificate when its URL is https. A member that does not answer in time is not healthy.

use std::{path::Path, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use rustls::{
    ClientConfig, RootCertStore,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

use crate::{Error, Result};

/// One health read: etcd answers from memory, so anything slower is a member in trouble.
const HEALTH_WITHIN: Duration = Duration::from_secs(2);

/// The files of `--etcd-client-certificates` (a kubernetes.io/tls Secret with the CA added).
const CA: &str = "ca.crt";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";

/// A member: the node it runs on and its client URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub node: String,
    pub url: http::Uri,
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    /// `node=url`, as `--etcd-member` takes it.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let usage = "give NODE=URL, e.g. master-0=https://10.0.0.10:2379";
        let (node, url) = s.split_once('=').ok_or_else(|| format!("{s:?} has no '=': {usage}"))?;
        if node.is_empty() {
            return Err(format!("{s:?} names no node: {usage}"));
        }
        let url: http::Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL ({e}): {usage}"))?;
        match (url.scheme_str(), url.host()) {
            (Some("http" | "https"), Some(_)) => Ok(Self {
                node: node.to_owned(),
                url,
            }),
            _ => Err(format!("{url} is not an http or https URL with a host: {usage}")),
        }
    }
}

/// The configured members and the client that asks them.
#[derive(Clone)]
pub struct External {
    endpoints: Arc<[Endpoint]>,
    client: HttpClient<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("External").field("endpoints", &self.endpoints).finish()
    }
}

impl External {
    /// `certificates`: a directory with ca.crt, tls.crt and tls.key, needed for https members.
    pub fn new(endpoints: Vec<Endpoint>, certificates: Option<&Path>) -> Result<Self> {
        let https = endpoints.iter().any(|e| e.url.scheme_str() == Some("https"));
        let tls = match (https, certificates) {
            (false, _) => None,
            (true, Some(dir)) => Some(tls_config(dir)?),
            (true, None) => {
                return Err(Error::Tls(
                    "an https etcd member needs etcd's CA and a client certificate: give --etcd-client-certificates a directory with ca.crt, tls.crt and tls.key".into(),
                ));
            }
        };
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let connector = match tls {
            Some(config) => builder.with_tls_config(config).https_or_http().enable_http1().build(),
            None => builder
                .with_tls_config(empty_tls_config()?)
                .https_or_http()
                .enable_http1()
                .build(),
        };
        Ok(Self {
            endpoints: endpoints.into(),
            client: HttpClient::builder(TokioExecutor::new()).build(connector),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Each member's node and whether it answered healthy, all asked at once.
    pub async fn health(&self) -> Vec<(String, bool)> {
        let asks = self.endpoints.iter().map(|e| async move {
            let healthy = match tokio::time::timeout(HEALTH_WITHIN, self.healthy(&e.url)).await {
                Ok(Ok(healthy)) => healthy,
                Ok(Err(why)) => {
                    tracing::debug!(node = %e.node, url = %e.url, %why, "etcd member unhealthy");
                    false
                }
                Err(_) => {
                    tracing::debug!(node = %e.node, url = %e.url, "etcd member did not answer in time");
                    false
                }
            };
            (e.node.clone(), healthy)
        });
        futures::future::join_all(asks).await
    }

    async fn healthy(&self, url: &http::Uri) -> std::result::Result<bool, String> {
        let base = url.to_string();
        let health: http::Uri = format!("{}/health", base.trim_end_matches('/'))
            .parse()
            .map_err(|e| format!("{e}"))?;
        let answer = self.client.get(health).await.map_err(|e| e.to_string())?;
        if !answer.status().is_success() {
            return Err(format!("answered {}", answer.status()));
        }
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(answered_healthy(&body))
    }
}

/// etcd's answer: `{"health":"true","reason":""}` from a member that has a leader and can
/// serve; "false" otherwise.
pub(crate) fn answered_healthy(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["health"] == "true")
}

fn tls_config(dir: &Path) -> Result<ClientConfig> {
    let bad = |file: &str, e: &dyn std::fmt::Display| {
        Error::Tls(format!("etcd client certificates: {}: {e}", dir.join(file).display()))
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join(CA)).map_err(|e| bad(CA, &e))? {
        roots.add(cert.map_err(|e| bad(CA, &e))?).map_err(|e| bad(CA, &e))?;
    }
    let chain = CertificateDer::pem_file_iter(dir.join(CERT))
        .map_err(|e| bad(CERT, &e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(CERT, &e))?;
    let key = PrivateKeyDer::from_pem_file(dir.join(KEY)).map_err(|e| bad(KEY, &e))?;
    ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(format!("etcd client configuration: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad(KEY, &e))
}

/// For a connector that never dials https (every member is http): trusts nothing.
fn empty_tls_config() -> Result<ClientConfig> {
    Ok(ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(format!("etcd client configuration: {e}")))?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_node_equals_url() {
        let e: Endpoint = "master-0=https://10.0.0.10:2379".parse().expect("valid");
        assert_eq!(e.node, "master-0");
        assert_eq!(e.url.port_u16(), Some(2379));
        for bad in [
            "master-0",
            "=https://10.0.0.10:2379",
            "m=10.0.0.10:2379",
            "m=ftp://x:1",
            "m=not a url",
        ] {
            let error = bad.parse::<Endpoint>().expect_err(bad);
            assert!(error.contains("NODE=URL"), "{bad}: {error}");
        }
    }

    #[test]
    fn only_a_true_health_is_healthy() {
        assert!(answered_healthy(br#"{"health":"true","reason":""}"#));
        assert!(!answered_healthy(br#"{"health":"false","reason":"RAFT NO LEADER"}"#));
        assert!(!answered_healthy(b"<html>"));
    }

    #[test]
    fn https_members_need_certificates() {
        let https = vec!["m=https://10.0.0.1:2379".parse().expect("valid")];
        let error = External::new(https, None).expect_err("no certificates");
        assert!(error.to_string().contains("--etcd-client-certificates"), "{error}");
        let http = vec!["m=http://10.0.0.1:2379".parse().expect("valid")];
        assert!(External::new(http, None).is_ok());
    }
}
