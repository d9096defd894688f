//! One drain pass: evict (or delete) every pod still to go, and report the ones a
//! PodDisruptionBudget (or anything else) keeps for now.

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, EvictParams},
};
use nodemedic_api::maintenance::BlockedPod;

use super::{Context, metrics::Metrics, observe::Observed};
use crate::{
    Result,
    decide::drain::{Fate, fate},
};

#[derive(Default)]
pub(super) struct Pass {
    pub blocked: Vec<BlockedPod>,
}

pub(super) async fn pass(ctx: &Context, observed: &Observed) -> Result<Pass> {
    let mut out = Pass::default();
    for (pod, facts) in observed.to_remove() {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let api = Api::<Pod>::namespaced(ctx.evictions.clone(), &facts.namespace);
        let (result, call) = match fate(&facts) {
            Fate::Stay => continue,
            // The eviction client does not retry: a 429 from a budget comes straight back here
            // instead of hanging in the client's backoff.
            Fate::Evict => (
                api.evict(&pod.name_any(), &EvictParams::default())
                    .await
                    .map(|_| "evicted"),
                "evicting",
            ),
            Fate::Delete => (
                api.delete(&pod.name_any(), &DeleteParams::default())
                    .await
                    .map(|_| "deleted"),
                "deleting",
            ),
        };
        let outcome = match result {
            Ok(done) => done,
            Err(kube::Error::Api(s)) if s.code == 404 => "gone",
            // 429: a budget allows no disruption now; 500: the pod matches several budgets;
            // others (a terminating namespace, a webhook): all say why in the message.
            Err(kube::Error::Api(s)) => {
                out.blocked.push(BlockedPod {
                    namespace: facts.namespace.clone(),
                    name: facts.name.clone(),
                    reason: s.message.clone(),
                });
                "blocked"
            }
            Err(e) => {
                let call = format!("{call} pod {}/{}", facts.namespace, facts.name);
                return Err(nodemedic_kube::Error::call(call, e).into());
            }
        };
        tracing::debug!(pod = %format!("{}/{}", facts.namespace, facts.name), outcome, "drain");
        Metrics::count(&ctx.metrics.evictions, outcome);
    }
    Ok(out)
}

/// One line naming the blocked pods and why, for lastError and events.
pub(super) fn summary(blocked: &[BlockedPod]) -> String {
    let pods: Vec<String> = blocked
        .iter()
        .map(|b| format!("{}/{} ({})", b.namespace, b.name, b.reason))
        .collect();
    format!("{} pods cannot be evicted yet: {}", blocked.len(), pods.join("; "))
}
