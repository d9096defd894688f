//! Fence Agents Remediation end to end: the real fence agents (Debian fence-agents) against the
//! lab's BMC emulators (sushy-tools Redfish over TLS, ipmi_sim), whose power off really kills the
//! node; a one-replica StatefulSet with a ReadWriteOnce volume; the at-most-one witness.

use std::time::Duration;

use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, Pod},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceAgentsRemediationTemplate},
    names::conditions as types,
};
use nodemedic_kube::conditions;
use nodemedic_lab::{BmcOptions, Event, Lab, LabConfig};
use serde_json::{Value, json};

use crate::machines;
use crate::support::{
    self, NS, apply_seed, apply_seed_check, assert_witness, event_with, eventually, lab, list, metrics, sample,
    scenario, start_controller, taints,
};
use scenario::node_of;

const LONG: Duration = Duration::from_secs(180);

/// Every version of every FenceAgentsRemediation the API server showed.
pub(crate) type History = support::History<FenceAgentsRemediation>;

fn summary(history: &History) -> Vec<String> {
    history
        .all()
        .iter()
        .map(|f| {
            format!(
                "{} {:?} {:?}",
                f.name_any(),
                f.annotations(),
                condition(f, types::SUCCEEDED)
            )
        })
        .collect()
}

const PASSWORD: &str = "n0tPassword";

/// The seed template adapted to the lab (see [`scenario::adapt_far_template`]).
pub(crate) fn adapt_template(lab: &Lab) -> impl FnOnce(&mut Value) + '_ {
    move |m: &mut Value| scenario::adapt_far_template(lab, m)
}

/// A seed lab with BMCs, nodemedic's controller (health check and fence agents), the seed FAR
/// secret and the workload; returns the pod's node.
async fn cluster() -> (Lab, String, u16, History) {
    let lab = lab(LabConfig::seed().with_bmcs(BmcOptions::default())).await;
    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    let history = History::record(&lab.client());
    let port = start_controller(&lab, "controller", &["--disable=self-remediation"]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let pod = running_pod(&lab.client(), &[]).await;
    (lab, node_of(&pod), port, history)
}

async fn running_pod(client: &Client, not_on: &[&str]) -> Pod {
    scenario::running_pod(client, not_on, LONG).await.expect("db-0 Running")
}

fn node_is(r: &FenceAgentsRemediation, node: &str) -> bool {
    r.annotations()
        .get("remediation.medik8s.io/node-name")
        .map(String::as_str)
        .unwrap_or(&r.name_any())
        == node
}

pub(crate) async fn far(client: &Client, node: &str) -> Option<FenceAgentsRemediation> {
    list::<FenceAgentsRemediation>(client, NS)
        .await
        .into_iter()
        .find(|r| node_is(r, node))
}

fn condition(far: &FenceAgentsRemediation, type_: &str) -> Option<(String, String, String)> {
    let list = far.status.as_ref()?.conditions.as_ref()?;
    conditions::find(list, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn finished(history: &History, node: &str, status: &str) -> FenceAgentsRemediation {
    eventually(
        &format!("{node}'s FenceAgentsRemediation Succeeded={status}"),
        LONG,
        || async {
            history.find(|r| node_is(r, node) && condition(r, types::SUCCEEDED).is_some_and(|c| c.0 == status))
        },
    )
    .await
}

/// The node's power changes its BMC made, in order (`true`: on).
pub(crate) fn bmc_power(lab: &Lab, node: &str) -> Vec<bool> {
    lab.timeline()
        .entries()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::Power { node: n, on, cause } if n == node && cause == "bmc" => Some(on),
            _ => None,
        })
        .collect()
}

/// Crash the pod's node; the FAR fences it through its BMC, db-0 runs elsewhere, the node is
/// powered on, and the health check then deletes the FAR and every taint goes.
pub(crate) async fn crash_and_recover(lab: &Lab, a: &str, history: &History) {
    let client = lab.client();
    let crashed = jiff::Timestamp::now();
    lab.crash(a).await.expect("crash");
    let moved = running_pod(&client, &[a]).await;
    println!(
        "crash of {a} -> db-0 Running on {} in {:.1}s",
        node_of(&moved),
        jiff::Timestamp::now().duration_since(crashed).as_secs_f64()
    );
    let done = finished(history, a, "True").await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.step.as_deref(), Some("Done"));
    assert_eq!(
        condition(&done, types::FENCE_AGENT_ACTION_SUCCEEDED)
            .map(|c| c.0)
            .as_deref(),
        Some("True")
    );
    // The BMC answers "on" at once; the node boots after the lab's boot delay.
    eventually(&format!("the BMC powered {a} off, then on"), LONG, || async {
        (bmc_power(lab, a) == [false, true]).then_some(())
    })
    .await;
    assert_witness(lab);
    eventually(&format!("{a} Ready again"), LONG, || async {
        lab.wait_ready_status(a, "True", Duration::from_secs(1)).await.ok()
    })
    .await;
    eventually(
        "the FAR deleted and every taint gone once the node is healthy",
        LONG,
        || async {
            let t = taints(&client, a).await;
            (far(&client, a).await.is_none()
                && !t.iter().any(|t| {
                    t.starts_with("remediation.medik8s.io/") || t.starts_with("node.kubernetes.io/out-of-service")
                }))
            .then_some(())
        },
    )
    .await;
}

