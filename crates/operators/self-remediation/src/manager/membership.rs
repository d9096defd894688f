//! Keeps the membership (who votes): bootstraps it on a fresh install, proposes a change when
//! agents register or their nodes go, commits a proposal once a majority of the committed
//! configuration acknowledged it, and removes the registrations of nodes that no longer exist.
//! The decisions are [`crate::protocol::membership::next_change`]; this only reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions},
};
use nodemedic_api::self_remediation::{SelfNodeRemediation, phases};
use nodemedic_kube::{
    CallContext,
    events::{Events, Note},
};

use super::Metrics;
use crate::{
    Result,
    protocol::{
        manager::Registration,
        membership::{self, Acknowledgement, Change, Membership},
    },
    registration,
};

/// What one read of the registrations and the membership gives.
pub(super) struct Read {
    pub leases: Vec<Lease>,
    pub registrations: Vec<Registration>,
    pub membership: Option<Membership>,
    /// The membership Lease's resourceVersion, for a conditional write.
    version: Option<String>,
}

pub(super) async fn read(client: &Client, namespace: &str) -> Result<Read> {
    let leases = registration::list(client, namespace).await?;
    let lease = leases
        .iter()
        .find(|l| l.metadata.name.as_deref() == Some(registration::MEMBERSHIP_LEASE));
    Ok(Read {
        registrations: leases.iter().filter_map(registration::registration).collect(),
        membership: lease.and_then(registration::membership),
        version: lease.and_then(|l| l.resource_version()),
        leases,
    })
}

/// Whether a remediation's safe time is running: a proposal now would make it start again.
async fn waits_running(client: &Client) -> Result<bool> {
    let list = Api::<SelfNodeRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing SelfNodeRemediations")?;
    Ok(list.items.iter().any(|r| {
        let status = r.status.as_ref();
        crate::remediation_object::is_intent(r)
            && status.and_then(|s| s.phase.as_deref()) == Some(phases::PRE_REBOOT_COMPLETED)
            && status.is_some_and(|s| s.wait_started_at.is_some())
    }))
}

/// Registrations whose node is gone, with their uids. An agent sets its Node as its
/// registration's owner, so the garbage collector removes it with the node; those without an
/// owner are checked here.
async fn orphaned(client: &Client, read: &Read) -> Result<BTreeMap<String, Option<String>>> {
    let nodes = Api::<Node>::all(client.clone());
    let mut gone = BTreeMap::new();
    for lease in &read.leases {
        let owned = lease.owner_references().iter().any(|o| o.kind == "Node");
        let Some(node) = registration::Published::from_lease(lease).map(|p| p.node) else {
            continue;
        };
        if !owned
            && nodes
                .get_opt(&node)
                .await
                .with_context(|| format!("reading node {node}"))?
                .is_none()
        {
            gone.insert(node, lease.uid());
        }
    }
    Ok(gone)
}

