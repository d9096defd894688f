//! What one decision reads, gathered from the API.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use nodemedic_api::{
    names::{annotations, conditions, finalizers, labels, taints as keys},
    self_remediation::{CONFIG_NAME, RemediationStrategy, SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_kube::{CallContext, taints, workloads};

use super::Context;
use crate::{
    Error, Result,
    decide::{Applied, Facts, Phase},
    manager::daemonset,
    protocol::{
        Timing, manager as rules,
        wait::{self, LocalWait, RecordedWait},
    },
};

pub(crate) struct Observed {
    pub facts: Facts,
    pub node: String,
    pub acceptance: rules::Acceptance,
    pub safe_time: Duration,
    pub adjusted_from: Option<Duration>,
}

pub(super) use crate::remediation_object::node_of;

/// The safe time a begun wait was set to (its assumed-rebooted time less its start).
fn recorded_safe_time(snr: &SelfNodeRemediation) -> Option<Duration> {
    let status = snr.status.as_ref()?;
    let started = status.wait_started_at.as_ref()?.0;
    let until = status.time_assumed_rebooted.as_ref()?.0;
    Duration::try_from(until.duration_since(started)).ok()
}

/// The wait a remediation's status records.
fn recorded_wait(snr: &SelfNodeRemediation) -> Option<RecordedWait> {
    let status = snr.status.as_ref()?;
    Some(RecordedWait {
        started: status.wait_started_at.as_ref()?.0,
        epoch: u64::try_from(status.membership_epoch?).ok()?,
    })
}

pub(super) async fn observe(snr: &SelfNodeRemediation, ctx: &Context) -> Result<Observed> {
    let node_name = node_of(snr).ok_or_else(|| Error::Unresolved(snr.name_any()))?;
    let uid = snr.uid().ok_or(Error::Unnamed("SelfNodeRemediation"))?;
    let config = Api::<SelfNodeRemediationConfig>::namespaced(ctx.client.clone(), &ctx.namespace)
        .get_opt(CONFIG_NAME)
        .await
        .with_context(|| format!("reading SelfNodeRemediationConfig {}/{CONFIG_NAME}", ctx.namespace))?
        .filter(|c| c.metadata.deletion_timestamp.is_none());
    let has_config = config.is_some();
    let config = config.map(|c| c.spec).unwrap_or_default();
    let settings = daemonset::licence_settings(&config)?;
    // How long the wait has run is measured before the membership is read: a wait counts only
    // up to a moment at which the membership is known unchanged.
    let phase = Phase::parse(snr.status.as_ref().and_then(|s| s.phase.as_deref()));
    let local = ctx
        .observed
        .lock()
        .map_err(|_| Error::Poisoned)?
        .get(&uid)
        .map(|(since, epoch)| LocalWait {
            elapsed: since.elapsed(),
            epoch: *epoch,
        });
    let recorded = recorded_wait(snr);
    // A wait this process did not see begin is continued on the API server's clock.
    let server_now = if phase == Phase::PreRebootCompleted && recorded.is_some() && local.is_none() {
        match nodemedic_kube::time::server_now(&ctx.client).await {
            Ok(now) => Some(now),
            Err(error) => {
                tracing::warn!(%error, "cannot read the API server's clock; the wait starts again");
                None
            }
        }
    } else {
        None
    };
    let node = Api::<Node>::all(ctx.client.clone())
        .get_opt(&node_name)
        .await
        .with_context(|| format!("reading node {node_name}"))?;
    let read = crate::manager::membership::read(&ctx.client, &ctx.namespace).await?;
    let (regs, membership) = (read.registrations, read.membership);
    let acceptance = rules::acceptance(&node_name, &uid, &regs, membership.as_ref());
    let timing = regs
        .iter()
        .find(|r| r.node == node_name)
        .map(|own| rules::timing(settings.licence(), own))
        .unwrap_or(Timing {
            licence: settings.licence(),
            watchdog: Duration::from_secs(60),
        });
    let configured = config
        .safe_time_to_assume_node_rebooted_seconds
        .map(|s| Duration::from_secs(s.max(0) as u64));
    // Never shorter than the wait already begun: the node's agent may have restarted since with
    // a shorter watchdog or licence, which bounds its new process, not the old one.
    let minimum = timing.safe_time().max(recorded_safe_time(snr).unwrap_or_default());
    let (safe_time, adjusted_from) = rules::safe_time(minimum, configured);
    let node_taints = node
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let strategy = match snr.spec.remediation_strategy {
        RemediationStrategy::ResourceDeletion => Applied::ResourceDeletion,
        RemediationStrategy::OutOfServiceTaint => Applied::OutOfServiceTaint,
        RemediationStrategy::Automatic if ctx.out_of_service => Applied::OutOfServiceTaint,
        RemediationStrategy::Automatic => Applied::ResourceDeletion,
    };
    let accepted_for = wait::waited(local, recorded, server_now, acceptance.epoch);
    let (pods_left, attachments_left) = if phase >= Phase::RebootCompleted {
        (
            workloads::pods(&ctx.client, &node_name).await?.len(),
            workloads::attachments(&ctx.client, &node_name).await?.len(),
        )
    } else {
        (0, 0)
    };
    let facts = Facts {
        deleting: snr.metadata.deletion_timestamp.is_some(),
        has_finalizer: snr.finalizers().iter().any(|f| f == finalizers::SNR),
        configured: has_config,
        disabled_reported: snr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .and_then(|c| nodemedic_kube::conditions::find(c, conditions::DISABLED))
            .is_some_and(|c| c.status == "True"),
        timed_out: snr.annotations().contains_key(annotations::NHC_TIMED_OUT),
        node_exists: node.is_some(),
        excluded: node.as_ref().is_some_and(|n| {
            n.labels()
                .get(labels::EXCLUDE_FROM_REMEDIATION)
                .is_some_and(|v| v == "true")
        }),
        phase,
        cannot_fence: rules::cannot_fence(
            &node_name,
            &regs,
            config.is_software_reboot_enabled,
            config.min_peers_for_remediation.max(0) as usize,
        ),
        target_disarmed: regs.iter().any(|r| r.node == node_name && r.disarmed),
        acceptance_met: acceptance.met,
        accepted_for,
        safe_time,
        no_schedule_taint: taints::has(&node_taints, keys::SNR_KEY, "NoSchedule"),
        out_of_service_taint: taints::has(&node_taints, keys::OUT_OF_SERVICE_KEY, "NoExecute"),
        strategy,
        pods_left,
        attachments_left,
    };
    Ok(Observed {
        facts,
        node: node_name,
        acceptance,
        safe_time,
        adjusted_from,
    })
}
