//! The agent's registration Lease and what it reads about its own node.

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use nodemedic_api::names::annotations;
use nodemedic_kube::CallContext;
use serde_json::json;

use crate::{
    Result,
    protocol::{Timing, manager::Means},
    registration::{self, Published},
};

/// The node's boot time: from `file` (an RFC 3339 time) when given, else `btime` of /proc/stat.
pub(super) fn boot_time(file: Option<&std::path::Path>) -> Option<jiff::Timestamp> {
    if let Some(path) = file {
        return std::fs::read_to_string(path).ok()?.trim().parse().ok();
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let seconds: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    jiff::Timestamp::from_second(seconds).ok()
}

/// Creates or updates the registration.
pub(super) async fn register(client: &Client, namespace: &str, published: &Published) -> Result<()> {
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let name = registration::lease_name(&published.node);
    let now = nodemedic_kube::time::micro_now();
    let existing = api
        .get_opt(&name)
        .await
        .with_context(|| format!("reading registration Lease {namespace}/{name}"))?;
    match existing {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(published.labels()),
                    annotations: Some(published.annotations()),
                    owner_references: published.owner_references(),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some(published.node.clone()),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease)
                .await
                .with_context(|| format!("creating registration Lease {namespace}/{name}"))?;
        }
        Some(existing) => {
            // Conditional on what was read: a write that lands late (its answer timed out) fails
            // instead of undoing a later one, such as the shutdown's `disarmed`.
            let mut metadata = json!({
                "labels": published.labels(),
                "annotations": published.annotations(),
                "resourceVersion": existing.metadata.resource_version,
            });
            if let Some(owners) = published.owner_references() {
                metadata["ownerReferences"] = json!(owners);
            }
            let patch = json!({ "metadata": metadata, "spec": { "renewTime": now } });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("renewing registration Lease {namespace}/{name}"))?;
        }
    }
    Ok(())
}

/// medik8s's node annotations, for tools that read them; returns the Node's uid (the
/// registration's owner), None when the node cannot be read.
pub(super) async fn annotate_node(client: &Client, node: &str, means: Means, timing: &Timing) -> Option<String> {
    let capable = !matches!(means, Means::None);
    let timeout = match means {
        Means::HardwareWatchdog | Means::Softdog => timing.watchdog.as_secs().max(1),
        Means::SoftwareReboot | Means::None => 0,
    };
    let patch = json!({ "metadata": { "annotations": {
        annotations::SNR_IS_REBOOT_CAPABLE: capable.to_string(),
        annotations::SNR_WATCHDOG_TIMEOUT: timeout.to_string(),
    } } });
    match Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(n) => n.metadata.uid,
        Err(error) => {
            tracing::warn!(%error, "cannot annotate the node");
            None
        }
    }
}