fn describe(members: &BTreeSet<String>) -> String {
    members.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// The membership after a reconcile.
pub(super) struct Outcome {
    pub current: Option<Membership>,
    pub registrations: Vec<Registration>,
    /// Agents acknowledged a membership the API no longer holds (see [`Change::Lost`]).
    pub lost: bool,
}

/// Makes the next membership change; returns the membership as it now stands, and the
/// registrations read.
pub(super) async fn reconcile(
    client: &Client,
    namespace: &str,
    events: &Events,
    metrics: &Metrics,
    on: &k8s_openapi::api::core::v1::ObjectReference,
) -> Result<Outcome> {
    let read = read(client, namespace).await?;
    let gone = orphaned(client, &read).await?;
    let leases = Api::<Lease>::namespaced(client.clone(), namespace);
    remove_registrations(&leases, &gone, events, on).await?;
    let desired: BTreeSet<String> = read
        .registrations
        .iter()
        .map(|r| r.node.clone())
        .filter(|n| !gone.contains_key(n))
        .collect();
    let acks: BTreeMap<String, Acknowledgement> = read
        .registrations
        .iter()
        .map(|r| (r.node.clone(), r.acknowledgement()))
        .collect();
    let held = read
        .membership
        .as_ref()
        .is_some_and(|m| m.proposed.is_none() && m.committed.members != desired)
        && waits_running(client).await?;
    let change = membership::next_change(read.membership.as_ref(), &desired, &acks, held);
    let next = membership::apply(read.membership.as_ref(), &change);
    if let Some(next) = &next {
        write(&leases, next, read.version.clone()).await?;
    }
    let (counted, note) = said(&change, read.membership.as_ref(), next.as_ref(), namespace);
    if let Some(counted) = counted {
        metrics.membership_change(counted);
    }
    if let Some(note) = note {
        events.record(on, &note).await;
    }
    let current = next.or(read.membership);
    if let Some(m) = &current {
        metrics
            .membership_epoch
            .set(i64::try_from(m.committed.epoch).unwrap_or(i64::MAX));
        metrics.members.set(m.committed.members.len() as i64);
        metrics.proposal_pending.set(i64::from(m.proposed.is_some()));
    }
    let registrations = read
        .registrations
        .into_iter()
        .filter(|r| !gone.contains_key(&r.node))
        .collect();
    Ok(Outcome {
        current,
        registrations,
        lost: matches!(change, Change::Lost { .. }),
    })
}

/// Deletes the registrations of gone nodes, each only as read: one the agent made again since is
/// left for the next pass.
async fn remove_registrations(
    leases: &Api<Lease>,
    gone: &BTreeMap<String, Option<String>>,
    events: &Events,
    on: &k8s_openapi::api::core::v1::ObjectReference,
) -> Result<()> {
    for (node, uid) in gone {
        let precondition = DeleteParams {
            preconditions: Some(Preconditions {
                uid: uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let name = registration::lease_name(node);
        match leases.delete(&name, &precondition).await {
            Ok(_) => {
                events
                    .normal(
                        on,
                        "RegistrationRemoved",
                        format!("node {node} no longer exists: removed its agent's registration"),
                    )
                    .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(error) => {
                let call = format!("deleting the registration Lease {name} of a gone node");
                return Err(nodemedic_kube::Error::call(call, error).into());
            }
        }
    }
    Ok(())
}

/// What a membership change says: the change it counts, and its event.
fn said(
    change: &Change,
    before: Option<&Membership>,
    next: Option<&Membership>,
    namespace: &str,
) -> (Option<&'static str>, Option<Note>) {
    match change {
        Change::Bootstrap(first) => (
            Some("bootstrapped"),
            Some(Note::normal(
                "MembershipBootstrapped",
                format!("membership epoch {} with {}", first.epoch, describe(&first.members)),
            )),
        ),
        Change::Propose(proposed) => {
            let committed = before.map(|m| m.committed.members.clone()).unwrap_or_default();
            let joining: BTreeSet<String> = proposed.members.difference(&committed).cloned().collect();
            let leaving: BTreeSet<String> = committed.difference(&proposed.members).cloned().collect();
            (
                Some("proposed"),
                Some(Note::normal(
                    "MembershipProposed",
                    format!(
                        "proposed membership epoch {} (joining: [{}], leaving: [{}]); it takes effect once a majority of [{}] acknowledge it",
                        proposed.epoch,
                        describe(&joining),
                        describe(&leaving),
                        describe(&committed)
                    ),
                )),
            )
        }
        Change::Commit => (
            Some("committed"),
            next.map(|m| {
                Note::normal(
                    "MembershipCommitted",
                    format!(
                        "membership epoch {} committed: {}",
                        m.committed.epoch,
                        describe(&m.committed.members)
                    ),
                )
            }),
        ),
        Change::Lost { highest_acknowledged } => (
            None,
            Some(Note::warning(
                "MembershipLost",
                format!(
                    "the membership Lease {} is gone while agents acknowledged epoch {highest_acknowledged}: nodemedic starts no new membership an old one could outvote, so self remediation waits and the agent DaemonSet is not re-created; to reset: delete the DaemonSet nodemedic-agent, wait until no agent runs on any node (power off nodes you cannot reach), then delete every nodemedic-agent-* Lease in {namespace}",
                    registration::MEMBERSHIP_LEASE
                ),
            )),
        ),
        Change::Keep => (None, None),
    }
}

async fn write(leases: &Api<Lease>, membership: &Membership, version: Option<String>) -> Result<()> {
    let (labels, annotations) = registration::membership_metadata(membership);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(registration::MEMBERSHIP_LEASE.into()),
            labels: Some(labels),
            annotations: Some(annotations),
            resource_version: version.clone(),
            ..Default::default()
        },
        spec: None,
    };
    // Conditional on what was read: two managers (a deposed leader) cannot both change it.
    match version {
        None => leases
            .create(&PostParams::default(), &lease)
            .await
            .with_context(|| format!("creating the membership Lease {}", registration::MEMBERSHIP_LEASE))?,
        Some(_) => leases
            .replace(registration::MEMBERSHIP_LEASE, &PostParams::default(), &lease)
            .await
            .with_context(|| format!("replacing the membership Lease {}", registration::MEMBERSHIP_LEASE))?,
    };
    Ok(())
}
