//! The FenceAgentsRemediationTemplate reconciler: checks the template's parameters for every node
//! it names (ParametersValid), and on each new generation checks the credentials of a sample of
//! those nodes with `--action=status` (FenceAgentStatusValidationSucceeded), so a wrong password
//! shows up before a node fails rather than after.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use kube::{
    ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediationTemplate,
    names::{annotations, conditions as types},
};
use nodemedic_kube::{CallContext, conditions};
use serde_json::json;

use super::{Context, options};
use crate::{Result, decide::parameters, decide::validation};

const STATUS_CHECK_TIMEOUT: Duration = Duration::from_secs(15);
/// Stands for "any node" when a template names none.
const ANY_NODE: &str = "any-node";

pub(super) async fn reconcile(template: Arc<FenceAgentsRemediationTemplate>, ctx: Arc<Context>) -> Result<Action> {
    let api = nodemedic_kube::client::namespaced_api(&ctx.client, template.as_ref())?;
    let namespace = template.namespace().unwrap_or_default();
    if !template
        .annotations()
        .contains_key(annotations::MULTIPLE_TEMPLATES_SUPPORT)
    {
        // What medik8s's mutating webhook does: a health check may escalate through several FAR
        // templates, since each remediation is named apart from its node.
        let patch = json!({"metadata": {"annotations": {annotations::MULTIPLE_TEMPLATES_SUPPORT: "true"}}});
        api.patch(&template.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| {
                let name = template.name_any();
                format!("annotating FenceAgentsRemediationTemplate {namespace}/{name} for multiple templates")
            })?;
        // The patch is a new version: its watch event brings the reconcile that validates.
        return Ok(Action::await_change());
    }
    let spec = &template.spec.template.spec;
    let generation = template.metadata.generation;
    let named = options::named_nodes(spec);
    let on = nodemedic_kube::events::reference(template.as_ref());

    let mut problems = BTreeMap::new();
    let mut checked = BTreeMap::new();
    let nodes = if named.is_empty() {
        vec![ANY_NODE.to_owned()]
    } else {
        named.clone()
    };
    for node in &nodes {
        match options::for_node(&ctx.client, &ctx.agents, &namespace, spec, node).await? {
            Ok(c) => {
                checked.insert(node.clone(), c);
            }
            Err(why) => {
                problems.insert(node.clone(), why.to_string());
            }
        }
    }
    let parameters_message = match problems.iter().next() {
        None => format!("{} accepts the parameters for {}", spec.agent, nodes.join(", ")),
        Some((node, why)) if named.is_empty() => format!("{why} (checked for {node})"),
        Some((node, why)) => format!("node {node}: {why}"),
    };

    let observed = template
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            conditions::find(c, types::FENCE_AGENT_STATUS_VALIDATION_SUCCEEDED).and_then(|c| c.observed_generation)
        });
    let sample = validation::sample(&named, template.spec.status_validation_sample.as_ref());
    let validation = if observed == generation && observed.is_some() {
        None
    } else {
        Some(validate(&ctx, spec, &checked, sample.clone()).await)
    };
    if validation.is_some() && validation::exceeds(named.len(), template.spec.status_validation_sample.as_ref()) {
        ctx.events
            .warning(
                &on,
                "StatusValidationSampleExceedsNodes",
                format!(
                    "statusValidationSample asks for more than the {} nodes the template names",
                    named.len()
                ),
            )
            .await;
    }

    let mut status = template.status.clone().unwrap_or_default();
    let now = nodemedic_kube::time::now();
    let list = status.conditions.get_or_insert_with(Vec::new);
    let valid = problems.is_empty();
    let parameters_changed = conditions::set_status(
        list,
        types::PARAMETERS_VALID,
        conditions::status_str(valid),
        if valid { "ParametersValid" } else { "InvalidParameters" },
        parameters_message.clone(),
        generation,
        &now,
    );
    let mut changed = parameters_changed;
    if !valid && parameters_changed {
        ctx.events.warning(&on, "InvalidParameters", parameters_message).await;
    }
    if let Some((passed, failed, summary, ok)) = validation {
        conditions::set_status(
            list,
            types::FENCE_AGENT_STATUS_VALIDATION_SUCCEEDED,
            conditions::status_str(ok),
            if ok { "ValidationSucceeded" } else { "ValidationFailed" },
            summary,
            generation,
            &now,
        );
        status.validation_passed = Some(passed.into_iter().map(|n| (n, now.clone())).collect());
        status.validation_failed = Some(failed);
        // A new generation's results are written even when they equal the last ones.
        changed = true;
    }
    if changed {
        nodemedic_kube::status::write(&api, template.as_ref(), |s, _| {
            *s = status;
            true
        })
        .await?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Passed nodes, failed nodes with why, a summary, and whether validation succeeded.
type Validation = (Vec<String>, BTreeMap<String, String>, String, bool);

/// Runs `--action=status` once for each sampled node; exit 0 (on) or 2 (off) means the BMC
/// answered and accepted the credentials.
async fn validate(
    ctx: &Context,
    spec: &nodemedic_api::fence_agents::FenceAgentsRemediationSpec,
    checked: &BTreeMap<String, options::Checked>,
    sample: Result<Vec<String>, String>,
) -> Validation {
    let sample = match sample {
        Ok(s) => s,
        Err(why) => return (Vec::new(), BTreeMap::new(), why, false),
    };
    if sample.is_empty() {
        return (
            Vec::new(),
            BTreeMap::new(),
            "no status validation requested".into(),
            true,
        );
    }
    let (mut passed, mut failed) = (Vec::new(), BTreeMap::new());
    for node in &sample {
        let Some(c) = checked.get(node) else {
            failed.insert(node.clone(), "its parameters are invalid (see ParametersValid)".into());
            continue;
        };
        let stdin = parameters::stdin(&c.options, &c.metadata, "status");
        let secrets = c
            .options
            .secret
            .iter()
            .filter_map(|k| c.options.values.get(k).cloned())
            .collect();
        let attempt = ctx
            .agents
            .attempt(&spec.agent, &stdin, &secrets, STATUS_CHECK_TIMEOUT)
            .await;
        match attempt.exit_code {
            Some(0 | 2) => passed.push(node.clone()),
            code => {
                let why = match code {
                    Some(code) => format!("exit {code}: {}", attempt.message),
                    None => attempt.message,
                };
                failed.insert(node.clone(), why);
            }
        }
    }
    let summary = if failed.is_empty() {
        format!("{} answered --action=status for {}", spec.agent, passed.join(", "))
    } else {
        let (node, why) = failed
            .iter()
            .next()
            .map(|(n, w)| (n.clone(), w.clone()))
            .unwrap_or_default();
        format!(
            "{} of {} nodes failed --action=status; {node}: {why}",
            failed.len(),
            sample.len()
        )
    };
    let ok = failed.is_empty();
    (passed, failed, summary, ok)
}
