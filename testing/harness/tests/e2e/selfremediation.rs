//! Self Node Remediation end to end: agents in the nodes' namespaces on the lab's emulated
//! watchdog devices (which the product's Linux watchdog driver opens), the manager in the
//! controller, a one-replica StatefulSet with a ReadWriteOnce volume, and the at-most-one witness
//! over everything that happened.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use nodemedic_api::self_remediation::{SelfNodeRemediation, phases};
use nodemedic_lab::{Event, Lab, LabConfig, wait};
use nodemedic_self_remediation::registration;
use serde_json::json;

use crate::support::{
    NS, apply_seed, apply_seed_check, assert_witness, event_with, events_so_far, eventually, lab, list,
    recorded_running, scenario, start_controller, taints,
};
use scenario::{LabWatchdog, node_of};

const LONG: Duration = Duration::from_secs(120);

/// A lab with nodemedic (controller + agents), the StatefulSet running and the seed health check
/// watching (every node when the lab's nodes lack the seed's role labels), its durations
/// shortened to [`scenario::TEST_CONDITION_DURATION`]; returns the pod's node.
pub(crate) async fn cluster(config: LabConfig) -> (Lab, String) {
    cluster_with(config, LabWatchdog::Device, scenario::FAST_CONFIG).await
}

/// [`cluster`] with the agents' watchdog and the SelfNodeRemediationConfig patch given.
pub(crate) async fn cluster_with(config: LabConfig, watchdog: LabWatchdog, patch: &str) -> (Lab, String) {
    installed(config, watchdog, patch, scenario::shorten_durations).await
}

/// [`cluster_with`] with the seed health check's own durations.
pub(crate) async fn cluster_with_seed_durations(
    config: LabConfig,
    watchdog: LabWatchdog,
    patch: &str,
) -> (Lab, String) {
    installed(config, watchdog, patch, |_| {}).await
}

async fn installed(
    config: LabConfig,
    watchdog: LabWatchdog,
    patch: &str,
    durations: fn(&mut serde_json::Value),
) -> (Lab, String) {
    let every_node = config
        .nodes
        .iter()
        .any(|n| !n.labels.contains_key("node-role.kubernetes.io/master"));
    let lab = lab(config).await;
    let client = lab.client();
    let config = scenario::configure_with(&lab, patch).await.expect("config");
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    start_controller(&lab, "controller", &[]);
    scenario::start_agents_with(&lab, &exe(), &config, watchdog).expect("agents");
    scenario::deploy_workload(&lab).await.expect("workload");
    let node = node_of(&running_pod(&client, &[]).await);
    scenario::agents_settled(&lab).await.expect("agents settled");
    apply_seed(&lab, "002-nhc-snr-3node.yaml", |m| {
        durations(m);
        if every_node {
            m["spec"]["selector"] =
                json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]});
        }
    });
    (lab, node)
}

pub(crate) fn exe() -> std::path::PathBuf {
    crate::nodemedic_exe()
}

pub(crate) async fn running_pod(client: &Client, not_on: &[&str]) -> Pod {
    scenario::running_pod(client, not_on, Duration::from_secs(180))
        .await
        .expect("db-0 Running")
}

pub(crate) async fn snr(client: &Client, node: &str) -> Option<SelfNodeRemediation> {
    list::<SelfNodeRemediation>(client, NS).await.into_iter().find(|r| {
        r.annotations()
            .get("remediation.medik8s.io/node-name")
            .map(String::as_str)
            == Some(node)
    })
}

pub(crate) async fn phase_reached(client: &Client, node: &str, phase: &str) -> SelfNodeRemediation {
    eventually(&format!("{node}'s remediation in phase {phase}"), LONG, || async {
        snr(client, node)
            .await
            .filter(|r| r.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase))
    })
    .await
}

