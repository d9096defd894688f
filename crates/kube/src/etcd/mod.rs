//! Whether a control-plane node may be taken away (fenced, rebooted, drained) without costing
//! etcd its quorum, for maintenance and the health check alike. The members are what the cluster
//! shows of them: kubeadm runs each as a mirror pod `component=etcd` in kube-system; OpenShift
//! runs a guard pod per member (`app=guard` in openshift-etcd, behind the `etcd-guard-pdb`
//! budget) that is Ready while the member on its node is healthy. A pod's readiness stands for
//! its member's health. Members outside any pod (external etcd) are configured and asked
//! ([`external`]).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, api::ListParams};

use crate::{CallContext, Result};

pub mod external;

pub use external::External;

/// Where the cluster shows its etcd members: (namespace, label selector).
const MEMBER_PODS: [(&str, &str); 2] = [("kube-system", "component=etcd"), ("openshift-etcd", "app=guard")];

/// One etcd member as the cluster shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    /// Its pod is Ready.
    pub ready: bool,
    /// Its node is Ready: otherwise the node lifecycle controller has marked every pod there not
    /// ready, whatever its containers do, and the member may well still be running.
    pub node_ready: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The node runs no etcd member: nothing to check.
    NotAMember,
    Allowed {
        healthy_after: usize,
        members: usize,
    },
    Refused {
        healthy_after: usize,
        members: usize,
    },
}

/// Taking `node` away leaves `healthy_after` ready members on nodes not `busy` (in maintenance,
/// being remediated); etcd needs more than half of all its members. A node whose own member is
/// known to be down (its pod not ready on a Ready node) costs nothing more when it goes, as
/// medik8s reads OpenShift's guard pods; one on a node that is not Ready may still run, and
/// counts as running.
pub fn check(members: &[Member], busy: &BTreeSet<String>, node: &str) -> Verdict {
    let Some(own) = members.iter().find(|m| m.node == node) else {
        return Verdict::NotAMember;
    };
    let healthy_after = members
        .iter()
        .filter(|m| m.ready && m.node != node && !busy.contains(&m.node))
        .count();
    let total = members.len();
    let known_down = !own.ready && own.node_ready;
    if healthy_after > total / 2 || known_down {
        Verdict::Allowed {
            healthy_after,
            members: total,
        }
    } else {
        Verdict::Refused {
            healthy_after,
            members: total,
        }
    }
}

/// A pod's node and readiness, when it is placed.
fn shown_by(pod: &Pod) -> Option<(String, bool)> {
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some((node, ready))
}

/// Every etcd member the cluster shows (none on a cluster whose etcd runs outside it) and every
/// `external` one configured, with its node's readiness (one read per member's node: a handful).
pub async fn members(client: &Client, external: Option<&External>) -> Result<Vec<Member>> {
    let mut shown = Vec::new();
    for (namespace, selector) in MEMBER_PODS {
        let listed = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .with_context(|| format!("listing the etcd member pods ({selector}) in {namespace}"))?;
        shown.extend(listed.items.iter().filter_map(shown_by));
    }
    if let Some(external) = external {
        shown.extend(external.health().await);
    }
    let nodes = Api::<Node>::all(client.clone());
    let mut ready_nodes = BTreeSet::new();
    let names: BTreeSet<&String> = shown.iter().map(|(node, _)| node).collect();
    for name in names {
        let node = nodes
            .get_opt(name)
            .await
            .with_context(|| format!("reading node {name} of an etcd member"))?;
        let ready = node
            .and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            ready_nodes.insert(name.clone());
        }
    }
    Ok(shown
        .into_iter()
        .map(|(node, ready)| Member {
            node_ready: ready_nodes.contains(&node),
            node,
            ready,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn members(ready: &[bool]) -> Vec<Member> {
        ready
            .iter()
            .enumerate()
            .map(|(i, r)| Member {
                node: format!("cp-{i}"),
                ready: *r,
                node_ready: true,
            })
            .collect()
    }

    #[test]
    fn one_of_three_may_go_two_may_not() {
        let three = members(&[true, true, true]);
        let none = BTreeSet::new();
        assert!(matches!(
            check(&three, &none, "cp-0"),
            Verdict::Allowed { healthy_after: 2, .. }
        ));
        let one_in = BTreeSet::from(["cp-1".to_owned()]);
        assert!(matches!(
            check(&three, &one_in, "cp-0"),
            Verdict::Refused { healthy_after: 1, .. }
        ));
        assert_eq!(check(&three, &none, "worker"), Verdict::NotAMember);
        let one_down = members(&[true, false, true]);
        assert!(matches!(check(&one_down, &none, "cp-0"), Verdict::Refused { .. }));
        // A member known down costs nothing more when its node goes...
        assert!(matches!(check(&one_down, &none, "cp-1"), Verdict::Allowed { .. }));
        // ...but one on a node that is not Ready may still run.
        let mut unknown = one_down.clone();
        unknown[1].node_ready = false;
        unknown[2].ready = false;
        assert!(matches!(check(&unknown, &none, "cp-1"), Verdict::Refused { .. }));
    }

    proptest! {
        /// Whatever the members' states, taking an allowed node away leaves a majority ready, or
        /// takes away a member that was not ready anyway.
        #[test]
        fn allowed_keeps_a_majority(ready in proptest::collection::vec(any::<bool>(), 1..7), node_ready in proptest::collection::vec(any::<bool>(), 7), busy in proptest::collection::btree_set(0usize..7, 0..4), target in 0usize..7) {
            let mut all = members(&ready);
            for (m, r) in all.iter_mut().zip(&node_ready) {
                m.node_ready = *r;
                m.ready &= *r;
            }
            let busy: BTreeSet<String> = busy.into_iter().map(|i| format!("cp-{i}")).collect();
            if let Verdict::Allowed { healthy_after, members } = check(&all, &busy, &format!("cp-{target}")) {
                let known_down = all.get(target).is_some_and(|m| !m.ready && m.node_ready);
                prop_assert!(2 * healthy_after > members || known_down);
            }
        }
    }
}
