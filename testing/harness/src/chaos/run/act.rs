//! A plan's steps done in a lab, and everything undone at the end whatever the steps managed.

use std::{collections::BTreeSet, path::Path, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig};
use nodemedic_lab::{Event, Lab, NodeSpec, wait};
use serde_json::json;

use crate::chaos::{plan::Action, verdict};
use crate::scenario::{self, LabWatchdog, NS};

/// How long a step `mid_remediation` waits for a remediation in flight.
const MID_REMEDIATION: Duration = Duration::from_secs(40);
/// How much longer than the lab the runner waits for the API after etcd is started again.
const API_BACK: Duration = Duration::from_secs(240);
/// On the extra node, so the scheduler never puts the workload there: a pod on a node that is
/// then removed waits for its volume's force-detach (minutes), which is not what the churn is
/// for. The extra node still votes, and is remediated, like any other.
const EXTRA_TAINT: &str = "chaos.nodemedic.io/extra";

/// What a trial's steps work on.
pub struct Ctx<'a> {
    pub lab: &'a Lab,
    /// The nodemedic binary (an added node's agent runs its sibling).
    pub exe: &'a Path,
    /// Slot -> node.
    pub nodes: &'a [String],
    /// The lab's nodes when the trial started, which it must have again at the end.
    pub originals: &'a [String],
    /// The trial's first step.
    pub since: jiff::Timestamp,
}

/// What the trial left broken, so everything can be healed at the end even if a step failed.
#[derive(Default)]
pub struct Faults {
    bmcs_hung: BTreeSet<String>,
    api_stopped: bool,
    etcd_stopped: bool,
    /// The nodes whose links were slowed.
    slowed: Vec<String>,
}

pub async fn act(ctx: &Ctx<'_>, action: &Action, faults: &mut Faults) -> anyhow::Result<String> {
    let (lab, since) = (ctx.lab, ctx.since);
    let node = |slot: &usize| ctx.nodes.get(*slot).cloned().context("no such node slot");
    match action {
        Action::Crash { node: s } => lab.crash(&node(s)?).await?,
        Action::PowerOn { node: s } => {
            let n = node(s)?;
            if lab.condition(&n)?.powered {
                return Ok(format!("{n} already powered on (fenced and rebooted)"));
            }
            lab.power_on(&n).await?;
        }
        Action::Freeze { node: s } => lab.freeze(&node(s)?).await?,
        Action::Thaw { node: s } => {
            let n = node(s)?;
            if !lab.condition(&n)?.frozen {
                return Ok(format!("{n} already thawed (power-cycled)"));
            }
            lab.thaw(&n).await?;
        }
        Action::Partition { nodes: set } => {
            let names = set.iter().map(node).collect::<anyhow::Result<Vec<_>>>()?;
            lab.partition(&as_strs(&names)).await?;
        }
        Action::IsolateFromApi { node: s } => lab.isolate_from_api(&node(s)?).await?,
        Action::Heal { node: s } => lab.heal(&node(s)?).await?,
        Action::StopApiserver => {
            faults.api_stopped = true;
            lab.stop_apiserver().await?;
        }
        Action::StartApiserver => {
            let line = start_control_plane(lab, Stopped::ApiServer).await?;
            faults.api_stopped = false;
            return Ok(line);
        }
        Action::RestartEtcd => lab.restart_etcd().await?,
        Action::StopEtcd => {
            faults.etcd_stopped = true;
            lab.stop_etcd().await?;
        }
        Action::StartEtcd => {
            let line = start_control_plane(lab, Stopped::Etcd).await?;
            faults.etcd_stopped = false;
            return Ok(line);
        }
        Action::RestartController { mid_remediation } => {
            let waited = in_flight(lab, *mid_remediation, since).await;
            restart_controller(lab)?;
            return Ok(format!("restart controller{waited}"));
        }
        Action::RestartControllerLoop { restarts, every_ms } => {
            let waited = in_flight(lab, true, since).await;
            for i in 0..*restarts {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(*every_ms)).await;
                }
                restart_controller(lab)?;
            }
            return Ok(format!(
                "restart controller {restarts} times, {:.1}s apart{waited}",
                *every_ms as f64 / 1000.0
            ));
        }
        Action::RestartAgent {
            node: s,
            mid_remediation,
        } => {
            let n = node(s)?;
            let waited = in_flight(lab, *mid_remediation, since).await;
            // Restarting the agent of a node that is off or frozen would run it where nothing runs.
            let c = lab.condition(&n)?;
            if !c.powered || c.frozen {
                return Ok(format!("skipped restarting {n}/agent: the node is off or frozen"));
            }
            lab.restart_process(&format!("{n}/agent"))?;
            return Ok(format!("restart {n}/agent{waited}"));
        }
        Action::HangBmc { node: s } => {
            let n = node(s)?;
            lab.hang_bmc(&n).await?;
            faults.bmcs_hung.insert(n);
        }
        Action::ResumeBmc { node: s } => {
            let n = node(s)?;
            lab.resume_bmc(&n).await?;
            faults.bmcs_hung.remove(&n);
        }
        Action::SlowLinks {
            delay_ms,
            jitter_ms,
            loss_permille,
        } => {
            let nodes = lab.nodes();
            faults.slowed.clone_from(&nodes);
            lab.slow_links(
                &as_strs(&nodes),
                Duration::from_millis(*delay_ms),
                Duration::from_millis(*jitter_ms),
                f64::from(*loss_permille) / 10.0,
            )
            .await?;
            return Ok(format!(
                "slow-links {} ({delay_ms} ms ± {jitter_ms} ms, {:.1}% lost)",
                nodes.join(","),
                f64::from(*loss_permille) / 10.0
            ));
        }
        Action::RestoreLinks => {
            lab.restore_links(&as_strs(&faults.slowed)).await?;
            faults.slowed.clear();
        }
        Action::RemoveNode { node: s } => remove_node(ctx, &node(s)?).await?,
        Action::AddNode { node: s } => add_node(ctx, &node(s)?).await?,
    }
    Ok(describe(action, ctx.nodes))
}