/// Nodes the lab power-cycled for a watchdog (expiry or an agent's immediate reset) or a
/// software reboot.
pub(crate) fn fenced(lab: &Lab) -> Vec<String> {
    let mut nodes: Vec<String> = lab
        .timeline()
        .entries()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::WatchdogExpired { node } | Event::SoftwareReboot { node } => Some(node),
            _ => None,
        })
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The fast timings with a watchdog timeout the agents program into their devices.
const PROGRAMMED: &str = r#"{"spec": {
    "apiCheckInterval": "1s", "apiServerTimeout": "500ms", "maxApiErrorThreshold": 2,
    "peerDialTimeout": "500ms", "peerRequestTimeout": "500ms", "peerUpdateInterval": "30s",
    "peerApiServerTimeout": "500ms", "safeTimeToAssumeNodeRebootedSeconds": 5, "watchdogTimeout": "4s"}}"#;

/// The seed scenario, every agent on the emulated watchdog device through the product's Linux
/// driver: the timeout it programs is what it registers, and it keeps the device fed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenario_a_crashed_node_s_statefulset_comes_back_elsewhere_and_the_node_is_released() {
    let (lab, a) = cluster_with(LabConfig::seed(), LabWatchdog::Device, PROGRAMMED).await;
    let client = lab.client();
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), NS);
    for node in lab.nodes() {
        // An agent registers once its device is armed; its first keepalive may come a tick later.
        let stats = eventually(
            &format!("{node} feeding its watchdog device"),
            Duration::from_secs(30),
            || async { lab.watchdog_device_stats(&node).ok().filter(|s| s.keepalives > 0) },
        )
        .await;
        assert_eq!(
            stats.programmed_timeout,
            Some(Duration::from_secs(4)),
            "{node}: {stats:?}"
        );
        let lease = leases
            .get(&format!("nodemedic-agent-{node}"))
            .await
            .expect("registration");
        let a = lease.annotations();
        assert_eq!(
            a.get("nodemedic.medik8s.io/watchdog-timeout-ms").map(String::as_str),
            Some("4000")
        );
        assert_eq!(
            a.get("nodemedic.medik8s.io/fencing-means").map(String::as_str),
            Some("hardware-watchdog")
        );
    }
    let crashed = jiff::Timestamp::now();
    lab.crash(&a).await.expect("crash");
    let moved = running_pod(&client, &[&a]).await;
    let running_at = jiff::Timestamp::now();
    println!(
        "seed scenario: crash of {a} -> db-0 Running on {} in {:.1}s",
        node_of(&moved),
        running_at.duration_since(crashed).as_secs_f64()
    );
    assert_witness(&lab);
    let done = phase_reached(&client, &a, phases::FENCING_COMPLETED).await;
    let status = done.status.expect("status");
    assert!(status.time_assumed_rebooted.is_some());
    assert!(
        status.accepted_by.is_some_and(|by| !by.is_empty()),
        "acceptances recorded"
    );
    let t = taints(&client, &a).await;
    assert!(
        t.iter()
            .any(|t| t == "remediation.medik8s.io/self-node-remediation:NoSchedule"),
        "{t:?}"
    );
    assert!(
        t.iter().any(|t| t == "node.kubernetes.io/out-of-service:NoExecute"),
        "{t:?}"
    );

    // The node comes back: the health check deletes the remediation, every taint it added goes.
    lab.power_on(&a).await.expect("power on");
    eventually("the remediation deleted once the node is healthy", LONG, || async {
        snr(&client, &a).await.is_none().then_some(())
    })
    .await;
    let t = taints(&client, &a).await;
    assert!(
        !t.iter()
            .any(|t| t.starts_with("remediation.medik8s.io/") || t.starts_with("node.kubernetes.io/out-of-service")),
        "{t:?}"
    );
    assert_witness(&lab);
}