/// The fence_ipmilan template users write for ipmi BMCs (ResourceDeletion strategy).
fn ipmi_template(lab: &Lab, name: &str, secret: &str) -> Value {
    scenario::ipmi_far_template(lab, name, secret, "ResourceDeletion")
}

/// The crashed node belongs to a Cluster API Machine: the health check's remediation is owned by
/// it too, so deleting the Machine would take the remediation with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_ipmilan_against_ipmi_sim_fences_the_crashed_node_and_brings_it_back() {
    let (lab, a, _, history) = cluster().await;
    let client = lab.client();
    lab.install_machine_crds().await.expect("machine CRDs");
    let set = machines::machine_set(&client, machines::CAPI, "md-0", 3).await;
    let machine = machines::machine(&client, machines::CAPI, "md-0-x", Some(&set), &a, &format!("lab://{a}")).await;
    machines::annotate_node(&client, &a, machines::CAPI, "md-0-x").await;
    lab.apply_yaml(&ipmi_template(&lab, "ipmi", "fence-agents-credentials-shared-sm-bmc").to_string())
        .expect("template");
    apply_seed_check(&lab, "002-nhc-far-3node.yaml", |m| {
        m["spec"]["remediationTemplate"]["name"] = json!("ipmi");
    });
    crash_and_recover(&lab, &a, &history).await;
    let made = history
        .find(|r| node_is(r, &a))
        .unwrap_or_else(|| panic!("no FAR for {a} in {:?}", summary(&history)));
    let owners: Vec<_> = made
        .owner_references()
        .iter()
        .map(|o| (o.kind.as_str(), o.name.as_str(), o.uid.as_str()))
        .collect();
    assert!(
        owners.contains(&("Machine", "md-0-x", machine.uid().expect("uid").as_str())),
        "the FAR's owners: {owners:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_every_attempt_without_showing_it_and_the_health_check_escalates() {
    let (lab, a, _, history) = cluster().await;
    let client = lab.client();
    lab.apply_yaml(
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wrong", "namespace": NS},
                "stringData": {"--password": "Wr0ngPassw0rd"}})
        .to_string(),
    )
    .expect("secret");
    lab.apply_yaml(&ipmi_template(&lab, "ipmi-wrong", "wrong").to_string())
        .expect("template");
    lab.apply_yaml(&ipmi_template(&lab, "ipmi", "fence-agents-credentials-shared-sm-bmc").to_string())
        .expect("template");
    apply_seed_check(&lab, "002-nhc-far-3node.yaml", |m| {
        let spec = m["spec"].as_object_mut().expect("spec");
        let reference = spec.remove("remediationTemplate").expect("template");
        let mut wrong = reference.clone();
        wrong["name"] = json!("ipmi-wrong");
        let mut right = reference;
        right["name"] = json!("ipmi");
        spec.insert(
            "escalatingRemediations".into(),
            json!([{"remediationTemplate": wrong, "order": 0, "timeout": "120s"},
                   {"remediationTemplate": right, "order": 1, "timeout": "120s"}]),
        );
    });
    lab.crash(&a).await.expect("crash");
    let failed = finished(&history, &a, "False").await;
    let (_, reason, message) = condition(&failed, types::SUCCEEDED).expect("Succeeded");
    assert_eq!(reason, "FenceAgentFailed");
    assert!(message.contains("exited 1"), "{message}");
    let status = failed.status.clone().expect("status");
    assert_eq!(status.attempts, Some(2));
    let everything = serde_json::to_string(&failed).expect("json");
    assert!(
        !everything.contains("Wr0ngPassw0rd"),
        "the password leaked: {everything}"
    );
    // Repeats of an event become a series (kube's recorder): the first attempt's note stays.
    event_with(&client, "FenceAgentAttemptFailed", "attempt 1 of 2").await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("events");
    assert!(
        !serde_json::to_string(&events.items)
            .expect("json")
            .contains("Wr0ngPassw0rd"),
        "the password leaked into an event"
    );
    // The health check moves on to the next template, which fences the node.
    let moved = running_pod(&client, &[&a]).await;
    println!("escalated: db-0 Running on {}", node_of(&moved));
    eventually(&format!("the BMC to power {a} off, then on"), LONG, || async {
        (bmc_power(&lab, &a) == [false, true]).then_some(())
    })
    .await;
    let escalated = history
        .find(|r| {
            r.annotations()
                .get("remediation.medik8s.io/template-name")
                .map(String::as_str)
                == Some("ipmi")
        })
        .unwrap_or_else(|| panic!("no FAR from template ipmi in {:?}", summary(&history)));
    assert_eq!(
        finished(&history, &a, "True")
            .await
            .annotations()
            .get("remediation.medik8s.io/template-name")
            .map(String::as_str),
        Some("ipmi")
    );
    assert!(escalated.name_any() != failed.name_any());
    assert_witness(&lab);
    let log = std::fs::read_to_string(lab.log_path("controller")).unwrap_or_default();
    assert!(
        !log.contains("Wr0ngPassw0rd"),
        "the password is in the controller's log"
    );
}

