//! Whether the API server is ready, asked without kube's request tracing. kube's client logs
//! every 5xx answer at ERROR level, and a starting or restarting API server answers /readyz with
//! 500 until its post-start hooks have run: a state the lab expects and waits out, not an error.

use std::path::Path;

use kube::{
    Client, Config,
    client::ConfigExt,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{Error, Result};

/// A client for `kubeconfig` whose failures reach only its caller.
pub(crate) async fn quiet_client(kubeconfig: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let https = config.rustls_https_connector()?;
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        // The auth layer's errors are boxed; so must the client's be, below it.
        .map_err(tower::BoxError::from)
        .service(hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https));
    Ok(Client::new(service, config.default_namespace))
}

/// `/readyz` answers "ok".
pub(crate) async fn api_ready(client: &Client) -> Result<bool> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| Error::Invalid(e.to_string()))?;
    // A stopped API server's port may still accept and never answer: each poll is bounded.
    let answer = tokio::time::timeout(std::time::Duration::from_secs(2), client.request_text(request)).await;
    Ok(matches!(answer, Ok(Ok(body)) if body.trim() == "ok"))
}
