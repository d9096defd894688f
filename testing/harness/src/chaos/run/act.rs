//! A plan's steps done in a lab, and everything undone at the end whatever the steps managed.

use nodemedic_lab::Fault;
use std::{path::Path, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig};
use nodemedic_lab::{Event, Lab, NodeSpec, wait};
use nodemedic_self_remediation::manager::daemonset;
use serde_json::json;

use crate::chaos::{plan::Action, verdict};
use crate::scenario::{self, LabWatchdog, NS};

/// How long deleting pods (a restart on real nodes) is retried.
const POD_DELETION: Duration = Duration::from_secs(30);
/// How long a step `mid_remediation` waits for a remediation in flight.
const MID_REMEDIATION: Duration = Duration::from_secs(40);
/// How much longer than the lab the runner waits for the API after etcd is started again.
const API_BACK: Duration = Duration::from_secs(240);
/// On the extra node, so the scheduler never puts the workload there: a pod on a node that is
/// then removed waits for its volume's force-detach (minutes), which is not what the churn is
/// for. The extra node still votes, and is remediated, like any other.
const EXTRA_TAINT: &str = "chaos.nodemedic.io/extra";

/// What a trial's steps work on.
pub(super) struct Ctx<'a> {
    pub lab: &'a Lab,
    /// The nodemedic binary (an added node's agent runs its sibling).
    pub exe: &'a Path,
    /// Slot -> node.
    pub nodes: &'a [String],
    /// The lab's nodes when the trial started, which it must have again at the end.
    pub originals: &'a [String],
    /// The trial's first step.
    pub since: jiff::Timestamp,
    /// Real nodes: the controller and agents are pods, restarted by deleting them.
    pub real_nodes: bool,
}

/// The faults the trial injected and has not undone yet, so everything can be healed at the end
/// even if a step failed.
#[derive(Default)]
pub(super) struct Faults {
    staying: Vec<Fault>,
}

impl Faults {
    /// Notes an injection: a fault that stays is remembered, one that undoes others forgets them.
    fn record(&mut self, fault: &Fault) {
        if fault.undoing().is_empty() {
            self.staying.retain(|stays| !stays.undoing().contains(fault));
        } else {
            self.staying.push(fault.clone());
        }
    }
}

pub(super) async fn act(ctx: &Ctx<'_>, action: &Action, faults: &mut Faults) -> anyhow::Result<String> {
    let (lab, since) = (ctx.lab, ctx.since);
    let node = |slot: &usize| ctx.nodes.get(*slot).cloned().context("no such node slot");
    match action {
        Action::Fault(fault) => inject(lab, &fault.resolve(node)?, faults).await,
        Action::RestartController { mid_remediation } => {
            let waited = in_flight(lab, *mid_remediation, since).await;
            restart_controller(ctx).await?;
            Ok(format!("restart controller{waited}"))
        }
        Action::RestartControllerLoop { restarts, every_ms } => {
            let waited = in_flight(lab, true, since).await;
            for i in 0..*restarts {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(*every_ms)).await;
                }
                restart_controller(ctx).await?;
            }
            Ok(format!(
                "restart controller {restarts} times, {:.1}s apart{waited}",
                *every_ms as f64 / 1000.0
            ))
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
            lab.timeline().record(Event::Fault {
                node: Some(n.clone()),
                fault: verdict::AGENT_RESTART.to_owned(),
            });
            if ctx.real_nodes {
                delete_pods(
                    lab,
                    &format!("app.kubernetes.io/component={}", daemonset::NAME),
                    Some(&n),
                )
                .await?;
                return Ok(format!("delete {n}'s agent pod{waited}"));
            }
            lab.restart_process(&format!("{n}/agent"))?;
            Ok(format!("restart {n}/agent{waited}"))
        }
        Action::RemoveNode { node: s } => {
            let n = node(s)?;
            remove_node(ctx, &n).await?;
            Ok(format!("remove-node {n}"))
        }
        Action::AddNode { node: s } => {
            let n = node(s)?;
            add_node(ctx, &n).await?;
            Ok(format!("add-node {n}"))
        }
        Action::Upgrade { announced } => announce_upgrade(lab, *announced),
    }
}

/// The annotation an upgrade tool sets on every node (README, "Cluster upgrades"); the note
/// after it is set and before it is removed, so the verdict never blames a remediation on an
/// announcement the health check could not have seen.
fn announce_upgrade(lab: &Lab, announced: bool) -> anyhow::Result<String> {
    const ANNOTATION: &str = nodemedic_healthcheck::decide::upgrade::UPGRADE_ANNOTATION;
    if announced {
        lab.kubectl(&[
            "annotate",
            "nodes",
            "--all",
            "--overwrite",
            &format!("{ANNOTATION}=chaos: rolling reboots"),
        ])
        .context("announcing the upgrade")?;
        lab.timeline().note(verdict::UPGRADE_ANNOUNCED);
        Ok("announce-upgrade (every node annotated)".into())
    } else {
        lab.timeline().note(verdict::UPGRADE_WITHDRAWN);
        lab.kubectl(&["annotate", "nodes", "--all", &format!("{ANNOTATION}-")])
            .context("withdrawing the upgrade")?;
        Ok("end-upgrade (the annotation removed)".into())
    }
}

