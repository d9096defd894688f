//! NetworkPolicies on real nodes ([`crate::LabConfig::network_policies`]): kubernetes-sigs'
//! kube-network-policies, the reference implementation, beside each node's kube-proxy in the
//! node's network namespace, as its DaemonSet (host network) would run it. It sends the first
//! packet of each connection to or from a pod that a policy selects to user space, where it
//! judges the policies, and lets the rest of the connection through by its conntrack state; the
//! bridge CNI plugin alone enforces nothing.
//!
//! Built by scripts/build-node.sh from its Go module at `KUBE_NETWORK_POLICIES_VERSION` with one
//! patch (testing/lab/node-patches): the kernel here has no nftables `queue` expression
//! (`CONFIG_NFT_QUEUE` is not set), so the patch queues through x_tables' NFQUEUE target
//! (nft_compat) instead, the same verdict; and it reads a kubeconfig instead of the in-cluster
//! configuration.

use std::path::{Path, PathBuf};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

use serde_json::json;

use super::RealNode;
use crate::{Result, binaries, pki::LabPki};

/// Every node's instance authenticates as this user, in [`GROUP`].
const USER: &str = "lab:kube-network-policies";
const GROUP: &str = "lab:network-policies";
const NAME: &str = "lab-kube-network-policies";

/// Its packet queue in each node's namespace: far above the slow links' (numbered from 0 by
/// each lab process, see slow_link.rs), so the two never bind one queue.
const QUEUE: u16 = 65_000;

/// The executable scripts/build-node.sh builds, in `bin` (the node parts' directory).
pub(crate) fn executable(bin: &Path) -> PathBuf {
    bin.join(format!(
        "kube-network-policies-v{}",
        binaries::version("KUBE_NETWORK_POLICIES_VERSION")
    ))
}

/// Lets every node's instance read what it judges by: its upstream DaemonSet's ClusterRole,
/// and the events it records.
pub(crate) async fn authorize(client: &Client) -> Result<()> {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        ],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}],
    });
    let apply = PatchParams::apply("nodemedic-lab").force();
    Api::<ClusterRole>::all(client.clone())
        .patch(NAME, &apply, &Patch::Apply(&role))
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(NAME, &apply, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

fn kubeconfig(node: &RealNode<'_>) -> PathBuf {
    node.dir().join("network-policies.kubeconfig")
}

/// Writes the node's instance its credentials.
pub(super) fn credentials(node: &RealNode<'_>, pki: &LabPki) -> Result<()> {
    let user = format!("{}-network-policies", node.name);
    pki.issue_client(&user, USER, &[GROUP])?;
    pki.kubeconfig(&user, node.server, &kubeconfig(node))
}

/// The node's instance's arguments.
pub(super) fn args(node: &RealNode<'_>) -> String {
    [
        format!("--kubeconfig={}", kubeconfig(node).display()),
        format!("--hostname-override={}", node.name),
        format!("--nfqueue-id={QUEUE}"),
        // While it is not running (a power-on, until it starts), packets pass: the lab's other
        // tests must not hang on it, and a test of a policy sees a connection it expected
        // refused get through.
        "--fail-open".into(),
        // Its metrics on the node's loopback: nothing on the node's network collides with them.
        "--metrics-bind-address=127.0.0.1:9080".into(),
        // Each verdict, for a test that fails.
        "--v=2".into(),
    ]
    .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_s_instance_judges_its_own_pods_with_its_own_credentials_and_fails_open() {
        let lab_dir = Path::new("/labs/x");
        let node = RealNode {
            lab: "x",
            name: "node-2",
            pod_cidr: "10.64.0.64/26".into(),
            ip: std::net::Ipv4Addr::new(10, 213, 1, 12),
            netns: "nmx-node-2",
            lab_dir,
            server: "https://10.213.1.1:6443",
            lease_seconds: 10,
            watchdog_device: Path::new("/labs/x/nodes/node-2-dev/watchdog"),
        };
        let args: Vec<String> = args(&node).split(' ').map(str::to_owned).collect();
        for expected in [
            "--kubeconfig=/labs/x/nodes/node-2/network-policies.kubeconfig",
            "--hostname-override=node-2",
            "--fail-open",
            "--nfqueue-id=65000",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
        }
        assert!(
            executable(Path::new("/bin"))
                .display()
                .to_string()
                .starts_with("/bin/kube-network-policies-v")
        );
    }
}
