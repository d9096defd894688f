//! The admission webhook against a real API server: the chart's ValidatingWebhookConfiguration
//! (its rules, failurePolicy Ignore and timeout), pointed by URL at the controller on this host,
//! whose caBundle the controller sets itself.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceAgentsRemediationTemplate},
    healthcheck::NodeHealthCheck,
    maintenance::{NodeMaintenance, NodeMaintenanceSpec},
    self_remediation::SelfNodeRemediation,
};
use nodemedic_lab::LabConfig;
use serde_json::json;

use crate::support::{NS, apply_seed, apply_seed_check, eventually, free_port, lab, list, start_controller};

const LONG: Duration = Duration::from_secs(90);
const NHC: &str = "nhc-snr-3node";

/// The chart's ValidatingWebhookConfiguration, each webhook called at `https://127.0.0.1:port`
/// plus its path instead of through the Service (the lab has no Service network).
fn chart_configuration(port: u16) -> ValidatingWebhookConfiguration {
    let rendered = include_str!("../../../../deploy/nodemedic.yaml");
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(rendered).expect("the rendered chart parses");
    let mut configuration = documents
        .into_iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("the chart renders a ValidatingWebhookConfiguration");
    for webhook in configuration["webhooks"].as_array_mut().expect("webhooks") {
        let path = webhook["clientConfig"]["service"]["path"]
            .as_str()
            .expect("a path")
            .to_owned();
        assert_eq!(webhook["failurePolicy"], "Ignore", "the chart's failurePolicy");
        webhook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}{path}")});
    }
    serde_json::from_value(configuration).expect("a ValidatingWebhookConfiguration")
}

fn maintenance(name: &str, node: &str) -> NodeMaintenance {
    NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            reason: Some("webhook test".into()),
            drain_timeout: None,
        },
    )
}

/// The API server's refusal of `result`: its code and message.
fn refusal<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

async fn nhc_exists(client: &Client) -> bool {
    Api::<NodeHealthCheck>::all(client.clone())
        .get_opt(NHC)
        .await
        .expect("reading the check")
        .is_some()
}

/// Waits until the check's status shows a remediation for `node` (what the webhook judges).
async fn remediating(client: &Client, node: &str) {
    eventually(&format!("{NHC} remediating {node}"), LONG, || async move {
        let check = Api::<NodeHealthCheck>::all(client.clone()).get(NHC).await.ok()?;
        let nodes = check.status?.unhealthy_nodes?;
        nodes
            .iter()
            .any(|n| n.name == node && !n.remediations.is_empty())
            .then_some(())
    })
    .await
}

async fn snr_for(client: &Client, node: &str) -> Option<SelfNodeRemediation> {
    list::<SelfNodeRemediation>(client, NS).await.into_iter().find(|r| {
        r.annotations()
            .get("remediation.medik8s.io/node-name")
            .map(String::as_str)
            == Some(node)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "a scenario on one lab, read whole in the order it happens: its steps share the lab, its clients and its objects"
)]
async fn the_webhook_refuses_what_medik8s_refuses_and_a_down_controller_blocks_nothing() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});
    let port = free_port();
    // No remediator runs: the health check's remediation objects stay until it removes them.
    start_controller(
        &lab,
        "controller",
        &[
            "--disable=self-remediation",
            "--disable=fence-agents",
            &format!("--webhook-bind=127.0.0.1:{port}"),
            "--webhook-extra-san=127.0.0.1",
        ],
    );
    let configurations = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let registered = configurations
        .create(&PostParams::default(), &chart_configuration(port))
        .await
        .expect("registering the chart's webhooks");
    let name = registered.name_any();

    // The controller sets the caBundle (the chart leaves it out) from its CA Secret.
    eventually("the controller to set the caBundle", LONG, || {
        let configurations = configurations.clone();
        let name = name.clone();
        async move {
            let c = configurations.get(&name).await.ok()?;
            let webhooks = c.webhooks?;
            webhooks
                .iter()
                .all(|w| w.client_config.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty()))
                .then_some(())
        }
    })
    .await;
    let nms = Api::<NodeMaintenance>::all(client.clone());
    // The API server picks the new caBundle up on its own time: probe with a dry run.
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("the webhook to answer", LONG, || {
        let nms = nms.clone();
        let dry_run = dry_run.clone();
        async move {
            nms.create(&dry_run, &maintenance("probe", "no-such-node"))
                .await
                .err()
                .filter(|e| e.to_string().contains("does not exist"))
        }
    })
    .await;

    // A NodeMaintenance for a missing node.
    let (code, message) = refusal(
        nms.create(&PostParams::default(), &maintenance("nm-missing", "node-9"))
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("node node-9 does not exist"), "{message}");

    // A second NodeMaintenance for the same node.
    nms.create(&PostParams::default(), &maintenance("nm-first", "node-1"))
        .await
        .expect("the first maintenance of node-1 is admitted");
    let (code, message) = refusal(
        nms.create(&PostParams::default(), &maintenance("nm-second", "node-1"))
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("node node-1 is already in maintenance by NodeMaintenance nm-first"),
        "{message}"
    );
    // Its controller's updates (finalizer, owner reference) and its removal pass the webhook.
    nms.delete("nm-first", &DeleteParams::default())
        .await
        .expect("deleting nm-first");
    eventually("nm-first to be gone", LONG, || {
        let nms = nms.clone();
        async move { nms.get_opt("nm-first").await.ok()?.is_none().then_some(()) }
    })
    .await;

    fence_agents_admission(&client).await;

    // A NodeHealthCheck with a remediation in flight cannot be deleted...
    let checks = Api::<NodeHealthCheck>::all(client.clone());
    lab.crash("node-2").await.expect("crash node-2");
    remediating(&client, "node-2").await;
    let (code, message) = refusal(checks.delete(NHC, &DeleteParams::default()).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("has remediations in flight") && message.contains("node node-2"),
        "{message}"
    );
    assert!(nhc_exists(&client).await, "the refused delete left the check");
    // ...nor its selector changed (node-2's remediation would be left behind), while a pause may
    // be added.
    let moved =
        json!({"spec": {"selector": {"matchLabels": {"kubernetes.io/hostname": "node-1"}, "matchExpressions": null}}});
    let (code, message) = refusal(checks.patch(NHC, &PatchParams::default(), &Patch::Merge(&moved)).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("spec.selector cannot change while remediations run") && message.contains("node-2"),
        "{message}"
    );
    let paused = json!({"spec": {"pauseRequests": ["webhook test"]}});
    checks
        .patch(NHC, &PatchParams::default(), &Patch::Merge(&paused))
        .await
        .expect("a pause passes");
    let resumed = json!({"spec": {"pauseRequests": null}});
    checks
        .patch(NHC, &PatchParams::default(), &Patch::Merge(&resumed))
        .await
        .expect("and its removal");

    // ...and can once none is.
    lab.power_on("node-2").await.expect("power on node-2");
    eventually("node-2's remediation to end", LONG, || async {
        let check = checks.get(NHC).await.ok()?;
        let busy = check
            .status?
            .unhealthy_nodes
            .unwrap_or_default()
            .iter()
            .any(|n| !n.remediations.is_empty());
        (!busy && snr_for(&client, "node-2").await.is_none()).then_some(())
    })
    .await;
    checks
        .delete(NHC, &DeleteParams::default())
        .await
        .expect("deleting the check with nothing in flight");
    eventually("the check to be gone", LONG, || async {
        (!nhc_exists(&client).await).then_some(())
    })
    .await;

    // With the controller down, failurePolicy Ignore lets an emergency delete through even with a
    // remediation in flight; the garbage collector then removes the remediation it owned.
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});
    lab.crash("node-3").await.expect("crash node-3");
    remediating(&client, "node-3").await;
    lab.kill_process("controller").expect("stop the controller");
    checks
        .delete(NHC, &DeleteParams::default())
        .await
        .expect("a down controller does not block the delete");
    eventually("the check to be gone", LONG, || async {
        (!nhc_exists(&client).await).then_some(())
    })
    .await;
    eventually("node-3's orphaned remediation to be collected", LONG, || async {
        snr_for(&client, "node-3").await.is_none().then_some(())
    })
    .await;
}