/// Injects a lab fault, with what a campaign adds: a node already powered on (fenced and
/// rebooted) or thawed (power-cycled) is left as it is, and the control plane's start (or etcd's
/// restart) waits longer than the lab does (see [`start_control_plane`]).
async fn inject(lab: &Lab, fault: &Fault, faults: &mut Faults) -> anyhow::Result<String> {
    let line = match fault {
        Fault::PowerOn { node } if lab.condition(node)?.powered => {
            format!("{node} already powered on (fenced and rebooted)")
        }
        Fault::Thaw { node } if !lab.condition(node)?.frozen => format!("{node} already thawed (power-cycled)"),
        Fault::StartApiserver | Fault::StartEtcd | Fault::RestartEtcd => start_control_plane(lab, fault).await?,
        _ => {
            lab.inject(fault).await?;
            fault.to_string()
        }
    };
    faults.record(fault);
    Ok(line)
}

/// Starts etcd or the API server again (`fault`: start-etcd, start-apiserver or restart-etcd)
/// and notes when the API answers (the verdict counts every node cut off from the API until
/// then): after minutes without etcd the API server reconnects on its own backoff,
/// which can take longer than the lab waits (60 s), so then this waits on (up to [`API_BACK`]
/// more) rather than fail the trial.
async fn start_control_plane(lab: &Lab, fault: &Fault) -> anyhow::Result<String> {
    let started = tokio::time::Instant::now();
    if let Err(error) = lab.inject(fault).await {
        let api = Api::<Namespace>::all(lab.client());
        wait::until("the API to answer reads", API_BACK, || {
            let api = api.clone();
            async move { Ok(api.get_opt("default").await.ok().flatten().map(|_| ())) }
        })
        .await
        .with_context(|| format!("{fault}: {error}; still no answer {API_BACK:?} later"))?;
    }
    lab.timeline().note(verdict::CONTROL_PLANE_BACK);
    Ok(format!(
        "{fault} (the API answered after {:.1}s)",
        started.elapsed().as_secs_f64()
    ))
}

/// Restarts the controller and records it: the verdict's remediation budget counts from the
/// controller's last start. On real nodes both replicas' pods are deleted, as `kubectl delete`
/// does (their Deployment starts new ones).
async fn restart_controller(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    ctx.lab.timeline().record(Event::Fault {
        node: None,
        fault: verdict::CONTROLLER_RESTART.to_owned(),
    });
    if ctx.real_nodes {
        return delete_pods(ctx.lab, "app.kubernetes.io/component=controller", None).await;
    }
    ctx.lab.restart_process("controller")?;
    Ok(())
}

/// Deletes nodemedic's pods with `labels` (on `node` only, if given), gracefully; retried for a
/// while, as the step may come right after the API server or etcd restarted. Deleting nothing is
/// an error: the step would restart nothing.
async fn delete_pods(lab: &Lab, labels: &str, node: Option<&str>) -> anyhow::Result<()> {
    let mut selection = ListParams::default().labels(labels);
    if let Some(node) = node {
        selection = selection.fields(&format!("spec.nodeName={node}"));
    }
    let pods = Api::<Pod>::namespaced(lab.client(), NS);
    let what = format!("deleting the pods {labels} on {}", node.unwrap_or("any node"));
    wait::until(&what, POD_DELETION, || {
        let (pods, selection) = (pods.clone(), selection.clone());
        async move {
            let deleted = pods
                .delete_collection(&DeleteParams::default(), &selection)
                .await?
                .left()
                .map_or(0, |list| list.items.len());
            Ok((deleted > 0).then_some(()))
        }
    })
    .await?;
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
    scenario::start_node_agent(lab, ctx.exe, &config, name, LabWatchdog::Device)?;
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
/// control plane first (the rest needs the API), then every other fault that stays but the
/// nodes' own, then the nodes as their conditions say, then the lab's nodes back to those the
/// trial started with.
pub(super) async fn heal_all(ctx: &Ctx<'_>, faults: &Faults, log: &mut Vec<String>, start: tokio::time::Instant) {
    let lab = ctx.lab;
    let mut done: Vec<(String, anyhow::Result<()>)> = Vec::new();
    let (control_plane, others): (Vec<&Fault>, Vec<&Fault>) = faults
        .staying
        .iter()
        .partition(|f| matches!(f, Fault::StopApiserver | Fault::StopEtcd));
    for start in control_plane.iter().flat_map(|stopped| stopped.undoing()) {
        let started = start_control_plane(lab, &start).await;
        done.push((start.to_string(), started.map(|_| ())));
    }
    for fault in others.into_iter().filter(|f| !of_a_node_condition(f)) {
        done.push((format!("undo {fault}"), lab.undo(fault).await.map_err(Into::into)));
    }
    for n in lab.nodes() {
        let Ok(c) = lab.condition(&n) else { continue };
        let node = || n.clone();
        let undo = [
            (c.frozen, Fault::Thaw { node: node() }),
            (c.partitioned || c.api_isolated, Fault::Heal { node: node() }),
            (!c.powered, Fault::PowerOn { node: node() }),
            (c.disk_full, Fault::FreeDisk { node: node() }),
        ];
        for (_, fault) in undo.into_iter().filter(|(broken, _)| *broken) {
            done.push((fault.to_string(), lab.inject(&fault).await.map_err(Into::into)));
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

/// A fault whose undoing [`heal_all`] reads from the node's condition (a node fenced and
/// rebooted meanwhile is already powered on and thawed).
fn of_a_node_condition(fault: &Fault) -> bool {
    matches!(
        fault,
        Fault::Crash { .. }
            | Fault::PowerOff { .. }
            | Fault::Freeze { .. }
            | Fault::Partition { .. }
            | Fault::IsolateFromApi { .. }
            | Fault::FillDisk { .. }
    )
}
