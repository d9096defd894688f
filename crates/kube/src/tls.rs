//! HTTPS with rustls (ring), the one TLS stack of the product, for the admission webhook and the
//! metrics endpoint: a listener axum serves from, and a certificate that can be swapped while it
//! serves (renewal, a new CA).

use std::{
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use rustls::{
    ServerConfig,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

use crate::{Error, Result, pki::Pem};

/// A slow or silent client must not hold a connection slot for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate handshakes present right now; none until the first is set.
#[derive(Debug, Default)]
pub(crate) struct Certificate(RwLock<Option<Arc<CertifiedKey>>>);

impl Certificate {
    pub(crate) fn set(&self, pem: &Pem) -> Result<()> {
        let bad = |what: &str, e: &dyn std::fmt::Display| Error::Tls(format!("the serving {what} is unusable: {e}"));
        let cert = CertificateDer::from_pem_slice(pem.cert.as_bytes()).map_err(|e| bad("certificate", &e))?;
        let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).map_err(|e| bad("key", &e))?;
        let key = ring::sign::any_supported_type(&key).map_err(|e| bad("key", &e))?;
        let certified = Arc::new(CertifiedKey::new(vec![cert], key));
        let mut current = self
            .0
            .write()
            .map_err(|_| Error::Tls("the serving certificate lock is poisoned".into()))?;
        *current = Some(certified);
        Ok(())
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok()?.clone()
    }
}

fn config(certificate: Arc<Certificate>) -> Result<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(format!("configuration: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    // axum here speaks HTTP/1.1 only; the API server's webhook client and Prometheus accept that.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepted connections, handshakes done; handshakes run on their own tasks so one slow client
/// does not hold up the others.
pub(crate) struct Listener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

/// Listens on `addr` for `what` (the admission webhook, metrics), which names it in the log.
pub(crate) async fn bind(what: &'static str, addr: SocketAddr, certificate: Arc<Certificate>) -> Result<Listener> {
    let serve_error = |source| Error::Serve { what, source };
    let tcp = TcpListener::bind(addr).await.map_err(serve_error)?;
    let local = tcp.local_addr().map_err(serve_error)?;
    let acceptor = TlsAcceptor::from(Arc::new(config(certificate)?));
    let (tx, incoming) = mpsc::channel(64);
    tokio::spawn(async move {
        while !tx.is_closed() {
            let (stream, peer) = match tcp.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(%error, "{what}: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    // The webhook's usual cause: a caBundle that is not the CA in the Secret (yet).
                    Ok(Err(error)) => tracing::warn!(%peer, %error, "{what}: TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "{what}: TLS handshake timed out"),
                }
            });
        }
    });
    Ok(Listener { incoming, local })
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accept task ended: nothing more will arrive.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Authority, Leaf};

    #[test]
    fn a_certificate_is_served_once_set() {
        let ca = Authority::new("test", 1).expect("ca");
        let leaf = ca
            .issue(&Leaf {
                common_name: "w".into(),
                dns_names: vec!["w".into()],
                server: true,
                valid_days: 1,
                ..Default::default()
            })
            .expect("leaf");
        let certificate = Certificate::default();
        assert!(certificate.0.read().expect("lock").is_none());
        certificate.set(&leaf).expect("usable");
        assert!(certificate.0.read().expect("lock").is_some());
        let error = certificate
            .set(&Pem {
                cert: leaf.cert.clone(),
                key: "junk".into(),
            })
            .expect_err("junk key")
            .to_string();
        assert!(error.contains("serving key is unusable"), "{error}");
    }
}
