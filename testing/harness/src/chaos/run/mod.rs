//! Running trial plans in labs: one lab per shape, kept for consecutive trials of that shape
//! while it stays sound; per trial, the faults at their times, everything healed and the lab's
//! nodes restored, a bounded wait for recovery, then the verdict. `nodemedic-lab chaos` and the
//! end-to-end test run this.

mod act;
mod cluster;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context;
use nodemedic_healthcheck::decide::{Budget, IntOrPercent};
use nodemedic_lab::{Event, Lab, data_witness::DataWitness, wait};
use serde::Serialize;

pub use super::plan::kind;
use super::{
    plan::{self, EXTRA_NODE, PathKind, Shape, TrialPlan},
    verdict::{self, Params, Violation, ViolationKind},
};
use crate::scenario;
use act::{Ctx, Faults};

/// The health check's unhealthy durations in the lab (the seed's 10 s, shortened as the bench's
/// fast profile does).
const UNHEALTHY_FOR: Duration = Duration::from_secs(5);
/// The seed health checks' `minHealthy`.
const BUDGET: Budget = Budget::MinHealthy(IntOrPercent::Percent(51));
/// Recovery can include a reboot, the safe time and the attach-detach controller's periodic
/// sync (about a minute with ResourceDeletion).
const RECOVERY: Duration = Duration::from_secs(300);
const CLEANUP: Duration = Duration::from_secs(60);
/// A controller that exited is started again no sooner than this after its last start, as a
/// kubelet backs off a container that keeps exiting.
const CONTROLLER_BACKOFF: Duration = Duration::from_secs(5);
const POD: &str = "vm/db-0";
/// Real nodes: how long after recovery the writer has to sync a record.
const WRITES_AGAIN: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialResult {
    pub plan: TrialPlan,
    /// Slot -> node, as resolved when the trial started (the extra node last, in labs that
    /// churn).
    pub nodes: Vec<String>,
    /// What was done, with seconds since the first step.
    pub log: Vec<String>,
    pub violations: Vec<Violation>,
    /// First step to the workload last seen Running (None: it never stopped being Running).
    pub workload_back_seconds: Option<f64>,
    /// First step to every node Ready, the workload Running, no remediation left and (self
    /// remediation) the membership settled on the lab's nodes.
    pub all_healthy_seconds: Option<f64>,
    /// The trial could not run as planned (a lab that did not start, a fault that failed).
    pub error: Option<String>,
    pub replay: String,
    /// Where the lab's logs were kept (a trial with a violation or an error keeps them).
    pub logs: Option<PathBuf>,
    /// Real nodes: the records on the writer's volume once the trial was judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<usize>,
}

/// A lab kept for the trials of its shape, with the witness of its writer's volume (real
/// nodes).
struct Kept {
    shape: Shape,
    lab: Lab,
    witness: Option<DataWitness>,
}

/// Runs trials; keeps the last lab for the next trial of its shape.
pub struct Runner {
    exe: PathBuf,
    lab: Option<Kept>,
    /// The `--nodes` restriction, repeated in replay commands.
    nodes_option: Option<usize>,
    /// `--peer-detection`: every lab runs the peer failure detector.
    peer_detection: bool,
    /// Every lab keeps other labs off the machine (see [`Runner::alone`]).
    alone: bool,
    /// `--chart-defaults`: nodemedic as the chart's default values install it (see
    /// [`Runner::with_chart_defaults`]).
    chart_defaults: bool,
}

impl Runner {
    /// `exe`: the nodemedic binary the lab's controller and agents run.
    pub fn new(exe: &Path, nodes_option: Option<usize>, peer_detection: bool) -> Self {
        Self {
            exe: exe.to_owned(),
            lab: None,
            nodes_option,
            peer_detection,
            alone: false,
            chart_defaults: false,
        }
    }

    /// Every kwok lab runs nodemedic with the chart's default values, read from the rendered
    /// chart: its default health check and its SelfNodeRemediationConfig (the peer detector
    /// on), the trial's template named in the check's values.
    pub fn with_chart_defaults(mut self) -> Self {
        self.chart_defaults = true;
        self
    }