fn remediation(name: &str, node: &str, spec: Value) -> FenceAgentsRemediation {
    serde_json::from_value(json!({
        "apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
        "kind": "FenceAgentsRemediation",
        "metadata": {"name": name, "namespace": NS, "annotations": {"remediation.medik8s.io/node-name": node}},
        "spec": spec,
    }))
    .expect("remediation")
}

/// An unanswering BMC and every configuration mistake, on one lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "a scenario on one lab, read whole in the order it happens: its steps share the lab, its clients and its objects"
)]
async fn an_unanswering_bmc_times_out_each_attempt_and_configuration_mistakes_are_reported_without_a_run() {
    let (lab, a, port, history) = cluster().await;
    let client = lab.client();
    let api = Api::<FenceAgentsRemediation>::namespaced(client.clone(), NS);
    let bmc = lab.bmc(&a).expect("bmc");
    let redfish = |node: &str, extra: Value| {
        let mut spec = json!({
            "agent": "fence_redfish",
            "sharedparameters": {"--username": "ansible", "--ssl-insecure": "", "--systems-uri": "/redfish/v1/Systems/1"},
            "nodeparameters": {"--ip": {node: bmc.ip.to_string()}},
            "sharedSecretName": "fence-agents-credentials-shared-sm-bmc",
            "retrycount": 2, "retryinterval": "2s", "timeout": "3s"
        });
        json_patch::merge(&mut spec, &extra);
        spec
    };

    // A BMC that does not answer: two attempts, each killed at 3 s, 2 s apart, then failure.
    lab.hang_bmc(&a).await.expect("hang");
    let started = std::time::Instant::now();
    api.create(&PostParams::default(), &remediation("hung", &a, redfish(&a, json!({}))))
        .await
        .expect("create");
    let hung = finished(&history, &a, "False").await;
    let took = started.elapsed();
    let (_, reason, message) = condition(&hung, types::SUCCEEDED).expect("Succeeded");
    assert_eq!(reason, "FenceAgentTimedOut", "{message}");
    assert_eq!(hung.status.as_ref().and_then(|s| s.attempts), Some(2));
    assert!(
        took >= Duration::from_secs(8),
        "2 x 3 s timeout + 2 s interval, took {took:?}"
    );
    let text = metrics(port).expect("metrics");
    assert_eq!(
        sample(
            &text,
            "nodemedic_fence_agent_attempts_total{agent=\"fence_redfish\",action=\"off\",result=\"timeout\"}"
        ),
        Some(2.0),
        "{text}"
    );
    let leftovers = std::process::Command::new("pgrep")
        .args(["-f", "fence_redfish"])
        .output()
        .expect("pgrep");
    assert!(
        leftovers.stdout.is_empty(),
        "agents left running: {}",
        String::from_utf8_lossy(&leftovers.stdout)
    );
    api.delete("hung", &Default::default()).await.expect("delete");
    eventually("the hung FAR gone, its taint removed", LONG, || async {
        (far(&client, &a).await.is_none()
            && !taints(&client, &a)
                .await
                .iter()
                .any(|t| t.starts_with("remediation.medik8s.io/")))
        .then_some(())
    })
    .await;
    lab.resume_bmc(&a).await.expect("resume");

    // Configuration mistakes: each a clear error, no agent run, no taint.
    let b = lab.nodes().into_iter().find(|n| *n != a).expect("another node");
    lab.apply_yaml(
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "with-ip", "namespace": NS},
                "stringData": {"--password": PASSWORD, "--ip": "10.0.0.1"}})
        .to_string(),
    )
    .expect("secret");
    let cases = [
        (
            "unknown-agent",
            json!({"agent": "fence_nonexistent"}),
            "fence agent fence_nonexistent is not installed",
        ),
        (
            "unknown-option",
            json!({"sharedparameters": {"--hostname": "bmc"}}),
            "fence_redfish has no option --hostname; did you mean --ip?",
        ),
        (
            "duplicate",
            json!({"sharedSecretName": "with-ip"}),
            "--ip is set both in the spec and in a secret",
        ),
        (
            "nothing-node-specific",
            json!({"nodeparameters": null}),
            "no parameter is node-specific",
        ),
    ];
    for (name, extra, expected) in cases {
        api.create(&PostParams::default(), &remediation(name, &b, redfish(&b, extra)))
            .await
            .expect("create");
        let failed = eventually(&format!("{name}: Succeeded=False"), LONG, || async {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|r| condition(r, types::SUCCEEDED).is_some_and(|c| c.0 == "False"))
        })
        .await;
        let (_, reason, message) = condition(&failed, types::SUCCEEDED).expect("Succeeded");
        assert_eq!(reason, "InvalidParameters", "{name}: {message}");
        assert!(message.contains(expected), "{name}: {message}");
        assert_eq!(
            failed.status.as_ref().and_then(|s| s.attempts),
            None,
            "{name}: an agent ran"
        );
        assert!(
            !taints(&client, &b)
                .await
                .iter()
                .any(|t| t.starts_with("remediation.medik8s.io/")),
            "{name}"
        );
        api.delete(name, &Default::default()).await.expect("delete");
        eventually(&format!("{name} deleted"), LONG, || async {
            api.get_opt(name).await.ok().flatten().is_none().then_some(())
        })
        .await;
    }
    assert_eq!(
        bmc_power(&lab, &b),
        Vec::<bool>::new(),
        "no configuration mistake reached a BMC"
    );

    // A Secret that does not exist yet: the remediation waits for it, and goes on once it does.
    let b_bmc = lab.bmc(&b).expect("b's bmc").ip.to_string();
    let late = redfish(
        &b,
        json!({"sharedSecretName": "late", "nodeparameters": {"--ip": {b.as_str(): b_bmc}}}),
    );
    api.create(&PostParams::default(), &remediation("late-secret", &b, late))
        .await
        .expect("create");
    let waiting = eventually("late-secret: Processing=True/WaitingForSecret", LONG, || async {
        api.get_opt("late-secret")
            .await
            .ok()
            .flatten()
            .filter(|r| condition(r, types::PROCESSING).is_some_and(|c| c.1 == "WaitingForSecret"))
    })
    .await;
    let (_, _, message) = condition(&waiting, types::PROCESSING).expect("Processing");
    assert!(
        message.contains("Secret late (named by sharedSecretName) does not exist"),
        "{message}"
    );
    event_with(&client, "SecretMissing", "Secret late").await;
    assert_eq!(waiting.status.as_ref().and_then(|s| s.attempts), None, "an agent ran");
    assert_eq!(
        bmc_power(&lab, &b),
        Vec::<bool>::new(),
        "the BMC was asked before the Secret existed"
    );
    lab.apply_yaml(
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "late", "namespace": NS},
                "stringData": {"--password": PASSWORD}})
        .to_string(),
    )
    .expect("the late Secret");
    finished(&history, &b, "True").await;
    assert_eq!(
        bmc_power(&lab, &b).first(),
        Some(&false),
        "fenced once the Secret existed"
    );
    api.delete("late-secret", &Default::default()).await.expect("delete");

    // The seed template as written (with --hostname) is accepted by the API server and says what
    // is wrong; adapted, its credentials check passes for every node.
    let templates = Api::<FenceAgentsRemediationTemplate>::namespaced(client.clone(), NS);
    apply_seed(&lab, "002-far-template.yaml", |_| {});
    let template_condition = |type_: &'static str, status: &'static str| {
        let templates = templates.clone();
        async move {
            let t = templates.get_opt("famt-3node").await.ok().flatten()?;
            let c = conditions::find(t.status.as_ref()?.conditions.as_ref()?, type_)?.clone();
            (c.status == status && c.observed_generation == t.metadata.generation).then_some((t, c))
        }
    };
    let (_, c) = eventually("the seed template's ParametersValid=False", LONG, || {
        template_condition(types::PARAMETERS_VALID, "False")
    })
    .await;
    assert!(
        c.message
            .contains("fence_redfish has no option --hostname; did you mean --ip?"),
        "{}",
        c.message
    );
    apply_seed(&lab, "002-far-template.yaml", |m| {
        adapt_template(&lab)(m);
        m["spec"]["statusValidationSample"] = json!("100%");
    });
    let (t, _) = eventually("the adapted template's credentials validated", LONG, || {
        template_condition(types::FENCE_AGENT_STATUS_VALIDATION_SUCCEEDED, "True")
    })
    .await;
    assert_eq!(t.status.and_then(|s| s.validation_passed).map(|p| p.len()), Some(3));
}

