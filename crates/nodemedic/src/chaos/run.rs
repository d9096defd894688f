//! Running trial plans in labs: one lab per shape, kept for consecutive trials of that shape
//! while it stays sound; per trial, the faults at their times, everything healed, a bounded wait
//! for recovery, then the verdict. `nodemedic chaos` and the end-to-end test run this.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{Api, api::ListParams};
use nodemedic_api::{fence_agents::FenceAgentsRemediation, names::leases, self_remediation::SelfNodeRemediation};
use nodemedic_healthcheck::decide::{Budget, IntOrPercent};
use nodemedic_kube::node_lease;
use nodemedic_lab::{BmcOptions, Event, Lab, LabConfig, NodeSpec, PowerDelays, wait};
use serde::Serialize;
use serde_json::json;

use super::{
    plan::{self, Action, PathKind, Shape, Strategy, TrialPlan},
    verdict::{self, NodeSnapshot, Params, Snapshot, Violation, ViolationKind},
};
use crate::scenario::{self, NS};

const TEMPLATE: &str = "chaos";
/// The health check's unhealthy durations in the lab (the seed's 10 s, shortened as the bench's
/// fast profile does).
const UNHEALTHY_FOR: Duration = Duration::from_secs(5);
/// The seed health checks' `minHealthy`.
const BUDGET: Budget = Budget::MinHealthy(IntOrPercent::Percent(51));
/// Recovery can include a reboot, the safe time and the attach-detach controller's periodic
/// sync (about a minute with ResourceDeletion).
const RECOVERY: Duration = Duration::from_secs(300);
const CLEANUP: Duration = Duration::from_secs(60);
const MID_REMEDIATION: Duration = Duration::from_secs(40);
const POD: &str = "vm/db-0";

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialResult {
    pub plan: TrialPlan,
    /// Slot -> node, as resolved when the trial started.
    pub nodes: Vec<String>,
    /// What was done, with seconds since the first step.
    pub log: Vec<String>,
    pub violations: Vec<Violation>,
    /// First step to the workload last seen Running (None: it never stopped being Running).
    pub workload_back_seconds: Option<f64>,
    /// First step to every node Ready, the workload Running and no remediation left.
    pub all_healthy_seconds: Option<f64>,
    /// The trial could not run as planned (a lab that did not start, a fault that failed).
    pub error: Option<String>,
    pub replay: String,
    /// Where the lab's logs were kept (a trial with a violation or an error keeps them).
    pub logs: Option<PathBuf>,
}

/// Runs trials; keeps the last lab for the next trial of its shape.
pub struct Runner {
    exe: PathBuf,
    lab: Option<(Shape, Lab)>,
    /// The `--nodes` restriction, repeated in replay commands.
    nodes_option: Option<usize>,
}

impl Runner {
    /// `exe`: the nodemedic binary the lab's controller and agents run.
    pub fn new(exe: &Path, nodes_option: Option<usize>) -> Self {
        Self {
            exe: exe.to_owned(),
            lab: None,
            nodes_option,
        }
    }

    pub async fn trial(&mut self, plan: &TrialPlan) -> TrialResult {
        let mut result = TrialResult {
            plan: plan.clone(),
            nodes: Vec::new(),
            log: Vec::new(),
            violations: Vec::new(),
            workload_back_seconds: None,
            all_healthy_seconds: None,
            error: None,
            replay: super::replay(plan.seed, plan.index, self.nodes_option),
            logs: None,
        };
        if let Err(e) = self.run(plan, &mut result).await {
            result.error = Some(format!("{e:#}"));
        }
        // A lab is reused only after a trial that ran and recovered cleanly; the logs of one that
        // did not are kept, to find out why (a replay is a race run again, and may pass).
        if result.error.is_some() || !result.violations.is_empty() {
            result.logs = self.lab.as_ref().map(|(_, lab)| lab.keep_logs());
            self.lab = None;
        }
        result
    }