    /// A campaign's labs run with nothing beside them, as benchmarks do: a violation must be
    /// nodemedic's, not the doing of a lab that shared the CPU. The fixed trials CI runs share
    /// the machine like every other lab test.
    pub fn alone(mut self) -> Self {
        self.alone = true;
        self
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
            replay: super::replay(plan, self.nodes_option, self.peer_detection, self.chart_defaults),
            logs: None,
            records: None,
        };
        if let Err(e) = self.run(plan, &mut result).await {
            result.error = Some(format!("{e:#}"));
        }
        // A lab is reused only after a trial that ran and recovered cleanly; the logs of one that
        // did not are kept, to find out why (a replay is a race run again, and may pass).
        if result.error.is_some() || !result.violations.is_empty() {
            result.logs = self.lab.as_ref().map(|kept| {
                let logs = kept.lab.keep_logs();
                keep_timeline(&kept.lab, &logs);
                logs
            });
            self.lab = None;
        }
        result
    }

    async fn lab(&mut self, shape: Shape) -> anyhow::Result<&mut Kept> {
        if self.lab.as_ref().is_some_and(|kept| kept.shape != shape) {
            // Dropped first: a campaign's lab waits for every other lab to end, its last one too.
            self.lab = None;
        }
        if self.lab.is_none() {
            println!("    starting a lab: {shape:?}");
            let (lab, witness) = if shape.real_nodes {
                let (lab, witness) = cluster::setup_real(&self.exe, shape, self.peer_detection, self.alone).await?;
                (lab, Some(witness))
            } else {
                let lab = if self.chart_defaults {
                    cluster::setup_with_chart_defaults(&self.exe, shape, self.alone).await?
                } else {
                    cluster::setup(&self.exe, shape, self.peer_detection, self.alone).await?
                };
                (lab, None)
            };
            self.lab = Some(Kept { shape, lab, witness });
        }
        self.lab.as_mut().context("no lab")
    }

    async fn run(&mut self, plan: &TrialPlan, result: &mut TrialResult) -> anyhow::Result<()> {
        plan::validate(plan).map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
        let exe = self.exe.clone();
        let kept = self.lab(plan.shape).await?;
        let (lab, witness) = (&kept.lab, kept.witness.as_mut());
        tokio::select! {
            done = trial(lab, &exe, plan, result, witness) => done,
            never = kubelet(lab, plan.shape.real_nodes) => match never {},
        }
    }
}

/// Writes the lab's timeline, one entry a line with its time, beside the logs kept: what a
/// violation is judged from.
fn keep_timeline(lab: &Lab, logs: &Path) {
    let lines: String = lab
        .timeline()
        .entries()
        .iter()
        .map(|e| format!("{}  {}\n", e.at, nodemedic_lab::timeline::describe(&e.event)))
        .collect();
    if let Err(error) = std::fs::write(logs.join("timeline.txt"), lines) {
        tracing::warn!(%error, "the timeline was not kept");
    }
}