/// Partitions the pod's node and `more` other nodes together; checks they fence before the pod
/// moves, the rest never fence, and the witness.
async fn partition_fences(config: LabConfig, more: usize, watchdog: LabWatchdog) {
    let (lab, a) = cluster_with(config, watchdog, scenario::FAST_CONFIG).await;
    let client = lab.client();
    let mut cut: Vec<String> = vec![a.clone()];
    cut.extend(lab.nodes().into_iter().filter(|n| *n != a).take(more));
    let cut_refs: Vec<&str> = cut.iter().map(String::as_str).collect();
    lab.partition(&cut_refs).await.expect("partition");
    let moved = running_pod(&client, &cut_refs).await;
    let moved_at = recorded_running(&lab, &moved).await;
    for node in &cut {
        let fenced_at = eventually(&format!("{node} fenced"), LONG, || async {
            lab.timeline()
                .entries()
                .into_iter()
                .find(|e| matches!(&e.event, Event::WatchdogExpired { node: n } if n == node))
                .map(|e| e.at)
        })
        .await;
        assert!(
            fenced_at < moved_at,
            "{node} fenced at {fenced_at}, after the pod moved at {moved_at}"
        );
    }
    println!(
        "partition of {cut:?}: db-0 Running on {} at {moved_at}",
        node_of(&moved)
    );
    assert_witness(&lab);
    let mut expected = cut.clone();
    expected.sort();
    assert_eq!(fenced(&lab), expected, "only the cut-off nodes fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_fences_before_its_pod_moves_and_its_peers_never_fence() {
    // On the emulated device: its expiry, not an agent's write, fences the node.
    partition_fences(LabConfig::seed(), 0, LabWatchdog::Device).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_partitioned_nodes_of_five_fence_before_their_pods_move_and_the_majority_never_fences() {
    partition_fences(LabConfig::workers(5), 1, LabWatchdog::Device).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_api_learns_from_its_peers_only_once_it_is_remediated() {
    let (lab, a) = cluster(LabConfig::seed()).await;
    let client = lab.client();
    let pause = json!({"spec": {"pauseRequests": ["testing an API isolation"]}});
    let checks = Api::<nodemedic_api::healthcheck::NodeHealthCheck>::all(client.clone());
    checks
        .patch("nhc-snr-3node", &PatchParams::default(), &Patch::Merge(&pause))
        .await
        .expect("pause");
    lab.isolate_from_api(&a).await.expect("isolate");
    lab.wait_ready_status(&a, "Unknown", LONG).await.expect("Unknown");
    // Well past L + W: its peers keep voting for it, so it keeps running.
    let since = jiff::Timestamp::now();
    eventually("20 s of isolation", Duration::from_secs(60), || async {
        (jiff::Timestamp::now().duration_since(since) >= jiff::SignedDuration::from_secs(20)).then_some(())
    })
    .await;
    assert!(
        fenced(&lab).is_empty(),
        "nobody fences while no remediation exists: {:?}",
        fenced(&lab)
    );
    assert!(lab.watchdog_armed(&a), "its agent still feeds the watchdog");

    let resume = json!({"spec": {"pauseRequests": null}});
    checks
        .patch("nhc-snr-3node", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .expect("resume");
    let moved = running_pod(&client, &[&a]).await;
    assert_ne!(node_of(&moved), a);
    assert_eq!(fenced(&lab), vec![a.clone()], "it learned from its peers and fenced");
    assert_witness(&lab);
}

/// The incarnation of `node`'s registration, and whether it acknowledges the committed
/// membership (its agent has read the API since it registered).
async fn registration_of(client: &Client, node: &str) -> Option<(String, bool)> {
    let leases = registration::list(client, NS).await.ok()?;
    let committed = leases.iter().find_map(registration::membership)?.committed.epoch;
    leases
        .iter()
        .filter_map(registration::Published::from_lease)
        .find(|p| p.node == node)
        .map(|p| (p.incarnation, p.epoch >= committed))
}

/// A node back from a remediation that released its workloads runs even when it loses the API
/// before the remediation is deleted: its peers, which accepted that remediation, tell it what
/// its own read did (over for a boot after it was created), not to fence. Before they were told
/// the asker's boot, they answered Remediating, and a node whose remediation was deleted a
/// moment before an API outage rebooted for nothing (ci run on 9a48aa2, issue 60).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_a_completed_remediation_keeps_running_when_it_loses_the_api() {
    let (lab, a) = cluster(LabConfig::seed()).await;
    let client = lab.client();
    lab.crash(&a).await.expect("crash");
    phase_reached(&client, &a, phases::FENCING_COMPLETED).await;
    // With the manager stopped nothing deletes the remediation when the node is back, so its
    // peers keep it accepted for as long as the test needs.
    lab.kill_process("controller").expect("the manager stopped");
    let before = registration_of(&client, &a).await.map(|(incarnation, _)| incarnation);
    lab.power_on(&a).await.expect("power on");
    eventually(
        &format!("{a}'s new agent licensed by its own API read"),
        LONG,
        || async {
            registration_of(&client, &a)
                .await
                .filter(|(incarnation, read)| *read && Some(incarnation) != before.as_ref())
        },
    )
    .await;
    assert!(snr(&client, &a).await.is_some(), "its remediation is still there");
    lab.isolate_from_api(&a).await.expect("isolate");
    // Well past L + W: only its peers' votes keep it running.
    let since = jiff::Timestamp::now();
    eventually("20 s without the API", Duration::from_secs(60), || async {
        assert!(
            fenced(&lab).is_empty(),
            "{a} fenced {:.1}s after losing the API: {:?}",
            jiff::Timestamp::now().duration_since(since).as_secs_f64(),
            fenced(&lab)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        (jiff::Timestamp::now().duration_since(since) >= jiff::SignedDuration::from_secs(20)).then_some(())
    })
    .await;
    assert!(lab.watchdog_armed(&a), "its agent still feeds the watchdog");

    lab.heal(&a).await.expect("heal");
    lab.restart_process("controller").expect("the manager started");
    eventually("the remediation deleted once the node is healthy", LONG, || async {
        snr(&client, &a).await.is_none().then_some(())
    })
    .await;
    assert!(fenced(&lab).is_empty(), "{:?}", fenced(&lab));
    assert_witness(&lab);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_and_agent_restarts_mid_remediation_duplicate_nothing_and_lose_no_taint() {
    let (lab, a) = cluster(LabConfig::seed()).await;
    let client = lab.client();
    lab.crash(&a).await.expect("crash");
    let waiting = phase_reached(&client, &a, phases::PRE_REBOOT_COMPLETED).await;
    let started = waiting.status.as_ref().and_then(|s| s.wait_started_at.clone());
    assert!(
        started.is_some(),
        "the wait's start is recorded on the API server's clock"
    );
    let peer = lab.nodes().into_iter().find(|n| *n != a).expect("peer");
    lab.restart_process(&format!("{peer}/agent")).expect("agent restart");
    lab.restart_process("controller").expect("manager restart");
    running_pod(&client, &[&a]).await;
    assert!(
        events_so_far(&client, "SafeTimeRestarted", &a).await.is_empty(),
        "the new manager continues the wait instead of starting it again"
    );
    phase_reached(&client, &a, phases::FENCING_COMPLETED).await;
    let t = taints(&client, &a).await;
    assert!(
        t.iter()
            .any(|t| t == "remediation.medik8s.io/self-node-remediation:NoSchedule"),
        "{t:?}"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("events");
    for reason in [
        "AddFinalizer",
        "AddNoScheduleTaint",
        "AddOutOfService",
        "RemediationStarted",
    ] {
        let count: i32 = events
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum();
        assert_eq!(count, 1, "{reason} happened {count} times");
    }
    assert_witness(&lab);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_an_agent_or_a_config_is_not_self_remediated_and_says_so() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    scenario::configure(&lab).await.expect("config");
    start_controller(&lab, "controller", &[]);
    let remediation = json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
        "metadata": {"name": "node-1", "namespace": NS, "annotations": {"remediation.medik8s.io/node-name": "node-1"}},
        "spec": {"remediationStrategy": "Automatic"}
    });
    lab.apply_yaml(&remediation.to_string()).expect("remediation");
    let failed = eventually("Succeeded=False", LONG, || async {
        let r = snr(&client, "node-1").await?;
        let conditions = r.status?.conditions?;
        conditions
            .iter()
            .find(|c| c.type_ == "Succeeded" && c.status == "False")
            .cloned()
    })
    .await;
    assert!(
        failed.message.contains("no registered nodemedic agent"),
        "{}",
        failed.message
    );
    let t = taints(&client, "node-1").await;
    assert!(
        t.iter().all(|t| !t.starts_with("remediation.medik8s.io/")),
        "nothing touched: {t:?}"
    );
    // The manager made the defaults a fresh install needs.
    eventually("the default templates", LONG, || async {
        let templates = list::<nodemedic_api::self_remediation::SelfNodeRemediationTemplate>(&client, NS).await;
        (templates.len() == 2).then_some(())
    })
    .await;
    wait::until("the agent DaemonSet", LONG, || async {
        Ok(
            Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), NS)
                .get_opt("nodemedic-agent")
                .await?
                .map(|_| ()),
        )
    })
    .await
    .expect("DaemonSet");
    config_deletion_disables_self_remediation(&client, &lab).await;
}

/// Seed 004: deleting the SelfNodeRemediationConfig disables self remediation. The agent
/// DaemonSet it owns goes with it (the garbage collector's doing), a new remediation says why and
/// touches nothing, and the
/// configuration's return lets it go on (here to say its node has no agent).
async fn config_deletion_disables_self_remediation(client: &Client, lab: &Lab) {
    use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig};
    let configs = Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), NS);
    let config = configs.get(CONFIG_NAME).await.expect("the config");
    let spec = config.spec.clone();
    // The DaemonSet goes with its config: its controller owner is the config. (Waiting for the
    // garbage collector would wait for its discovery resync, up to 30 s, since the config's CRD
    // is new to this lab.)
    let daemonsets = Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), NS);
    let daemonset = daemonsets.get("nodemedic-agent").await.expect("the agent DaemonSet");
    let owner = daemonset
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.controller == Some(true))
        .expect("the DaemonSet's controller owner");
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid.as_str())),
        ("SelfNodeRemediationConfig", config.metadata.uid.as_deref()),
        "owned by the config"
    );
    configs
        .delete(CONFIG_NAME, &Default::default())
        .await
        .expect("deleting the config");
    let remediation = json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
        "metadata": {"name": "node-2", "namespace": NS, "annotations": {"remediation.medik8s.io/node-name": "node-2"}},
        "spec": {"remediationStrategy": "Automatic"}
    });
    lab.apply_yaml(&remediation.to_string()).expect("remediation");
    let condition = |status: &'static str| async move {
        let r = snr(client, "node-2").await?;
        r.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Disabled" && c.status == status)
    };
    let disabled = eventually("Disabled=True", LONG, || condition("True")).await;
    assert_eq!(disabled.reason, "ConfigurationNotFound", "{disabled:?}");
    event_with(client, "RemediationDisabled", "self remediation is disabled").await;
    let t = taints(client, "node-2").await;
    assert!(
        t.iter().all(|t| !t.starts_with("remediation.medik8s.io/")),
        "nothing touched while disabled: {t:?}"
    );
    configs
        .create(&Default::default(), &SelfNodeRemediationConfig::new(CONFIG_NAME, spec))
        .await
        .expect("the config created again");
    eventually("Disabled=False", LONG, || condition("False")).await;
    eventually(
        "node-2's remediation to go on: Succeeded=False, no agent",
        LONG,
        || async {
            let r = snr(client, "node-2").await?;
            r.status?.conditions?.into_iter().find(|c| {
                c.type_ == "Succeeded" && c.status == "False" && c.message.contains("no registered nodemedic agent")
            })
        },
    )
    .await;
}

