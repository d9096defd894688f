//! A stand-in for KubeVirt's side of an eviction (KubeVirt itself cannot be had here). KubeVirt's
//! `virt-launcher-eviction-interceptor` webhook answers the eviction of a VM's launcher pod with
//! 429 `Eviction triggered evacuation of VMI "<ns>/<name>"` and live-migrates the VM; the lab's
//! webhook (a small HTTPS server, lab process `kubevirt-eviction-webhook`, registered for
//! `pods/eviction` like KubeVirt's) answers the same for pods named `virt-launcher-*`, and the
//! lab then plays the migration: the pod is annotated
//! `descheduler.alpha.kubernetes.io/eviction-in-progress`, then deleted, so its controller starts
//! it again where the scheduler now prefers.

use std::{net::Ipv4Addr, sync::Arc, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{
            RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;

use crate::{Error, Lab, Result, error::io, lab::Inner, process::ProcessSpec};

/// What the descheduler recognises as "the eviction goes on in the background".
pub const EVACUATION_TRIGGERED: &str = "Eviction triggered evacuation of VMI";
pub const EVICTION_IN_PROGRESS: &str = "descheduler.alpha.kubernetes.io/eviction-in-progress";
const CONFIGURATION: &str = "lab-kubevirt-eviction-interceptor";
/// How long the lab's live migration takes.
const MIGRATION: Duration = Duration::from_secs(2);

const WEBHOOK: &str = r##"
import http.server, json, ssl, sys, time
cert, key, address, port, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        name, namespace = request.get("name", ""), request.get("namespace", "")
        response = {"uid": request["uid"], "allowed": True}
        if name.startswith("virt-launcher-"):
            vmi = name[len("virt-launcher-"):].rsplit("-", 1)[0]
            response = {"uid": request["uid"], "allowed": False, "status": {
                "code": 429, "reason": "TooManyRequests",
                "message": 'Eviction triggered evacuation of VMI "%s/%s"' % (namespace, vmi)}}
            with open(requests, "a") as f:
                f.write("%s/%s %f\n" % (namespace, name, time.time()))
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server = http.server.HTTPServer((address, port), Handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"##;

impl Lab {
    /// Registers the stand-in for KubeVirt's eviction webhook and plays the migrations it
    /// triggers (see the module's description).
    pub async fn stand_in_for_kubevirt_evictions(&mut self) -> Result<()> {
        let dir = self.dir().join("kubevirt");
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let ip = self.api_ip();
        let (crt, key) = self.inner.pki.issue_server("kubevirt-eviction-webhook", ip)?;
        let script = dir.join("webhook.py");
        std::fs::write(&script, WEBHOOK).map_err(io("writing the eviction webhook"))?;
        let requests = dir.join("evacuations");
        std::fs::write(&requests, "").map_err(io("creating the evacuation list"))?;
        let port = crate::lab::free_port()?;
        self.add_host_process(
            "kubevirt-eviction-webhook",
            ProcessSpec::new(
                "python3",
                [
                    script.display().to_string(),
                    crt.display().to_string(),
                    key.display().to_string(),
                    ip.to_string(),
                    port.to_string(),
                    requests.display().to_string(),
                ],
            ),
        )?;
        let ca = std::fs::read(self.ca_certificate()).map_err(io("reading the lab CA"))?;
        Api::<ValidatingWebhookConfiguration>::all(self.client())
            .patch(
                CONFIGURATION,
                &PatchParams::apply("nodemedic-lab").force(),
                &Patch::Apply(configuration(ip, port, ca)),
            )
            .await?;
        self.tasks.push(tokio::spawn(migrate(self.inner.clone(), requests)));
        Ok(())
    }
}

fn configuration(ip: Ipv4Addr, port: u16, ca: Vec<u8>) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(CONFIGURATION.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "virt-launcher-eviction-interceptor.lab.kubevirt.io".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "NoneOnDryRun".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(5),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods/eviction".into()]),
                scope: Some("Namespaced".into()),
            }]),
            client_config: WebhookClientConfig {
                url: Some(format!("https://{ip}:{port}/")),
                ca_bundle: Some(ByteString(ca)),
                ..WebhookClientConfig::default()
            },
            ..ValidatingWebhook::default()
        }]),
    }
}

/// Plays each requested evacuation once: eviction in progress, then the pod goes.
async fn migrate(inner: Arc<Inner>, requests: std::path::PathBuf) {
    let mut done = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(text) = std::fs::read_to_string(&requests) else {
            continue;
        };
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        for request in lines.iter().skip(done) {
            if let Err(error) = evacuate(&inner, request).await {
                tracing::warn!(%request, %error, "lab KubeVirt stand-in: evacuation failed");
            }
        }
        done = lines.len();
    }
}

async fn evacuate(inner: &Inner, request: &str) -> Result<()> {
    let malformed = || Error::Invalid(format!("not <namespace>/<pod> <epoch seconds>: {request}"));
    let (pod, at) = request.split_once(' ').ok_or_else(malformed)?;
    let (namespace, name) = pod.split_once('/').ok_or_else(malformed)?;
    let at: f64 = at.parse().map_err(|_| malformed())?;
    let pods = Api::<Pod>::namespaced(inner.client.clone(), namespace);
    // A StatefulSet's new pod has the old one's name: only the pod the eviction was for moves.
    let Some(current) = pods.get_opt(name).await? else {
        return Ok(());
    };
    let created = current
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second() as f64);
    if created.is_some_and(|c| c > at) {
        return Ok(());
    }
    let patch = json!({"metadata": {"annotations": {EVICTION_IN_PROGRESS: "lab-kubevirt"}}});
    match pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        // Evicted twice before the first migration ended: the pod is gone already.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    tracing::info!(%namespace, pod = %name, "lab KubeVirt stand-in: live migration started");
    tokio::time::sleep(MIGRATION).await;
    let same_pod = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: current.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(name, &same_pod).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}
