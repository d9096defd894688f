//! The Helm chart: the committed plain manifests are its rendering, and every object it renders
//! (monitoring included) is accepted by a real API server (server-side dry-run).

use std::{path::PathBuf, process::Command};

use nodemedic_lab::{LabConfig, tools_dir, version};

use crate::{support::lab, text};

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn the_committed_manifests_are_the_charts_rendering() {
    let rendered = tempfile::NamedTempFile::new().expect("temp file");
    let out = Command::new("bash")
        .arg(repo().join("scripts/render-manifests.sh"))
        .arg(rendered.path())
        .output()
        .expect("render-manifests.sh runs");
    assert!(out.status.success(), "{}", text(&out));
    let fresh = std::fs::read_to_string(rendered.path()).expect("rendered");
    let committed = std::fs::read_to_string(repo().join("deploy/nodemedic.yaml")).expect("committed");
    assert!(
        fresh == committed,
        "deploy/nodemedic.yaml is not what the chart renders; run `make manifests` and commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_the_chart_renders_is_valid_against_a_real_api_server() {
    let mut config = LabConfig::workers(1);
    config.storage = false;
    let lab = lab(config).await;
    let kubectl = |args: &[&str]| {
        let out = Command::new(lab.kubectl_path())
            .args(args)
            .env("KUBECONFIG", lab.kubeconfig())
            .output()
            .expect("kubectl runs");
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for crd in [
        "monitoring.coreos.com_servicemonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ] {
        kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &tools_dir().join(crd).display().to_string(),
        ]);
    }
    lab.crds_established().await.expect("the monitoring CRDs established");

    // Every template and toggle on.
    let out = Command::new(tools_dir().join("helm"))
        .args(["template", "nodemedic"])
        .arg(repo().join("charts/nodemedic"))
        .args([
            "--namespace=workload-availability",
            "--include-crds",
            &format!("--kube-version={}", version("KUBERNETES_VERSION")),
            "--set=serviceMonitor.enabled=true",
            "--set=prometheusRule.enabled=true",
            "--set=grafanaDashboard.enabled=true",
            "--set=metrics.agentPort=9448",
            "--set=networkPolicy.enabled=true",
            "--set=networkPolicy.bmcCidrs={10.1.0.0/16}",
            "--set=networkPolicy.nodeCidrs={10.0.0.0/24}",
            "--set=descheduler.prometheus.url=http://prometheus.monitoring.svc:9090",
            "--set=serviceMonitor.prometheusServiceAccount.name=prometheus-k8s",
            "--set=serviceMonitor.prometheusServiceAccount.namespace=monitoring",
            "--set=controller.disabled={maintenance}",
            "--set=selfNodeRemediationConfig.spec.watchdogFilePath=/dev/watchdog1",
        ])
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template: {}", text(&out));
    let rendered = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(rendered.path(), &out.stdout).expect("write");
    let applied = kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        &rendered.path().display().to_string(),
    ]);
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/nodemaintenances.nodemaintenance.medik8s.io",
        "serviceaccount/nodemedic-controller",
        "serviceaccount/nodemedic-agent",
        "clusterrole.rbac.authorization.k8s.io/nodemedic-controller",
        "clusterrole.rbac.authorization.k8s.io/nodemedic-agent",
        "clusterrole.rbac.authorization.k8s.io/nodemedic-ext-remediation",
        "clusterrolebinding.rbac.authorization.k8s.io/nodemedic-controller",
        "deployment.apps/nodemedic-controller",
        "service/nodemedic-controller-metrics",
        "servicemonitor.monitoring.coreos.com/nodemedic-controller",
        "servicemonitor.monitoring.coreos.com/nodemedic-agent",
        "service/nodemedic-agent-metrics",
        "clusterrole.rbac.authorization.k8s.io/nodemedic-metrics-reader",
        "clusterrolebinding.rbac.authorization.k8s.io/nodemedic-metrics-reader",
        "clusterrole.rbac.authorization.k8s.io/nodemedic-controller-namespace",
        "networkpolicy.networking.k8s.io/nodemedic-controller",
        "prometheusrule.monitoring.coreos.com/nodemedic",
        "configmap/nodemedic-dashboard",
        "configmap/nodemedic-default-self-remediation-config",
        "customresourcedefinition.apiextensions.k8s.io/poisonpillremediations.medik8s.io",
        "configmap/nodemedic-default-health-check",
    ] {
        assert!(
            applied.contains(&format!("{object} serverside-applied (server dry run)")),
            "{object} not accepted:\n{applied}"
        );
    }

    // The default health check and configuration the controller creates from those ConfigMaps
    // are valid too.
    let rendered_chart = String::from_utf8_lossy(&out.stdout);
    for (yaml, created) in [
        (
            default_health_check(&rendered_chart).expect("the chart renders the default check"),
            "nodehealthcheck.remediation.medik8s.io/nhc-worker-default created (server dry run)",
        ),
        (
            configmap_key(
                &rendered_chart,
                "nodemedic-default-self-remediation-config",
                "selfnoderemediationconfig.yaml",
            )
            .expect("the chart renders the default configuration"),
            "selfnoderemediationconfig.self-node-remediation.medik8s.io/self-node-remediation-config created (server dry run)",
        ),
    ] {
        std::fs::write(rendered.path(), yaml).expect("write");
        let applied = kubectl(&[
            "create",
            "--dry-run=server",
            "--namespace=workload-availability",
            "-f",
            &rendered.path().display().to_string(),
        ]);
        assert!(applied.contains(created), "{applied}");
    }
}

