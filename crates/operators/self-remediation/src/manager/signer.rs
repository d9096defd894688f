//! nodemedic's certificate signer (`nodemedic.medik8s.io/peer`): approves and signs a
//! CertificateSigningRequest only when the requester is the very node the certificate would name.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::{
    ByteString,
    api::{certificates::v1::CertificateSigningRequest, core::v1::Node},
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_kube::{CallContext, events::Events, pki::Authority};
use serde_json::json;
use x509_parser::prelude::FromDer;

use crate::{
    identity::{SIGNER_NAME, pem_der},
    manager::{Metrics, daemonset::SERVICE_ACCOUNT},
};

const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const VALID_DAYS: i64 = 365;

/// The node a request's author speaks for: a node identity (`system:node:<n>`), or the agent's
/// service account with a token bound to a pod on node `n`.
pub(crate) fn requester_node(csr: &CertificateSigningRequest, namespace: &str) -> Option<String> {
    let user = csr.spec.username.as_deref()?;
    if let Some(node) = user.strip_prefix("system:node:") {
        return Some(node.to_owned());
    }
    if user == format!("system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}") {
        let nodes = csr.spec.extra.as_ref()?.get(NODE_NAME_EXTRA)?;
        return match nodes.as_slice() {
            [node] => Some(node.clone()),
            _ => None,
        };
    }
    None
}

/// The names a PEM certificate request asks for: its common name and DNS names.
pub(crate) fn requested_names(request_pem: &[u8]) -> Option<(String, Vec<String>)> {
    use x509_parser::{
        certification_request::X509CertificationRequest,
        extensions::{GeneralName, ParsedExtension},
    };
    let der = pem_der(std::str::from_utf8(request_pem).ok()?)?;
    let (_, request) = X509CertificationRequest::from_der(&der).ok()?;
    let info = &request.certification_request_info;
    let cn = info.subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let mut dns = Vec::new();
    for extension in request.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension {
            dns.extend(san.general_names.iter().filter_map(|n| {
                if let GeneralName::DNSName(d) = n {
                    Some((*d).to_owned())
                } else {
                    None
                }
            }));
        }
    }
    Some((cn, dns))
}

/// Whether to sign: `Ok(node)`, or why not.
pub(crate) fn verdict(csr: &CertificateSigningRequest, namespace: &str) -> Result<String, String> {
    let node = requester_node(csr, namespace).ok_or_else(|| {
        format!(
            "requested by {:?}, which is neither a node (system:node:<name>) nor the agent service account {namespace}/{SERVICE_ACCOUNT} with a node-bound token",
            csr.spec.username
        )
    })?;
    let (cn, dns) = requested_names(&csr.spec.request.0).ok_or("the request is not a PEM certificate request")?;
    if cn != node || dns.iter().any(|d| *d != node) {
        return Err(format!(
            "node {node} asked for a certificate naming {cn} {dns:?}; it may only name itself"
        ));
    }
    Ok(node)
}

fn settled(csr: &CertificateSigningRequest) -> (bool, bool) {
    let status = csr.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let approved = conditions.iter().any(|c| c.type_ == "Approved" && c.status == "True");
    let refused = conditions
        .iter()
        .any(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True");
    (approved, refused || status.certificate.is_some())
}

async fn handle(
    client: &Client,
    authority: &Authority,
    namespace: &str,
    csr: &CertificateSigningRequest,
    metrics: &Metrics,
    events: &Events,
) -> crate::Result<()> {
    if csr.spec.signer_name != SIGNER_NAME {
        return Ok(());
    }
    let (approved, done) = settled(csr);
    if done {
        return Ok(());
    }
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    let name = csr.name_any();
    let now = nodemedic_kube::time::now();
    let checked = match verdict(csr, namespace) {
        Ok(node)
            if Api::<Node>::all(client.clone())
                .get_opt(&node)
                .await
                .with_context(|| format!("reading node {node}"))?
                .is_none() =>
        {
            Err(format!("node {node} does not exist"))
        }
        other => other,
    };
    let node = match checked {
        Ok(node) => node,
        Err(why) => {
            tracing::warn!(csr = %name, %why, "denying a peer certificate request");
            let denial = json!({"status": {"conditions": [{"type": "Denied", "status": "True", "reason": "NotTheRequestingNode", "message": why, "lastUpdateTime": now}]}});
            decide(&api, &name, &denial)
                .await
                .with_context(|| format!("denying CertificateSigningRequest {name}"))?;
            metrics.csr(false);
            events
                .warning(&nodemedic_kube::events::reference(csr), "CertificateDenied", why)
                .await;
            return Ok(());
        }
    };
    // Each write is conditional on the version this decision read: the watch also delivers the
    // versions our own writes left behind, and acting on one of those would issue a second
    // certificate over the first.
    let mut current = csr.clone();
    if !approved {
        let approval = json!({
            "metadata": {"resourceVersion": csr.resource_version()},
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "NodeVerified", "message": format!("requested by node {node} for itself"), "lastUpdateTime": now}]},
        });
        match decide(&api, &name, &approval).await {
            Ok(updated) => current = updated,
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            Err(e) => {
                let call = format!("approving CertificateSigningRequest {name}");
                return Err(nodemedic_kube::Error::call(call, e).into());
            }
        }
    }
    let request = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
    let cert = authority
        .sign_request(&request, &node, VALID_DAYS)
        .map_err(|e| crate::Error::Certificate(e.to_string()))?;
    let issued = nodemedic_kube::status::write_built_in(&api, &current, current.status.as_ref(), |status, _| {
        status.certificate = Some(ByteString(cert.into_bytes()));
        true
    })
    .await;
    match issued {
        Ok(_) => {}
        Err(e) if e.is_conflict() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    metrics.csr(true);
    tracing::info!(csr = %name, %node, "signed a peer certificate");
    Ok(())
}

