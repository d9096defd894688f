//! The OLM bundle, as `make bundle` writes it from the chart and the images: the Operator
//! Framework's own validation passes it (its default bundle validators, OperatorHub's, good
//! practices and deprecated APIs), and it carries what OLM must know to run nodemedic as Helm
//! does.

use std::{process::Command, time::Duration};

use nodemedic_harness::{bundle, images::Images};
use nodemedic_lab::{LabConfig, NodeSpec, ProcessSpec, tools_dir, version};
use serde_json::Value;

use crate::{
    nodemedic_exe,
    support::{eventually, free_port, lab},
    text,
};

#[test]
fn the_olm_bundle_made_from_the_chart_passes_the_operator_framework_s_validation() {
    let images = Images::of(&nodemedic_exe()).expect("the images are built");
    // The Operator Framework's loader skips a directory whose name starts with a dot, as
    // tempfile's do by default.
    let out = tempfile::Builder::new().prefix("bundle-").tempdir().expect("temp dir");
    bundle::generate(out.path(), &images).expect("the bundle is written");

    let kubernetes = version("KUBERNETES_VERSION");
    let minor = kubernetes.rsplit_once('.').map_or(kubernetes, |(minor, _)| minor);
    let validated = Command::new(tools_dir().join("bundle-validate"))
        .arg(out.path())
        .arg(minor)
        .output()
        .expect("the validator runs (scripts/build-tools.sh builds it)");
    println!("{}", text(&validated));
    assert!(validated.status.success(), "{}", text(&validated));

    let csv_file = out
        .path()
        .join(format!("manifests/{}.clusterserviceversion.yaml", bundle::PACKAGE));
    let csv: Value = serde_saphyr::from_str(&std::fs::read_to_string(csv_file).expect("the CSV")).expect("YAML");
    let spec = &csv["spec"];
    // Every CRD the chart installs is owned.
    let crds = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/crds"))
        .expect("the CRDs")
        .count();
    assert_eq!(
        spec["customresourcedefinitions"]["owned"].as_array().map(Vec::len),
        Some(crds)
    );
    // The accounts OLM makes, each with its ClusterRole's rules.
    let accounts: Vec<&str> = spec["install"]["spec"]["clusterPermissions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["serviceAccountName"].as_str())
        .collect();
    assert_eq!(
        accounts,
        ["nodemedic-agent", "nodemedic-controller", "nodemedic-soft-tainter"]
    );
    // The webhooks, served by the controller with the certificate OLM mounts.
    let webhooks: Vec<&str> = spec["webhookdefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["webhookPath"].as_str())
        .collect();
    assert_eq!(
        webhooks,
        [
            "/validate-nodemaintenance",
            "/validate-nodehealthcheck",
            "/validate-fenceagentsremediation"
        ]
    );
    let deployment = &spec["install"]["spec"]["deployments"][0]["spec"];
    let container = &deployment["template"]["spec"]["containers"][0];
    let args = bundle::container_args(container);
    assert!(
        args.contains(&"--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs"),
        "{args:?}"
    );
    // The images by digest.
    for image in [
        container["image"].as_str(),
        args.iter().find_map(|a| a.strip_prefix("--agent-image=")),
    ] {
        assert!(image.is_some_and(|i| i.contains("@sha256:")), "{image:?}");
    }
    // The namespace OLM suggests admits the privileged agents.
    let template = csv["metadata"]["annotations"]["operatorframework.io/suggested-namespace-template"]
        .as_str()
        .expect("a namespace template");
    assert!(
        template.contains("\"pod-security.kubernetes.io/enforce\":\"privileged\""),
        "{template}"
    );
}

/// OLM itself installs the bundle, as OperatorHub does on OpenShift: OLM's operators (built from
/// their Go modules) run beside a lab's control plane, opm serves a file-based catalog holding
/// the bundle, and a Subscription in the suggested namespace, under an OperatorGroup for every
/// namespace, takes nodemedic from it. OLM resolves it, applies the CRDs, the RBAC and the CSV,
/// makes the webhooks' certificates and the controller's Deployment, and the CSV succeeds. The
/// lab's nodes run pods as kwok does: the Deployment is available without its image running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn olm_installs_the_bundle_from_a_catalog_and_its_csv_succeeds() {
    let images = Images::of(&nodemedic_exe()).expect("the images are built");
    let work = tempfile::Builder::new().prefix("olm-").tempdir().expect("temp dir");
    let bundle_dir = work.path().join("bundle");
    bundle::generate(&bundle_dir, &images).expect("the bundle is written");
    let catalog = work.path().join("catalog");
    file_based_catalog(&bundle_dir, &catalog);

    let nodes = (1..=2).map(|i| NodeSpec::plain(&format!("node-{i}"))).collect();
    let lab = lab(LabConfig::new(nodes)).await;
    let tools = tools_dir();
    lab.kubectl(&["create", "-f", &tools.join("olm-crds").display().to_string()])
        .expect("OLM's CRDs");
    lab.crds_established().await.expect("OLM's CRDs established");
    let port = free_port();

    // OLM's operators serve their health on a fixed :8080 each: each runs in a node's network
    // namespace (which reaches the API server), the catalog operator beside opm.
    let kubeconfig = lab.kubeconfig().display().to_string();
    let opm = ProcessSpec::new(
        tools.join("opm"),
        [
            "serve".to_owned(),
            catalog.display().to_string(),
            format!("--port={port}"),
        ],
    );
    lab.add_node_process("node-2", "opm", opm)
        .expect("opm serves the catalog");
    // The catalog operator's first connection must find opm listening: a refused one puts its
    // gRPC channel in backoff, which on a loaded machine held the install back for minutes.
    eventually("opm listening", Duration::from_secs(120), || async {
        lab.node_can_reach("node-2", std::net::Ipv4Addr::LOCALHOST, port)
            .ok()?
            .then_some(())
    })
    .await;
    lab.apply_yaml(&olm_objects(port))
        .expect("OLM's namespace, catalog and subscription");
    for (node, name) in [("node-1", "olm"), ("node-2", "catalog")] {
        let spec = ProcessSpec::new(
            tools.join(name),
            [format!("--namespace={OLM_NAMESPACE}"), "--writeStatusName=".into()],
        )
        .env("KUBECONFIG", &kubeconfig)
        .env("OPERATOR_NAMESPACE", OLM_NAMESPACE);
        lab.add_node_process(node, name, spec).expect("OLM's operator starts");
    }

    let csv = bundle::csv_name();
    eventually(&format!("CSV {csv} Succeeded"), Duration::from_secs(240), || async {
        let phase = lab
            .kubectl(&[
                "get",
                "csv",
                &csv,
                "-n",
                bundle::SUGGESTED_NAMESPACE,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .unwrap_or_default();
        (phase.trim() == "Succeeded").then_some(())
    })
    .await;
    // What OLM made from the bundle: the controller by digest, the webhooks with OLM's CA.
    let image = lab
        .kubectl(&[
            "get",
            "deployment",
            "nodemedic-controller",
            "-n",
            bundle::SUGGESTED_NAMESPACE,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .expect("the controller's Deployment");
    assert!(image.contains("@sha256:"), "{image}");
    let ca = lab
        .kubectl(&[
            "get",
            "validatingwebhookconfigurations",
            "-l",
            &format!("olm.owner={csv}"),
            "-o",
            "jsonpath={.items[*].webhooks[*].clientConfig.caBundle}",
        ])
        .expect("the webhooks");
    assert_eq!(ca.split_whitespace().filter(|c| !c.is_empty()).count(), 3, "{ca}");
}

const OLM_NAMESPACE: &str = "olm";
const CATALOG: &str = "nodemedic-catalog";

/// The catalog opm serves: the bundle as `opm render` makes it (its manifests inline, so OLM
/// installs it without pulling a bundle image), in a package with one channel.
fn file_based_catalog(bundle_dir: &std::path::Path, catalog: &std::path::Path) {
    let opm = tools_dir().join("opm");
    let rendered = Command::new(&opm)
        .args(["render", "--output=yaml"])
        .arg(bundle_dir)
        .output()
        .expect("opm runs (scripts/build-tools.sh builds it)");
    assert!(rendered.status.success(), "{}", text(&rendered));
    let rendered = String::from_utf8(rendered.stdout).expect("UTF-8");
    let csv = bundle::csv_name();
    let package = format!(
        "---\nschema: olm.package\nname: {package}\ndefaultChannel: {channel}\n---\nschema: olm.channel\npackage: {package}\nname: {channel}\nentries:\n- name: {csv}\n",
        package = bundle::PACKAGE,
        channel = bundle::CHANNEL,
    );
    let dir = catalog.join(bundle::PACKAGE);
    std::fs::create_dir_all(&dir).expect("catalog dir");
    // opm starts its document with a separator.
    let bundle = rendered.trim_start().trim_start_matches("---").trim_start();
    std::fs::write(dir.join("catalog.yaml"), format!("{package}---\n{bundle}")).expect("catalog written");
    let validated = Command::new(&opm)
        .arg("validate")
        .arg(catalog)
        .output()
        .expect("opm runs");
    assert!(validated.status.success(), "{}", text(&validated));
}

fn olm_objects(port: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {OLM_NAMESPACE}
---
apiVersion: operators.coreos.com/v1alpha1
kind: CatalogSource
metadata:
  name: {CATALOG}
  namespace: {OLM_NAMESPACE}
spec:
  sourceType: grpc
  address: 127.0.0.1:{port}
  displayName: nodemedic
---
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
  labels:
    pod-security.kubernetes.io/enforce: privileged
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata:
  name: {package}
  namespace: {ns}
---
apiVersion: operators.coreos.com/v1alpha1
kind: Subscription
metadata:
  name: {package}
  namespace: {ns}
spec:
  channel: {channel}
  name: {package}
  source: {CATALOG}
  sourceNamespace: {OLM_NAMESPACE}
  installPlanApproval: Automatic
"#,
        ns = bundle::SUGGESTED_NAMESPACE,
        package = bundle::PACKAGE,
        channel = bundle::CHANNEL,
    )
}
