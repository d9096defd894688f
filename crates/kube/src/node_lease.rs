//! The node leases (`medik8s-leases/node-<name>`) through which the health check and node
//! maintenance keep off each other's nodes, with medik8s/common's exact rules.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Namespace,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference},
};
use kube::{
    Client,
    api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions},
};
use nodemedic_api::names::leases;

use crate::{CallContext, Error, Result};

/// What a lease looks like to the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    pub holder: Option<String>,
    pub duration: Duration,
    pub renewed: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    Create,
    /// Held by us and would expire within the requested time.
    Renew,
    /// Held by us for long enough already.
    Keep,
    /// Held by someone whose lease expired (or by no one).
    TakeOver,
    HeldBy(String),
}

impl LeaseView {
    fn valid_at(&self, now: Timestamp) -> bool {
        match self.renewed {
            Some(renewed) => renewed <= now && renewed + self.duration >= now,
            None => false,
        }
    }
}

/// medik8s/common `RequestLease`: renew our own lease only when it is about to expire; refuse a
/// valid lease of another holder; take over an expired one.
pub fn decide(existing: Option<&LeaseView>, me: &str, requested: Duration, now: Timestamp) -> LeaseDecision {
    let Some(lease) = existing else {
        return LeaseDecision::Create;
    };
    match lease.holder.as_deref() {
        Some(holder) if holder == me => match lease.renewed {
            Some(renewed) if renewed + lease.duration >= now + requested => LeaseDecision::Keep,
            _ => LeaseDecision::Renew,
        },
        Some(holder) if !holder.is_empty() && lease.valid_at(now) => LeaseDecision::HeldBy(holder.to_owned()),
        _ => LeaseDecision::TakeOver,
    }
}

/// What [`NodeLeases::request`] decides when asked to hold a lease for `duration`: our own lease
/// is renewed once less than half of that is left.
pub fn decide_request(existing: Option<&LeaseView>, me: &str, duration: Duration, now: Timestamp) -> LeaseDecision {
    decide(existing, me, duration / 2, now)
}

/// Who validly holds the lease at `now`, if anyone.
pub fn valid_holder(lease: Option<&LeaseView>, now: Timestamp) -> Option<&str> {
    lease
        .filter(|l| l.valid_at(now))
        .and_then(|l| l.holder.as_deref())
        .filter(|h| !h.is_empty())
}

pub fn view(lease: &Lease) -> LeaseView {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseView {
        holder: spec.holder_identity,
        duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
        renewed: spec.renew_time.map(|t| t.0),
    }
}

/// Node leases in the `medik8s-leases` namespace.
#[derive(Clone)]
pub struct NodeLeases {
    client: Client,
    api: Api<Lease>,
}

impl NodeLeases {
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::namespaced(client.clone(), leases::NAMESPACE),
            client,
        }
    }

    /// Creates the lease namespace when missing (medik8s does this at start).
    pub async fn ensure_namespace(&self) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let existing = api
            .get_opt(leases::NAMESPACE)
            .await
            .with_context(|| format!("reading namespace {}", leases::NAMESPACE))?;
        if existing.is_none() {
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(leases::NAMESPACE.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("creating namespace {}", leases::NAMESPACE)),
            }
        }
        Ok(())
    }

    pub async fn get(&self, node: &str) -> Result<Option<Lease>> {
        let name = leases::node_lease_name(node);
        self.api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading node lease {}/{name}", leases::NAMESPACE))
    }

    /// The valid holder of the node's lease right now.
    pub async fn holder(&self, node: &str) -> Result<Option<String>> {
        let lease = self.get(node).await?;
        Ok(valid_holder(lease.as_ref().map(view).as_ref(), Timestamp::now()).map(str::to_owned))
    }

    /// Takes the node's lease for `duration`, or extends ours once half of it has passed;
    /// `Error::LeaseHeld` when another holder has a valid lease.
    pub async fn request(&self, node: &str, node_uid: &str, holder: &str, duration: Duration) -> Result<()> {
        let name = leases::node_lease_name(node);
        let existing = self
            .api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading node lease {}/{name}", leases::NAMESPACE))?;
        let now = Timestamp::now();
        let decision = decide_request(existing.as_ref().map(view).as_ref(), holder, duration, now);
        match (decision, existing) {
            (LeaseDecision::Keep, _) => Ok(()),
            (LeaseDecision::HeldBy(other), _) => Err(Error::LeaseHeld {
                lease: name,
                holder: other,
            }),
            (LeaseDecision::Create, _) | (_, None) => {
                self.api
                    .create(
                        &PostParams::default(),
                        &new_lease(node, node_uid, holder, duration, now),
                    )
                    .await
                    .with_context(|| format!("creating node lease {}/{name}", leases::NAMESPACE))?;
                Ok(())
            }
            (LeaseDecision::Renew, Some(mut lease)) => {
                let old = lease.spec.take().unwrap_or_default();
                let transitions = old.lease_transitions.unwrap_or(0);
                lease.spec = Some(spec(holder, duration, now, transitions, old.acquire_time));
                self.api
                    .replace(&name, &PostParams::default(), &lease)
                    .await
                    .with_context(|| format!("renewing node lease {}/{name}", leases::NAMESPACE))?;
                Ok(())
            }
            (LeaseDecision::TakeOver, Some(mut lease)) => {
                let old = lease.spec.take().unwrap_or_default();
                let transitions = old.lease_transitions.unwrap_or(0) + 1;
                lease.spec = Some(spec(holder, duration, now, transitions, None));
                self.api
                    .replace(&name, &PostParams::default(), &lease)
                    .await
                    .with_context(|| format!("taking over node lease {}/{name}", leases::NAMESPACE))?;
                Ok(())
            }
        }
    }

    /// [`Self::request`] for a lease the caller has no record of: creates it straight away, one
    /// request instead of a read and a create (which counts when hundreds of nodes fail at
    /// once); when it exists after all, the creation fails without harm and the full request
    /// decides.
    pub async fn request_unseen(&self, node: &str, node_uid: &str, holder: &str, duration: Duration) -> Result<()> {
        let lease = new_lease(node, node_uid, holder, duration, Timestamp::now());
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => self.request(node, node_uid, holder, duration).await,
            Err(e) => Err(e).with_context(|| {
                format!(
                    "creating node lease {}/{}",
                    leases::NAMESPACE,
                    leases::node_lease_name(node)
                )
            }),
        }
    }

    /// Releases our lease (deletes it). Someone else's valid lease is left alone and reported.
    pub async fn invalidate(&self, node: &str, holder: &str) -> Result<()> {
        let name = leases::node_lease_name(node);
        let Some(lease) = self
            .api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading node lease {}/{name}", leases::NAMESPACE))?
        else {
            return Ok(());
        };
        let view = view(&lease);
        match view.holder.as_deref() {
            Some(h) if h != holder && view.valid_at(Timestamp::now()) => Err(Error::LeaseHeld {
                lease: name,
                holder: h.to_owned(),
            }),
            // Only the lease as read: one taken or renewed since is no longer ours to delete.
            _ => {
                let as_read = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: lease.metadata.uid.clone(),
                        resource_version: lease.metadata.resource_version.clone(),
                    }),
                    ..DeleteParams::default()
                };
                match self.api.delete(&name, &as_read).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::LeaseHeld {
                        lease: name,
                        holder: "someone who changed it since it was read".into(),
                    }),
                    Err(e) => Err(e).with_context(|| format!("deleting node lease {}/{name}", leases::NAMESPACE)),
                }
            }
        }
    }
}

