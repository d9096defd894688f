//! The Poison Pill kinds (`medik8s.io/v1alpha1`) as self remediation: each PoisonPillRemediation
//! is carried out by a SelfNodeRemediation of the same name that it owns (the same agents, the
//! same protocol), whose progress is copied back; a PoisonPillConfig's fields are applied to
//! the SelfNodeRemediationConfig. Pure functions over the objects: the manager's bridge
//! (`manager::poison_pill`) reads and writes them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt, api::ObjectMeta};
use nodemedic_api::{
    machines,
    poison_pill::{PoisonPillConfigSpec, PoisonPillRemediation, PoisonPillRemediationStatus},
    self_remediation::{SelfNodeRemediation, SelfNodeRemediationSpec},
};
use serde_json::{Value, json};

/// Holds a PoisonPillRemediation until its carrier is gone, as the SelfNodeRemediation's own
/// finalizer holds it until the node's taints are removed: a health check that sees the
/// remediation gone may start the next one.
pub(crate) const CARRIER_FINALIZER: &str = "medik8s.io/poison-pill-carrier";

/// The field manager that owns the SelfNodeRemediationConfig fields a PoisonPillConfig sets.
pub(crate) const CONFIG_FIELD_MANAGER: &str = "nodemedic-poison-pill-config";

/// The SelfNodeRemediation that carries out `ppr`: its name, namespace, labels and annotations
/// (the health check's node name and timed-out marks among them), its strategy, owned by it
/// and by the Machine that owns it, if any (whose node the manager then resolves).
pub(crate) fn carrier(ppr: &PoisonPillRemediation) -> SelfNodeRemediation {
    let mut owners = vec![owned_by(ppr)];
    owners.extend(
        ppr.owner_references()
            .iter()
            .filter(|o| o.kind == machines::MACHINE_KIND)
            .map(|o| OwnerReference {
                controller: Some(false),
                block_owner_deletion: None,
                ..o.clone()
            }),
    );
    SelfNodeRemediation {
        metadata: ObjectMeta {
            name: ppr.metadata.name.clone(),
            namespace: ppr.metadata.namespace.clone(),
            labels: ppr.metadata.labels.clone(),
            annotations: ppr.metadata.annotations.clone(),
            owner_references: Some(owners),
            ..Default::default()
        },
        spec: SelfNodeRemediationSpec {
            remediation_strategy: ppr.spec.remediation_strategy.self_remediation(),
        },
        status: None,
    }
}

fn owned_by(ppr: &PoisonPillRemediation) -> OwnerReference {
    OwnerReference {
        api_version: PoisonPillRemediation::api_version(&()).into_owned(),
        kind: PoisonPillRemediation::kind(&()).into_owned(),
        name: ppr.name_any(),
        uid: ppr.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `snr` carries out `ppr` (and not an earlier remediation of the same name).
pub(crate) fn carries(snr: &SelfNodeRemediation, ppr: &PoisonPillRemediation) -> bool {
    let uid = ppr.uid();
    snr.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// Whether `snr` carries out a PoisonPillRemediation other than `ppr` (an earlier one of the
/// same name): another PoisonPillRemediation controls it.
pub(crate) fn carried_for_another(snr: &SelfNodeRemediation, ppr: &PoisonPillRemediation) -> bool {
    let uid = ppr.uid();
    snr.owner_references().iter().any(|o| {
        o.controller == Some(true) && o.kind == PoisonPillRemediation::kind(&()) && Some(&o.uid) != uid.as_ref()
    })
}

/// The annotations and labels of `ppr` its carrier lacks or holds otherwise, as a merge patch
/// (the health check marks a remediation timed out after it was created). What the manager
/// added to the carrier itself stays.
pub(crate) fn carrier_patch(ppr: &PoisonPillRemediation, snr: &SelfNodeRemediation) -> Option<Value> {
    let missing = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        want.iter()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let annotations = missing(ppr.annotations(), snr.annotations());
    let labels = missing(ppr.labels(), snr.labels());
    (!annotations.is_empty() || !labels.is_empty())
        .then(|| json!({"metadata": {"annotations": annotations, "labels": labels}}))
}

/// The PoisonPillRemediation's status: its carrier's.
pub(crate) fn status_of(snr: &SelfNodeRemediation) -> PoisonPillRemediationStatus {
    let status = snr.status.clone().unwrap_or_default();
    PoisonPillRemediationStatus {
        phase: status.phase,
        time_assumed_rebooted: status.time_assumed_rebooted,
        last_error: status.last_error,
        conditions: status.conditions,
    }
}

/// The SelfNodeRemediationConfig fields a PoisonPillConfig sets, as a server-side apply body.
pub(crate) fn config_fields(name: &str, spec: &PoisonPillConfigSpec) -> Value {
    json!({
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
        "kind": "SelfNodeRemediationConfig",
        "metadata": {"name": name},
        "spec": {
            "watchdogFilePath": spec.watchdog_file_path,
            "safeTimeToAssumeNodeRebootedSeconds": spec.safe_time_to_assume_node_rebooted_seconds,
            "isSoftwareRebootEnabled": spec.is_software_reboot_enabled,
        }
    })
}

#[cfg(test)]
mod tests;
