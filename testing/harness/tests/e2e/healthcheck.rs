//! Node Health Check against a real control plane (no remediator runs: the remediation objects
//! themselves are what is checked).

use std::time::Duration;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    healthcheck::{NodeHealthCheck, NodeHealthCheckPhase},
    self_remediation::SelfNodeRemediation,
};
use nodemedic_lab::{LabConfig, NodeSpec};
use serde_json::json;

use crate::support::{
    NS, apply_seed, apply_seed_check, event_with, eventually, lab, list, metrics, sample, start_controller,
};

const LONG: Duration = Duration::from_secs(90);
/// No remediator runs here: the remediation objects themselves are what is checked.
pub(crate) const ONLY_HEALTH_CHECK: &[&str] = &["--disable", "self-remediation", "--disable", "fence-agents"];

pub(crate) async fn nhc(client: &Client, name: &str) -> NodeHealthCheck {
    Api::<NodeHealthCheck>::all(client.clone())
        .get(name)
        .await
        .expect("NodeHealthCheck")
}

async fn patch_check(client: &Client, name: &str, patch: serde_json::Value) {
    Api::<NodeHealthCheck>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch the check");
}

pub(crate) async fn phase_is(client: &Client, name: &str, phase: NodeHealthCheckPhase) {
    eventually(&format!("{name} phase {phase:?}"), LONG, || async move {
        (nhc(client, name).await.status.and_then(|s| s.phase) == Some(phase)).then_some(())
    })
    .await
}

/// Waits until the node's self remediation carries the annotation that tells it its check timed
/// out: written after the next remediation is created (the creations of one decision go first),
/// so awaited rather than read once.
async fn told_timed_out(client: &Client, node: &str) {
    eventually(&format!("{node}'s timed-out remediation told so"), LONG, || async {
        snr_for(client, node)
            .await
            .into_iter()
            .next()
            .filter(|snr| snr.annotations().contains_key("remediation.medik8s.io/nhc-timed-out"))
    })
    .await;
}

pub(crate) async fn snr_for(client: &Client, node: &str) -> Vec<SelfNodeRemediation> {
    list::<SelfNodeRemediation>(client, NS)
        .await
        .into_iter()
        .filter(|r| {
            r.annotations()
                .get("remediation.medik8s.io/node-name")
                .map(String::as_str)
                == Some(node)
        })
        .collect()
}

/// The node's current Ready condition: (status, lastTransitionTime).
async fn ready(client: &Client, node: &str) -> (String, jiff::Timestamp) {
    let node = Api::<Node>::all(client.clone()).get(node).await.expect("node");
    let c = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .expect("Ready");
    (c.status, c.last_transition_time.map(|t| t.0).expect("transition time"))
}

async fn unhealthy_listed(client: &Client, name: &str, node: &str) {
    eventually(&format!("{node} listed unhealthy by {name}"), LONG, || async move {
        let status = nhc(client, name).await.status?;
        status.unhealthy_nodes?.iter().any(|n| n.name == node).then_some(())
    })
    .await
}