/// The lab's fault calls take node names as `&[&str]`.
fn as_strs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

fn describe(action: &Action, nodes: &[String]) -> String {
    let name = |s: &usize| nodes.get(*s).cloned().unwrap_or_else(|| format!("slot {s}"));
    match action {
        Action::Partition { nodes: set } => format!("partition {}", set.iter().map(name).collect::<Vec<_>>().join(",")),
        Action::Crash { node: s }
        | Action::PowerOn { node: s }
        | Action::Freeze { node: s }
        | Action::Thaw { node: s }
        | Action::IsolateFromApi { node: s }
        | Action::Heal { node: s }
        | Action::HangBmc { node: s }
        | Action::ResumeBmc { node: s }
        | Action::RemoveNode { node: s }
        | Action::AddNode { node: s } => format!("{} {}", super::kind(action), name(s)),
        other => super::kind(other),
    }
}

/// The part of the control plane a trial stopped.
#[derive(Clone, Copy, Debug)]
enum Stopped {
    ApiServer,
    Etcd,
}

/// Starts etcd or the API server again and notes when the API answers: after minutes without
/// etcd the API server reconnects on its own backoff, which can take longer than the lab waits
/// (60 s), so then this waits on (up to [`API_BACK`] more) rather than fail the trial.
async fn start_control_plane(lab: &Lab, stopped: Stopped) -> anyhow::Result<String> {
    let started = tokio::time::Instant::now();
    let (what, first) = match stopped {
        Stopped::ApiServer => ("start-apiserver", lab.start_apiserver().await),
        Stopped::Etcd => ("start-etcd", lab.start_etcd().await),
    };
    if let Err(error) = first {
        let api = Api::<Namespace>::all(lab.client());
        wait::until("the API to answer reads", API_BACK, || {
            let api = api.clone();
            async move { Ok(api.get_opt("default").await.ok().flatten().map(|_| ())) }
        })
        .await
        .with_context(|| format!("{what}: {error}; still no answer {API_BACK:?} later"))?;
    }
    lab.timeline().note(verdict::CONTROL_PLANE_BACK);
    Ok(format!(
        "{what} (the API answered after {:.1}s)",
        started.elapsed().as_secs_f64()
    ))
}

/// Restarts the controller and records it: the verdict's remediation budget counts from the
/// controller's last start.
fn restart_controller(lab: &Lab) -> anyhow::Result<()> {
    lab.timeline().record(Event::Fault {
        node: None,
        fault: verdict::CONTROLLER_RESTART.to_owned(),
    });
    lab.restart_process("controller")?;
    Ok(())
}