/// Approves or denies a request: its Approved or Denied condition, which only the `approval`
/// subresource takes (with the signer's `approve` permission), not `status`.
#[allow(
    clippy::disallowed_methods,
    reason = "a CSR's approval is written only through its approval subresource, which the status writer cannot reach"
)]
async fn decide(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    decision: &serde_json::Value,
) -> kube::Result<CertificateSigningRequest> {
    api.patch_subresource("approval", name, &PatchParams::default(), &Patch::Merge(decision))
        .await
}

/// Signs requests as they come, until the process ends.
pub(crate) async fn run(
    client: Client,
    authority: Arc<Authority>,
    namespace: String,
    metrics: Metrics,
    events: Events,
) {
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .applied_objects()
        .boxed();
    // Requests a write failed for, retried from a fresh read (no watch event would come).
    let (retry_tx, mut retries) = tokio::sync::mpsc::unbounded_channel::<String>();
    loop {
        let csr = tokio::select! {
            event = stream.next() => match event {
                Some(Ok(csr)) => csr,
                Some(Err(error)) => {
                    tracing::debug!(%error, "certificate request watch error; retrying");
                    continue;
                }
                None => return,
            },
            Some(name) = retries.recv() => match api.get_opt(&name).await {
                Ok(Some(csr)) => csr,
                _ => continue,
            },
        };
        if let Err(error) = handle(&client, &authority, &namespace, &csr, &metrics, &events).await {
            let name = csr.name_any();
            tracing::warn!(%error, csr = %name, "could not settle a certificate request; retrying in 5 s");
            let retry_tx = retry_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                let _ = retry_tx.send(name);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn request(cn: &str, dns: &str, user: &str) -> CertificateSigningRequest {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = vec![SanType::DnsName(dns.try_into().expect("dns"))];
        let pem = params.serialize_request(&key).and_then(|r| r.pem()).expect("csr");
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: SIGNER_NAME.into(),
                username: Some(user.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_node_may_only_certify_itself() {
        assert_eq!(
            verdict(&request("node-1", "node-1", "system:node:node-1"), "ns"),
            Ok("node-1".into())
        );
        assert!(
            verdict(&request("node-2", "node-2", "system:node:node-1"), "ns")
                .is_err_and(|e| e.contains("may only name itself"))
        );
        assert!(verdict(&request("node-1", "node-2", "system:node:node-1"), "ns").is_err());
        assert!(verdict(&request("node-1", "node-1", "alice"), "ns").is_err_and(|e| e.contains("neither a node")));
    }

    #[test]
    fn the_agent_service_account_speaks_for_the_node_its_token_is_bound_to() {
        let mut csr = request("node-3", "node-3", "system:serviceaccount:ns:nodemedic-agent");
        assert!(verdict(&csr, "ns").is_err(), "no node-bound token");
        csr.spec.extra = Some([(NODE_NAME_EXTRA.to_owned(), vec!["node-3".to_owned()])].into());
        assert_eq!(verdict(&csr, "ns"), Ok("node-3".into()));
        assert!(verdict(&csr, "other").is_err(), "another namespace's account");
    }
}