fn snr_check(name: &str, selector: &str, extra: serde_json::Value) -> String {
    let mut spec = json!({
        "selector": {"matchExpressions": [{"key": selector, "operator": "Exists"}]},
        "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "namespace": NS, "name": "self-node-remediation-automatic-strategy-template"},
        "minHealthy": "51%",
        "unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5s"}, {"type": "Ready", "status": "Unknown", "duration": "5s"}]
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": name}, "spec": spec}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_checks_remediate_a_crashed_node_after_the_duration_and_stop_when_it_is_back() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {});
    let port = start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "nhc-snr-3node", NodeHealthCheckPhase::Enabled).await;

    lab.crash("node-2").await.expect("crash");
    let snr = eventually("a SelfNodeRemediation for node-2", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
    let (status, since) = ready(&client, "node-2").await;
    assert_eq!(status, "Unknown");
    let created = snr.metadata.creation_timestamp.as_ref().expect("created").0;
    assert!(
        created >= since + Duration::from_secs(10),
        "created {created}, before Ready=Unknown since {since} held for 10s"
    );
    assert_eq!(snr.name_any(), "node-2");
    assert_eq!(snr.owner_references()[0].kind, "NodeHealthCheck");
    assert!(
        snr.labels().contains_key("remediation.medik8s.io/isControlPlaneNode"),
        "node-2 is a control-plane node"
    );
    assert_eq!(
        snr.annotations()["remediation.medik8s.io/template-name"],
        "self-node-remediation-automatic-strategy-template"
    );
    phase_is(&client, "nhc-snr-3node", NodeHealthCheckPhase::Remediating).await;
    let text = eventually("metrics", LONG, || async { metrics(port) }).await;
    assert_eq!(
        sample(&text, "nodemedic_healthcheck_remediations_started_total{"),
        Some(1.0),
        "{text}"
    );

    lab.power_on("node-2").await.expect("power on");
    eventually("the SelfNodeRemediation to be removed", LONG, || async {
        snr_for(&client, "node-2").await.is_empty().then_some(())
    })
    .await;
    phase_is(&client, "nhc-snr-3node", NodeHealthCheckPhase::Enabled).await;
    assert_eq!(
        nhc(&client, "nhc-snr-3node").await.status.and_then(|s| s.healthy_nodes),
        Some(3)
    );

    // The fence-agents seed the same way (its template's --hostname is the remediator's
    // business, not the health check's).
    Api::<NodeHealthCheck>::all(client.clone())
        .delete("nhc-snr-3node", &DeleteParams::default())
        .await
        .expect("delete");
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    apply_seed(&lab, "002-far-template.yaml", |_| {});
    apply_seed(&lab, "002-nhc-far-3node.yaml", |_| {});
    phase_is(&client, "nhc-far-3node", NodeHealthCheckPhase::Enabled).await;
    lab.crash("node-3").await.expect("crash");
    let far = eventually("a FenceAgentsRemediation for node-3", LONG, || async {
        list::<FenceAgentsRemediation>(&client, NS)
            .await
            .into_iter()
            .find(|f| f.name_any() == "node-3")
    })
    .await;
    assert_eq!(far.spec.agent, "fence_redfish", "the spec is the template's");
    assert_eq!(far.spec.sharedparameters["--hostname"], "{{.NodeName}}.mgmt.kemo.labs");
    lab.power_on("node-3").await.expect("power on");
    eventually("the FenceAgentsRemediation to be removed", LONG, || async {
        list::<FenceAgentsRemediation>(&client, NS)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    phase_is(&client, "nhc-far-3node", NodeHealthCheckPhase::Enabled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_budget_nothing_is_remediated_and_the_check_says_why() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "nhc-snr-3node", NodeHealthCheckPhase::Enabled).await;

    lab.crash("node-1").await.expect("crash");
    lab.crash("node-2").await.expect("crash");
    unhealthy_listed(&client, "nhc-snr-3node", "node-1").await;
    unhealthy_listed(&client, "nhc-snr-3node", "node-2").await;
    let condition = eventually("RemediationAllowed=False", LONG, || async {
        let conditions = nhc(&client, "nhc-snr-3node").await.status?.conditions?;
        conditions
            .into_iter()
            .find(|c| c.type_ == "RemediationAllowed" && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, "TooFewHealthyNodes");
    assert!(
        condition
            .message
            .contains("1 of 3 selected nodes are healthy and 2 unhealthy")
            && condition.message.contains("requires at least 2"),
        "{}",
        condition.message
    );
    let event = event_with(&client, "RemediationSkipped", "should equal or exceed 2").await;
    assert!(event.note.as_deref().is_some_and(|n| n.contains("is 1")), "{event:?}");
    assert!(
        list::<SelfNodeRemediation>(&client, NS).await.is_empty(),
        "nothing is remediated over budget"
    );
}

/// Every self-remediation template can escalate (medik8s marks them all so): a user's own runs
/// after the default one. Two steps of one kind cannot both name their remediation after the
/// node, so each gets a generated name and names its node in the annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_from_one_self_remediation_template_to_another_gives_each_remediation_its_own_name() {
    let lab = lab(LabConfig::workers(3)).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "004-snr-template-automatic.yaml", |m| {
        m["metadata"]["name"] = json!("snr-resource-deletion");
        m["spec"]["template"]["spec"]["remediationStrategy"] = json!("ResourceDeletion");
    });
    let template = |name: &str| json!({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "namespace": NS, "name": name});
    let check = json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "two-snr"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
            "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "duration": "5s"}],
            "escalatingRemediations": [
                {"order": 1, "timeout": "5m", "remediationTemplate": template("self-node-remediation-automatic-strategy-template")},
                {"order": 2, "timeout": "5m", "remediationTemplate": template("snr-resource-deletion")}
            ]
        }
    });
    lab.apply_yaml(&check.to_string()).expect("the check");
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "two-snr", NodeHealthCheckPhase::Enabled).await;
    lab.crash("node-1").await.expect("crash");
    let first = eventually("node-1's first SelfNodeRemediation", LONG, || async {
        snr_for(&client, "node-1").await.into_iter().next()
    })
    .await;
    assert!(
        first.name_any().starts_with("node-1-"),
        "a generated name: {}",
        first.name_any()
    );
    let failed = json!({"status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "RemediationFailed", "message": "test", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    Api::<SelfNodeRemediation>::namespaced(client.clone(), NS)
        .patch_status(&first.name_any(), &PatchParams::default(), &Patch::Merge(&failed))
        .await
        .expect("report failure");
    let second = eventually("node-1's second SelfNodeRemediation", LONG, || async {
        snr_for(&client, "node-1")
            .await
            .into_iter()
            .find(|r| r.name_any() != first.name_any())
    })
    .await;
    assert!(
        second.name_any().starts_with("node-1-"),
        "a generated name: {}",
        second.name_any()
    );
    assert_eq!(
        second.spec.remediation_strategy,
        nodemedic_api::self_remediation::RemediationStrategy::ResourceDeletion,
        "made from the user's template"
    );
    let listed = eventually("the check to list both of node-1's remediations", LONG, || async {
        nhc(&client, "two-snr")
            .await
            .status
            .and_then(|s| s.unhealthy_nodes)
            .and_then(|nodes| nodes.into_iter().find(|n| n.name == "node-1"))
            .filter(|n| n.remediations.len() == 2)
    })
    .await;
    assert!(
        listed
            .remediations
            .iter()
            .any(|r| r.resource.name == Some(second.name_any())),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_moves_on_when_a_remediation_fails_or_times_out() {
    let lab = lab(LabConfig::workers(5)).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    apply_seed(&lab, "002-far-template.yaml", |_| {});
    let check = json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "NodeHealthCheck", "metadata": {"name": "escalating"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "Exists"}]},
            "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "duration": "5s"}],
            "escalatingRemediations": [
                {"order": 1, "timeout": "1m", "remediationTemplate": {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate", "namespace": NS, "name": "self-node-remediation-automatic-strategy-template"}},
                {"order": 2, "timeout": "5m", "remediationTemplate": {"apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1", "kind": "FenceAgentsRemediationTemplate", "namespace": NS, "name": "famt-3node"}}
            ]
        }
    });
    lab.apply_yaml(&check.to_string()).expect("escalating check");
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "escalating", NodeHealthCheckPhase::Enabled).await;
    let far_for = |node: &'static str| {
        let client = client.clone();
        async move {
            list::<FenceAgentsRemediation>(&client, NS)
                .await
                .into_iter()
                .find(|f| f.name_any() == node)
        }
    };

    // node-1's remediator reports Succeeded=False: the next template at once. node-2's never
    // finishes: timed out after its minute, then the next template. Both crash together so the
    // minute runs while node-1 is checked.
    lab.crash("node-1").await.expect("crash");
    lab.crash("node-2").await.expect("crash");
    eventually("node-1's SelfNodeRemediation", LONG, || async {
        snr_for(&client, "node-1").await.into_iter().next()
    })
    .await;
    let failed = json!({"status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "RemediationFailed", "message": "test", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let failed_at = jiff::Timestamp::now();
    Api::<SelfNodeRemediation>::namespaced(client.clone(), NS)
        .patch_status("node-1", &PatchParams::default(), &Patch::Merge(&failed))
        .await
        .expect("report failure");
    let far = eventually("node-1's FenceAgentsRemediation", LONG, || far_for("node-1")).await;
    let escalated = far.metadata.creation_timestamp.expect("created").0;
    assert!(
        escalated.duration_since(failed_at) < jiff::SignedDuration::from_secs(15),
        "escalated {escalated} long after the failure {failed_at}"
    );
    // Kept until the node is healthy, and told to stop once the next one is created.
    told_timed_out(&client, "node-1").await;

    let first = eventually("node-2's SelfNodeRemediation", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
    let far = eventually("node-2's FenceAgentsRemediation", Duration::from_secs(150), || {
        far_for("node-2")
    })
    .await;
    let waited = far
        .metadata
        .creation_timestamp
        .expect("created")
        .0
        .duration_since(first.metadata.creation_timestamp.expect("created").0);
    assert!(
        waited >= jiff::SignedDuration::from_secs(60),
        "escalated after {waited:?}, before the 1m timeout"
    );
    told_timed_out(&client, "node-2").await;
    // The status write follows the create, so it is awaited rather than read once.
    let node2 = eventually("node-2 listed with both remediations", LONG, || async {
        nhc(&client, "escalating")
            .await
            .status
            .and_then(|s| s.unhealthy_nodes)
            .and_then(|nodes| nodes.into_iter().find(|n| n.name == "node-2"))
            .filter(|n| n.remediations.len() == 2)
    })
    .await;
    assert!(node2.remediations[0].timed_out.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_exclusion_and_a_maintenance_lease_hold_remediation_back() {
    let lab = lab(LabConfig::workers(5)).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    lab.apply_yaml(&snr_check(
        "workers",
        "node-role.kubernetes.io/worker",
        json!({"pauseRequests": ["upgrade in progress"]}),
    ))
    .expect("check");
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "workers", NodeHealthCheckPhase::Paused).await;

    lab.crash("node-3").await.expect("crash");
    unhealthy_listed(&client, "workers", "node-3").await;
    assert!(snr_for(&client, "node-3").await.is_empty(), "paused: nothing new");
    lab.apply_yaml(&snr_check(
        "workers",
        "node-role.kubernetes.io/worker",
        json!({"pauseRequests": []}),
    ))
    .expect("unpause");
    eventually("node-3 remediated once unpaused", LONG, || async {
        snr_for(&client, "node-3").await.into_iter().next()
    })
    .await;
    lab.power_on("node-3").await.expect("power on");
    phase_is(&client, "workers", NodeHealthCheckPhase::Enabled).await;

    let nodes = Api::<Node>::all(client.clone());
    nodes
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"metadata": {"labels": {"remediation.medik8s.io/exclude-from-remediation": "true"}}}),
            ),
        )
        .await
        .expect("exclude");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "node-node-2", "namespace": "medik8s-leases"},
        "spec": {"holderIdentity": "node-maintenance", "leaseDurationSeconds": 3600, "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()}
    });
    Api::<Lease>::namespaced(client.clone(), "medik8s-leases")
        .create(&PostParams::default(), &serde_json::from_value(lease).expect("lease"))
        .await
        .expect("maintenance lease");
    lab.crash("node-1").await.expect("crash");
    lab.crash("node-2").await.expect("crash");
    unhealthy_listed(&client, "workers", "node-1").await;
    unhealthy_listed(&client, "workers", "node-2").await;
    event_with(&client, "RemediationSkipped", "exclude-from-remediation=true").await;
    event_with(
        &client,
        "RemediationSkipped",
        "node lease is already taken by node-maintenance",
    )
    .await;
    assert!(snr_for(&client, "node-1").await.is_empty() && snr_for(&client, "node-2").await.is_empty());

    // Maintenance lets go of the node: the health check may act.
    Api::<Lease>::namespaced(client.clone(), "medik8s-leases")
        .delete("node-node-2", &DeleteParams::default())
        .await
        .expect("release");
    eventually("node-2 remediated once the lease is gone", LONG, || async {
        snr_for(&client, "node-2").await.into_iter().next()
    })
    .await;
    assert!(
        snr_for(&client, "node-1").await.is_empty(),
        "the excluded node still is not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_control_plane_node_at_a_time_and_the_healthy_delay() {
    let nodes = (1..=5)
        .map(|i| NodeSpec::control_plane_worker(&format!("node-{i}")))
        .collect();
    let lab = lab(LabConfig::new(nodes)).await;
    let client = lab.client();
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    lab.apply_yaml(&snr_check(
        "masters",
        "node-role.kubernetes.io/control-plane",
        json!({"healthyDelay": "15s"}),
    ))
    .expect("check");
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "masters", NodeHealthCheckPhase::Enabled).await;

    lab.crash("node-1").await.expect("crash");
    lab.crash("node-2").await.expect("crash");
    unhealthy_listed(&client, "masters", "node-1").await;
    unhealthy_listed(&client, "masters", "node-2").await;
    eventually("one control-plane remediation", LONG, || async {
        let all = list::<SelfNodeRemediation>(&client, NS).await;
        (all.len() == 1).then_some(())
    })
    .await;
    event_with(&client, "RemediationSkipped", "one at a time").await;
    let first = list::<SelfNodeRemediation>(&client, NS).await.remove(0);
    let (a, b) = if first.name_any() == "node-1" {
        ("node-1", "node-2")
    } else {
        ("node-2", "node-1")
    };
    assert_eq!(
        list::<SelfNodeRemediation>(&client, NS).await.len(),
        1,
        "never two control-plane nodes at once"
    );

    lab.power_on(a).await.expect("power on");
    lab.wait_ready_status(a, "True", LONG).await.expect("back");
    let ready_at = ready(&client, a).await.1;
    eventually(
        &format!("{a}'s remediation removed after the healthy delay"),
        LONG,
        || async { snr_for(&client, a).await.is_empty().then_some(()) },
    )
    .await;
    let removed_at = jiff::Timestamp::now();
    assert!(
        removed_at.duration_since(ready_at) >= jiff::SignedDuration::from_secs(15),
        "removed {removed_at}, less than 15s after Ready at {ready_at}"
    );
    eventually(&format!("{b} remediated once {a} is done"), LONG, || async {
        snr_for(&client, b).await.into_iter().next()
    })
    .await;
}

