//! Reads what the decision needs: the remediation, its node and taints, the agent's checked
//! options while it is live, and the node's pods and volume attachments while it releases them.

use k8s_openapi::api::{core::v1::Node, core::v1::Pod, storage::v1::VolumeAttachment};
use kube::{Api, ResourceExt};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    machines::{self, NodeOf},
    names::{annotations, finalizers, taints as keys},
};
use nodemedic_kube::{CallContext, machines as machine_nodes, taints, workloads};

use super::{
    super::{Context, options},
    Seen,
};
use crate::{
    Result,
    decide::{
        fencing::{Facts, Step},
        parameters::Unusable,
    },
};

pub struct Observed {
    pub current: FenceAgentsRemediation,
    pub node: String,
    pub uid: String,
    /// The agent's options and metadata, or why they cannot be used; only while live.
    pub checked: std::result::Result<options::Checked, Unusable>,
    pub pods: Vec<Pod>,
    pub attachments: Vec<VolumeAttachment>,
    pub facts: Facts,
}

pub(super) async fn observe(current: FenceAgentsRemediation, ctx: &Context) -> Result<Seen> {
    let namespace = current.namespace().unwrap_or_default();
    let Some(node) = node_name(&current) else {
        let settled = current_step(&current).finished();
        let resolution = machine_nodes::resolution(&ctx.client, &current.metadata, settled).await?;
        return Ok(Seen::Unresolved {
            current: Box::new(current),
            resolution,
        });
    };
    let uid = current.uid().unwrap_or_default();
    let step = current_step(&current);
    let deleting = current.metadata.deletion_timestamp.is_some();
    let live = !deleting && !step.finished();
    let node_object = Api::<Node>::all(ctx.client.clone())
        .get_opt(&node)
        .await
        .with_context(|| format!("reading node {node}"))?;
    let node_taints = node_object
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let checked = if live {
        options::for_node(&ctx.client, &ctx.agents, &namespace, &current.spec, &node).await?
    } else {
        Err(Unusable::Invalid("not needed".into()))
    };
    let (pods, attachments) = if live && step == Step::RecoveringWorkloads {
        (
            workloads::pods(&ctx.client, &node).await?,
            workloads::attachments(&ctx.client, &node).await?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let facts = Facts {
        deleting,
        timed_out_by_health_check: current.annotations().contains_key(annotations::NHC_TIMED_OUT),
        node_exists: node_object.is_some(),
        has_finalizer: nodemedic_kube::finalizers::has(&current, finalizers::FAR),
        has_remediation_taint: taints::has(&node_taints, keys::FAR_KEY, "NoSchedule"),
        has_out_of_service_taint: taints::has(&node_taints, keys::OUT_OF_SERVICE_KEY, "NoExecute"),
        parameters: checked.as_ref().map(|c| c.options.action).map_err(Clone::clone),
        strategy: current.spec.remediation_strategy,
        step,
        run: ctx.runs.state(&uid),
        pods_left: pods.len(),
        attachments_left: attachments.len(),
    };
    Ok(Seen::Fencing(Box::new(Observed {
        current,
        node,
        uid,
        checked,
        pods,
        attachments,
        facts,
    })))
}

/// The node-name annotation, else the CR's name (medik8s), except for a Machine-owned remediation
/// not yet resolved: its name is the Machine's, and fencing a node of that name could fence the
/// wrong one (medik8s does).
pub(super) fn node_name(far: &FenceAgentsRemediation) -> Option<String> {
    match machines::node_of(&far.metadata) {
        NodeOf::Named(node) => Some(node),
        NodeOf::Machine(_) => None,
    }
}

pub(super) fn current_step(far: &FenceAgentsRemediation) -> Step {
    let status = far.status.as_ref();
    if let Some(step) = status.and_then(|s| s.step.as_deref()) {
        return Step::parse(Some(step));
    }
    let condition = |type_| {
        status
            .and_then(|s| s.conditions.as_deref())
            .and_then(|c| nodemedic_kube::conditions::find(c, type_))
            .map(|c| c.status.as_str())
    };
    Step::from_conditions(
        condition(nodemedic_api::names::conditions::SUCCEEDED),
        condition(nodemedic_api::names::conditions::FENCE_AGENT_ACTION_SUCCEEDED),
    )
}