/// A key of a ConfigMap the chart renders, if any.
fn configmap_key(rendered: &str, name: &str, key: &str) -> Option<String> {
    rendered
        .split("\n---\n")
        .filter_map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).ok())
        .find(|doc| doc["kind"] == "ConfigMap" && doc["metadata"]["name"] == name)
        .and_then(|doc| doc["data"][key].as_str().map(str::to_owned))
}

/// The NodeHealthCheck in the rendered ConfigMap nodemedic-default-health-check, if any.
fn default_health_check(rendered: &str) -> Option<String> {
    configmap_key(rendered, "nodemedic-default-health-check", "nodehealthcheck.yaml")
}

#[test]
fn the_default_health_check_is_rendered_unless_disabled() {
    let render = |extra: &[&str]| {
        let out = Command::new(tools_dir().join("helm"))
            .args(["template", "nodemedic"])
            .arg(repo().join("charts/nodemedic"))
            .arg("--namespace=workload-availability")
            .args(extra)
            .output()
            .expect("helm runs");
        assert!(out.status.success(), "helm template: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let defaults = render(&[]);
    let check = default_health_check(&defaults).expect("rendered by default");
    for line in [
        "name: nhc-worker-default",
        "minHealthy: \"51%\"",
        "type: PeersReachable",
        "duration: 0s",
        "duration: 60s",
        "kind: SelfNodeRemediationTemplate",
        "namespace: workload-availability",
    ] {
        assert!(check.contains(line), "{line:?} missing:\n{check}");
    }
    // The controller picks the workers' selector (docs/defaults.md).
    assert_eq!(
        configmap_key(&defaults, "nodemedic-default-health-check", "selector").as_deref(),
        Some("workers")
    );
    let config = configmap_key(
        &defaults,
        "nodemedic-default-self-remediation-config",
        "selfnoderemediationconfig.yaml",
    )
    .expect("the default configuration");
    for line in ["watchdogTimeout: 2s", "apiCheckInterval: 4s", "peerDetection: {}"] {
        assert!(config.contains(line), "{line:?} missing:\n{config}");
    }
    // medik8s's defaults on request: seed 001's check, medik8s's configuration.
    let medik8s = render(&["--set=medik8sDefaults=true"]);
    let check = default_health_check(&medik8s).expect("rendered");
    for line in ["key: node-role.kubernetes.io/worker", "duration: 300s"] {
        assert!(check.contains(line), "{line:?} missing:\n{check}");
    }
    assert!(!check.contains("PeersReachable"), "{check}");
    assert_eq!(
        configmap_key(&medik8s, "nodemedic-default-health-check", "selector"),
        None
    );
    let config = configmap_key(
        &medik8s,
        "nodemedic-default-self-remediation-config",
        "selfnoderemediationconfig.yaml",
    )
    .expect("the configuration");
    assert!(
        !config.contains("peerDetection") && !config.contains("apiCheckInterval"),
        "{config}"
    );
    // Fence agents first, then self remediation, with one value.
    let fenced = render(&["--set=defaultHealthCheck.fenceAgentsTemplate.name=my-bmcs"]);
    let check = default_health_check(&fenced).expect("rendered");
    for line in [
        "escalatingRemediations:",
        "kind: FenceAgentsRemediationTemplate",
        "name: my-bmcs",
        "order: 1",
    ] {
        assert!(check.contains(line), "{line:?} missing:\n{check}");
    }
    let selector = r#"--set-json=defaultHealthCheck.selector={"matchExpressions":[{"key":"node-role.kubernetes.io/control-plane","operator":"DoesNotExist"}]}"#;
    let check = default_health_check(&render(&[selector, "--set=defaultHealthCheck.minHealthy=2"])).expect("rendered");
    assert!(
        check.contains("operator: DoesNotExist") && check.contains("minHealthy: \"2\""),
        "{check}"
    );
    let disabled = render(&["--set=defaultHealthCheck.enabled=false"]);
    assert_eq!(default_health_check(&disabled), None);
    assert!(!disabled.contains("kind: NodeHealthCheck"), "{disabled}");
}
