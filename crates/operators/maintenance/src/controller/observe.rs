//! Reads what the decisions need: the node, its pods, its lease, the other NodeMaintenances and,
//! before a start, the etcd members.

use std::{collections::BTreeSet, time::Duration};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt, api::ListParams};
use nodemedic_api::{
    maintenance::{MaintenancePhase, NodeMaintenance},
    names::{conditions as types, finalizers, labels, leases, taints},
};
use nodemedic_kube::{CallContext, conditions, node_lease};

use super::Context;
use crate::{
    Result,
    decide::{
        drain::{self, PodFacts},
        quorum,
        steps::{Facts, Lease, Phase},
    },
};

/// How long the maintenance takes the node lease for (medik8s: one hour), renewed at half.
pub(super) const LEASE_DURATION: Duration = Duration::from_secs(3600);
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

pub struct Observed {
    /// The NodeMaintenance as read now.
    pub current: NodeMaintenance,
    pub node: Option<Node>,
    /// Every pod bound to the node.
    pub pods: Vec<Pod>,
    pub facts: Facts,
}

impl Observed {
    pub fn node_uid(&self) -> String {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.uid.clone())
            .unwrap_or_default()
    }

    /// The pods the drain must still see gone, with their facts.
    pub(crate) fn to_remove(&self) -> Vec<(&Pod, PodFacts)> {
        let mut out: Vec<(&Pod, PodFacts)> = self
            .pods
            .iter()
            .map(|p| (p, pod_facts(p)))
            .filter(|(_, f)| drain::fate(f) != drain::Fate::Stay)
            .collect();
        out.sort_by(|a, b| (&a.1.namespace, &a.1.name).cmp(&(&b.1.namespace, &b.1.name)));
        out
    }
}

pub(super) fn pod_facts(pod: &Pod) -> PodFacts {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodFacts {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        daemon_set: pod.owner_references().iter().any(|o| o.kind == "DaemonSet"),
        mirror: pod.annotations().contains_key(MIRROR_ANNOTATION),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
    }
}

pub(super) fn phase(nm: &NodeMaintenance) -> Phase {
    match nm.status.as_ref().and_then(|s| s.phase) {
        None => Phase::NotStarted,
        Some(MaintenancePhase::Running) => Phase::Running,
        Some(MaintenancePhase::Succeeded) => Phase::Succeeded,
        Some(MaintenancePhase::Failed) => Phase::Failed,
    }
}

fn live_and_active(nm: &NodeMaintenance) -> bool {
    nm.metadata.deletion_timestamp.is_none() && phase(nm) != Phase::Failed
}

pub(super) async fn observe(ctx: &Context, current: NodeMaintenance) -> Result<Observed> {
    let nm = &current;
    let node_name = nm.spec.node_name.as_str();
    let node = Api::<Node>::all(ctx.client.clone())
        .get_opt(node_name)
        .await
        .with_context(|| format!("reading node {node_name}"))?;
    let pods = Api::<Pod>::all(ctx.client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
        .with_context(|| format!("listing the pods on node {node_name}"))?
        .items;
    let all = Api::<NodeMaintenance>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NodeMaintenances")?
        .items;
    let others: Vec<&NodeMaintenance> = all
        .iter()
        .filter(|o| o.metadata.uid != nm.metadata.uid && live_and_active(o))
        .collect();
    let key = |o: &NodeMaintenance| (o.creation_timestamp().map(|t| t.0), o.name_any());
    let earlier_for_node = others
        .iter()
        .filter(|o| o.spec.node_name == node_name)
        .find(|o| phase(o) != Phase::NotStarted || key(o) < key(nm))
        .map(|o| o.name_any());
    // A successor that has not started has not touched the node (and may still fail).
    let other_active_for_node = others
        .iter()
        .any(|o| o.spec.node_name == node_name && phase(o) != Phase::NotStarted);
    let status_phase = phase(nm);

    let quorum = if status_phase == Phase::NotStarted && nm.metadata.deletion_timestamp.is_none() {
        // Two maintenances created together must not both pass: the earlier one counts as busy.
        let busy: BTreeSet<String> = others
            .iter()
            .filter(|o| phase(o) != Phase::NotStarted || key(o) < key(nm))
            .map(|o| o.spec.node_name.clone())
            .collect();
        nodemedic_kube::etcd::check(
            &nodemedic_kube::etcd::members(&ctx.client, ctx.etcd.as_ref()).await?,
            &busy,
            node_name,
        )
    } else {
        quorum::Verdict::NotAMember
    };

    let lease = match ctx.leases.get(node_name).await? {
        None => Lease::Free,
        Some(l) => {
            let view = node_lease::view(&l);
            match node_lease::decide(
                Some(&view),
                leases::MAINTENANCE_HOLDER,
                LEASE_DURATION / 2,
                Timestamp::now(),
            ) {
                node_lease::LeaseDecision::Keep => Lease::Ours,
                node_lease::LeaseDecision::HeldBy(holder) => Lease::HeldBy(holder),
                _ => Lease::Free,
            }
        }
    };

    let node_labels = node.as_ref().map(|n| n.labels().clone()).unwrap_or_default();
    let node_taints = node
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let status = nm.status.clone().unwrap_or_default();
    let mut observed = Observed {
        facts: Facts {
            deleting: nm.metadata.deletion_timestamp.is_some(),
            phase: status_phase,
            node_exists: node.is_some(),
            earlier_for_node,
            other_active_for_node,
            quorum,
            has_finalizer: nm.finalizers().iter().any(|f| f == finalizers::NODE_MAINTENANCE),
            lease,
            lease_errors: status.error_on_lease_count.unwrap_or(0).max(0) as u32,
            labelled: node_labels.get(labels::EXCLUDE_FROM_REMEDIATION).map(String::as_str) == Some("true"),
            tainted: nodemedic_kube::taints::has(&node_taints, taints::UNSCHEDULABLE_KEY, "NoSchedule")
                && nodemedic_kube::taints::has(&node_taints, taints::DRAIN_KEY, "NoSchedule"),
            cordoned: node
                .as_ref()
                .and_then(|n| n.spec.as_ref())
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            pending: 0,
            drain_timed_out: drain_timed_out(nm),
        },
        node,
        pods,
        current,
    };
    observed.facts.pending = observed.to_remove().len();
    Ok(observed)
}

/// Whether the optional drain timeout has passed since the drain started (the Drained
/// condition's transition to False).
fn drain_timed_out(nm: &NodeMaintenance) -> bool {
    let Some(timeout) = nm.spec.drain_timeout.as_ref().and_then(|t| t.duration().ok()) else {
        return false;
    };
    let list = nm
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    conditions::find(list, types::DRAINED)
        .filter(|c| c.status == "False")
        .is_some_and(|c| nodemedic_kube::time::since(&c.last_transition_time.0, &Timestamp::now()) >= timeout)
}
