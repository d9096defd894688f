//! An agent's registration: a Lease `nodemedic-agent-<node>` in nodemedic's namespace. The set of
//! registrations is the membership the licence protocol counts; each also carries what peers and
//! the manager need (address, watchdog, identity) and the remediations the agent has accepted.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

use crate::protocol::manager::Registration;

pub const PREFIX: &str = "nodemedic-agent-";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const COMPONENT: &str = "nodemedic-agent";
pub const NODE_LABEL: &str = "nodemedic.medik8s.io/node";

const ADDRESS: &str = "nodemedic.medik8s.io/address";
const WATCHDOG_MS: &str = "nodemedic.medik8s.io/watchdog-timeout-ms";
const SOFTWARE_REBOOT: &str = "nodemedic.medik8s.io/software-reboot";
const CERTIFICATE: &str = "nodemedic.medik8s.io/certificate-sha256";
const BOOT_TIME: &str = "nodemedic.medik8s.io/boot-time";
const ACCEPTS: &str = "nodemedic.medik8s.io/accepts";
const LICENCE_MS: &str = "nodemedic.medik8s.io/licence-ms";
pub const DISARMED: &str = "nodemedic.medik8s.io/disarmed";

pub fn lease_name(node: &str) -> String {
    format!("{PREFIX}{node}")
}

/// Everything an agent publishes about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub node: String,
    pub address: String,
    pub watchdog: Duration,
    /// `L` as this agent computes it from its own settings.
    pub licence: Duration,
    pub software_reboot: bool,
    pub certificate_sha256: String,
    pub boot_time: Option<Timestamp>,
    /// `(node, remediation uid)`.
    pub accepts: BTreeSet<(String, String)>,
    /// Set on a deliberate shutdown, before the watchdog's magic close.
    pub disarmed: bool,
}

impl Published {
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
        ])
    }

    pub fn from_lease(lease: &Lease) -> Option<Self> {
        let node = lease.metadata.name.as_deref()?.strip_prefix(PREFIX)?.to_owned();
        let a = lease.metadata.annotations.clone().unwrap_or_default();
        let get = |k: &str| a.get(k).cloned().unwrap_or_default();
        Some(Self {
            node,
            address: get(ADDRESS),
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
            disarmed: get(DISARMED) == "true",
        })
    }
}

/// The protocol's view of a registration Lease.
pub fn registration(lease: &Lease) -> Option<Registration> {
    let published = Published::from_lease(lease)?;
    Some(Registration {
        node: published.node,
        registered: lease
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH),
        watchdog: published.watchdog,
        licence: published.licence,
        software_reboot: published.software_reboot,
        accepts: published.accepts,
        disarmed: published.disarmed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_facts_survive_the_lease() {
        let published = Published {
            node: "node-1".into(),
            address: "10.0.0.1:30001".into(),
            watchdog: Duration::from_secs(5),
            licence: Duration::from_secs(3),
            software_reboot: true,
            certificate_sha256: "ab".into(),
            boot_time: Some("2026-01-01T00:00:00Z".parse().expect("time")),
            accepts: [("node-2".to_owned(), "u-2".to_owned())].into(),
            disarmed: true,
        };
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(lease_name("node-1")),
                annotations: Some(published.annotations()),
                ..Default::default()
            },
            spec: None,
        };
        assert_eq!(Published::from_lease(&lease), Some(published));
    }
}
