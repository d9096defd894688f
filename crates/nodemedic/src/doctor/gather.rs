//! Reads the doctor's facts from the API server. A kind whose CRD is not installed reads as none;
//! anything else that fails stops the doctor, saying what it was reading.

use std::collections::BTreeMap;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
        SubjectAccessReviewSpec,
    },
    coordination::v1::Lease,
    core::v1::{Namespace, Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, ObjectMeta, PostParams},
    core::{GroupVersion, GroupVersionKind},
    discovery::{self, Scope},
};
use nodemedic_api::{
    fence_agents::{FenceAgentsRemediationTemplate, FenceRemediationStrategy},
    healthcheck::NodeHealthCheck,
    self_remediation::{CONFIG_NAME, RemediationStrategy, SelfNodeRemediationConfig, SelfNodeRemediationTemplate},
};
use nodemedic_healthcheck::decide::TemplateRef;
use nodemedic_self_remediation::manager::daemonset;

use super::{
    facts::{
        AccountAccess, AgentAdmission, ControllerLease, FENCE_AGENTS_TEMPLATE, Facts, FenceTemplate, HealthCheck,
        NodeFacts, SELF_REMEDIATION_TEMPLATE, SelfRemediationSettings, Subject, TemplateLookup, Version,
    },
    rbac::{self, Permission},
};
use crate::status::{all, registrations};

/// The controller's leader-election lease (its `--lease-name` default).
const CONTROLLER_LEASE: &str = "nodemedic-controller";
/// Access reviews in flight at once: enough to be quick, few enough to spare the API server.
const REVIEWS_AT_ONCE: usize = 8;

pub(super) async fn facts(client: &Client, namespace: &str) -> anyhow::Result<Facts> {
    let version = async {
        client
            .apiserver_version()
            .await
            .context("reading the API server's version")
    };
    let (info, nodes, namespaces, agents, controllers, checks, snr_templates, far_templates, config) = tokio::try_join!(
        version,
        all::<Node>(client),
        all::<Namespace>(client),
        registrations(client),
        controller_leases(client),
        all::<NodeHealthCheck>(client),
        all::<SelfNodeRemediationTemplate>(client),
        all::<FenceAgentsRemediationTemplate>(client),
        self_remediation_config(client, namespace),
    )?;
    let checks: Vec<HealthCheck> = checks.iter().map(HealthCheck::from_object).collect();
    let mut templates = BTreeMap::new();
    for t in checks.iter().flat_map(|c| c.templates()) {
        if !templates.contains_key(t) {
            templates.insert(t.clone(), lookup(client, t).await?);
        }
    }
    let elsewhere = agents
        .iter()
        .chain(&controllers)
        .filter_map(|l| l.namespace())
        .filter(|ns| ns != namespace)
        .collect();
    let now = jiff::Timestamp::now();
    let out_of_service_templates = snr_templates
        .iter()
        .filter(|t| t.spec.template.spec.remediation_strategy == RemediationStrategy::OutOfServiceTaint)
        .map(|t| described(SELF_REMEDIATION_TEMPLATE, t))
        .chain(
            far_templates
                .iter()
                .filter(|t| t.spec.template.spec.remediation_strategy == FenceRemediationStrategy::OutOfServiceTaint)
                .map(|t| described(FENCE_AGENTS_TEMPLATE, t)),
        )
        .collect();
    Ok(Facts {
        namespace: namespace.to_owned(),
        version: Version::parse(&info.major, &info.minor, &info.git_version),
        nodes: nodes.iter().map(NodeFacts::from_node).collect(),
        namespaces: namespaces.iter().map(|n| n.name_any()).collect(),
        registrations: agents
            .iter()
            .filter(|l| l.namespace().as_deref() == Some(namespace))
            .filter_map(nodemedic_self_remediation::registration::registration)
            .collect(),
        fencing_notes: agents
            .iter()
            .filter(|l| l.namespace().as_deref() == Some(namespace))
            .filter_map(nodemedic_self_remediation::registration::Published::from_lease)
            .filter(|p| !p.fencing_note.is_empty())
            .map(|p| (p.node, p.fencing_note))
            .collect(),
        elsewhere,
        self_remediation: config
            .as_ref()
            .map(|c| SelfRemediationSettings::from_spec(&c.spec))
            .unwrap_or_default(),
        controller: controllers
            .iter()
            .find(|l| l.namespace().as_deref() == Some(namespace))
            .map(|l| ControllerLease::from_lease(l, now)),
        checks,
        templates,
        out_of_service_templates,
        fence_templates: far_templates.iter().map(FenceTemplate::from_object).collect(),
        access: access(client, namespace).await?,
        agent_admission: agent_admission(client, namespace, config.as_ref()).await,
    })
}

