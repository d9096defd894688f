//! Which node a new Machine gets: the lab's hosts, as an infrastructure provider's pool of
//! servers. A plain decision over names, so both machine controllers (Cluster API's
//! infrastructure and OpenShift's) place Machines by one rule.

use std::collections::BTreeSet;

use crate::nodes::PROVIDER_ID_SCHEME;

/// Where a Machine's node comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// A lab node no Machine holds yet (the lab's first nodes are the pool's hosts).
    Adopt(String),
    /// A new node, named `node-<n>` after the highest number the lab ever gave a node: a cloud
    /// names a new instance afresh, so a deleted node's name never comes back as another host's.
    Add(String),
    /// The host asked for cannot be had (why).
    Unavailable(String),
}

/// The host asked for (as Metal3 selects a bare-metal host), else the first node (by name) that
/// no Machine holds, else a new one.
pub(super) fn place(
    nodes: &BTreeSet<String>,
    held: &BTreeSet<String>,
    ever_named: &BTreeSet<String>,
    wanted: Option<&str>,
) -> Placement {
    if let Some(host) = wanted {
        return if held.contains(host) {
            Placement::Unavailable(format!("host {host} is another Machine's"))
        } else if nodes.contains(host) {
            Placement::Adopt(host.to_owned())
        } else {
            Placement::Unavailable(format!("the lab has no node {host}"))
        };
    }
    if let Some(free) = nodes.iter().find(|n| !held.contains(*n)) {
        return Placement::Adopt(free.clone());
    }
    let highest = ever_named
        .iter()
        .chain(nodes)
        .filter_map(|n| n.strip_prefix("node-")?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    Placement::Add(format!("node-{}", highest + 1))
}

/// The lab node a providerID names, if it is one of the lab's.
pub(super) fn node_of(provider_id: &str) -> Option<&str> {
    provider_id.strip_prefix(PROVIDER_ID_SCHEME).filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn free_nodes_are_adopted_in_order_then_new_ones_are_added() {
        let nodes = set(&["node-1", "node-2", "node-3"]);
        assert_eq!(
            place(&nodes, &set(&["node-1"]), &nodes, None),
            Placement::Adopt("node-2".into())
        );
        assert_eq!(place(&nodes, &nodes, &nodes, None), Placement::Add("node-4".into()));
        let ever = set(&["node-1", "node-2", "node-3", "node-4"]);
        assert_eq!(
            place(&set(&["node-1", "node-2"]), &set(&["node-1", "node-2"]), &ever, None),
            Placement::Add("node-5".into()),
            "node-4 was removed: its name does not come back"
        );
    }

    #[test]
    fn a_host_asked_for_is_adopted_only_when_free() {
        let nodes = set(&["node-1", "node-2"]);
        let held = set(&["node-1"]);
        assert_eq!(
            place(&nodes, &held, &nodes, Some("node-2")),
            Placement::Adopt("node-2".into())
        );
        assert!(matches!(
            place(&nodes, &held, &nodes, Some("node-1")),
            Placement::Unavailable(_)
        ));
        assert!(matches!(
            place(&nodes, &held, &nodes, Some("node-9")),
            Placement::Unavailable(_)
        ));
    }

    #[test]
    fn provider_ids_name_lab_nodes_only() {
        assert_eq!(node_of("lab://node-2"), Some("node-2"));
        assert_eq!(node_of("lab://"), None);
        assert_eq!(node_of("aws:///us-east-1a/i-0"), None);
    }

    proptest! {
        #[test]
        fn a_placement_never_hands_out_a_held_node_or_reuses_a_name(
            nodes in proptest::collection::btree_set("node-[1-9]", 0..6),
            held_mask in proptest::collection::vec(any::<bool>(), 6),
            gone in proptest::collection::btree_set("node-[1-9]", 0..4),
        ) {
            let held: BTreeSet<String> = nodes.iter().zip(held_mask).filter(|(_, h)| *h).map(|(n, _)| n.clone()).collect();
            let ever: BTreeSet<String> = nodes.union(&gone).cloned().collect();
            match place(&nodes, &held, &ever, None) {
                Placement::Adopt(node) => {
                    prop_assert!(nodes.contains(&node));
                    prop_assert!(!held.contains(&node));
                }
                Placement::Add(node) => {
                    prop_assert!(!ever.contains(&node));
                    prop_assert!(nodes.iter().all(|n| held.contains(n)));
                }
                Placement::Unavailable(why) => prop_assert!(false, "nothing asked for, yet {}", why),
            }
        }
    }
}
