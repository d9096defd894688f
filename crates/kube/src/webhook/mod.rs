//! The validating admission webhook server every controller replica runs (not only the leader:
//! admission must answer while leadership moves). HTTPS with a certificate it manages itself:
//! the CA in a Secret ([`certs`]), the caBundle of its ValidatingWebhookConfiguration kept equal
//! to that CA ([`bundle`]), the serving certificate renewed while it serves ([`tls`]).
//!
//! Nothing here stops the controller: if the webhook cannot start or keep its certificate, it
//! says so in the log and tries again, and admission meanwhile goes on as with a webhook that is
//! down (the chart registers it with failurePolicy Ignore). Remediation matters more than
//! admission checks.

pub(crate) mod bundle;
pub mod certs;

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::post,
};
use kube::Client;

use self::certs::San;
use crate::{
    Result,
    admission::{self, Request, Verdict},
    tls,
};

/// How often each replica re-reads the CA Secret and the configuration's caBundle: a
/// `helm upgrade` empties the caBundle, and admission is unchecked until it is set again.
const REFRESH: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct Settings {
    pub bind: SocketAddr,
    /// The controller's namespace: the CA Secret's, and the Service's.
    pub namespace: String,
    /// The Service the API server calls the webhook through (its DNS names are in the certificate).
    pub service: String,
    /// The ValidatingWebhookConfiguration whose caBundle this keeps.
    pub configuration: String,
    pub extra_names: Vec<San>,
    /// Serve the certificate in this directory (`tls.crt`, `tls.key`, read again as it changes)
    /// instead of one from nodemedic's own CA, and leave the caBundle to whoever writes them:
    /// OLM (which mounts them at /tmp/k8s-webhook-server/serving-certs) or cert-manager.
    pub certificate_dir: Option<PathBuf>,
}

type Validate = Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Verdict> + Send>> + Send + Sync>;

/// One webhook: the path the configuration names, and the decision behind it.
#[derive(Clone)]
pub struct Route {
    path: String,
    validate: Validate,
}

impl Route {
    pub fn new<F, Fut>(path: &str, validate: F) -> Self
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        Self {
            path: path.to_owned(),
            validate: Arc::new(move |request| Box::pin(validate(request))),
        }
    }
}

pub(crate) fn router(routes: Vec<Route>) -> Router {
    routes.into_iter().fold(Router::new(), |router, route| {
        let Route { path, validate } = route;
        let name = path.clone();
        router.route(
            &path,
            post(move |body: Bytes| {
                let validate = validate.clone();
                let name = name.clone();
                async move { answer(&name, &validate, &body).await }
            }),
        )
    })
}

async fn answer(path: &str, validate: &Validate, body: &[u8]) -> impl IntoResponse + use<> {
    let json = [(header::CONTENT_TYPE, "application/json")];
    let request = match admission::parse(body) {
        Ok(request) => request,
        Err(why) => return (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "text/plain")], why),
    };
    let (operation, name) = (request.operation.clone(), request.name.clone());
    let verdict = validate(request.clone()).await;
    match &verdict {
        Verdict::Allowed => tracing::debug!(%path, ?operation, %name, "admitted"),
        Verdict::Denied(why) => tracing::info!(%path, ?operation, %name, %why, "denied"),
        Verdict::Unchecked(why) => tracing::warn!(%path, ?operation, %name, %why, "admitted unchecked"),
    }
    match serde_json::to_string(&admission::respond(&request, &verdict)) {
        Ok(body) => (StatusCode::OK, json, body),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json,
            format!("encoding the answer: {e}"),
        ),
    }
}

/// Starts the webhook in the background; see the module's note on failures.
pub fn spawn(client: Client, settings: Settings, routes: Vec<Route>) {
    tokio::spawn(run(client, settings, routes));
}

