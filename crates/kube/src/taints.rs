//! Node taints: pure list edits, and an optimistic read-modify-write against the API server.
//!
//! `spec.taints` has no merge key, so a patch replaces the whole list; other writers (the node
//! lifecycle controller adds `unreachable`) would be lost without the resourceVersion precondition.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::{CallContext, Error, Result};

pub fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        value: value.map(str::to_owned),
        effect: effect.to_owned(),
        time_added: Some(crate::time::now()),
    }
}

fn same(a: &Taint, key: &str, effect: &str) -> bool {
    a.key == key && a.effect == effect
}

pub fn has(taints: &[Taint], key: &str, effect: &str) -> bool {
    taints.iter().any(|t| same(t, key, effect))
}

/// The list with `new` added, or `None` when a taint with its key and effect is already there.
pub fn with(taints: &[Taint], new: &Taint) -> Option<Vec<Taint>> {
    if has(taints, &new.key, &new.effect) {
        return None;
    }
    let mut out = taints.to_vec();
    out.push(new.clone());
    Some(out)
}

/// The list without the taint, or `None` when it is not there.
pub fn without(taints: &[Taint], key: &str, effect: &str) -> Option<Vec<Taint>> {
    has(taints, key, effect).then(|| taints.iter().filter(|t| !same(t, key, effect)).cloned().collect())
}

/// Applies `edit` to the node's current taints until it sticks; returns whether it changed
/// anything. A missing node is not an error (nothing to taint).
pub async fn update(api: &Api<Node>, node: &str, edit: impl Fn(&[Taint]) -> Option<Vec<Taint>>) -> Result<bool> {
    const ATTEMPTS: u32 = 8;
    for _ in 0..ATTEMPTS {
        let Some(current) = api
            .get_opt(node)
            .await
            .with_context(|| format!("reading node {node} to edit its taints"))?
        else {
            return Ok(false);
        };
        let taints = current.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let Some(next) = edit(&taints) else { return Ok(false) };
        let patch = json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "spec": { "taints": next },
        });
        match api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(e).with_context(|| format!("patching the taints of node {node}")),
        }
    }
    Err(Error::Conflict {
        what: format!("taints of node {node}"),
        attempts: ATTEMPTS,
    })
}

pub async fn add(api: &Api<Node>, node: &str, new: &Taint) -> Result<bool> {
    update(api, node, |taints| with(taints, new)).await
}

pub async fn remove(api: &Api<Node>, node: &str, key: &str, effect: &str) -> Result<bool> {
    update(api, node, |taints| without(taints, key, effect)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_are_idempotent_and_keep_other_taints() {
        let other = taint("node.kubernetes.io/unreachable", None, "NoExecute");
        let ours = taint("remediation.medik8s.io/fence-agents-remediation", None, "NoSchedule");
        let added = with(std::slice::from_ref(&other), &ours).expect("adds");
        assert_eq!(added.len(), 2);
        assert!(with(&added, &ours).is_none());
        let removed = without(&added, &ours.key, "NoSchedule").expect("removes");
        assert_eq!(removed, vec![other]);
        assert!(without(&removed, &ours.key, "NoSchedule").is_none());
    }
}
