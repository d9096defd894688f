//! The SelfNodeRemediationConfig reconciler: validates it, keeps the agent DaemonSet rendered from
//! it (re-created on any change), and reports the membership and the provable safe time.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::apps::v1::DaemonSet,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::controller::Action,
};
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig, SelfNodeRemediationConfigStatus};
use nodemedic_kube::{CallContext, conditions, events::Events};

use super::{Metrics, daemonset, membership};
use crate::{
    Error, Result,
    protocol::{manager as rules, membership::Membership},
};

pub(super) struct Context {
    pub client: Client,
    pub namespace: String,
    pub install: daemonset::Install,
    pub events: Events,
    pub metrics: Metrics,
}

const VALID: &str = "Valid";

pub(super) async fn reconcile(config: Arc<SelfNodeRemediationConfig>, ctx: Arc<Context>) -> Result<Action> {
    if config.name_any() != CONFIG_NAME || config.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let on = nodemedic_kube::events::reference(config.as_ref());
    let mut status = config.status.clone().unwrap_or_default();
    let now = nodemedic_kube::time::now();
    let valid = set_validity(&config, status.conditions.get_or_insert_with(Vec::new), &now);
    let membership::Outcome {
        current,
        registrations: regs,
        lost,
    } = membership::reconcile(&ctx.client, &ctx.namespace, &ctx.events, &ctx.metrics, &on).await?;
    // With the membership lost, agents that still count votes in it must all be stopped before a
    // new one starts: the DaemonSet stays gone until an administrator has reset them.
    if valid && !lost {
        ensure_daemonset(&config, &ctx, &on).await?;
    }
    let licence = daemonset::licence_settings(&config.spec)
        .map(|s| s.licence())
        .unwrap_or_default();
    report_agents(&mut status, current.as_ref(), &regs, licence);
    set_membership_condition(
        status.conditions.get_or_insert_with(Vec::new),
        current.as_ref(),
        &regs,
        config.metadata.generation,
        &now,
    );
    count_agents(&ctx.metrics, &regs, status.minimum_safe_time_seconds);
    let api = Api::<SelfNodeRemediationConfig>::namespaced(ctx.client.clone(), &ctx.namespace);
    if let Err(error) = nodemedic_kube::status::replace(&api, config.as_ref(), status).await {
        return nodemedic_kube::status::requeue_on_conflict(config.as_ref(), error);
    }
    // Everything read here is watched (the config, its DaemonSet, the registrations, the
    // membership, the remediations): a change wakes this reconcile. No periodic pass: at rest
    // the manager makes no requests.
    Ok(Action::await_change())
}

/// The `Valid` condition; returns whether the DaemonSet may be rendered from the config.
fn set_validity(config: &SelfNodeRemediationConfig, list: &mut Vec<Condition>, now: &Time) -> bool {
    let validated = daemonset::validate(&config.spec).map(|mut warnings| {
        warnings.extend(watchdog_warning(&config.spec.watchdog_file_path));
        warnings
    });
    let (status, reason, message) = match validated {
        Err(error) => (false, "InvalidField", error.to_string()),
        Ok(warnings) if warnings.is_empty() => (true, "Valid", "every field is usable".to_owned()),
        Ok(warnings) => (true, "ValidWithWarnings", warnings.join("; ")),
    };
    conditions::set(
        list,
        conditions::Desired {
            type_: VALID,
            status,
            reason,
            message,
        },
        config.metadata.generation,
        now,
    );
    status
}

/// A `watchdogFilePath` the agents refuse (the CRD refuses it too, but a config stored before
/// that rule, or one a PoisonPillConfig set, may hold one). Only a warning: the agents still run
/// and vote, and fence with what the order offers after the device (softdog, software reboot).
fn watchdog_warning(path: &str) -> Option<String> {
    crate::watchdog::refusal(path).map(|why| {
        format!(
            "{why} (the agents do not open it: each falls back to a softdog device, then software reboot if enabled)"
        )
    })
}

/// The registered agents, their fencing means, the membership and the provable safe time.
fn report_agents(
    status: &mut SelfNodeRemediationConfigStatus,
    current: Option<&Membership>,
    regs: &[rules::Registration],
    licence: Duration,
) {
    // Only nodes that can fence themselves bound the safe time.
    let minimum = regs
        .iter()
        .filter(|r| r.means != rules::Means::None)
        .map(|r| rules::timing(licence, r).safe_time())
        .max();
    status.registered_agents = Some(regs.len() as i32);
    status.minimum_safe_time_seconds = minimum.map(|m| m.as_secs_f64().ceil() as i64);
    status.membership_epoch = current.and_then(|m| i64::try_from(m.committed.epoch).ok());
    status.members = current.map(|m| m.committed.members.iter().cloned().collect());
    status.proposed_members = current
        .and_then(|m| m.proposed.as_ref())
        .map(|p| p.members.iter().cloned().collect());
    status.fencing_means = Some(
        regs.iter()
            .map(|r| (r.node.clone(), r.means.as_str().to_owned()))
            .collect(),
    );
}

fn count_agents(metrics: &Metrics, regs: &[rules::Registration], minimum_safe_seconds: Option<i64>) {
    for means in [
        rules::Means::HardwareWatchdog,
        rules::Means::Softdog,
        rules::Means::SoftwareReboot,
        rules::Means::None,
    ] {
        let count = regs.iter().filter(|r| r.means == means).count();
        metrics
            .means
            .get_or_create(&super::metrics::MeansLabels { means: means.as_str() })
            .set(count as i64);
    }
    metrics.registered_agents.set(regs.len() as i64);
    metrics.minimum_safe_seconds.set(minimum_safe_seconds.unwrap_or(0));
}