/// Takes the node out of the cluster; refuses the node running the workload (the plan removes
/// it only before the workload could have moved there).
async fn remove_node(ctx: &Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let pod = Api::<Pod>::namespaced(ctx.lab.client(), "vm").get_opt("db-0").await?;
    if pod.as_ref().map(scenario::node_of).as_deref() == Some(name) {
        anyhow::bail!("{name} runs db-0, and the plan never removes the workload's node");
    }
    ctx.lab.remove_node(name).await?;
    Ok(())
}

/// Adds the node (back) with its agent, as the agent DaemonSet would start one on a new node;
/// a node that is not one of the trial's own is tainted (see [`EXTRA_TAINT`]).
async fn add_node(ctx: &Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let lab = ctx.lab;
    lab.add_node(NodeSpec::control_plane_worker(name)).await?;
    if !ctx.originals.iter().any(|n| n == name) {
        let taint = json!({"spec": {"taints": [{"key": EXTRA_TAINT, "effect": "NoSchedule"}]}});
        Api::<Node>::all(lab.client())
            .patch(name, &PatchParams::default(), &Patch::Strategic(taint))
            .await
            .with_context(|| format!("tainting {name}"))?;
    }
    let config = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS)
        .get(CONFIG_NAME)
        .await
        .context("reading the SelfNodeRemediationConfig")?;
    scenario::start_node_agent(lab, ctx.exe, &config, name, LabWatchdog::Socket)?;
    Ok(())
}

/// Waits (bounded) for a remediation in flight; says how it went.
async fn in_flight(lab: &Lab, wanted: bool, since: jiff::Timestamp) -> String {
    if !wanted {
        return String::new();
    }
    let found = wait::until("a remediation in flight", MID_REMEDIATION, || async {
        Ok(verdict::remediation_in_flight(&lab.timeline().entries(), since).then_some(()))
    })
    .await;
    match found {
        Ok(()) => " (remediation in flight)".into(),
        Err(_) => " (no remediation in flight)".into(),
    }
}

/// Undoes whatever is still broken, whatever the plan did (its own heals may have failed): the
/// control plane first (the rest needs the API), then BMCs and nodes, then the lab's nodes back
/// to those the trial started with.
pub async fn heal_all(ctx: &Ctx<'_>, faults: &Faults, log: &mut Vec<String>, start: tokio::time::Instant) {
    let lab = ctx.lab;
    let mut done: Vec<(String, anyhow::Result<()>)> = Vec::new();
    if faults.api_stopped {
        let started = start_control_plane(lab, Stopped::ApiServer).await;
        done.push(("start-apiserver".to_owned(), started.map(|_| ())));
    }
    if faults.etcd_stopped {
        let started = start_control_plane(lab, Stopped::Etcd).await;
        done.push(("start-etcd".to_owned(), started.map(|_| ())));
    }
    for n in &faults.bmcs_hung {
        done.push((format!("resume-bmc {n}"), lab.resume_bmc(n).await.map_err(Into::into)));
    }
    if !faults.slowed.is_empty() {
        done.push((
            "restore-links".to_owned(),
            lab.restore_links(&as_strs(&faults.slowed)).await.map_err(Into::into),
        ));
    }
    for n in lab.nodes() {
        let Ok(c) = lab.condition(&n) else { continue };
        if c.frozen {
            done.push((format!("thaw {n}"), lab.thaw(&n).await.map_err(Into::into)));
        }
        if c.partitioned || c.api_isolated {
            done.push((format!("heal {n}"), lab.heal(&n).await.map_err(Into::into)));
        }
        if !c.powered {
            done.push((format!("power-on {n}"), lab.power_on(&n).await.map_err(Into::into)));
        }
    }
    let present = lab.nodes();
    for n in ctx.originals.iter().filter(|n| !present.contains(n)) {
        done.push((format!("add-node {n}"), add_node(ctx, n).await));
    }
    for n in present.iter().filter(|n| !ctx.originals.contains(n)) {
        done.push((format!("remove-node {n}"), lab.remove_node(n).await.map_err(Into::into)));
    }
    for (what, outcome) in done {
        let how = outcome.map_or_else(|e| format!(" failed: {e:#}"), |()| String::new());
        log.push(format!("{:>6.1}s final {what}{how}", start.elapsed().as_secs_f64()));
    }
}
