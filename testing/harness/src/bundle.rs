//! The OLM bundle (`make bundle`): nodemedic for OpenShift's OperatorHub, installed the way the
//! seeds' users install the medik8s operators. It is the chart rendered for OLM, so it cannot
//! drift from what `helm install` installs:
//! - the controller Deployment, and every ServiceAccount's ClusterRoles as the CSV's cluster
//!   permissions (OLM creates the accounts and binds them);
//! - the admission webhooks as the CSV's webhook definitions: OLM issues their certificate,
//!   mounts it where `--webhook-cert-dir` reads it, and keeps their caBundle;
//! - every CRD, owned, with its description, descriptors for the console and the seeds'
//!   manifests as examples;
//! - the defaults' ConfigMaps, the metrics Service, the roles nothing binds at install time;
//! - the images by digest, read from the archives `make image` builds.
//!
//! A bundle cannot carry the soft tainter's ValidatingAdmissionPolicy; docs/install.md says what
//! that changes.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::images::Images;

pub const PACKAGE: &str = "nodemedic";
/// OLM's channel naming: "candidate" until nodemedic has a stable release.
pub const CHANNEL: &str = "candidate";
/// The namespace the console suggests, the seeds' (medik8s's) own.
pub const SUGGESTED_NAMESPACE: &str = "openshift-workload-availability";
/// Where OLM mounts a webhook's serving certificate (controller-runtime's directory).
const OLM_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
const CONTROLLER: &str = "nodemedic-controller";
/// The seeds' manifests that show each kind (the console's "create" examples).
const EXAMPLES: [&str; 6] = [
    "002-nhc-snr-3node.yaml",
    "004-snr-config.yaml",
    "004-snr-template-automatic.yaml",
    "002-far-template.yaml",
    "002-node-maintenance.yaml",
    "002-kube-descheduler.yaml",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes the bundle into `out` (`manifests/`, `metadata/`, `bundle.Dockerfile`), with the
/// images in `images` by digest.
pub fn generate(out: &Path, images: &Images) -> anyhow::Result<()> {
    let digests = [digest(&images.controller)?, digest(&images.agent)?];
    let objects = render(&digests)?;
    let crds = crds()?;
    let manifests = out.join("manifests");
    let metadata = out.join("metadata");
    for dir in [&manifests, &metadata] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut files = vec![(
        manifests.join(format!("{PACKAGE}.clusterserviceversion.yaml")),
        csv(&objects, &crds)?,
    )];
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        files.push((manifests.join(format!("{name}.yaml")), crd.clone()));
    }
    for object in plain_manifests(&objects) {
        let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        files.push((manifests.join(format!("{name}.{kind}.yaml")), object));
    }
    files.push((
        metadata.join("annotations.yaml"),
        json!({ "annotations": annotations() }),
    ));
    for (path, value) in files {
        let yaml = serde_saphyr::to_string(&value).with_context(|| format!("writing {}", path.display()))?;
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    }
    let labels: String = annotations().iter().map(|(k, v)| format!("LABEL {k}={v}\n")).collect();
    let dockerfile = format!("FROM scratch\n{labels}COPY manifests /manifests/\nCOPY metadata /metadata/\n");
    std::fs::write(out.join("bundle.Dockerfile"), dockerfile).context("writing bundle.Dockerfile")?;
    Ok(())
}

fn annotations() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("operators.operatorframework.io.bundle.mediatype.v1", "registry+v1"),
        ("operators.operatorframework.io.bundle.manifests.v1", "manifests/"),
        ("operators.operatorframework.io.bundle.metadata.v1", "metadata/"),
        ("operators.operatorframework.io.bundle.package.v1", PACKAGE),
        ("operators.operatorframework.io.bundle.channels.v1", CHANNEL),
        ("operators.operatorframework.io.bundle.channel.default.v1", CHANNEL),
    ])
}

