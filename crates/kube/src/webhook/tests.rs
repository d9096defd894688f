//! The server end to end on loopback, as the API server uses it: TLS trusting only the CA,
//! an AdmissionReview in, the verdict out.

use std::sync::Arc;

use rustls::{
    ClientConfig, RootCertStore,
    crypto::ring,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::pki::{Authority, Pem};

async fn serve(ca: &Authority, routes: Vec<Route>) -> SocketAddr {
    let (dns, ips) = certs::serving_names("svc", "ns", &["127.0.0.1".parse().expect("ip")]);
    let certificate = Arc::new(tls::Certificate::default());
    certificate
        .set(&certs::serving(ca.pem(), &dns, &ips).expect("leaf"))
        .expect("usable");
    let listener = tls::bind(
        "the admission webhook",
        "127.0.0.1:0".parse().expect("addr"),
        certificate,
    )
    .await
    .expect("binds");
    let addr = axum::serve::Listener::local_addr(&listener).expect("addr");
    tokio::spawn(async move { axum::serve(listener, router(routes)).await });
    addr
}

/// POSTs `body` to `path` over TLS trusting `ca` alone; the raw HTTP answer.
async fn post(addr: SocketAddr, ca: &Pem, path: &str, body: &str) -> std::io::Result<String> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert.as_bytes()).expect("ca pem"))
        .expect("root");
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = connector.connect(name, tcp).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await?;
    Ok(answer)
}

fn review(node: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
            "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
            "name": "nm", "operation": "CREATE", "userInfo": {"username": "admin"},
            "object": {"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance", "metadata": {"name": "nm"}, "spec": {"nodeName": node}}
        }
    })
    .to_string()
}

fn only_node_w1() -> Route {
    Route::new("/validate-test", |request: Request| async move {
        let node = request
            .object
            .as_ref()
            .and_then(|o| o.data["spec"]["nodeName"].as_str().map(str::to_owned))
            .unwrap_or_default();
        if node == "w1" {
            Verdict::Allowed
        } else {
            Verdict::Denied(format!("node {node} does not exist"))
        }
    })
}

#[tokio::test]
async fn answers_an_admission_review_over_tls() {
    let ca = Authority::new("test ca", 1).expect("ca");
    let addr = serve(&ca, vec![only_node_w1()]).await;

    let denied = post(addr, ca.pem(), "/validate-test", &review("w9"))
        .await
        .expect("answer");
    assert!(denied.starts_with("HTTP/1.1 200"), "{denied}");
    let body: serde_json::Value = serde_json::from_str(denied.split("\r\n\r\n").nth(1).expect("body")).expect("json");
    assert_eq!(body["response"]["uid"], "u-1");
    assert_eq!(body["response"]["allowed"], false);
    assert_eq!(body["response"]["status"]["message"], "node w9 does not exist");

    let allowed = post(addr, ca.pem(), "/validate-test", &review("w1"))
        .await
        .expect("answer");
    assert!(allowed.contains("\"allowed\":true"), "{allowed}");

    let empty = r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#;
    let bad = post(addr, ca.pem(), "/validate-test", empty).await.expect("answer");
    assert!(bad.starts_with("HTTP/1.1 400") && bad.contains("no request"), "{bad}");
    let unknown = post(addr, ca.pem(), "/validate-other", &review("w1"))
        .await
        .expect("answer");
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
}

#[tokio::test]
async fn a_client_trusting_another_ca_is_refused() {
    let ca = Authority::new("test ca", 1).expect("ca");
    let addr = serve(&ca, vec![only_node_w1()]).await;
    let other = Authority::new("other ca", 1).expect("ca");
    let error = post(addr, other.pem(), "/validate-test", &review("w1"))
        .await
        .expect_err("untrusted certificate");
    assert!(error.to_string().contains("certificate"), "{error}");
}

/// `--webhook-cert-dir`: the files someone else writes (OLM, cert-manager) are served, and
/// served again when they change; a directory without them says which flag names it.
#[tokio::test]
async fn a_certificate_directory_is_served_as_it_changes() {
    let ca = Authority::new("test ca", 1).expect("ca");
    let (dns, ips) = certs::serving_names("svc", "ns", &[]);
    let dir = std::env::temp_dir().join(format!("nodemedic-webhook-certs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let client =
        kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().expect("url"))).expect("client");
    let settings = Settings {
        bind: "127.0.0.1:0".parse().expect("addr"),
        namespace: "ns".into(),
        service: "svc".into(),
        configuration: "cfg".into(),
        extra_names: Vec::new(),
        certificate_dir: Some(dir.clone()),
    };
    let mut keeper = Keeper::new(client, settings, Arc::new(tls::Certificate::default()));
    let error = keeper.tick().await.expect_err("no files yet").to_string();
    assert!(error.contains("--webhook-cert-dir"), "{error}");
    for _ in 0..2 {
        let leaf = certs::serving(ca.pem(), &dns, &ips).expect("leaf");
        std::fs::write(dir.join("tls.crt"), &leaf.cert).expect("cert");
        std::fs::write(dir.join("tls.key"), &leaf.key).expect("key");
        keeper.tick().await.expect("served");
        assert_eq!(keeper.serving_ca.as_deref(), Some(leaf.cert.as_str()));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
