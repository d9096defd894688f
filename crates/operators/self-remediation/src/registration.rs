//! An agent's registration: a Lease `nodemedic-agent-<node>` in nodemedic's namespace, carrying
//! what peers and the manager need (address, fencing means, watchdog, identity), the remediations
//! the agent has accepted and the membership epoch it acknowledged. The membership itself (who
//! votes) is one more Lease, `nodemedic-membership`, written by the manager alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::OwnerReference};
use nodemedic_kube::CallContext;

use crate::protocol::{
    manager::{Means, Registration},
    membership::Membership,
};

pub(crate) const PREFIX: &str = "nodemedic-agent-";
pub(crate) const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub(crate) const COMPONENT: &str = "nodemedic-agent";
pub(crate) const NODE_LABEL: &str = "nodemedic.medik8s.io/node";
/// The membership Lease and its component label value.
pub(crate) const MEMBERSHIP_LEASE: &str = "nodemedic-membership";
pub(crate) const MEMBERSHIP_COMPONENT: &str = "nodemedic-membership";
const MEMBERSHIP: &str = "nodemedic.medik8s.io/membership";

/// Selects the registrations.
pub fn registrations_selector() -> String {
    format!("{COMPONENT_LABEL}={COMPONENT}")
}

/// Selects the registrations and the membership: one list reads both.
pub(crate) fn registrations_and_membership_selector() -> String {
    format!("{COMPONENT_LABEL} in ({COMPONENT},{MEMBERSHIP_COMPONENT})")
}

/// The registration Leases and the membership Lease, in one list.
pub async fn list(client: &kube::Client, namespace: &str) -> nodemedic_kube::Result<Vec<Lease>> {
    let selector = kube::api::ListParams::default().labels(&registrations_and_membership_selector());
    Ok(kube::Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&selector)
        .await
        .with_context(|| format!("listing the registration and membership Leases in {namespace}"))?
        .items)
}

const ADDRESS: &str = "nodemedic.medik8s.io/address";
const WATCHDOG_MS: &str = "nodemedic.medik8s.io/watchdog-timeout-ms";
const SOFTWARE_REBOOT: &str = "nodemedic.medik8s.io/software-reboot";
const CERTIFICATE: &str = "nodemedic.medik8s.io/certificate-sha256";
const BOOT_TIME: &str = "nodemedic.medik8s.io/boot-time";
const ACCEPTS: &str = "nodemedic.medik8s.io/accepts";
const LICENCE_MS: &str = "nodemedic.medik8s.io/licence-ms";
const MEANS: &str = "nodemedic.medik8s.io/fencing-means";
const EPOCH: &str = "nodemedic.medik8s.io/membership-epoch";
/// Why the agent fences by less than the configured device (each means it passed over).
const FENCING_NOTE: &str = "nodemedic.medik8s.io/fencing-note";
pub(crate) const DISARMED: &str = "nodemedic.medik8s.io/disarmed";
/// Which agent process wrote the registration last (random per process).
pub(crate) const INCARNATION: &str = "nodemedic.medik8s.io/incarnation";

pub fn lease_name(node: &str) -> String {
    format!("{PREFIX}{node}")
}

/// Everything an agent publishes about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub node: String,
    pub address: String,
    pub means: Means,
    /// The watchdog timeout programmed and read back (zero without a device).
    pub watchdog: Duration,
    /// `L` as this agent computes it from its own settings.
    pub licence: Duration,
    pub software_reboot: bool,
    pub certificate_sha256: String,
    pub boot_time: Option<Timestamp>,
    /// `(node, remediation uid)`.
    pub accepts: BTreeSet<(String, String)>,
    /// The newest membership epoch adopted from the API (its acknowledgement).
    pub epoch: u64,
    /// Set on a deliberate shutdown, before the watchdog's magic close.
    pub disarmed: bool,
    /// The agent process that wrote it.
    pub incarnation: String,
    /// The Node's uid: the registration's owner, so it goes with the node.
    pub node_uid: Option<String>,
    /// Why each better means of fencing was passed over (empty: the configured device is used).
    pub fencing_note: String,
}

