//! nodemedic on real nodes, installed as users install it: `helm install` of the shipped chart,
//! from the images `make image` builds (imported into each node's containerd: nothing can be
//! pulled here), the controller's replicas and the agent DaemonSet running as pods on real
//! kubelets.

use std::{path::Path, process::Command, time::Duration};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::Api;
use nodemedic_harness::images::Images;
use nodemedic_lab::{Lab, LabConfig, NodeSpec, tools_dir};

use crate::{
    support::{NS, eventually, lab},
    text,
};

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const INSTALLED: Duration = Duration::from_secs(180);

/// The seed's three nodes, real, each importing nodemedic's images at its boot.
async fn real_lab() -> Lab {
    let images = Images::of(&crate::nodemedic_exe()).expect("the images are built");
    let mut config = LabConfig::new(NODES.iter().map(|n| NodeSpec::control_plane_worker(n).real()).collect());
    config.storage = false;
    config.persistent_volumes = 0;
    config.node_images = vec![images.controller, images.agent];
    lab(config).await
}

/// `helm install` of charts/nodemedic as shipped, with `values` (`--set` pairs) on top.
fn helm_install(lab: &Lab, values: &[&str]) {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/nodemedic");
    let mut helm = Command::new(tools_dir().join("helm"));
    helm.args(["install", "nodemedic"])
        .arg(&chart)
        .args(["--namespace", NS, "--kubeconfig"])
        .arg(lab.kubeconfig());
    for value in values {
        helm.args(["--set", value]);
    }
    let out = helm.output().expect("helm runs");
    assert!(out.status.success(), "helm install: {}", text(&out));
}

/// Both controller replicas ready and an agent ready on every node.
async fn installed(lab: &Lab) {
    let deployments = Api::<Deployment>::namespaced(lab.client(), NS);
    eventually("the controller's two replicas ready", INSTALLED, || async {
        let ready = deployments.get_opt("nodemedic-controller").await.ok().flatten()?;
        (ready.status?.ready_replicas? == 2).then_some(())
    })
    .await;
    let daemon_sets = Api::<DaemonSet>::namespaced(lab.client(), NS);
    eventually("an agent ready on every node", INSTALLED, || async {
        let status = daemon_sets.get_opt("nodemedic-agent").await.ok().flatten()?.status?;
        (status.number_ready == NODES.len() as i32).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_nodemedic_from_its_images_and_every_agent_arms_its_node_s_watchdog_from_its_pod() {
    let lab = real_lab().await;
    helm_install(&lab, &[]);
    installed(&lab).await;
    // Each agent found its node, its peers and its certificates, and opened the node's
    // /dev/watchdog (the lab's emulated device) from inside its container.
    for node in NODES {
        eventually(&format!("{node}'s agent feeds its watchdog"), INSTALLED, || async {
            lab.watchdog_device_stats(node)
                .ok()
                .filter(|s| s.keepalives > 0)
                .map(|_| ())
        })
        .await;
    }
}