/// A fence-agents spec with its options shared by every node, `extra` added.
fn far_spec(secret: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut shared = json!({"--ip": "{{.NodeName}}.bmc", "--username": "admin"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        shared[k] = v.clone();
    }
    json!({"agent": "fence_redfish", "sharedSecretName": secret, "sharedparameters": shared})
}

fn far_template(name: &str, spec: serde_json::Value) -> FenceAgentsRemediationTemplate {
    serde_json::from_value(json!({
        "apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
        "kind": "FenceAgentsRemediationTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": spec}}
    }))
    .expect("a template")
}

/// medik8s's fence-agents admission: a template is refused while a Secret it names is missing or
/// its options cannot be built (found now, not during an outage); a remediation whose Secret is
/// missing is admitted, since it waits for it, but one whose options cannot be built is refused.
async fn fence_agents_admission(client: &Client) {
    let templates = Api::<FenceAgentsRemediationTemplate>::namespaced(client.clone(), NS);
    let (code, message) = refusal(
        templates
            .create(
                &PostParams::default(),
                &far_template("far-early", far_spec("bmc-login", json!({}))),
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("for every node: Secret bmc-login (named by sharedSecretName) does not exist"),
        "{message}"
    );
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "bmc-login", "namespace": NS},
        "stringData": {"--password": "secret"}
    }))
    .expect("a Secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret");
    // A parameter both in the spec and in the Secret: only a read of the Secret can tell.
    let (code, message) = refusal(
        templates
            .create(
                &PostParams::default(),
                &far_template("far-twice", far_spec("bmc-login", json!({"--password": "inline"}))),
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("is set both in the spec and in a secret"), "{message}");
    templates
        .create(
            &PostParams::default(),
            &far_template("far-early", far_spec("bmc-login", json!({}))),
        )
        .await
        .expect("with its Secret, the template is admitted");

    let remediations = Api::<FenceAgentsRemediation>::namespaced(client.clone(), NS);
    let remediation = |name: &str, spec: serde_json::Value| -> FenceAgentsRemediation {
        serde_json::from_value(json!({
            "apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
            "kind": "FenceAgentsRemediation",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec
        }))
        .expect("a remediation")
    };
    remediations
        .create(
            &PostParams::default(),
            &remediation("node-1", far_spec("not-yet", json!({}))),
        )
        .await
        .expect("a remediation waits for its Secret: admitted");
    let (code, message) = refusal(
        remediations
            .create(
                &PostParams::default(),
                &remediation("node-2", far_spec("bmc-login", json!({"--password": "inline"}))),
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("FenceAgentsRemediation node-2 cannot fence: for node node-2:")
            && message.contains("is set both in the spec and in a secret"),
        "{message}"
    );
    remediations
        .delete("node-1", &DeleteParams::default())
        .await
        .expect("deleting the waiting remediation");
    templates
        .delete("far-early", &DeleteParams::default())
        .await
        .expect("deleting the template");
}