/// Restarts kube-controller-manager and kube-scheduler whenever they exit, as the kubelet of a
/// real control-plane node does (see [`Lab::revive_control_plane`]), and on kwok nodes the
/// controller, as the kubelet of its Deployment's pod does: a controller that loses the lead
/// (the API server or etcd gone longer than its lease) exits so as never to act beside a new
/// leader. On real nodes the controller's pods have real kubelets.
async fn kubelet(lab: &Lab, real_nodes: bool) -> std::convert::Infallible {
    let mut controller_started = tokio::time::Instant::now();
    loop {
        if let Err(error) = lab.revive_control_plane() {
            tracing::warn!(%error, "restarting the control plane failed");
        }
        if !real_nodes && !lab.process_running("controller") && controller_started.elapsed() >= CONTROLLER_BACKOFF {
            match lab.restart_process("controller") {
                Ok(()) => lab
                    .timeline()
                    .note("controller had exited; started again, as the kubelet of its Deployment's pod does"),
                Err(error) => tracing::warn!(%error, "restarting the controller failed"),
            }
            controller_started = tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One trial in a ready lab: baseline, the steps at their times, quiet until the plan's end,
/// heal, recovery, verdict (on real nodes, the writer's volume's too).
async fn trial(
    lab: &Lab,
    exe: &Path,
    plan: &TrialPlan,
    result: &mut TrialResult,
    witness: Option<&mut DataWitness>,
) -> anyhow::Result<()> {
    let mut found = lab.nodes();
    found.sort();
    anyhow::ensure!(
        found.len() == plan.shape.nodes,
        "the lab has nodes {found:?}, not the shape's {}",
        plan.shape.nodes
    );
    wait::until("the cluster healthy before the trial", RECOVERY, || {
        cluster::healthy(lab)
    })
    .await?;
    if plan.shape.path == PathKind::SelfRemediation {
        scenario::agents_settled(lab).await?;
    }
    cluster::apply_template(lab, plan.shape.path, plan.strategy)?;
    // The configuration the verdict judges fences by, read while the cluster is healthy.
    let agents = cluster::agent_timings(lab).await?;
    let peer_detection = cluster::peer_detection_after(lab).await?;
    let pod = scenario::running_pod(&lab.client(), &[], RECOVERY).await?;
    let first = scenario::node_of(&pod);
    result.nodes = std::iter::once(first.clone())
        .chain(found.iter().filter(|n| **n != first).cloned())
        .collect();
    if plan.shape.churns() {
        result.nodes.push(EXTRA_NODE.to_owned());
    }
    lab.timeline()
        .note(format!("chaos trial {} of seed {}", plan.index, plan.seed));
    let since = jiff::Timestamp::now();
    let start = tokio::time::Instant::now();
    let ctx = Ctx {
        lab,
        exe,
        nodes: &result.nodes,
        originals: &found,
        since,
        real_nodes: plan.shape.real_nodes,
    };
    let mut faults = Faults::default();
    let mut failed = None;
    let mut log = Vec::new();
    for step in &plan.steps {
        tokio::time::sleep_until(start + Duration::from_millis(step.at_ms)).await;
        let line = match act::act(&ctx, &step.action, &mut faults).await {
            Ok(what) => what,
            Err(e) => {
                failed.get_or_insert_with(|| format!("{:?}: {e:#}", step.action));
                format!("{:?} failed: {e:#}", step.action)
            }
        };
        log.push(format!("{:>6.1}s {line}", start.elapsed().as_secs_f64()));
    }
    // Quiet for as long after the last step as the plan has after it, also when the steps ran
    // late (the API taking its time after a long outage, a loop waiting for a remediation).
    let tail = plan.end_ms.saturating_sub(plan.steps.last().map_or(0, |s| s.at_ms));
    let quiet = tokio::time::Instant::now() + Duration::from_millis(tail);
    tokio::time::sleep_until(quiet.max(start + Duration::from_millis(plan.end_ms))).await;
    act::heal_all(&ctx, &faults, &mut log, start).await;
    result.log = log;
    let mut recovered = wait::until(
        "recovery: every node Ready, db-0 Running, no remediation",
        RECOVERY,
        || cluster::healthy(lab),
    )
    .await
    .map_err(|e| e.to_string());
    if recovered.is_ok() && plan.shape.path == PathKind::SelfRemediation {
        recovered = scenario::members_are(lab, &lab.nodes())
            .await
            .map_err(|e| format!("the membership did not settle on the lab's nodes: {e}"));
    }
    let until = jiff::Timestamp::now();
    if let Some(witness) = witness {
        let (records, violations) = data_verdict(witness, recovered.is_ok()).await;
        result.records = Some(records);
        result.violations.extend(violations);
    }
    if let Err(detail) = recovered {
        result.violations.push(Violation {
            kind: ViolationKind::NotRecovered,
            node: None,
            at: Some(until),
            detail,
        });
    } else {
        result.all_healthy_seconds = Some(until.duration_since(since).as_secs_f64());
        let client = lab.client();
        let clean = wait::until("nothing left behind", CLEANUP, || {
            let client = client.clone();
            async move {
                let snapshot = cluster::snapshot(&client).await?;
                Ok(Some(snapshot).filter(|s| verdict::leftovers(s).is_empty()))
            }
        })
        .await;
        if clean.is_err() {
            result
                .violations
                .extend(verdict::leftovers(&cluster::snapshot(&lab.client()).await?));
        }
    }
    let entries = lab.timeline().entries();
    let params = verdict_params(lab, plan.shape.nodes, agents, peer_detection).await;
    judge(&entries, (since, until), &params, result);
    result.workload_back_seconds =
        verdict::last_running(&entries, since, POD).map(|t| t.duration_since(since).as_secs_f64());
    result.log.extend(revivals(&entries, since));
    match failed {
        Some(e) => anyhow::bail!(e),
        None => Ok(()),
    }
}

/// What the verdict judges a trial by: the lab's timings, and the agents' configuration and
/// peer detection as read before the trial.
async fn verdict_params(
    lab: &Lab,
    nodes: usize,
    agents: Option<verdict::AgentTimings>,
    peer_detection: Option<Duration>,
) -> Params {
    let mut params = Params::new(
        nodes,
        BUDGET,
        &lab.config().timings,
        cluster::ready_duration(lab).await.unwrap_or(UNHEALTHY_FOR),
    );
    if let Some(agents) = agents {
        params = params.with_agents(agents);
    }
    if let Some(after) = peer_detection {
        params = params.with_peer_detection(after);
    }
    params
}

/// The verdict's violations, and every fence the trial saw with what excused it (the false-fence
/// check's evidence) in the trial's log.
fn judge(
    entries: &[nodemedic_lab::timeline::Entry],
    (since, until): (jiff::Timestamp, jiff::Timestamp),
    params: &Params,
    result: &mut TrialResult,
) {
    result.violations.extend(verdict::judge(entries, since, until, params));
    result.log.extend(
        verdict::fences::judge_fences(entries, since, params)
            .iter()
            .filter(|j| j.excuse.is_some())
            .map(|j| j.line(since)),
    );
}

/// The data witness's verdict on the writer's volume, and how many records it holds: once the
/// cluster `recovered`, the writer must also sync a record past the last one there (whichever
/// instance writes it).
async fn data_verdict(witness: &mut DataWitness, recovered: bool) -> (usize, Vec<Violation>) {
    let (records, mut found) = witness.look();
    let mut held = records.len();
    let mut writing = true;
    if recovered && found.is_empty() {
        let last = records.last().map(|r| r.sequence);
        let deadline = tokio::time::Instant::now() + WRITES_AGAIN;
        loop {
            let (now, violations) = witness.look();
            held = now.len();
            if !violations.is_empty() {
                found = violations;
                break;
            }
            if now.last().map(|r| r.sequence) > last {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                writing = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut violations: Vec<Violation> = found
        .iter()
        .map(|v| Violation {
            kind: ViolationKind::DataWitness,
            node: None,
            at: None,
            detail: format!("{v} ({})", witness.path().display()),
        })
        .collect();
    if !writing {
        violations.push(Violation {
            kind: ViolationKind::NotRecovered,
            node: None,
            at: None,
            detail: format!(
                "the writer synced no record in the {WRITES_AGAIN:?} after recovery ({held} records in {})",
                witness.path().display()
            ),
        });
    }
    (held, violations)
}

/// The restarts [`kubelet`] made during the trial, as log lines: one per process, however
/// often (a control plane kept down for minutes can see them exit every few seconds).
fn revivals(entries: &[nodemedic_lab::timeline::Entry], since: jiff::Timestamp) -> Vec<String> {
    let mut seen: BTreeMap<&str, (f64, f64, usize)> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.at >= since) {
        if let Event::Note { text } = &e.event
            && text.contains("had exited")
        {
            let at = e.at.duration_since(since).as_secs_f64();
            let entry = seen.entry(text).or_insert((at, at, 0));
            entry.1 = at;
            entry.2 += 1;
        }
    }
    let mut lines: Vec<(f64, String)> = seen
        .into_iter()
        .map(|(text, (first, last, count))| {
            let again = match count {
                1 => String::new(),
                n => format!(" (x{n}, the last at {last:.1}s)"),
            };
            (first, format!("{first:>6.1}s {text}{again}"))
        })
        .collect();
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    lines.into_iter().map(|(_, line)| line).collect()
}
