//! API requests nodemedic made, counted from the API server's audit log (one JSON line per
//! request: the lab logs only nodemedic's users, at the stage a request completes, or starts for a
//! watch). Pure: the caller reads the file.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    verb: String,
    #[serde(default)]
    stage: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    request_received_timestamp: Timestamp,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
}

/// Requests by kind in one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Requests {
    /// Every request by verb (`list`, `watch`, `patch`, ...).
    pub by_verb: BTreeMap<String, u64>,
    /// Every request by `verb resource` (`list selfnoderemediations`, `update leases`,
    /// `patch nodes/status`: a subresource after a slash).
    pub by_verb_and_resource: BTreeMap<String, u64>,
    /// Leases read or written one by one (leader election, renewals); a list of leases is not
    /// renewal and counts as other.
    pub lease: u64,
    /// Everything but watches and lease traffic: what "no requests at rest" is about.
    pub other: u64,
    /// Those, by `verb resource`.
    pub other_by_kind: BTreeMap<String, u64>,
    /// Of those, the health check's outage probes: one kubelet lease read (a list of one) after
    /// 5 s in which no watch said anything. A fleet whose renewals come in bursts (kwok's, at a
    /// few hundred nodes) is silent between them; one whose renewals never pause is never asked.
    pub probes: u64,
    /// Of those, discovery reads: a GET of /api or /apis (a group, a version) that names no
    /// object, asking which kinds the API serves. A controller that asks again and again polls.
    pub discovery: u64,
}

impl Requests {
    pub fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }
}

/// Counts `user`'s requests received in `[from, to)` from audit log lines. A watch is logged when
/// it starts and again when it ends; only its start counts.
pub fn count(lines: &str, user: &str, from: Timestamp, to: Timestamp) -> Requests {
    let mut out = Requests::default();
    for event in lines.lines().filter_map(|l| serde_json::from_str::<AuditEvent>(l).ok()) {
        let received = event.request_received_timestamp;
        if event.user.username != user || received < from || received >= to {
            continue;
        }
        if event.verb == "watch" && event.stage != "ResponseStarted" {
            continue;
        }
        *out.by_verb.entry(event.verb.clone()).or_default() += 1;
        let (resource, subresource, namespace) = event
            .object_ref
            .map(|o| (o.resource, o.subresource, o.namespace))
            .unwrap_or_default();
        let full_resource = if subresource.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{subresource}")
        };
        *out.by_verb_and_resource
            .entry(format!("{} {full_resource}", event.verb))
            .or_default() += 1;
        if resource == "leases" && event.verb != "list" {
            out.lease += 1;
        } else if event.verb != "watch" {
            out.other += 1;
            if event.verb == "list" && resource == "leases" && namespace == "kube-node-lease" && one(&event.request_uri)
            {
                out.probes += 1;
            }
            if event.verb == "get" && resource.is_empty() && discovery(&event.request_uri) {
                out.discovery += 1;
            }
            *out.other_by_kind
                .entry(format!("{} {resource}", event.verb))
                .or_default() += 1;
        }
    }
    out
}