/// The manifest digest of an OCI archive's image (`sha256:...`), from its index.
fn digest(archive: &Path) -> anyhow::Result<String> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("index.json")
        .output()
        .with_context(|| format!("reading {}", archive.display()))?;
    if !out.status.success() {
        bail!(
            "{} has no index.json: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let index: Value = serde_json::from_slice(&out.stdout).context("its index.json")?;
    index["manifests"][0]["digest"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{}: its index names no manifest", archive.display()))
}

/// The chart as OLM runs it: the webhook's certificate from OLM, the namespace labelled by OLM
/// (the suggested namespace's template), the images by digest.
fn render(digests: &[String; 2]) -> anyhow::Result<Vec<Value>> {
    let out = Command::new(nodemedic_lab::tools_dir().join("helm"))
        .args(["template", "nodemedic"])
        .arg(repo().join("charts/nodemedic"))
        .arg(format!("--namespace={SUGGESTED_NAMESPACE}"))
        .arg(format!("--set=webhook.certDir={OLM_CERT_DIR}"))
        .arg("--set=podSecurity.labelNamespace=false")
        .arg(format!("--set=image.digests.controller={}", digests[0]))
        .arg(format!("--set=image.digests.agent={}", digests[1]))
        .output()
        .context("running helm template (scripts/build-tools.sh builds helm)")?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).context("the rendered chart")?;
    Ok(documents.into_iter().filter(|d| d.is_object()).collect())
}

fn crds() -> anyhow::Result<Vec<Value>> {
    let dir = repo().join("deploy/crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", f.display()))
        })
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    objects.iter().filter(move |o| o["kind"] == kind)
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// ClusterRoles (and Roles) bound to the release's ServiceAccounts, as OLM's permissions:
/// account -> rules. Aggregated roles have no rules of their own and stay plain manifests.
fn permissions(objects: &[Value], binding: &str, role: &str) -> Vec<Value> {
    let mut by_account: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for b in of_kind(objects, binding) {
        let Some(r) = b["roleRef"]["name"].as_str().and_then(|n| named(objects, role, n)) else {
            continue;
        };
        if r.get("aggregationRule").is_some() {
            continue;
        }
        for subject in b["subjects"].as_array().into_iter().flatten() {
            let ours = subject["namespace"] == SUGGESTED_NAMESPACE || binding == "RoleBinding";
            if subject["kind"] == "ServiceAccount" && ours {
                let account = subject["name"].as_str().unwrap_or_default().to_owned();
                let rules = r["rules"].as_array().cloned().unwrap_or_default();
                by_account.entry(account).or_default().extend(rules);
            }
        }
    }
    by_account
        .into_iter()
        .map(|(account, rules)| json!({ "serviceAccountName": account, "rules": rules }))
        .collect()
}

/// What OLM installs as it is: ConfigMaps, the metrics Services, the roles bound later (the
/// metrics reader, the descheduler's) or aggregated, and their bindings.
fn plain_manifests(objects: &[Value]) -> Vec<Value> {
    let bound: Vec<&str> = of_kind(objects, "ClusterRoleBinding")
        .filter(|b| {
            b["roleRef"]["name"]
                .as_str()
                .and_then(|n| named(objects, "ClusterRole", n))
                .is_some_and(|r| r.get("aggregationRule").is_none())
        })
        .filter_map(|b| b["roleRef"]["name"].as_str())
        .collect();
    objects
        .iter()
        .filter(|o| match o["kind"].as_str().unwrap_or_default() {
            "ConfigMap" => true,
            "Service" => o["metadata"]["name"] != "nodemedic-controller-webhook",
            "ClusterRole" => !bound.contains(&o["metadata"]["name"].as_str().unwrap_or_default()),
            "ClusterRoleBinding" => !bound.contains(&o["roleRef"]["name"].as_str().unwrap_or_default()),
            _ => false,
        })
        .map(|o| {
            let mut o = o.clone();
            if let Some(meta) = o["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
            o
        })
        .collect()
}

/// The webhooks as OLM's definitions of them, served by the controller Deployment.
fn webhook_definitions(objects: &[Value], port: i64) -> Vec<Value> {
    of_kind(objects, "ValidatingWebhookConfiguration")
        .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default())
        .map(|w| {
            json!({
                "type": "ValidatingAdmissionWebhook",
                "generateName": w["name"],
                "deploymentName": CONTROLLER,
                "containerPort": port,
                "targetPort": port,
                "webhookPath": w["clientConfig"]["service"]["path"],
                "admissionReviewVersions": w["admissionReviewVersions"],
                "failurePolicy": w["failurePolicy"],
                "sideEffects": w["sideEffects"],
                "timeoutSeconds": w["timeoutSeconds"],
                "rules": w["rules"],
            })
        })
        .collect()
}

/// The ClusterServiceVersion's name: the package and this release's version.
pub fn csv_name() -> String {
    format!("{PACKAGE}.v{}", env!("CARGO_PKG_VERSION"))
}