async fn run(client: Client, settings: Settings, routes: Vec<Route>) {
    let certificate = Arc::new(tls::Certificate::default());
    let mut keeper = Keeper::new(client, settings.clone(), certificate.clone());
    // Serving before there is a certificate would fail every handshake; a caBundle that cannot
    // be set yet (RBAC, no configuration) is no reason to wait.
    loop {
        if let Err(error) = keeper.tick().await {
            tracing::error!(%error, "admission webhook: setting up its certificate failed; trying again");
        }
        if keeper.serving_ca.is_some() {
            break;
        }
        tokio::time::sleep(REFRESH).await;
    }
    let listener = loop {
        match tls::bind("the admission webhook", settings.bind, certificate.clone()).await {
            Ok(listener) => break listener,
            Err(error) => {
                tracing::error!(%error, bind = %settings.bind, "admission webhook: cannot listen (another process on the port? --webhook-bind changes it); trying again");
                tokio::time::sleep(REFRESH).await;
            }
        }
    };
    tracing::info!(bind = %settings.bind, configuration = %settings.configuration, "admission webhook serving");
    let app = router(routes);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "admission webhook stopped serving");
        }
    });
    loop {
        tokio::time::sleep(REFRESH).await;
        if let Err(error) = keeper.tick().await {
            tracing::warn!(%error, "admission webhook: keeping its certificate failed; trying again");
        }
    }
}

/// Follows the CA Secret and keeps the serving certificate and the caBundle in line with it.
struct Keeper {
    client: Client,
    settings: Settings,
    certificate: Arc<tls::Certificate>,
    serving_ca: Option<String>,
    issued: Option<tokio::time::Instant>,
    missing_said: bool,
}

impl Keeper {
    fn new(client: Client, settings: Settings, certificate: Arc<tls::Certificate>) -> Self {
        Self {
            client,
            settings,
            certificate,
            serving_ca: None,
            issued: None,
            missing_said: false,
        }
    }

    async fn tick(&mut self) -> Result<()> {
        if let Some(dir) = self.settings.certificate_dir.clone() {
            return self.tick_files(&dir);
        }
        let ca = certs::authority(&self.client, &self.settings.namespace).await?;
        let age = self.issued.map(|at| at.elapsed());
        if certs::reissue(self.serving_ca.as_deref(), &ca.cert, age) {
            let s = &self.settings;
            let (dns, ips) = certs::serving_names(&s.service, &s.namespace, &s.extra_names);
            self.certificate.set(&certs::serving(&ca, &dns, &ips)?)?;
            tracing::info!(?dns, ?ips, "admission webhook: issued a serving certificate");
            self.serving_ca = Some(ca.cert.clone());
            self.issued = Some(tokio::time::Instant::now());
        }
        let name = &self.settings.configuration;
        match bundle::ensure(&self.client, name, ca.cert.as_bytes()).await? {
            bundle::Outcome::Missing if !self.missing_said => {
                self.missing_said = true;
                tracing::info!(configuration = %name, "admission webhook: no ValidatingWebhookConfiguration of that name, so the API server calls no webhook (the chart installs it; --webhook-configuration names it)");
            }
            bundle::Outcome::Patched(webhooks) => {
                self.missing_said = false;
                tracing::info!(configuration = %name, ?webhooks, "admission webhook: set the caBundle");
            }
            _ => {}
        }
        Ok(())
    }
}

impl Keeper {
    /// Serves the certificate files as they are now. `serving_ca` holds the served certificate.
    fn tick_files(&mut self, dir: &Path) -> Result<()> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read_to_string(&path).map_err(|e| {
                crate::Error::Webhook(format!(
                    "reading {} ({e}): --webhook-cert-dir names the directory holding tls.crt and tls.key",
                    path.display()
                ))
            })
        };
        let pem = crate::pki::Pem {
            cert: read("tls.crt")?,
            key: read("tls.key")?,
        };
        if self.serving_ca.as_deref() != Some(pem.cert.as_str()) {
            self.certificate.set(&pem)?;
            tracing::info!(dir = %dir.display(), "admission webhook: serving the certificate of its directory (whoever writes it keeps the caBundle)");
            self.serving_ca = Some(pem.cert);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