/// The lease is garbage-collected with its node.
fn owner(node: &str, uid: &str) -> Option<OwnerReference> {
    (!uid.is_empty()).then(|| OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_owned(),
        uid: uid.to_owned(),
        ..Default::default()
    })
}

fn spec(holder: &str, duration: Duration, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.to_owned()),
        lease_duration_seconds: Some(duration.as_secs() as i32),
        acquire_time: acquired.or(Some(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

fn new_lease(node: &str, node_uid: &str, holder: &str, duration: Duration, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(leases::node_lease_name(node)),
            namespace: Some(leases::NAMESPACE.into()),
            owner_references: owner(node, node_uid).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(spec(holder, duration, now, 0, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("valid")
    }

    fn lease(holder: &str, renewed: i64, secs: u64) -> LeaseView {
        LeaseView {
            holder: Some(holder.into()),
            duration: Duration::from_secs(secs),
            renewed: Some(at(renewed)),
        }
    }

    #[test]
    fn follows_medik8s_request_rules() {
        let hour = Duration::from_secs(3600);
        assert_eq!(decide(None, "a", hour, at(1000)), LeaseDecision::Create);
        assert_eq!(
            decide(Some(&lease("a", 1000, 3600)), "a", hour, at(1000)),
            LeaseDecision::Keep
        );
        assert_eq!(
            decide(Some(&lease("a", 1000, 3600)), "a", hour, at(1001)),
            LeaseDecision::Renew
        );
        assert_eq!(
            decide(Some(&lease("b", 1000, 60)), "a", hour, at(1030)),
            LeaseDecision::HeldBy("b".into())
        );
        assert_eq!(
            decide(Some(&lease("b", 1000, 60)), "a", hour, at(1061)),
            LeaseDecision::TakeOver
        );
        // A renew time in the future is not trusted (clock skew): take over.
        assert_eq!(
            decide(Some(&lease("b", 2000, 60)), "a", hour, at(1000)),
            LeaseDecision::TakeOver
        );
    }

    #[test]
    fn a_request_keeps_our_lease_until_half_of_the_requested_time_is_left() {
        let requested = Duration::from_secs(600);
        let ours = lease("a", 1000, 600);
        assert_eq!(
            decide_request(Some(&ours), "a", requested, at(1300)),
            LeaseDecision::Keep
        );
        assert_eq!(
            decide_request(Some(&ours), "a", requested, at(1301)),
            LeaseDecision::Renew
        );
        assert_eq!(
            decide_request(Some(&ours), "b", requested, at(1300)),
            LeaseDecision::HeldBy("a".into())
        );
    }

    proptest! {
        #[test]
        fn never_takes_a_valid_lease_from_another_holder(renewed in 0i64..10_000, secs in 1u64..5000, now in 0i64..20_000) {
            let existing = lease("other", renewed, secs);
            let decision = decide(Some(&existing), "me", Duration::from_secs(60), at(now));
            if existing.valid_at(at(now)) {
                prop_assert_eq!(decision, LeaseDecision::HeldBy("other".into()));
            } else {
                prop_assert_eq!(decision, LeaseDecision::TakeOver);
            }
        }
    }
}