/// A container's arguments, as rendered.
pub fn container_args(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn csv(objects: &[Value], crds: &[Value]) -> anyhow::Result<Value> {
    let deployment = named(objects, "Deployment", CONTROLLER).context("the chart renders no controller Deployment")?;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let controller_image = container["image"].as_str().unwrap_or_default().to_owned();
    let args = container_args(container);
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_default()
            .to_owned()
    };
    let webhook_port: i64 = flag("webhook-bind")
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9443);
    let mut clusters = permissions(objects, "ClusterRoleBinding", "ClusterRole");
    clusters.sort_by(|a, b| a["serviceAccountName"].as_str().cmp(&b["serviceAccountName"].as_str()));
    let namespace_template = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {
            "name": SUGGESTED_NAMESPACE,
            // The agents run on every node, workers or not.
            "annotations": {"openshift.io/node-selector": ""},
            // The agents are privileged pods (docs/install.md).
            "labels": {
                "pod-security.kubernetes.io/enforce": "privileged",
                "pod-security.kubernetes.io/audit": "privileged",
                "pod-security.kubernetes.io/warn": "privileged",
            },
        },
    });
    Ok(json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": csv_name(),
            "namespace": "placeholder",
            "annotations": {
                "alm-examples": serde_json::to_string_pretty(&examples()?)?,
                "capabilities": "Basic Install",
                "categories": "OpenShift Optional",
                "containerImage": controller_image,
                "description": "Detects unhealthy nodes, fences them and brings their stateful workloads back on a healthy node: Node Health Check, Self Node Remediation, Fence Agents Remediation, Node Maintenance, Machine Deletion Remediation and the descheduler in one operator, API-compatible with medik8s.",
                "operatorframework.io/suggested-namespace": SUGGESTED_NAMESPACE,
                "operatorframework.io/suggested-namespace-template": namespace_template.to_string(),
                "operators.openshift.io/infrastructure-features": "[\"disconnected\"]",
                "repository": "https://github.com/nodemedic/nodemedic",
                "support": "nodemedic",
            },
        },
        "spec": {
            "displayName": "nodemedic",
            "description": DESCRIPTION,
            "version": env!("CARGO_PKG_VERSION"),
            "minKubeVersion": "1.28.0",
            "maturity": "alpha",
            "icon": [{"base64data": icon(), "mediatype": "image/svg+xml"}],
            "provider": {"name": "nodemedic"},
            "maintainers": [{"name": "nodemedic", "email": "maintainers@nodemedic.io"}],
            "links": [{"name": "Source", "url": "https://github.com/nodemedic/nodemedic"}],
            "keywords": ["remediation", "fencing", "node health", "self node remediation", "fence agents", "maintenance", "medik8s"],
            "installModes": [
                {"type": "OwnNamespace", "supported": true},
                {"type": "SingleNamespace", "supported": false},
                {"type": "MultiNamespace", "supported": false},
                {"type": "AllNamespaces", "supported": true},
            ],
            "customresourcedefinitions": {"owned": crds.iter().map(owned).collect::<Vec<_>>()},
            "install": {
                "strategy": "deployment",
                "spec": {
                    "deployments": [{
                        "name": CONTROLLER,
                        "label": deployment["metadata"]["labels"],
                        "spec": deployment["spec"],
                    }],
                    "clusterPermissions": clusters,
                    "permissions": permissions(objects, "RoleBinding", "Role"),
                },
            },
            "webhookdefinitions": webhook_definitions(objects, webhook_port),
            "relatedImages": [
                {"name": "controller", "image": controller_image},
                {"name": "agent", "image": flag("agent-image")},
                {"name": "descheduler", "image": flag("descheduler-image")},
            ],
        },
    }))
}

/// The console's icon, base64 (as k8s-openapi writes bytes).
fn icon() -> Value {
    let svg = include_bytes!("../../../deploy/olm/icon.svg");
    serde_json::to_value(k8s_openapi::ByteString(svg.to_vec())).unwrap_or(Value::Null)
}

