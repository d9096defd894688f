//! What maintenance does to the node itself, and how it gives the node back.

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use nodemedic_api::names::{labels, leases, taints};
use nodemedic_kube::taints as taint_list;
use serde_json::{Value, json};

use super::Context;
use crate::Result;

const NO_SCHEDULE: &str = "NoSchedule";
const OUR_TAINTS: [&str; 2] = [taints::UNSCHEDULABLE_KEY, taints::DRAIN_KEY];

fn nodes(ctx: &Context) -> Api<Node> {
    Api::all(ctx.client.clone())
}

/// A merge patch on a node that may be gone (nothing to do then). `what` names it in an error:
/// "{what} node {node}".
async fn patch(ctx: &Context, node: &str, what: &str, patch: Value) -> Result<()> {
    match nodes(ctx)
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(nodemedic_kube::Error::call(format!("{what} node {node}"), e).into()),
    }
}

/// The health check leaves a node with this label alone.
pub(super) async fn label(ctx: &Context, node: &str) -> Result<()> {
    patch(
        ctx,
        node,
        "adding the exclude-from-remediation label to",
        json!({"metadata": {"labels": {labels::EXCLUDE_FROM_REMEDIATION: "true"}}}),
    )
    .await
}

pub(super) async fn taint(ctx: &Context, node: &str) -> Result<()> {
    for key in OUR_TAINTS {
        taint_list::add(&nodes(ctx), node, &taint_list::taint(key, None, NO_SCHEDULE)).await?;
    }
    Ok(())
}

pub(super) async fn cordon(ctx: &Context, node: &str, unschedulable: bool) -> Result<()> {
    let (value, what) = if unschedulable {
        (json!(true), "cordoning")
    } else {
        (Value::Null, "uncordoning")
    };
    patch(ctx, node, what, json!({"spec": {"unschedulable": value}})).await
}

/// Uncordons and removes the taints, the label and our lease; each step is a no-op when already
/// done, so a retry after a partial give-back finishes it.
pub(super) async fn give_back(ctx: &Context, node: &str) -> Result<()> {
    // Uncordon first: the node lifecycle controller re-adds the unschedulable taint to a node
    // that is still cordoned.
    cordon(ctx, node, false).await?;
    for key in OUR_TAINTS {
        taint_list::remove(&nodes(ctx), node, key, NO_SCHEDULE).await?;
    }
    patch(
        ctx,
        node,
        "removing the exclude-from-remediation label from",
        json!({"metadata": {"labels": {labels::EXCLUDE_FROM_REMEDIATION: null}}}),
    )
    .await?;
    match ctx.leases.invalidate(node, leases::MAINTENANCE_HOLDER).await {
        // Someone else's valid lease is theirs to release.
        Ok(()) | Err(nodemedic_kube::Error::LeaseHeld { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