/// A deliberate stop (SIGTERM) closes the agent's watchdog only after its registration says so:
/// nothing resets the node, and a remediation of it reports that it cannot be safe (so an
/// escalating health check moves on). An agent stopped while it starts ends cleanly with nothing
/// armed; a restarted agent arms its watchdog and says so again. A configuration change
/// re-creates the agent DaemonSet with the new tolerations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliberately_stopped_agent_closes_its_watchdog_and_the_manager_stops_counting_on_it() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    let config = scenario::configure(&lab).await.expect("config");
    // No controller yet, so no signer: every agent waits for its peer certificate.
    scenario::start_agents_with(&lab, &exe(), &config, LabWatchdog::Device).expect("agents");
    an_agent_stopped_while_starting_ends_cleanly_with_nothing_armed(&lab, "node-2").await;
    lab.restart_process("node-2/agent").expect("agent start");
    start_controller(&lab, "controller", &[]);
    scenario::agents_settled(&lab).await.expect("agents settled");
    assert_eq!(
        lab.watchdog_device_stats("node-2").expect("stats").magic_closes,
        0,
        "a running agent never closes its watchdog"
    );
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), NS);
    let disarmed = || async {
        let lease = leases.get_opt("nodemedic-agent-node-2").await.ok()??;
        Some(lease.annotations().get("nodemedic.medik8s.io/disarmed")? == "true")
    };
    assert!(lab.watchdog_armed("node-2"));
    assert_eq!(disarmed().await, Some(false));

    lab.terminate_process("node-2/agent").expect("SIGTERM");
    eventually("node-2's agent stopped", LONG, || async {
        (!lab.process_running("node-2/agent")).then_some(())
    })
    .await;
    assert_eq!(disarmed().await, Some(true), "the registration says disarmed");
    assert!(!lab.watchdog_armed("node-2"), "the magic close disarmed the watchdog");
    assert_eq!(
        lab.watchdog_device_stats("node-2").expect("stats").magic_closes,
        1,
        "one magic close, on the deliberate stop"
    );

    let remediation = json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
        "metadata": {"name": "node-2", "namespace": NS, "annotations": {"remediation.medik8s.io/node-name": "node-2"}},
        "spec": {"remediationStrategy": "Automatic"}
    });
    lab.apply_yaml(&remediation.to_string()).expect("remediation");
    let failed = eventually("Succeeded=False", LONG, || async {
        let conditions = snr(&client, "node-2").await?.status?.conditions?;
        conditions
            .iter()
            .find(|c| c.type_ == "Succeeded" && c.status == "False")
            .cloned()
    })
    .await;
    assert!(failed.message.contains("disarmed"), "{}", failed.message);
    Api::<SelfNodeRemediation>::namespaced(client.clone(), NS)
        .delete("node-2", &Default::default())
        .await
        .expect("delete remediation");

    lab.restart_process("node-2/agent").expect("agent start");
    eventually("node-2's agent armed and registered again", LONG, || async {
        (lab.watchdog_armed("node-2") && disarmed().await == Some(false)).then_some(())
    })
    .await;
    assert!(fenced(&lab).is_empty(), "no node was reset: {:?}", fenced(&lab));

    // A configuration change re-creates the agents' DaemonSet.
    let daemonsets = Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), NS);
    let before = eventually("the agent DaemonSet", LONG, || async {
        daemonsets.get_opt("nodemedic-agent").await.ok()?
    })
    .await;
    let tolerate = json!({"spec": {"customDsTolerations": [
        {"key": "lab.nodemedic/dedicated", "operator": "Exists", "effect": "NoSchedule"}
    ]}});
    Api::<nodemedic_api::self_remediation::SelfNodeRemediationConfig>::namespaced(client.clone(), NS)
        .patch(
            "self-node-remediation-config",
            &PatchParams::default(),
            &Patch::Merge(&tolerate),
        )
        .await
        .expect("config change");
    eventually("a new agent DaemonSet with the toleration", LONG, || async {
        let ds = daemonsets.get_opt("nodemedic-agent").await.ok()??;
        let tolerates = ds
            .spec
            .as_ref()?
            .template
            .spec
            .as_ref()?
            .tolerations
            .as_ref()?
            .iter()
            .any(|t| t.key.as_deref() == Some("lab.nodemedic/dedicated"));
        (ds.metadata.uid != before.metadata.uid && tolerates).then_some(())
    })
    .await;
    event_with(&client, "AgentsRecreated", "re-creating").await;
}

