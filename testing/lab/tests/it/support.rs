use std::{sync::Once, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nodemedic_lab::{Lab, ProcessSpec, wait};

pub(crate) fn logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A TCP listener inside the node (port 9000), so reachability between nodes can be checked.
pub(crate) fn listen_in(lab: &Lab, node: &str) {
    let ip = lab.node_ip(node).expect("node");
    let spec = ProcessSpec::new(
        "/usr/bin/python3",
        ["-m", "http.server", "--bind", &ip.to_string(), "9000"],
    );
    lab.add_node_process(node, "listener", spec).expect("listener starts");
}

pub(crate) async fn wait_reachable(lab: &Lab, from: &str, to: &str) {
    let ip = lab.node_ip(to).expect("node");
    wait::until(
        &format!("{from} reaches {to}"),
        Duration::from_secs(20),
        || async move { Ok(lab.node_can_reach(from, ip, 9000)?.then_some(())) },
    )
    .await
    .expect("reachable");
}

pub(crate) async fn has_taint(lab: &Lab, node: &str, key: &str) -> bool {
    let node = Api::<Node>::all(lab.client()).get(node).await.expect("node");
    node.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == key)
}

/// Grace before Ready=Unknown, plus the monitor period and slack for a loaded 2-core machine.
pub(crate) fn unknown_within(lab: &Lab) -> Duration {
    let t = &lab.config().timings;
    t.node_monitor_grace + t.node_monitor_period * 2 + Duration::from_secs(8)
}