/// A server-side dry run of one agent pod in `namespace`, as the DaemonSet creates them (or,
/// before the controller made it, as the configuration would have it).
async fn agent_admission(
    client: &Client,
    namespace: &str,
    config: Option<&SelfNodeRemediationConfig>,
) -> AgentAdmission {
    let made = match Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .get_opt(daemonset::NAME)
        .await
    {
        Ok(made) => made,
        Err(e) => {
            return AgentAdmission::Unknown(format!("reading DaemonSet {namespace}/{}: {e}", daemonset::NAME));
        }
    };
    let daemon_set = made.unwrap_or_else(|| {
        let spec = config.map(|c| c.spec.clone()).unwrap_or_default();
        daemonset::render(&spec, namespace, &daemonset::Install::new(daemonset::NAME))
    });
    let pod = Pod {
        metadata: ObjectMeta {
            generate_name: Some("nodemedic-doctor-".into()),
            ..Default::default()
        },
        spec: daemon_set.spec.and_then(|s| s.template.spec),
        status: None,
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let outcome = match Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&dry_run, &pod)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err((status.code, status.message.clone())),
        Err(e) => Err((0, e.to_string())),
    };
    AgentAdmission::from_dry_run(outcome)
}

fn described<K: ResourceExt>(kind: &str, t: &K) -> String {
    format!("{kind} {}/{}", t.namespace().unwrap_or_default(), t.name_any())
}

async fn controller_leases(client: &Client) -> anyhow::Result<Vec<Lease>> {
    let named = ListParams::default().fields(&format!("metadata.name={CONTROLLER_LEASE}"));
    Ok(Api::<Lease>::all(client.clone())
        .list(&named)
        .await
        .context("listing the controller's leases")?
        .items)
}

async fn self_remediation_config(
    client: &Client,
    namespace: &str,
) -> anyhow::Result<Option<SelfNodeRemediationConfig>> {
    match Api::<SelfNodeRemediationConfig>::namespaced(client.clone(), namespace)
        .get(CONFIG_NAME)
        .await
    {
        Ok(config) => Ok(Some(config)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading SelfNodeRemediationConfig {namespace}/{CONFIG_NAME}")),
    }
}

/// Whether a template exists, whatever its kind: discovery finds the kind, as the health check's
/// controller finds it.
async fn lookup(client: &Client, t: &TemplateRef) -> anyhow::Result<TemplateLookup> {
    let gvk = t
        .api_version
        .parse::<GroupVersion>()
        .map(|gv| gv.with_kind(&t.kind))
        .unwrap_or_else(|_| GroupVersionKind::gvk("", &t.api_version, &t.kind));
    let (resource, capabilities) = match discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(kube::Error::Discovery(_)) => return Ok(TemplateLookup::KindNotServed),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(TemplateLookup::KindNotServed),
        Err(e) => return Err(e).with_context(|| format!("looking up the kind {} ({})", t.kind, t.api_version)),
    };
    let api: Api<DynamicObject> = match (capabilities.scope, &t.namespace) {
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        // The health check's controller finds no template without a namespace either.
        (Scope::Namespaced, None) => return Ok(TemplateLookup::NotFound),
    };
    let found = api
        .get_opt(&t.name)
        .await
        .with_context(|| format!("reading template {t}"))?;
    Ok(if found.is_some() {
        TemplateLookup::Found
    } else {
        TemplateLookup::NotFound
    })
}

fn attributes(p: &Permission) -> ResourceAttributes {
    ResourceAttributes {
        verb: Some(p.verb.clone()),
        group: Some(p.group.clone()),
        resource: Some(p.resource.clone()),
        subresource: p.subresource.clone(),
        name: p.name.clone(),
        ..Default::default()
    }
}

async fn may_i(client: &Client, p: &Permission) -> anyhow::Result<bool> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attributes(p)),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("asking whether you may {p}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

async fn may_account(client: &Client, namespace: &str, account: &str, p: &Permission) -> anyhow::Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{account}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(attributes(p)),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("asking whether {namespace}/{account} may {p}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Each account's permissions, asked for the account when the caller may ask for others, else
/// for the caller (which says only what the caller may do).
async fn access(client: &Client, namespace: &str) -> anyhow::Result<Vec<AccountAccess>> {
    let ask_for_others = Permission {
        verb: "create".into(),
        group: "authorization.k8s.io".into(),
        resource: "subjectaccessreviews".into(),
        subresource: None,
        name: None,
    };
    let subject = if may_i(client, &ask_for_others).await? {
        Subject::Account
    } else {
        Subject::Caller
    };
    let mut out = Vec::new();
    for account in rbac::ACCOUNTS {
        let required = rbac::required(account).map_err(anyhow::Error::msg)?;
        let checked = required.len();
        let answers: Vec<(Permission, bool)> = futures::stream::iter(required)
            .map(|p| async move {
                let allowed = match subject {
                    Subject::Account => may_account(client, namespace, account, &p).await?,
                    Subject::Caller => may_i(client, &p).await?,
                };
                anyhow::Ok((p, allowed))
            })
            .buffered(REVIEWS_AT_ONCE)
            .try_collect()
            .await?;
        out.push(AccountAccess {
            account: account.to_owned(),
            role: account.to_owned(),
            subject,
            checked,
            denied: answers
                .into_iter()
                .filter(|(_, allowed)| !allowed)
                .map(|(p, _)| p)
                .collect(),
        });
    }
    Ok(out)
}