/// Whether a request's path is the API's discovery (`/api`, `/apis`, `/apis/apps/v1`, ...).
fn discovery(uri: &str) -> bool {
    let path = uri.split_once('?').map_or(uri, |(path, _)| path);
    ["/api", "/apis"].iter().any(|root| {
        path.strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// Whether a request asks for one object at most (`limit=1`).
fn one(uri: &str) -> bool {
    uri.split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|p| p == "limit=1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(user: &str, verb: &str, stage: &str, resource: &str, second: i64) -> String {
        let at = Timestamp::from_second(second).expect("time");
        serde_json::json!({
            "kind": "Event", "level": "Metadata", "auditID": "x", "stage": stage, "verb": verb,
            "requestURI": "/", "user": {"username": user, "groups": []},
            "objectRef": {"resource": resource}, "requestReceivedTimestamp": at.to_string(),
            "stageTimestamp": at.to_string()
        })
        .to_string()
    }

    #[test]
    fn a_read_of_one_kubelet_lease_is_an_outage_probe() {
        let me = "system:serviceaccount:ns:controller";
        let at = Timestamp::from_second(10).expect("time");
        let list = |namespace: &str, query: &str| {
            serde_json::json!({
                "stage": "ResponseComplete", "verb": "list",
                "requestURI": format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases?{query}"),
                "user": {"username": me}, "objectRef": {"resource": "leases", "namespace": namespace},
                "requestReceivedTimestamp": at.to_string()
            })
            .to_string()
        };
        let log = [
            list("kube-node-lease", "&limit=1"),
            list("kube-node-lease", "&limit=200"),
            list("workload-availability", "&limit=1"),
        ]
        .join("\n");
        let r = count(&log, me, at, Timestamp::from_second(11).expect("time"));
        assert_eq!((r.other, r.probes), (3, 1));
    }

    #[test]
    fn a_get_of_the_apis_paths_is_discovery() {
        let me = "system:serviceaccount:ns:controller";
        let at = Timestamp::from_second(10).expect("time");
        let get = |uri: &str, object: serde_json::Value| {
            serde_json::json!({
                "stage": "ResponseComplete", "verb": "get", "requestURI": uri,
                "user": {"username": me}, "objectRef": object,
                "requestReceivedTimestamp": at.to_string()
            })
            .to_string()
        };
        let log = [
            get("/apis", serde_json::Value::Null),
            get("/api?timeout=32s", serde_json::Value::Null),
            get("/apis/cluster.x-k8s.io/v1beta1", serde_json::Value::Null),
            get(
                "/apis/apps/v1/namespaces/a/deployments/b",
                serde_json::json!({"resource": "deployments"}),
            ),
            get("/apiserver-health", serde_json::Value::Null),
        ]
        .join("\n");
        let r = count(&log, me, at, Timestamp::from_second(11).expect("time"));
        assert_eq!((r.other, r.discovery), (5, 3));
    }

    #[test]
    fn counts_only_the_user_in_the_window_and_each_watch_once() {
        let me = "system:serviceaccount:ns:controller";
        let log = [
            line(me, "watch", "ResponseStarted", "nodes", 10),
            line(me, "watch", "ResponseComplete", "nodes", 10),
            line(me, "update", "ResponseComplete", "leases", 11),
            line(me, "get", "ResponseComplete", "leases", 12),
            line(me, "patch", "ResponseComplete", "nodes", 13),
            line("someone-else", "patch", "ResponseComplete", "nodes", 13),
            line(me, "list", "ResponseComplete", "leases", 14),
            line(me, "list", "ResponseComplete", "pods", 30),
            "not json".to_owned(),
        ]
        .join("\n");
        let from = Timestamp::from_second(10).expect("time");
        let to = Timestamp::from_second(20).expect("time");
        let r = count(&log, me, from, to);
        assert_eq!(r.by_verb.get("watch"), Some(&1));
        assert_eq!(r.by_verb.get("update"), Some(&1));
        assert_eq!(r.lease, 2);
        assert_eq!(
            r.other, 2,
            "the patch and the lease list; the pod list is outside the window"
        );
        assert_eq!(r.other_by_kind.get("patch nodes"), Some(&1));
        assert_eq!(r.other_by_kind.get("list leases"), Some(&1));
        assert_eq!(r.by_verb_and_resource.get("watch nodes"), Some(&1));
        assert_eq!(r.by_verb_and_resource.get("update leases"), Some(&1));
        assert_eq!(r.by_verb_and_resource.values().sum::<u64>(), r.total());
        assert_eq!(r.total(), 5);
    }

    #[test]
    fn a_subresource_follows_its_resource() {
        let me = "system:node:node-1";
        let mut event: serde_json::Value =
            serde_json::from_str(&line(me, "patch", "ResponseComplete", "nodes", 10)).expect("json");
        event["objectRef"]["subresource"] = "status".into();
        let from = Timestamp::from_second(0).expect("time");
        let to = Timestamp::from_second(20).expect("time");
        let r = count(&event.to_string(), me, from, to);
        assert_eq!(r.by_verb_and_resource.get("patch nodes/status"), Some(&1));
        assert_eq!(r.other_by_kind.get("patch nodes"), Some(&1));
    }
}