const MEMBERSHIP_SETTLED: &str = "MembershipSettled";

/// `MembershipSettled`: whether a membership change is waiting for acknowledgements, and from
/// whom.
fn set_membership_condition(
    list: &mut Vec<Condition>,
    current: Option<&Membership>,
    regs: &[rules::Registration],
    generation: Option<i64>,
    now: &Time,
) {
    let (status, reason, message) = match current {
        None if regs.iter().any(|r| r.acknowledged > 0) => (
            false,
            "MembershipLost",
            format!(
                "the membership Lease {} is gone while agents count votes in it; self remediation waits and the agent DaemonSet is not re-created until every agent was stopped and every nodemedic-agent-* Lease deleted (see the MembershipLost event)",
                crate::registration::MEMBERSHIP_LEASE
            ),
        ),
        None => (false, "NoAgents", "no agent has registered yet".to_owned()),
        Some(m) => match &m.proposed {
            None => (
                true,
                "Committed",
                format!("epoch {}: {} members", m.committed.epoch, m.committed.members.len()),
            ),
            Some(p) => {
                let waiting: Vec<String> = m
                    .committed
                    .members
                    .iter()
                    .filter(|n| {
                        !regs
                            .iter()
                            .any(|r| &r.node == *n && r.acknowledgement().covers(p.epoch))
                    })
                    .cloned()
                    .collect();
                (
                    false,
                    "Proposed",
                    format!(
                        "epoch {} proposed; waiting for a majority of epoch {} to acknowledge it (not yet: {})",
                        p.epoch,
                        m.committed.epoch,
                        waiting.join(", ")
                    ),
                )
            }
        },
    };
    conditions::set(
        list,
        conditions::Desired {
            type_: MEMBERSHIP_SETTLED,
            status,
            reason,
            message,
        },
        generation,
        now,
    );
}

async fn ensure_daemonset(
    config: &SelfNodeRemediationConfig,
    ctx: &Context,
    on: &k8s_openapi::api::core::v1::ObjectReference,
) -> Result<()> {
    let api = Api::<DaemonSet>::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut desired = daemonset::render(&config.spec, &ctx.namespace, &ctx.install);
    desired.metadata.owner_references = config.controller_owner_ref(&()).map(|o| vec![o]);
    let hash = |d: &DaemonSet| d.annotations().get(daemonset::CONFIG_HASH).cloned();
    let existing = api
        .get_opt(daemonset::NAME)
        .await
        .with_context(|| format!("reading DaemonSet {}/{}", ctx.namespace, daemonset::NAME))?;
    match existing {
        Some(existing) if hash(&existing) == hash(&desired) => return Ok(()),
        Some(existing) if existing.metadata.deletion_timestamp.is_some() => return Ok(()),
        Some(_) => {
            // medik8s re-creates the agents on a config change; so does nodemedic.
            api.delete(daemonset::NAME, &DeleteParams::foreground())
                .await
                .with_context(|| format!("deleting DaemonSet {}/{}", ctx.namespace, daemonset::NAME))?;
            ctx.events
                .normal(
                    on,
                    "AgentsRecreated",
                    "the configuration changed: re-creating the agent DaemonSet",
                )
                .await;
            return Ok(());
        }
        None => {}
    }
    match api.create(&PostParams::default(), &desired).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => {
            let call = format!("creating DaemonSet {}/{}", ctx.namespace, daemonset::NAME);
            Err(nodemedic_kube::Error::call(call, e).into())
        }
    }
}

pub(super) fn error_policy(config: Arc<SelfNodeRemediationConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&super::metrics::ResultLabels {
            result: error.kind().to_owned(),
        })
        .inc();
    nodemedic_kube::steps::retry(config.as_ref(), error, Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use nodemedic_api::self_remediation::SelfNodeRemediationConfigSpec;

    use super::*;

    fn validity(path: &str) -> Condition {
        let spec = SelfNodeRemediationConfigSpec {
            watchdog_file_path: path.to_owned(),
            ..Default::default()
        };
        let config = SelfNodeRemediationConfig::new(CONFIG_NAME, spec);
        let mut list = Vec::new();
        assert!(set_validity(&config, &mut list, &nodemedic_kube::time::now()), "{path}");
        list.into_iter()
            .find(|c| c.type_ == VALID)
            .expect("the Valid condition")
    }

    #[test]
    fn a_watchdog_path_the_agents_refuse_is_a_warning_that_says_how_to_fix_it() {
        let valid = validity("/dev/watchdog");
        assert_eq!((valid.status.as_str(), valid.reason.as_str()), ("True", "Valid"));
        for path in ["lab:/x", "dev/watchdog", "/dev/../watchdog"] {
            let warned = validity(path);
            assert_eq!(
                (warned.status.as_str(), warned.reason.as_str()),
                ("True", "ValidWithWarnings"),
                "{path}"
            );
            assert!(
                warned.message.contains(&format!("watchdogFilePath {path}")),
                "{}",
                warned.message
            );
            assert!(
                warned
                    .message
                    .contains("set an absolute device path such as /dev/watchdog"),
                "{}",
                warned.message
            );
        }
    }
}