    async fn lab(&mut self, shape: Shape) -> anyhow::Result<&Lab> {
        if self.lab.as_ref().is_some_and(|(s, _)| *s != shape) {
            // Dropped first: one lab at a time on a machine.
            self.lab = None;
        }
        if self.lab.is_none() {
            println!("    starting a lab: {shape:?}");
            self.lab = Some((shape, setup(&self.exe, shape).await?));
        }
        self.lab.as_ref().map(|(_, lab)| lab).context("no lab")
    }

    async fn run(&mut self, plan: &TrialPlan, result: &mut TrialResult) -> anyhow::Result<()> {
        plan::validate(plan).map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
        let lab = self.lab(plan.shape).await?;
        tokio::select! {
            done = trial(lab, plan, result) => done,
            never = kubelet(lab) => match never {},
        }
    }
}

/// Restarts kube-controller-manager and kube-scheduler whenever they exit, as the kubelet of a
/// real control-plane node does (see [`Lab::revive_control_plane`]).
async fn kubelet(lab: &Lab) -> std::convert::Infallible {
    loop {
        if let Err(error) = lab.revive_control_plane() {
            tracing::warn!(%error, "restarting the control plane failed");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One trial in a ready lab: baseline, the steps at their times, heal, recovery, verdict.
async fn trial(lab: &Lab, plan: &TrialPlan, result: &mut TrialResult) -> anyhow::Result<()> {
    wait::until("the cluster healthy before the trial", RECOVERY, || healthy(lab)).await?;
    if plan.shape.path == PathKind::SelfRemediation {
        scenario::agents_settled(lab).await?;
    }
    apply_template(lab, plan.shape.path, plan.strategy)?;
    let pod = scenario::running_pod(&lab.client(), &[], RECOVERY).await?;
    let first = scenario::node_of(&pod);
    result.nodes = std::iter::once(first.clone())
        .chain(lab.nodes().into_iter().filter(|n| *n != first))
        .collect();
    lab.timeline()
        .note(format!("chaos trial {} of seed {}", plan.index, plan.seed));
    let since = jiff::Timestamp::now();
    let start = tokio::time::Instant::now();
    let mut faults = Faults::default();
    let mut failed = None;
    for step in &plan.steps {
        tokio::time::sleep_until(start + Duration::from_millis(step.at_ms)).await;
        let line = match act(lab, &result.nodes, &step.action, since, &mut faults).await {
            Ok(what) => what,
            Err(e) => {
                failed.get_or_insert_with(|| format!("{:?}: {e:#}", step.action));
                format!("{:?} failed: {e:#}", step.action)
            }
        };
        result
            .log
            .push(format!("{:>6.1}s {line}", start.elapsed().as_secs_f64()));
    }
    heal_all(lab, &faults, &mut result.log, start).await;
    let recovered = wait::until(
        "recovery: every node Ready, db-0 Running, no remediation",
        RECOVERY,
        || healthy(lab),
    )
    .await;
    let until = jiff::Timestamp::now();
    if let Err(e) = recovered {
        result.violations.push(Violation {
            kind: ViolationKind::NotRecovered,
            node: None,
            at: Some(until),
            detail: e.to_string(),
        });
    } else {
        result.all_healthy_seconds = Some(until.duration_since(since).as_secs_f64());
        let client = lab.client();
        let clean = wait::until("nothing left behind", CLEANUP, || {
            let client = client.clone();
            async move { Ok(Some(snapshot(&client).await?).filter(|s| verdict::leftovers(s).is_empty())) }
        })
        .await;
        if clean.is_err() {
            result
                .violations
                .extend(verdict::leftovers(&snapshot(&lab.client()).await?));
        }
    }
    let entries = lab.timeline().entries();
    let params = Params::new(plan.shape.nodes, BUDGET, &lab.config().timings, UNHEALTHY_FOR);
    result
        .violations
        .extend(verdict::judge(&entries, since, until, &params));
    result.workload_back_seconds =
        verdict::last_running(&entries, since, POD).map(|t| t.duration_since(since).as_secs_f64());
    result.log.extend(revivals(&entries, since));
    match failed {
        Some(e) => anyhow::bail!(e),
        None => Ok(()),
    }
}

/// The control-plane restarts [`kubelet`] made during the trial, as log lines.
fn revivals(entries: &[nodemedic_lab::timeline::Entry], since: jiff::Timestamp) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e.at >= since)
        .filter_map(|e| match &e.event {
            Event::Note { text } if text.contains("had exited") => {
                Some(format!("{:>6.1}s {text}", e.at.duration_since(since).as_secs_f64()))
            }
            _ => None,
        })
        .collect()
}

/// What the trial left broken, so everything can be healed at the end even if a step failed.
#[derive(Default)]
struct Faults {
    bmcs_hung: BTreeSet<String>,
    api_stopped: bool,
}

async fn act(
    lab: &Lab,
    nodes: &[String],
    action: &Action,
    since: jiff::Timestamp,
    faults: &mut Faults,
) -> anyhow::Result<String> {
    let node = |slot: &usize| nodes.get(*slot).cloned().context("no such node slot");
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
            lab.partition(&names.iter().map(String::as_str).collect::<Vec<_>>())
                .await?;
        }
        Action::IsolateFromApi { node: s } => lab.isolate_from_api(&node(s)?).await?,
        Action::Heal { node: s } => lab.heal(&node(s)?).await?,
        Action::StopApiserver => {
            faults.api_stopped = true;
            lab.stop_apiserver().await?;
        }
        Action::StartApiserver => {
            lab.start_apiserver().await?;
            faults.api_stopped = false;
        }
        Action::RestartEtcd => lab.restart_etcd().await?,
        Action::RestartController { mid_remediation } => {
            let waited = in_flight(lab, *mid_remediation, since).await;
            lab.restart_process("controller")?;
            return Ok(format!("restart controller{waited}"));
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
    }
    Ok(describe(action, nodes))
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
        | Action::ResumeBmc { node: s } => format!("{} {}", kind(action), name(s)),
        other => kind(other),
    }
}

