//! The `endpointHealthCheckUrl` probe: a TCP connection to the URL's host and port (medik8s
//! sends ICMP pings, which need a raw socket the agent does not otherwise use).

use std::time::Duration;

/// The `host:port` a URL names (the scheme's port when none is given).
fn authority(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    Some(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// Whether a connection to the URL's endpoint opens within `timeout`.
pub(super) async fn probe(url: &str, timeout: Duration) -> bool {
    let Some(address) = authority(url) else {
        tracing::warn!(%url, "endpointHealthCheckUrl is not a URL with a host");
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&address)).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_defaults_to_the_scheme_s_port() {
        assert_eq!(authority("https://10.0.0.1/healthz").as_deref(), Some("10.0.0.1:443"));
        assert_eq!(authority("http://gw.example:8080/").as_deref(), Some("gw.example:8080"));
        assert_eq!(authority("not a url"), None);
    }

    #[tokio::test]
    async fn a_listening_endpoint_is_reachable_and_a_closed_one_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(probe(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(1)).await);
        drop(listener);
        assert!(!probe(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(1)).await);
    }
}