impl Published {
    /// The Node as the registration's owner (not blocking its deletion).
    pub fn owner_references(&self) -> Option<Vec<OwnerReference>> {
        self.node_uid.as_ref().map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node.clone(),
                uid: uid.clone(),
                ..Default::default()
            }]
        })
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (COMPONENT_LABEL.to_owned(), COMPONENT.to_owned()),
            (NODE_LABEL.to_owned(), self.node.clone()),
        ])
    }

    pub fn annotations(&self) -> BTreeMap<String, String> {
        let accepts: Vec<String> = self.accepts.iter().map(|(n, u)| format!("{n}@{u}")).collect();
        BTreeMap::from([
            (ADDRESS.to_owned(), self.address.clone()),
            (MEANS.to_owned(), self.means.as_str().to_owned()),
            (EPOCH.to_owned(), self.epoch.to_string()),
            (WATCHDOG_MS.to_owned(), self.watchdog.as_millis().to_string()),
            (LICENCE_MS.to_owned(), self.licence.as_millis().to_string()),
            (SOFTWARE_REBOOT.to_owned(), self.software_reboot.to_string()),
            (CERTIFICATE.to_owned(), self.certificate_sha256.clone()),
            (
                BOOT_TIME.to_owned(),
                self.boot_time.map(|t| t.to_string()).unwrap_or_default(),
            ),
            (ACCEPTS.to_owned(), accepts.join(",")),
            (DISARMED.to_owned(), self.disarmed.to_string()),
            (INCARNATION.to_owned(), self.incarnation.clone()),
            (FENCING_NOTE.to_owned(), self.fencing_note.clone()),
        ])
    }

    pub fn from_lease(lease: &Lease) -> Option<Self> {
        let node = lease.metadata.name.as_deref()?.strip_prefix(PREFIX)?.to_owned();
        let a = lease.metadata.annotations.clone().unwrap_or_default();
        let get = |k: &str| a.get(k).cloned().unwrap_or_default();
        Some(Self {
            node,
            address: get(ADDRESS),
            means: Means::parse(&get(MEANS)).unwrap_or_default(),
            watchdog: Duration::from_millis(get(WATCHDOG_MS).parse().unwrap_or(0)),
            licence: Duration::from_millis(get(LICENCE_MS).parse().unwrap_or(0)),
            software_reboot: get(SOFTWARE_REBOOT) == "true",
            certificate_sha256: get(CERTIFICATE),
            boot_time: get(BOOT_TIME).parse().ok(),
            accepts: get(ACCEPTS)
                .split(',')
                .filter_map(|pair| pair.split_once('@'))
                .map(|(n, u)| (n.to_owned(), u.to_owned()))
                .collect(),
            epoch: get(EPOCH).parse().unwrap_or(0),
            disarmed: get(DISARMED) == "true",
            incarnation: get(INCARNATION),
            fencing_note: get(FENCING_NOTE),
            node_uid: lease
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "Node")
                .map(|o| o.uid.clone()),
        })
    }
}

/// The protocol's view of a registration Lease.
pub fn registration(lease: &Lease) -> Option<Registration> {
    let published = Published::from_lease(lease)?;
    Some(Registration {
        node: published.node,
        means: published.means,
        watchdog: published.watchdog,
        licence: published.licence,
        accepts: published.accepts,
        acknowledged: published.epoch,
        disarmed: published.disarmed,
    })
}

/// The membership a Lease holds, if it is the membership Lease and says one.
pub fn membership(lease: &Lease) -> Option<Membership> {
    if lease.metadata.name.as_deref() != Some(MEMBERSHIP_LEASE) {
        return None;
    }
    let text = lease.metadata.annotations.as_ref()?.get(MEMBERSHIP)?;
    serde_json::from_str(text).ok()
}

/// The membership Lease's labels and annotations for `membership`.
pub(crate) fn membership_metadata(membership: &Membership) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let labels = BTreeMap::from([(COMPONENT_LABEL.to_owned(), MEMBERSHIP_COMPONENT.to_owned())]);
    let text = serde_json::to_string(membership).unwrap_or_default();
    (labels, BTreeMap::from([(MEMBERSHIP.to_owned(), text)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_facts_survive_the_lease() {
        let published = Published {
            node: "node-1".into(),
            address: "10.0.0.1:30001".into(),
            means: Means::Softdog,
            watchdog: Duration::from_secs(5),
            licence: Duration::from_secs(3),
            software_reboot: true,
            certificate_sha256: "ab".into(),
            boot_time: Some("2026-01-01T00:00:00Z".parse().expect("time")),
            accepts: [("node-2".to_owned(), "u-2".to_owned())].into(),
            epoch: 7,
            disarmed: true,
            incarnation: "f00d".into(),
            node_uid: Some("uid-1".into()),
            fencing_note: "/dev/watchdog: no such device".into(),
        };
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(lease_name("node-1")),
                annotations: Some(published.annotations()),
                owner_references: published.owner_references(),
                ..Default::default()
            },
            spec: None,
        };
        assert_eq!(Published::from_lease(&lease), Some(published));
        assert_eq!(membership(&lease), None, "a registration is no membership");
    }

    #[test]
    fn the_membership_survives_its_lease() {
        let m = Membership {
            committed: crate::protocol::membership::Configuration::new(3, ["a", "b"]),
            proposed: Some(crate::protocol::membership::Configuration::new(4, ["a", "b", "c"])),
        };
        let (labels, annotations) = membership_metadata(&m);
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(MEMBERSHIP_LEASE.into()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: None,
        };
        assert_eq!(membership(&lease), Some(m));
        assert_eq!(Published::from_lease(&lease), None, "the membership is no registration");
    }
}