/// The action's kebab-case name, as in the JSON report.
pub fn kind(action: &Action) -> String {
    serde_json::to_value(action)
        .ok()
        .and_then(|v| v["action"].as_str().map(str::to_owned))
        .unwrap_or_default()
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

/// Undoes whatever is still broken, whatever the plan did (its own heals may have failed).
async fn heal_all(lab: &Lab, faults: &Faults, log: &mut Vec<String>, start: tokio::time::Instant) {
    let mut done = Vec::new();
    if faults.api_stopped {
        done.push(("start-apiserver".to_owned(), lab.start_apiserver().await));
    }
    for n in &faults.bmcs_hung {
        done.push((format!("resume-bmc {n}"), lab.resume_bmc(n).await));
    }
    for n in lab.nodes() {
        let Ok(c) = lab.condition(&n) else { continue };
        if c.frozen {
            done.push((format!("thaw {n}"), lab.thaw(&n).await));
        }
        if c.partitioned || c.api_isolated {
            done.push((format!("heal {n}"), lab.heal(&n).await));
        }
        if !c.powered {
            done.push((format!("power-on {n}"), lab.power_on(&n).await));
        }
    }
    for (what, outcome) in done {
        let how = outcome.map_or_else(|e| format!(" failed: {e}"), |()| String::new());
        log.push(format!("{:>6.1}s final {what}{how}", start.elapsed().as_secs_f64()));
    }
}

/// Every node Ready, db-0 Running (not being deleted), no remediation object.
async fn healthy(lab: &Lab) -> nodemedic_lab::Result<Option<()>> {
    let client = lab.client();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            return Ok(None);
        }
    }
    let pod = Api::<Pod>::namespaced(client.clone(), "vm").get_opt("db-0").await?;
    let running = pod.is_some_and(|p| {
        p.metadata.deletion_timestamp.is_none() && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
    });
    let left = Api::<SelfNodeRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len()
        + Api::<FenceAgentsRemediation>::all(client)
            .list(&ListParams::default())
            .await?
            .items
            .len();
    Ok((running && left == 0).then_some(()))
}

