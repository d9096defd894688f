//! The Poison Pill bridge: each PoisonPillRemediation carried out by the SelfNodeRemediation of
//! the same name (created, kept marked as the health check marks the original, its progress
//! copied back, deleted with it), and a PoisonPillConfig's fields applied to the
//! SelfNodeRemediationConfig. What to write is decided in [`crate::poison_pill`].

use std::{sync::Arc, time::Duration};

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::controller::Action,
};
use nodemedic_api::{
    poison_pill::{CONFIG_NAME as POISON_PILL_CONFIG, PoisonPillConfig, PoisonPillRemediation},
    self_remediation::{CONFIG_NAME, SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_kube::{CallContext, conditions, events::Events, finalizers};

use crate::{
    Error, Result,
    poison_pill::{
        CARRIER_FINALIZER, CONFIG_FIELD_MANAGER, carried_for_another, carrier, carrier_patch, carries, status_of,
    },
};

pub(super) struct Context {
    pub client: Client,
    pub namespace: String,
    pub events: Events,
}

pub(super) async fn reconcile(ppr: Arc<PoisonPillRemediation>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = ppr.namespace().unwrap_or_default();
    let name = ppr.name_any();
    let pprs = Api::<PoisonPillRemediation>::namespaced(ctx.client.clone(), &namespace);
    let snrs = Api::<SelfNodeRemediation>::namespaced(ctx.client.clone(), &namespace);
    let on = nodemedic_kube::events::reference(ppr.as_ref());
    let existing = snrs
        .get_opt(&name)
        .await
        .with_context(|| format!("reading SelfNodeRemediation {namespace}/{name}"))?;

    if ppr.meta().deletion_timestamp.is_some() {
        return match existing {
            Some(snr) if carries(&snr, &ppr) => {
                if snr.meta().deletion_timestamp.is_none() {
                    snrs.delete(&name, &DeleteParams::default())
                        .await
                        .with_context(|| format!("deleting SelfNodeRemediation {namespace}/{name}"))?;
                    ctx.events
                        .normal(
                            &on,
                            "CarrierDeleted",
                            format!(
                                "deleted SelfNodeRemediation {namespace}/{name}; waiting until its node is released"
                            ),
                        )
                        .await;
                }
                // Its deletion wakes this reconcile (owned objects are watched).
                Ok(Action::requeue(Duration::from_secs(30)))
            }
            _ => {
                finalizers::remove(&pprs, &ppr, CARRIER_FINALIZER).await?;
                Ok(Action::await_change())
            }
        };
    }
    // Go on with what the API returned: the cache may not have the finalizer yet.
    let ppr = if finalizers::has(ppr.as_ref(), CARRIER_FINALIZER) {
        ppr
    } else {
        Arc::new(finalizers::add(&pprs, &ppr, CARRIER_FINALIZER).await?)
    };

    match existing {
        None => {
            snrs.create(&PostParams::default(), &carrier(&ppr))
                .await
                .with_context(|| format!("creating SelfNodeRemediation {namespace}/{name}"))?;
            tracing::info!(remediation = %name, %namespace, "PoisonPillRemediation carried out as a SelfNodeRemediation");
            ctx.events
                .normal(&on, "CarrierCreated", format!("carried out as SelfNodeRemediation {namespace}/{name} (Poison Pill is Self Node Remediation's former name)"))
                .await;
        }
        // An earlier remediation's carrier, still releasing its node: this one starts after it.
        Some(snr) if !carries(&snr, &ppr) && snr.meta().deletion_timestamp.is_some() => {
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        // The carrier of an earlier PoisonPillRemediation of this name, left behind (its owner
        // was deleted without waiting for it): it is released first, then this one starts.
        Some(snr) if carried_for_another(&snr, &ppr) => {
            snrs.delete(&name, &DeleteParams::default()).await.with_context(|| {
                format!("deleting SelfNodeRemediation {namespace}/{name}, left by an earlier PoisonPillRemediation")
            })?;
            ctx.events
                .normal(&on, "StaleCarrierDeleted", format!("deleted SelfNodeRemediation {namespace}/{name}, left by an earlier PoisonPillRemediation of this name; this one starts once it is gone"))
                .await;
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        Some(snr) if !carries(&snr, &ppr) => {
            let why = format!(
                "SelfNodeRemediation {namespace}/{name} exists and is not this PoisonPillRemediation's; delete one of the two"
            );
            ctx.events.warning(&on, "NameTaken", why.clone()).await;
            nodemedic_kube::status::write(&pprs, ppr.as_ref(), |s, now| {
                let list = s.conditions.get_or_insert_with(Vec::new);
                let changed = conditions::set_finished(list, false, "NameTaken", &why, now);
                let error_changed = s.last_error.as_deref() != Some(why.as_str());
                s.last_error = Some(why.clone());
                changed | error_changed
            })
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
        Some(snr) => {
            if let Some(patch) = carrier_patch(&ppr, &snr) {
                snrs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| {
                        format!("marking SelfNodeRemediation {namespace}/{name} as its PoisonPillRemediation")
                    })?;
            }
            let copied = status_of(&snr);
            let before = ppr.status.clone().unwrap_or_default();
            if before != copied {
                if let Some(phase) = copied.phase.as_deref().filter(|p| before.phase.as_deref() != Some(*p)) {
                    ctx.events.normal(&on, "PhaseChanged", format!("phase {phase}")).await;
                }
                nodemedic_kube::status::replace(&pprs, ppr.as_ref(), copied).await?;
            }
        }
    }
    Ok(Action::await_change())
}

/// A PoisonPillConfig in the manager's namespace: its fields set on the SelfNodeRemediationConfig
/// (owned by their own field manager, so a later edit of either is visible in managedFields).
pub(super) async fn reconcile_config(config: Arc<PoisonPillConfig>, ctx: Arc<Context>) -> Result<Action> {
    if config.name_any() != POISON_PILL_CONFIG || config.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let body = crate::poison_pill::config_fields(CONFIG_NAME, &config.spec);
    Api::<SelfNodeRemediationConfig>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch(
            CONFIG_NAME,
            &PatchParams::apply(CONFIG_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .with_context(|| {
            format!("applying PoisonPillConfig {POISON_PILL_CONFIG} to SelfNodeRemediationConfig {CONFIG_NAME}")
        })?;
    let api = Api::<PoisonPillConfig>::namespaced(ctx.client.clone(), &ctx.namespace);
    let written = nodemedic_kube::status::write(&api, config.as_ref(), |status, now| {
        conditions::set(
            status.conditions.get_or_insert_with(Vec::new),
            conditions::Desired {
                type_: "Applied",
                status: true,
                reason: "AppliedToSelfNodeRemediationConfig",
                message: format!(
                    "watchdogFilePath, safeTimeToAssumeNodeRebootedSeconds and isSoftwareRebootEnabled set on SelfNodeRemediationConfig {CONFIG_NAME}, which the agents read"
                ),
            },
            config.metadata.generation,
            now,
        )
    })
    .await;
    match written {
        Ok(true) => {
            ctx.events
                .normal(
                    &nodemedic_kube::events::reference(config.as_ref()),
                    "Applied",
                    format!("applied to SelfNodeRemediationConfig {CONFIG_NAME}"),
                )
                .await;
        }
        Ok(false) => {}
        Err(error) => return nodemedic_kube::status::requeue_on_conflict(config.as_ref(), error),
    }
    Ok(Action::await_change())
}

pub(super) fn error_policy<K: Resource<DynamicType = ()>>(object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    nodemedic_kube::steps::retry(object.as_ref(), error, Duration::from_secs(2))
}