/// A stale Ready=Unknown on a node whose kubelet still renews its lease (after a control-plane
/// outage the node controller marks every node it has not heard from, and may itself be
/// restarting): the health check reads the lease before remediating and holds back, so nothing is
/// fenced. The lab's kwok would rewrite the condition at once and the node controller would mark
/// it again, so both are stopped and the test plays them: the node is frozen, the condition set
/// Unknown, and the lease renewed as the kubelet would. When the renewals stop, the hold is over
/// and the remediation goes ahead: held back, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_unknown_with_a_renewing_kubelet_fences_nothing_until_the_renewals_stop() {
    let (lab, a, _, history) = cluster().await;
    apply_seed(&lab, "002-far-template.yaml", adapt_template(&lab));
    apply_seed(&lab, "002-nhc-far-3node.yaml", |m| {
        for c in m["spec"]["unhealthyConditions"].as_array_mut().expect("conditions") {
            c["duration"] = json!("5s");
        }
    });
    let client = lab.client();
    lab.kill_process("kube-controller-manager")
        .expect("stop the node controller");
    lab.freeze(&a).await.expect("freeze");
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
    let renew = |leases: Api<Lease>, node: String| async move {
        let now = json!({"spec": {"renewTime": MicroTime(jiff::Timestamp::now())}});
        leases
            .patch(&node, &PatchParams::default(), &Patch::Merge(&now))
            .await
            .map(|_| ())
    };
    renew(leases.clone(), a.clone()).await.expect("renew");
    let renewing = tokio::spawn({
        let (leases, node) = (leases.clone(), a.clone());
        async move {
            loop {
                let _ = renew(leases.clone(), node.clone()).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    let stale = json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": jiff::Timestamp::now().to_string(),
        "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
    }]}});
    Api::<Node>::all(client.clone())
        .patch_status(&a, &PatchParams::default(), &Patch::Strategic(&stale))
        .await
        .expect("mark the node Unknown");
    event_with(&client, "RemediationHeldBack", &a).await;
    assert!(
        history.find(|_| true).is_none(),
        "a remediation was created while the kubelet renewed: {:?}",
        summary(&history)
    );
    renewing.abort();
    eventually("the remediation once the renewals stopped", LONG, || async {
        history.find(|f| node_is(f, &a))
    })
    .await;
}