/// A pod deleted as it starts: in a container the agent is PID 1, which the kernel spares a
/// SIGTERM it has no handler for, so an agent that listened late was killed at the end of its
/// grace period instead, its watchdog armed and never fed (a node reset by a `kubectl delete`).
async fn an_agent_stopped_while_starting_ends_cleanly_with_nothing_armed(lab: &Lab, node: &str) {
    let requests = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(lab.client());
    let prefix = format!("nodemedic-peer-{node}-");
    eventually(
        &format!("{node}'s agent asking for its peer certificate"),
        LONG,
        || async {
            let listed = requests.list(&Default::default()).await.ok()?;
            listed
                .items
                .iter()
                .any(|r| r.name_any().starts_with(&prefix))
                .then_some(())
        },
    )
    .await;
    let agent = format!("{node}/agent");
    lab.terminate_process(&agent).expect("SIGTERM");
    let ended = eventually(&format!("{node}'s starting agent stopped"), LONG, || async {
        lab.process_exit_status(&agent)
    })
    .await;
    assert!(
        ended.success(),
        "the SIGTERM ended the agent's own way, not by the signal: {ended}"
    );
    let stats = lab.watchdog_device_stats(node).expect("stats");
    assert_eq!(
        stats.opens, 0,
        "an agent stopped before it armed its watchdog never opens it"
    );
}