async fn snapshot(client: &kube::Client) -> nodemedic_lab::Result<Snapshot> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let spec = n.spec.unwrap_or_default();
            NodeSnapshot {
                name: n.metadata.name.unwrap_or_default(),
                taints: spec.taints.unwrap_or_default().into_iter().map(|t| t.key).collect(),
                unschedulable: spec.unschedulable.unwrap_or(false),
            }
        })
        .collect();
    let named = |kind: &str, name: Option<String>| format!("{kind}/{}", name.unwrap_or_default());
    let mut remediations: Vec<String> = Api::<SelfNodeRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|r| named("SelfNodeRemediation", r.metadata.name))
        .collect();
    remediations.extend(
        Api::<FenceAgentsRemediation>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|r| named("FenceAgentsRemediation", r.metadata.name)),
    );
    let now = jiff::Timestamp::now();
    let leases = Api::<Lease>::namespaced(client.clone(), leases::NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|l| {
            let view = node_lease::view(l);
            let holder = node_lease::valid_holder(Some(&view), now)?;
            Some(format!("{} ({holder})", l.metadata.name.clone().unwrap_or_default()))
        })
        .collect();
    Ok(Snapshot {
        nodes,
        remediations,
        leases,
    })
}

/// A lab of the shape with nodemedic installed (as the bench installs it), the workload
/// running and the seed health check for the path watching every node.
async fn setup(exe: &Path, shape: Shape) -> anyhow::Result<Lab> {
    // Every node control-plane and worker, as in the seed topology, so the seed health checks'
    // selector takes them all, also with five.
    let nodes = (1..=shape.nodes)
        .map(|i| NodeSpec::control_plane_worker(&format!("node-{i}")))
        .collect();
    let mut config = LabConfig::new(nodes);
    if shape.path == PathKind::FenceRedfish {
        let delays = if shape.slow_bmc {
            PowerDelays::Realistic
        } else {
            PowerDelays::None
        };
        config = config.with_bmcs(BmcOptions {
            delays,
            ..BmcOptions::default()
        });
    }
    let lab = Lab::start(config).await.context("starting the lab")?;
    scenario::create_namespace(&lab.client(), NS).await?;
    let metrics = scenario::free_port()?;
    let nhc = match shape.path {
        PathKind::SelfRemediation => {
            apply_template(&lab, shape.path, Strategy::OutOfServiceTaint)?;
            scenario::install_self_remediation(&lab, exe, scenario::FAST_CONFIG, metrics).await?;
            scenario::deploy_workload(&lab).await?;
            scenario::agents_settled(&lab).await?;
            "002-nhc-snr-3node.yaml"
        }
        PathKind::FenceRedfish => {
            scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
            apply_template(&lab, shape.path, Strategy::OutOfServiceTaint)?;
            scenario::start_fence_agents_controller(&lab, exe, metrics)?;
            scenario::deploy_workload(&lab).await?;
            "002-nhc-far-3node.yaml"
        }
    };
    scenario::apply_seed(&lab, nhc, |m| {
        m["spec"]["remediationTemplate"]["name"] = json!(TEMPLATE);
        if let Some(conditions) = m["spec"]["unhealthyConditions"].as_array_mut() {
            for c in conditions {
                c["duration"] = json!(format!("{}s", UNHEALTHY_FOR.as_secs()));
            }
        }
    })?;
    Ok(lab)
}

/// The path's template, named [`TEMPLATE`], with the trial's strategy. Fence agents: the seed
/// template adapted to the lab, with attempts short enough that a hung BMC fails one within
/// a trial (the seed's 5 x 60 s would outlast it), yet long enough for a slow BMC's 1-11 s.
fn apply_template(lab: &Lab, path: PathKind, strategy: Strategy) -> anyhow::Result<()> {
    let strategy = format!("{strategy:?}");
    match path {
        PathKind::SelfRemediation => {
            lab.apply_yaml(&scenario::self_remediation_template(TEMPLATE, &strategy).to_string())?;
        }
        PathKind::FenceRedfish => scenario::apply_seed(lab, "002-far-template.yaml", |m| {
            scenario::adapt_far_template(lab, m);
            m["metadata"]["name"] = json!(TEMPLATE);
            let spec = &mut m["spec"]["template"]["spec"];
            spec["remediationStrategy"] = json!(strategy);
            spec["retrycount"] = json!(3);
            spec["retryinterval"] = json!("2s");
            spec["timeout"] = json!("30s");
        })?,
    }
    Ok(())
}
