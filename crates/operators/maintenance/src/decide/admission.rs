//! Whether the API server admits a NodeMaintenance, as medik8s's validating webhook decides: a
//! new one must name a node that exists and that no other NodeMaintenance already holds, and
//! its node cannot change later. CEL cannot see other objects or Nodes; the webhook can.

use nodemedic_kube::admission::Verdict;

/// A NodeMaintenance as admission sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Maintenance {
    pub name: String,
    pub node: String,
    /// Being deleted: it is giving its node back.
    pub deleting: bool,
}

/// A NodeMaintenance being created, given the others and whether its node exists.
pub(crate) fn on_create(new: &Maintenance, others: &[Maintenance], node_exists: bool) -> Verdict {
    let node = &new.node;
    if let Some(holder) = others.iter().find(|o| o.node == *node && o.name != new.name) {
        let holder_name = &holder.name;
        return Verdict::Denied(if holder.deleting {
            format!(
                "node {node} is still in maintenance by NodeMaintenance {holder_name}, which is being deleted (the node is being given back): wait until it is gone, then create this one again"
            )
        } else {
            format!(
                "node {node} is already in maintenance by NodeMaintenance {holder_name}: a node has at most one; keep that one (kubectl get nodemaintenance {holder_name}), or delete it first and then create this one"
            )
        });
    }
    if !node_exists {
        return Verdict::Denied(format!(
            "node {node} does not exist: spec.nodeName must name a Node of this cluster (kubectl get nodes lists them)"
        ));
    }
    Verdict::Allowed
}

/// A NodeMaintenance being changed. Only its node is checked: a missing node or a second
/// NodeMaintenance must never keep one from being updated, or its finalizer could not be
/// removed and it could not be deleted.
pub(crate) fn on_update(old: &Maintenance, new: &Maintenance) -> Verdict {
    if old.node == new.node || old.deleting {
        return Verdict::Allowed;
    }
    Verdict::Denied(format!(
        "spec.nodeName cannot change (from {} to {}): delete NodeMaintenance {} and create one for node {}",
        old.node, new.node, old.name, new.node
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nm(name: &str, node: &str) -> Maintenance {
        Maintenance {
            name: name.into(),
            node: node.into(),
            deleting: false,
        }
    }

    fn denial(verdict: Verdict) -> String {
        match verdict {
            Verdict::Denied(message) => message,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn a_first_maintenance_of_an_existing_node_is_admitted() {
        assert_eq!(on_create(&nm("a", "w1"), &[nm("b", "w2")], true), Verdict::Allowed);
    }

    #[test]
    fn a_second_maintenance_of_a_node_is_denied_naming_the_first() {
        let message = denial(on_create(&nm("b", "w1"), &[nm("a", "w1")], true));
        assert!(
            message.contains("node w1 is already in maintenance by NodeMaintenance a"),
            "{message}"
        );
        assert!(message.contains("delete it first"), "{message}");
        let deleting = Maintenance {
            deleting: true,
            ..nm("a", "w1")
        };
        let message = denial(on_create(&nm("b", "w1"), &[deleting], true));
        assert!(
            message.contains("being deleted") && message.contains("wait until it is gone"),
            "{message}"
        );
    }

    #[test]
    fn a_maintenance_of_a_missing_node_is_denied() {
        let message = denial(on_create(&nm("a", "w9"), &[], false));
        assert!(message.contains("node w9 does not exist"), "{message}");
        assert!(message.contains("kubectl get nodes"), "{message}");
    }

    #[test]
    fn the_node_cannot_change_but_anything_else_can() {
        assert_eq!(on_update(&nm("a", "w1"), &nm("a", "w1")), Verdict::Allowed);
        let message = denial(on_update(&nm("a", "w1"), &nm("a", "w2")));
        assert!(
            message.contains("from w1 to w2") && message.contains("delete NodeMaintenance a"),
            "{message}"
        );
    }

    fn maintenance() -> impl Strategy<Value = Maintenance> {
        ("[a-d]", "w[1-3]", any::<bool>()).prop_map(|(name, node, deleting)| Maintenance { name, node, deleting })
    }

    proptest! {
        /// Admitted exactly when the node exists and no other NodeMaintenance holds it; a denial
        /// always names the node.
        #[test]
        fn create_admits_one_per_existing_node(new in maintenance(), others in proptest::collection::vec(maintenance(), 0..5), exists in any::<bool>()) {
            let taken = others.iter().any(|o| o.node == new.node && o.name != new.name);
            match on_create(&new, &others, exists) {
                Verdict::Allowed => prop_assert!(exists && !taken),
                Verdict::Denied(message) => {
                    prop_assert!(!exists || taken);
                    let named = format!("node {}", new.node);
                    prop_assert!(message.contains(&named));
                }
                Verdict::Unchecked(_) => prop_assert!(false, "pure decisions are never unchecked"),
            }
        }

        /// An update is refused only for a changed node of a NodeMaintenance not being deleted.
        #[test]
        fn update_refuses_only_a_node_change(old in maintenance(), new in maintenance()) {
            let refused = matches!(on_update(&old, &new), Verdict::Denied(_));
            prop_assert_eq!(refused, old.node != new.node && !old.deleting);
        }
    }
}
