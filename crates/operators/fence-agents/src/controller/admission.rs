//! The `/validate-fenceagentsremediation` webhook, for remediations and their templates: builds
//! each node's options as a run would (the agent installed, the Secrets read) and asks
//! [`crate::decide::admission`]. Only a new or changed spec is judged: the health check's
//! timed-out annotation and the controller's finalizer must always get through.

use std::time::Duration;

use kube::{Client, ResourceExt, core::admission::Operation};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediation, FenceAgentsRemediationSpec, FenceAgentsRemediationTemplate},
    machines::{self, NodeOf},
};
use nodemedic_kube::admission::{self, Request, Verdict};

use super::options;
use crate::{
    Result,
    agent::Agents,
    decide::{
        admission::{Kind, judge},
        parameters::Unusable,
    },
};

pub const PATH: &str = "/validate-fenceagentsremediation";

/// The API server gives the webhook 5 s (the chart's timeout); an answer after that is never seen.
const CHECK_WITHIN: Duration = Duration::from_secs(4);

/// The node a template naming none is checked for: what every node shares is checked.
const STAND_IN: &str = "any-node";

/// How a refusal names the node it was checked for.
fn label(node: &str) -> String {
    if node == STAND_IN {
        "every node".to_owned()
    } else {
        format!("node {node}")
    }
}

/// What one request asks to judge: `None` when nothing needs judging.
struct Judged {
    kind: Kind,
    name: String,
    namespace: String,
    spec: FenceAgentsRemediationSpec,
    nodes: Vec<String>,
}

/// `client` should fail fast: an answer after the API server's webhook timeout is no answer.
pub async fn validate(client: Client, agents: Agents, request: Request) -> Verdict {
    let judged = match judged(&request) {
        Ok(Some(judged)) => judged,
        Ok(None) => return Verdict::Allowed,
        Err(why) => return unchecked(&request, &why),
    };
    match tokio::time::timeout(CHECK_WITHIN, outcomes(&client, &agents, &judged)).await {
        Ok(Ok(outcomes)) => judge(judged.kind, &judged.name, &outcomes),
        Ok(Err(error)) => unchecked(&request, &error.to_string()),
        Err(_) => unchecked(&request, &format!("building the options took over {CHECK_WITHIN:?}")),
    }
}

fn unchecked(request: &Request, why: &str) -> Verdict {
    Verdict::Unchecked(format!("nodemedic could not check this {}: {why}", request.kind.kind))
}

fn judged(request: &Request) -> std::result::Result<Option<Judged>, String> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Ok(None);
    }
    if request.kind.kind == "FenceAgentsRemediationTemplate" {
        let new = admission::object::<FenceAgentsRemediationTemplate>(request)?;
        let old = admission::old_object::<FenceAgentsRemediationTemplate>(request)?;
        if new.metadata.deletion_timestamp.is_some() || old.is_some_and(|o| o.spec == new.spec) {
            return Ok(None);
        }
        let spec = new.spec.template.spec.clone();
        let mut nodes = options::named_nodes(&spec);
        if nodes.is_empty() {
            nodes.push(STAND_IN.to_owned());
        }
        return Ok(Some(Judged {
            kind: Kind::Template,
            name: new.name_any(),
            namespace: new.namespace().unwrap_or_default(),
            spec,
            nodes,
        }));
    }
    let new = admission::object::<FenceAgentsRemediation>(request)?;
    let old = admission::old_object::<FenceAgentsRemediation>(request)?;
    if new.metadata.deletion_timestamp.is_some() || old.is_some_and(|o| o.spec == new.spec) {
        return Ok(None);
    }
    // A remediation named after its Machine is judged once the controller knows the node.
    let NodeOf::Named(node) = machines::node_of(&new.metadata) else {
        return Ok(None);
    };
    Ok(Some(Judged {
        kind: Kind::Remediation,
        name: new.name_any(),
        namespace: new.namespace().unwrap_or_default(),
        spec: new.spec,
        nodes: vec![node],
    }))
}

async fn outcomes(
    client: &Client,
    agents: &Agents,
    judged: &Judged,
) -> Result<Vec<(String, std::result::Result<(), Unusable>)>> {
    let mut outcomes = Vec::with_capacity(judged.nodes.len());
    for node in &judged.nodes {
        let built = options::buildable(client, agents, &judged.namespace, &judged.spec, node).await?;
        outcomes.push((label(node), built));
    }
    Ok(outcomes)
}
