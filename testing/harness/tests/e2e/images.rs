//! The images `make image` builds, run as containers (runc) in a lab: the controller as the
//! chart's Deployment runs it, fencing a crashed node through its BMC with the fence agents the
//! image carries; an agent in every node's network namespace, as the DaemonSet runs it. The
//! fence-agents seed scenario runs here, from the images, rather than in a lab of its own.

use nodemedic_harness::images::{self, Images};
use nodemedic_lab::{BmcOptions, LabConfig, PowerDelays};

use crate::{
    fenceagents::{History, adapt_template, crash_and_recover},
    nodemedic_exe,
    support::{apply_seed, apply_seed_check, free_port, lab, metrics, sample, scenario},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenario_from_the_images_fence_redfish_with_a_slow_bmc_fences_the_crashed_node_and_brings_it_back() {
    let images = Images::of(&nodemedic_exe()).expect("the images are built");
    let lab = lab(LabConfig::seed().with_bmcs(BmcOptions {
        delays: PowerDelays::Realistic,
        ..BmcOptions::default()
    }))
    .await;

    // What ships: the operators and the kubectl plugin, none of the test tooling.
    let (binaries, help) = images::image_commands(&lab, &images.controller).expect("the image lists its commands");
    assert_eq!(
        binaries,
        ["kubectl-nodemedic", "nodemedic", "nodemedic-controller"],
        "{binaries:?}"
    );
    for tooling in ["demo", "bench", "chaos", "lab"] {
        assert!(
            !help.lines().any(|l| l.split_whitespace().next() == Some(tooling)),
            "the image's nodemedic offers `{tooling}`:\n{help}"
        );
    }

    fence_agents_that_can_run(&lab, &images.controller);

    apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {});
    let history = History::record(&lab.client());
    // The configuration first, as users apply it: a controller that starts without one creates
    // the default, and a client-side apply racing that creation fails with AlreadyExists.
    let config = scenario::configure(&lab).await.expect("SelfNodeRemediationConfig");
    let port = free_port();
    images::start_controller_container(&lab, &images.controller, "controller", port, &[])
        .await
        .expect("the controller container starts");
    images::start_agent_containers(&lab, &images.agent, &config)
        .await
        .expect("the agent containers start");
    // Registered through the controller, with certificates it signed, and members of one ring.
    scenario::agents_settled(&lab)
        .await
        .expect("every agent container registered");
    // Each opened its node's emulated watchdog device, bound into its container, with the
    // product's Linux driver: a hardware watchdog as far as it can tell.
    for node in lab.nodes() {
        assert_eq!(
            crate::fencing_means::means(&lab, &node).await.as_deref(),
            Some("hardware-watchdog"),
            "{node}'s agent container"
        );
        assert!(lab.watchdog_armed(&node), "{node}'s watchdog device is armed");
    }

    scenario::deploy_workload(&lab).await.expect("workload");
    let pod = scenario::running_pod(&lab.client(), &[], std::time::Duration::from_secs(180))
        .await
        .expect("db-0 Running");
    let crashed = scenario::node_of(&pod);
    apply_seed(&lab, "002-far-template.yaml", adapt_template(&lab));
    apply_seed_check(&lab, "002-nhc-far-3node.yaml", |_| {});
    crash_and_recover(&lab, &crashed, &history).await;
    let text = metrics(port).expect("the controller container's metrics");
    assert!(
        sample(
            &text,
            "nodemedic_fence_agent_attempts_total{agent=\"fence_redfish\",action=\"off\",result=\"success\"}"
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    // The crashed node's agent container came back with the node.
    scenario::agents_settled(&lab)
        .await
        .expect("every agent container registered after the fence");
}

/// The controller image offers the agents that fence by power, none of the others, and carries
/// what the cloud, KubeVirt and SNMP agents load to run.
fn fence_agents_that_can_run(lab: &nodemedic_lab::Lab, image: &std::path::Path) {
    let listed = images::run_in_image(lab, image, "list-agents", &["/bin/ls", "/usr/sbin"]).expect("ls runs");
    let agents: Vec<&str> = listed.split_whitespace().filter(|f| f.starts_with("fence_")).collect();
    for (refused, _) in nodemedic_api::fence_agents::NOT_BY_POWER {
        assert!(!agents.contains(refused), "the image offers {refused}: {agents:?}");
    }
    for power in [
        "fence_redfish",
        "fence_ipmilan",
        "fence_aws",
        "fence_azure_arm",
        "fence_gce",
        "fence_kubevirt",
        "fence_apc_snmp",
        "fence_ilo_ssh",
    ] {
        assert!(agents.contains(&power), "the image lacks {power}: {agents:?}");
    }
    let modules = "boto3, googleapiclient.discovery, kubernetes.config, openshift.dynamic, azure.identity, \
                   azure.mgmt.compute, azure.mgmt.network, msrestazure.azure_active_directory";
    let imported = images::run_in_image(
        lab,
        image,
        "imports",
        &[
            "/usr/bin/python3",
            "-c",
            &format!("import {modules}; print('imported')"),
        ],
    )
    .expect("python3 runs");
    assert!(imported.contains("imported"), "{imported}");
    for tool in ["/usr/bin/snmpget", "/usr/bin/ssh", "/usr/bin/telnet"] {
        let found = images::run_in_image(lab, image, "tools", &["/bin/ls", tool]).expect("ls runs");
        assert!(found.contains(tool), "the image lacks {tool}: {found}");
    }
}