const DESCRIPTION: &str = "nodemedic keeps stateful workloads (VMs, StatefulSets, pods with ReadWriteOnce volumes) \
running when a node dies, hangs or is cut off. Its health check (NodeHealthCheck) finds unhealthy nodes; \
self remediation (a watchdog-armed agent on every node) or fence agents (the node's BMC, PDU, hypervisor or \
cloud) make certain nothing runs there any more; the stranded pods and volumes are released so the workload \
starts on a healthy node, and the node is brought back. Node maintenance drains nodes; machine deletion \
replaces them; the descheduler rebalances.\n\nInstall into openshift-workload-availability. The default health \
check and self-remediation configuration are created on start (docs/defaults.md); `oc nodemedic doctor` \
says what is missing and how to fix it.";

/// A CRD as the CSV owns it: its kind, storage version, description and the fields the console
/// shows (every top-level spec field; status phase and conditions with their widgets).
fn owned(crd: &Value) -> Value {
    let spec = &crd["spec"];
    let kind = spec["names"]["kind"].as_str().unwrap_or_default();
    let version = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .cloned()
        .unwrap_or(Value::Null);
    let schema = &version["schema"]["openAPIV3Schema"];
    let described = |properties: &Value| -> Vec<(String, String)> {
        properties
            .as_object()
            .map(|p| {
                p.iter()
                    .map(|(name, field)| {
                        let description = field["description"].as_str().unwrap_or_default();
                        (name.clone(), first_sentence(description))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let spec_descriptors: Vec<Value> = described(&schema["properties"]["spec"]["properties"])
        .into_iter()
        .map(|(path, description)| json!({"path": path, "displayName": display(&path), "description": description}))
        .collect();
    let status_descriptors: Vec<Value> = described(&schema["properties"]["status"]["properties"])
        .into_iter()
        .map(|(path, description)| {
            let widget = match path.as_str() {
                "phase" => vec!["urn:alm:descriptor:io.kubernetes.phase"],
                "conditions" => vec!["urn:alm:descriptor:io.kubernetes.conditions"],
                _ => Vec::new(),
            };
            json!({"path": path, "displayName": display(&path), "description": description, "x-descriptors": widget})
        })
        .collect();
    json!({
        "name": crd["metadata"]["name"],
        "kind": kind,
        "version": version["name"],
        "displayName": display(kind),
        "description": first_sentence(schema["description"].as_str().unwrap_or(kind)),
        "specDescriptors": spec_descriptors,
        "statusDescriptors": status_descriptors,
    })
}

fn first_sentence(text: &str) -> String {
    let text = text.split("\n\n").next().unwrap_or_default().replace('\n', " ");
    match text.find(". ") {
        Some(end) => text[..=end].trim().to_owned(),
        None => text.trim().to_owned(),
    }
}

/// `minHealthy` -> `Min Healthy`, `NodeHealthCheck` -> `Node Health Check`.
fn display(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if i == 0 {
            out.extend(c.to_uppercase());
        } else {
            if c.is_uppercase() {
                out.push(' ');
            }
            out.push(c);
        }
    }
    out
}

/// The seeds' manifests, one per kind, as the console's examples.
fn examples() -> anyhow::Result<Vec<Value>> {
    let dir = repo().join("fixtures/seed-manifests");
    let mut out = Vec::new();
    for file in EXAMPLES {
        let text = std::fs::read_to_string(dir.join(file)).with_context(|| format!("reading seed manifest {file}"))?;
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {file}"))?;
        out.extend(documents.into_iter().filter(|d| d.is_object()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_words() {
        assert_eq!(display("minHealthy"), "Min Healthy");
        assert_eq!(display("NodeHealthCheck"), "Node Health Check");
        assert_eq!(first_sentence("One thing. Then more.\n\nOther"), "One thing.");
        assert_eq!(first_sentence("No stop"), "No stop");
    }

    #[test]
    fn bound_roles_become_permissions_and_aggregated_ones_stay_manifests() {
        let objects = vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "a"}, "rules": [{"verbs": ["get"]}]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "agg"}, "aggregationRule": {}, "rules": []}),
            json!({"kind": "ClusterRole", "metadata": {"name": "reader"}, "rules": [{"verbs": ["get"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "a"}, "roleRef": {"name": "a"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": SUGGESTED_NAMESPACE}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "agg"}, "roleRef": {"name": "agg"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": SUGGESTED_NAMESPACE}]}),
        ];
        let perms = permissions(&objects, "ClusterRoleBinding", "ClusterRole");
        assert_eq!(
            perms,
            vec![json!({"serviceAccountName": "sa", "rules": [{"verbs": ["get"]}]})]
        );
        let plain: Vec<String> = plain_manifests(&objects)
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(plain, ["agg", "reader", "agg"]);
    }
}
