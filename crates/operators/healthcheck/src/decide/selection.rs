//! A health check whose selector matches no node watches nothing and says nothing unless told
//! to: the seed manifests select `node-role.kubernetes.io/master`, which plain Kubernetes stopped
//! setting, and kubeadm never sets `node-role.kubernetes.io/worker`. Reported as a condition and
//! a Warning event (once, when it starts), with the plain-Kubernetes label to use when one fits.
//! `nodemedic doctor` asks [`seed_style_label`] the same question.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector};
use nodemedic_api::names::labels::{ROLE_CONTROL_PLANE, ROLE_MASTER, ROLE_WORKER};

use super::{Decision, Input, Severity};

/// A role label of OpenShift's that the selector names and no node carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedStyleLabel {
    /// `master`, while this many nodes carry `control-plane`, the label Kubernetes sets instead.
    Master { control_plane_nodes: usize },
    /// `worker`, which kubeadm does not set.
    Worker,
}

pub fn seed_style_label<'a>(
    selector_keys: &BTreeSet<String>,
    nodes: impl Iterator<Item = &'a BTreeMap<String, String>> + Clone,
) -> Option<SeedStyleLabel> {
    let carry = |label: &str| nodes.clone().filter(|labels| labels.contains_key(label)).count();
    let unmet = |label: &str| selector_keys.contains(label) && carry(label) == 0;
    if unmet(ROLE_MASTER) && carry(ROLE_CONTROL_PLANE) > 0 {
        Some(SeedStyleLabel::Master {
            control_plane_nodes: carry(ROLE_CONTROL_PLANE),
        })
    } else if unmet(ROLE_WORKER) {
        Some(SeedStyleLabel::Worker)
    } else {
        None
    }
}

/// Every label key a selector mentions.
pub fn keys(selector: &Selector) -> BTreeSet<String> {
    selector
        .clone()
        .into_iter()
        .map(|expression| match expression {
            Expression::In(key, _)
            | Expression::NotIn(key, _)
            | Expression::Equal(key, _)
            | Expression::NotEqual(key, _)
            | Expression::Exists(key)
            | Expression::DoesNotExist(key) => key,
        })
        .collect()
}

pub(super) fn report(input: &Input<'_>, observed: usize, decision: &mut Decision) {
    if observed > 0 {
        decision.status.nodes_selected =
            Some((true, "NodesSelected", format!("the selector matches {observed} nodes")));
        return;
    }
    let hint = match seed_style_label(&keys(&input.check.selector), input.nodes.iter().map(|n| &n.labels)) {
        Some(SeedStyleLabel::Master { control_plane_nodes }) => format!(
            "; {control_plane_nodes} nodes carry {ROLE_CONTROL_PLANE}, the label Kubernetes sets since 1.24 instead of {ROLE_MASTER}: select that"
        ),
        Some(SeedStyleLabel::Worker) => format!(
            "; no node carries {ROLE_WORKER} (kubeadm does not set it): label the workers, or select the nodes without {ROLE_CONTROL_PLANE} (for the check the chart creates: its value defaultHealthCheck.selector)"
        ),
        None => String::new(),
    };
    let message = format!(
        "the selector {:?} matches none of the cluster's {} nodes, so nothing is watched{hint}",
        input.check.selector.to_string(),
        input.nodes.len(),
    );
    if input.memory.nodes_selected != Some(false) {
        decision.notice(None, Severity::Warning, "NoNodesSelected", message.clone());
    }
    decision.status.nodes_selected = Some((false, "NoNodesSelected", message));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter().map(|k| (k.to_string(), String::new())).collect()
    }

    fn selecting(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn a_master_selector_on_control_plane_nodes_names_the_label_to_use() {
        let nodes = [
            labels(&[ROLE_CONTROL_PLANE]),
            labels(&[ROLE_CONTROL_PLANE]),
            labels(&[ROLE_WORKER]),
        ];
        assert_eq!(
            seed_style_label(&selecting(&[ROLE_MASTER]), nodes.iter()),
            Some(SeedStyleLabel::Master { control_plane_nodes: 2 })
        );
    }

    #[test]
    fn a_worker_selector_where_kubeadm_set_no_worker_label_says_so() {
        let nodes = [labels(&[ROLE_CONTROL_PLANE]), labels(&[])];
        assert_eq!(
            seed_style_label(&selecting(&[ROLE_WORKER]), nodes.iter()),
            Some(SeedStyleLabel::Worker)
        );
    }

    #[test]
    fn nothing_to_say_when_the_nodes_do_carry_the_label() {
        let nodes = [labels(&[ROLE_MASTER, ROLE_CONTROL_PLANE])];
        assert_eq!(seed_style_label(&selecting(&[ROLE_MASTER, "zone"]), nodes.iter()), None);
    }

    #[test]
    fn keys_come_from_labels_and_expressions() {
        let selector = Selector::from_iter([
            Expression::Exists(ROLE_MASTER.into()),
            Expression::Equal("zone".into(), "b".into()),
        ]);
        assert_eq!(keys(&selector), selecting(&[ROLE_MASTER, "zone"]));
    }
}
