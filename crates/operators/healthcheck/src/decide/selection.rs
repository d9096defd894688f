//! A health check whose selector matches no node watches nothing and says nothing unless told
//! to: the seed manifests select `node-role.kubernetes.io/master`, which plain Kubernetes stopped
//! setting, and kubeadm never sets `node-role.kubernetes.io/worker`. Reported as a condition and
//! a Warning event (once, when it starts), with the plain-Kubernetes label to use when one fits.

use super::{Decision, Input, NodeFacts, Severity};

const MASTER: &str = "node-role.kubernetes.io/master";
const CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";
const WORKER: &str = "node-role.kubernetes.io/worker";

pub(super) fn report(input: &Input<'_>, observed: usize, decision: &mut Decision) {
    if observed > 0 {
        decision.status.nodes_selected =
            Some((true, "NodesSelected", format!("the selector matches {observed} nodes")));
        return;
    }
    let selector = input.check.selector.to_string();
    let message = format!(
        "the selector {selector:?} matches none of the cluster's {} nodes, so nothing is watched{}",
        input.nodes.len(),
        hint(&selector, input.nodes)
    );
    if input.memory.nodes_selected != Some(false) {
        decision.notice(None, Severity::Warning, "NoNodesSelected", message.clone());
    }
    decision.status.nodes_selected = Some((false, "NoNodesSelected", message));
}

/// The label the nodes carry instead, when the selector names one they do not.
fn hint(selector: &str, nodes: &[&NodeFacts]) -> String {
    let carry = |label: &str| nodes.iter().filter(|n| n.labels.contains_key(label)).count();
    if selector.contains(MASTER) && carry(MASTER) == 0 && carry(CONTROL_PLANE) > 0 {
        format!(
            "; {} nodes carry {CONTROL_PLANE}, the label Kubernetes sets since 1.24 instead of {MASTER}: select that",
            carry(CONTROL_PLANE)
        )
    } else if selector.contains(WORKER) && carry(WORKER) == 0 {
        format!(
            "; no node carries {WORKER} (kubeadm does not set it): label the workers, or select the nodes without {CONTROL_PLANE}"
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn node(labels: &[&str]) -> NodeFacts {
        NodeFacts {
            name: "n".into(),
            uid: "u".into(),
            labels: labels
                .iter()
                .map(|l| (l.to_string(), String::new()))
                .collect::<BTreeMap<_, _>>(),
            conditions: Vec::new(),
            confirmed_healthy: false,
        }
    }

    #[test]
    fn a_master_selector_on_control_plane_nodes_names_the_label_to_use() {
        let nodes = [node(&[CONTROL_PLANE]), node(&[CONTROL_PLANE]), node(&[WORKER])];
        let refs: Vec<&NodeFacts> = nodes.iter().collect();
        let said = hint("node-role.kubernetes.io/master", &refs);
        assert!(
            said.contains("2 nodes carry node-role.kubernetes.io/control-plane"),
            "{said}"
        );
    }

    #[test]
    fn a_worker_selector_where_kubeadm_set_no_worker_label_says_so() {
        let nodes = [node(&[CONTROL_PLANE]), node(&[])];
        let refs: Vec<&NodeFacts> = nodes.iter().collect();
        assert!(hint("node-role.kubernetes.io/worker", &refs).contains("kubeadm does not set it"));
    }

    #[test]
    fn no_hint_when_the_nodes_do_carry_the_label() {
        let nodes = [node(&[MASTER, CONTROL_PLANE])];
        let refs: Vec<&NodeFacts> = nodes.iter().collect();
        assert_eq!(hint("node-role.kubernetes.io/master,zone=b", &refs), "");
    }
}
