//! A deliberate stop (SIGTERM: the DaemonSet rolls or is deleted, the node shuts down) may close
//! the watchdog (the magic close) only when nothing can be counting on it:
//!
//! 0. the licence loop stops between rounds, so no registration write of its own is in flight,
//!    and the agent stops voting: a disarmed registration counts as having acknowledged every
//!    membership epoch, which is true only of an agent that votes for no one;
//! 1. the registration says `disarmed` first, so from then on the manager treats the node as one
//!    that cannot fence itself (a remediation created later reports `Succeeded=False` and an
//!    escalating health check moves on; one already waiting stops before releasing anything);
//! 2. a fresh read, made after that write, shows no remediation of this node: any remediation the
//!    manager could still act on without seeing the flag existed before the write, so this read
//!    would show it;
//! 3. only then the feeder thread closes the watchdog.
//!
//! If any step fails the watchdog stays armed and resets the node when it runs out: an agent that
//! cannot prove it is safe to stop quietly does not.

use std::{sync::mpsc, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use nodemedic_kube::CallContext;
use serde_json::json;
use tokio::sync::oneshot;

use super::{AgentArgs, licence};
use crate::{Result, registration};

/// How long a stopping agent waits for its current licence round (an API read with its own
/// timeout, a vote round, a registration write) to end.
pub(super) const ROUND_GRACE: Duration = Duration::from_secs(20);

/// What the async side asks the feeder thread: close the watchdog, and say how it went.
pub(super) type DisarmRequest = oneshot::Sender<std::result::Result<(), String>>;

pub(super) async fn stop(
    args: &AgentArgs,
    client: &Client,
    fast: &Client,
    state: &super::shared::SharedState,
    incarnation: &str,
    feeder: &mpsc::Sender<DisarmRequest>,
) {
    tracing::info!("stopping: the watchdog is closed only if no remediation of this node exists");
    match state.lock() {
        Ok(mut s) => s.stop_voting(),
        Err(_) => {
            tracing::warn!("the agent state is poisoned; the watchdog stays armed");
            return;
        }
    }
    if let Err(error) = publish_disarmed(client, &args.namespace, &args.node, incarnation).await {
        tracing::warn!(%error, "cannot record the disarm; the watchdog stays armed and resets the node when it runs out");
        return;
    }
    match remediated(fast, args).await {
        Ok(false) => {}
        Ok(true) => {
            tracing::warn!("this node is being remediated: the watchdog stays armed");
            return;
        }
        Err(error) => {
            tracing::warn!(%error, "cannot check for a remediation of this node; the watchdog stays armed");
            return;
        }
    }
    let (reply, answer) = oneshot::channel();
    if feeder.send(reply).is_err() {
        tracing::warn!("the watchdog feeder is gone; the watchdog stays armed");
        return;
    }
    match tokio::time::timeout(Duration::from_secs(5), answer).await {
        Ok(Ok(Ok(()))) => tracing::info!("watchdog closed (magic close); the registration says so"),
        Ok(Ok(Err(why))) => tracing::warn!(%why, "the watchdog stays armed"),
        _ => tracing::warn!("the watchdog feeder did not answer; the watchdog stays armed"),
    }
}

/// Marks the registration disarmed, only if it is still this process's: a write that stalled
/// and landed after a restarted agent had cleared the flag would count that live agent as
/// having acknowledged every epoch.
async fn publish_disarmed(client: &Client, namespace: &str, node: &str, incarnation: &str) -> Result<()> {
    use json_patch::{PatchOperation, ReplaceOperation, TestOperation, jsonptr::PointerBuf};
    let annotation = |key: &str| PointerBuf::from_tokens(["metadata", "annotations", key]);
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: annotation(registration::INCARNATION),
            value: json!(incarnation),
        }),
        PatchOperation::Replace(ReplaceOperation {
            path: annotation(registration::DISARMED),
            value: json!("true"),
        }),
    ]);
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let name = registration::lease_name(node);
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        // Never registered: nothing counts on this node's watchdog.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other
            .map(|_| ())
            .with_context(|| format!("marking registration Lease {namespace}/{name} disarmed"))
            .map_err(Into::into),
    }
}

async fn remediated(fast: &Client, args: &AgentArgs) -> Result<bool> {
    let booted = super::register::boot_time(args.boot_time_file.as_deref());
    let intents = licence::read_intents(fast).await?;
    Ok(intents.iter().any(|i| i.node == args.node && !i.over_for(booted)))
}