/// fence_aws, as a cluster on EC2 runs it, against moto's EC2 emulator whose instances are the
/// lab's nodes: the crashed node's instance is stopped (the node is off), db-0 runs elsewhere,
/// the instance is started again and the node comes back. The credentials come from a Secret,
/// the instance ids from nodeparameters, as users write the template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_aws_against_moto_s_ec2_stops_the_crashed_node_s_instance_and_starts_it_again() {
    use nodemedic_lab::cloud;
    let lab = lab(LabConfig::seed().with_bmcs(BmcOptions {
        aws: true,
        ..BmcOptions::default()
    }))
    .await;
    let aws = lab.aws().expect("the lab's cloud");
    lab.apply_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: aws-credentials, namespace: {NS}}}\nstringData: {{'--access-key': {}, '--secret-key': {}}}\n",
        cloud::ACCESS_KEY,
        cloud::SECRET_KEY
    ))
    .expect("the credentials");
    let template = json!({
        "apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
        "kind": "FenceAgentsRemediationTemplate",
        "metadata": {"name": "ec2", "namespace": NS},
        "spec": {"template": {"spec": {
            "agent": "fence_aws",
            "sharedparameters": {"--region": cloud::REGION},
            "nodeparameters": {"--plug": aws.instances},
            "sharedSecretName": "aws-credentials",
            "retrycount": 2,
            "retryinterval": "1s",
            "timeout": "60s",
            "remediationStrategy": "ResourceDeletion"
        }}}
    });
    lab.apply_yaml(&template.to_string()).expect("template");
    let history = History::record(&lab.client());
    let agents = format!("--fence-agents-dir={}", aws.agents_dir.display());
    start_controller(&lab, "controller", &["--disable=self-remediation", agents.as_str()]);
    scenario::deploy_workload(&lab).await.expect("workload");
    let a = node_of(&running_pod(&lab.client(), &[]).await);
    apply_seed_check(&lab, "002-nhc-far-3node.yaml", |m| {
        m["spec"]["remediationTemplate"]["name"] = json!("ec2");
    });
    crash_and_recover(&lab, &a, &history).await;
}