const POISON_PILL_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: poisonpillremediationtemplates.medik8s.io}
spec:
  group: medik8s.io
  names: {kind: PoisonPillRemediationTemplate, plural: poisonpillremediationtemplates}
  scope: Namespaced
  versions: [{name: v1alpha1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: poisonpillremediations.medik8s.io}
spec:
  group: medik8s.io
  names: {kind: PoisonPillRemediation, plural: poisonpillremediations}
  scope: Namespaced
  versions: [{name: v1alpha1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
# What a third-party remediator ships so the health check may use its kinds (aggregated into
# nodemedic-ext-remediation).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: poison-pill-ext-remediation
  labels: {rbac.ext-remediation/aggregate-to-ext-remediation: "true"}
rules:
- apiGroups: [medik8s.io]
  resources: [poisonpillremediationtemplates, poisonpillremediations]
  verbs: [get, list, watch, create, update, patch, delete]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_template_kind_disables_the_check_until_a_third_party_remediator_provides_it() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    apply_seed(&lab, "001-nhc-worker-default.yaml", |_| {});
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    phase_is(&client, "nhc-worker-default", NodeHealthCheckPhase::Disabled).await;
    let status = nhc(&client, "nhc-worker-default").await.status.expect("status");
    let disabled = status
        .conditions
        .expect("conditions")
        .into_iter()
        .find(|c| c.type_ == "Disabled")
        .expect("Disabled condition");
    assert_eq!(
        (disabled.status.as_str(), disabled.reason.as_str()),
        ("True", "RemediationTemplateNotFound")
    );
    assert!(
        disabled.message.contains("PoisonPillRemediationTemplate"),
        "{}",
        disabled.message
    );
    assert!(
        status
            .reason
            .is_some_and(|r| r.contains("PoisonPillRemediationTemplate"))
    );

    lab.apply_yaml(POISON_PILL_CRDS).expect("third-party CRDs");
    lab.wait_ready_status("node-1", "True", LONG).await.expect("ready");
    eventually("the kind to be served", LONG, || async { lab.apply_yaml(&format!("apiVersion: medik8s.io/v1alpha1\nkind: PoisonPillRemediationTemplate\nmetadata: {{name: poison-pill-default-template, namespace: {NS}}}\nspec: {{template: {{spec: {{}}}}}}\n")).ok() }).await;
    phase_is(&client, "nhc-worker-default", NodeHealthCheckPhase::Enabled).await;

    // The third-party kind is remediated like any other (300 s seed durations shortened).
    patch_check(
        &client,
        "nhc-worker-default",
        json!({"spec": {"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "duration": "5s"}]}}),
    )
    .await;
    lab.crash("node-1").await.expect("crash");
    let resource = kube::api::ApiResource {
        group: "medik8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "medik8s.io/v1alpha1".into(),
        kind: "PoisonPillRemediation".into(),
        plural: "poisonpillremediations".into(),
    };
    let api = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), NS, &resource);
    eventually("a PoisonPillRemediation for node-1", LONG, || async {
        api.get_opt("node-1").await.ok().flatten()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_only_the_leader_acts_and_a_new_leader_duplicates_nothing() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    // Generated names: a controller that forgot an object exists would make a second one.
    apply_seed(&lab, "004-snr-template-automatic.yaml", |m| {
        m["metadata"]["annotations"] = json!({"remediation.medik8s.io/multiple-templates-support": "true"});
    });
    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});
    let ports = [
        (
            "controller-a",
            start_controller(
                &lab,
                "controller-a",
                &["--lease-seconds", "6", "--disable", "self-remediation"],
            ),
        ),
        (
            "controller-b",
            start_controller(
                &lab,
                "controller-b",
                &["--lease-seconds", "6", "--disable", "self-remediation"],
            ),
        ),
    ];
    let leases = Api::<Lease>::namespaced(client.clone(), NS);
    let holder = || async {
        leases
            .get_opt("nodemedic-controller")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    };
    let leader = eventually("a leader", LONG, holder).await;
    phase_is(&client, "nhc-snr-3node", NodeHealthCheckPhase::Enabled).await;
    let (_, standby_port) = ports.iter().find(|(n, _)| *n != leader).copied().expect("standby");
    let standby = eventually("the standby's metrics", LONG, || async { metrics(standby_port) }).await;
    assert_eq!(
        sample(&standby, "nodemedic_healthcheck_observed_nodes{"),
        None,
        "the standby decides nothing"
    );

    lab.crash("node-1").await.expect("crash");
    eventually("node-1 remediated", LONG, || async {
        snr_for(&client, "node-1").await.into_iter().next()
    })
    .await;
    lab.kill_process(&leader).expect("kill the leader");
    let new_leader = eventually("the standby to take over", LONG, || async {
        holder().await.filter(|h| *h != leader)
    })
    .await;
    let port = ports
        .iter()
        .find(|(n, _)| *n == new_leader)
        .map(|(_, p)| *p)
        .expect("port");
    eventually("the new leader to reconcile", LONG, || async {
        metrics(port).and_then(|m| sample(&m, "nodemedic_healthcheck_observed_nodes{"))
    })
    .await;
    // Restart the old one (it stands by), then make the new leader act: still one object.
    lab.restart_process(&leader).expect("restart");
    patch_check(&client, "nhc-snr-3node", json!({"spec": {"pauseRequests": ["touch"]}})).await;
    phase_is(&client, "nhc-snr-3node", NodeHealthCheckPhase::Paused).await;
    assert_eq!(snr_for(&client, "node-1").await.len(), 1, "no duplicate after failover");

    lab.power_on("node-1").await.expect("power on");
    eventually("the new leader to remove the remediation", LONG, || async {
        snr_for(&client, "node-1").await.is_empty().then_some(())
    })
    .await;
}

/// The seed's three-node manifest applied unchanged to a plain cluster, whose nodes carry
/// `node-role.kubernetes.io/control-plane` (as kubeadm sets it) and not `master`: the check
/// says it watches nothing, names the label to select instead, and `nodemedic status` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_check_selecting_no_nodes_says_so_and_names_the_label_to_use() {
    let nodes = (1..=2)
        .map(|i| {
            let mut node = NodeSpec::plain(&format!("node-{i}"));
            node.labels
                .insert("node-role.kubernetes.io/control-plane".into(), String::new());
            node
        })
        .collect();
    let lab = lab(LabConfig::new(nodes)).await;
    let client = lab.client();
    start_controller(&lab, "controller", ONLY_HEALTH_CHECK);
    let seed = nodemedic_lab::seeds::load("002-nhc-snr-3node.yaml").expect("the seed manifest");
    lab.apply_yaml(&nodemedic_lab::seeds::yaml(&seed))
        .expect("applied unchanged");
    let condition = eventually("the NodesSelected condition", LONG, || async {
        nhc(&client, "nhc-snr-3node")
            .await
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "NodesSelected")
    })
    .await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "NoNodesSelected")
    );
    assert!(
        condition.message.contains("node-role.kubernetes.io/master")
            && condition
                .message
                .contains("2 nodes carry node-role.kubernetes.io/control-plane"),
        "{}",
        condition.message
    );
    event_with(&client, "NoNodesSelected", "node-role.kubernetes.io/control-plane").await;
    let table = crate::status::status(&lab, &[]);
    assert!(
        table.contains("WARNING: NodeHealthCheck nhc-snr-3node selects no nodes"),
        "{table}"
    );
}
