//! What nodemedic's ServiceAccounts must be allowed to do: exactly what the chart grants them,
//! read from the rendered chart this binary was built with, so the list cannot drift from it.

use k8s_openapi::api::rbac::v1::ClusterRole;
use serde::Serialize;

const RENDERED_CHART: &str = include_str!("../../../../deploy/nodemedic.yaml");

/// The chart's ServiceAccounts, each with the ClusterRole of the same name bound to it.
pub(super) const ACCOUNTS: [&str; 2] = ["nodemedic-controller", "nodemedic-agent"];

/// One verb on one resource (optionally one object of it), cluster-wide.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(super) struct Permission {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(sub) = &self.subresource {
            write!(f, "/{sub}")?;
        }
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        Ok(())
    }
}

/// Every permission the chart's ClusterRole `role` grants, one per verb, resource and name.
pub(super) fn required(role: &str) -> Result<Vec<Permission>, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(RENDERED_CHART).map_err(|e| format!("the rendered chart: {e}"))?;
    let document = documents
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == role)
        .ok_or_else(|| format!("the rendered chart has no ClusterRole {role}"))?;
    let role: ClusterRole = serde_json::from_value(document).map_err(|e| format!("ClusterRole {role}: {e}"))?;
    Ok(permissions(&role))
}

pub(super) fn permissions(role: &ClusterRole) -> Vec<Permission> {
    let mut out = Vec::new();
    for rule in role.rules.iter().flatten() {
        // Names unset means any object; one `None` stands for that.
        let names: Vec<Option<String>> = match &rule.resource_names {
            Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                let (resource, subresource) = match resource.split_once('/') {
                    Some((r, s)) => (r.to_owned(), Some(s.to_owned())),
                    None => (resource.clone(), None),
                };
                for verb in &rule.verbs {
                    for name in &names {
                        out.push(Permission {
                            verb: verb.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            subresource: subresource.clone(),
                            name: name.clone(),
                        });
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_grants_each_account_what_its_operators_use() {
        let controller = required(ACCOUNTS[0]).expect("the controller's role");
        let has = |verb: &str, resource: &str, subresource: Option<&str>| {
            controller
                .iter()
                .any(|p| p.verb == verb && p.resource == resource && p.subresource.as_deref() == subresource)
        };
        assert!(has("create", "pods", Some("eviction")));
        assert!(has("patch", "nodes", Some("status")));
        assert!(has("delete", "volumeattachments", None));
        let sign = controller
            .iter()
            .find(|p| p.verb == "sign")
            .expect("the signer's permission");
        assert_eq!(sign.name.as_deref(), Some("nodemedic.medik8s.io/peer"));
        assert_eq!(
            sign.to_string(),
            "sign signers.certificates.k8s.io nodemedic.medik8s.io/peer"
        );
        let agent = required(ACCOUNTS[1]).expect("the agent's role");
        assert!(
            agent
                .iter()
                .any(|p| p.verb == "create" && p.resource == "certificatesigningrequests")
        );
        assert!(required("no-such-role").is_err());
    }
}