/// The agents with only what the chart gives a real agent pod: the `nodemedic-agent`
/// ServiceAccount (a token bound to the DaemonSet's pod on each node, which names the node to the
/// signer) and the chart's agent role. They get their peer certificates, register, hold licences,
/// and a crashed node is remediated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_with_only_the_charts_service_account_and_role_register_and_remediate() {
    let lab = lab(LabConfig::seed()).await;
    let client = lab.client();
    let config = scenario::configure(&lab).await.expect("config");
    apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {});
    start_controller(&lab, "controller", &[]);
    scenario::start_agents_as_daemonset_pods(&lab, &crate::nodemedic_exe(), &config)
        .await
        .expect("agents");
    scenario::deploy_workload(&lab).await.expect("workload");
    let node = node_of(&running_pod(&client, &[]).await);
    scenario::agents_settled(&lab).await.expect("agents settled");
    let requests = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("CSRs");
    let peer: Vec<_> = requests
        .items
        .iter()
        .filter(|c| c.spec.signer_name == "nodemedic.medik8s.io/peer")
        .collect();
    assert_eq!(peer.len(), 3, "one peer certificate per agent");
    for csr in &peer {
        assert_eq!(
            csr.spec.username.as_deref(),
            Some("system:serviceaccount:workload-availability:nodemedic-agent")
        );
        assert!(
            csr.status.as_ref().is_some_and(|s| s.certificate.is_some()),
            "signed: {csr:?}"
        );
    }
    assert!(lab.nodes().iter().all(|n| lab.watchdog_armed(n)));

    apply_seed_check(&lab, "002-nhc-snr-3node.yaml", |_| {});
    lab.crash(&node).await.expect("crash");
    let moved = running_pod(&client, &[&node]).await;
    println!("db-0 moved from {node} to {}", node_of(&moved));
    assert_witness(&lab);
}
