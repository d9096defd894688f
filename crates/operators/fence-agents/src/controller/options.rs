//! Gathers one node's fence-agent options from the spec and its Secrets, and checks them against
//! the agent's metadata. Configuration mistakes come back as a message for the status (the outer
//! `Result` is for API failures, which are retried).

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use nodemedic_api::fence_agents::{DEFAULT_SHARED_SECRET_NAME, FenceAgentsRemediationSpec};
use nodemedic_kube::CallContext;

use crate::{
    Result,
    agent::{AgentError, Agents},
    decide::{
        metadata::Metadata,
        parameters::{self, Options, Sources, Unusable},
    },
};

pub struct Checked {
    pub options: Options,
    pub metadata: Arc<Metadata>,
}

pub(crate) async fn for_node(
    client: &Client,
    agents: &Agents,
    namespace: &str,
    spec: &FenceAgentsRemediationSpec,
    node: &str,
) -> Result<Result<Checked, Unusable>> {
    let metadata = match agents.metadata(&spec.agent).await {
        Ok(m) => m,
        Err(e @ AgentError::NotInstalled { .. }) => return Ok(Err(Unusable::Invalid(e.to_string()))),
        // A slow or failing `-o metadata` is no configuration mistake: retry.
        Err(e) => return Err(e.into()),
    };
    let sources = match sources(client, namespace, spec, node).await? {
        Ok(sources) => sources,
        Err(unusable) => return Ok(Err(unusable)),
    };
    let checked = parameters::build(&sources).and_then(|options| {
        parameters::check(&options, &metadata)?;
        Ok(options)
    });
    Ok(checked
        .map(|options| Checked { options, metadata })
        .map_err(|e| Unusable::Invalid(e.to_string())))
}

/// What medik8s's admission checks: the agent is installed, the Secrets exist and the options
/// can be built for `node`. Not checked against the agent's metadata: medik8s admits an option
/// the agent lacks (the seed's `--hostname`), so nodemedic says so in the status instead.
pub(crate) async fn buildable(
    client: &Client,
    agents: &Agents,
    namespace: &str,
    spec: &FenceAgentsRemediationSpec,
    node: &str,
) -> Result<Result<(), Unusable>> {
    if let Err(e) = agents.path(&spec.agent) {
        return Ok(Err(Unusable::Invalid(e.to_string())));
    }
    Ok(match sources(client, namespace, spec, node).await? {
        Ok(sources) => parameters::build(&sources)
            .map(|_| ())
            .map_err(|e| Unusable::Invalid(e.to_string())),
        Err(unusable) => Err(unusable),
    })
}

/// Where `node`'s options come from, the Secrets read.
async fn sources<'a>(
    client: &Client,
    namespace: &str,
    spec: &FenceAgentsRemediationSpec,
    node: &'a str,
) -> Result<Result<Sources<'a>, Unusable>> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let shared_secret = match &spec.shared_secret_name {
        Some(name) => match read(&secrets, namespace, name).await? {
            Some(values) => values,
            None => return Ok(Err(missing(name, namespace, "sharedSecretName"))),
        },
        // medik8s's old default applies only when that Secret exists.
        None => read(&secrets, namespace, DEFAULT_SHARED_SECRET_NAME)
            .await?
            .unwrap_or_default(),
    };
    let node_secret = match spec.node_secret_names.get(node) {
        Some(name) => match read(&secrets, namespace, name).await? {
            Some(values) => values,
            None => return Ok(Err(missing(name, namespace, &format!("nodeSecretNames[{node}]")))),
        },
        None => BTreeMap::new(),
    };
    Ok(Ok(Sources {
        node,
        shared: spec.sharedparameters.clone(),
        per_node: spec.nodeparameters.clone(),
        shared_secret,
        node_secret,
    }))
}

fn missing(name: &str, namespace: &str, field: &str) -> Unusable {
    Unusable::SecretMissing(format!(
        "Secret {name} (named by {field}) does not exist in namespace {namespace}: create it with the agent's secret options as keys (e.g. --password)"
    ))
}

async fn read(secrets: &Api<Secret>, namespace: &str, name: &str) -> Result<Option<BTreeMap<String, String>>> {
    let Some(secret) = secrets
        .get_opt(name)
        .await
        .with_context(|| format!("reading Secret {namespace}/{name}"))?
    else {
        return Ok(None);
    };
    let mut values: BTreeMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    values.extend(secret.string_data.unwrap_or_default());
    Ok(Some(values))
}

/// The nodes a spec names (in nodeparameters or nodeSecretNames), sorted.
pub(crate) fn named_nodes(spec: &FenceAgentsRemediationSpec) -> Vec<String> {
    let mut nodes: Vec<String> = spec
        .nodeparameters
        .values()
        .flat_map(|per_node| per_node.keys().cloned())
        .chain(spec.node_secret_names.keys().cloned())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}
