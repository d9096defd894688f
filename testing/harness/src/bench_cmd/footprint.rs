//! The agent's footprint: memory and CPU of every agent of an 8-node lab at rest, and during a
//! peer storm: the API server stopped, so every agent loses it at once and asks all its peers;
//! then, in a lab of its own, at rest with the peer failure detector on; then, in a third, at
//! rest with the chart's default values, with every request the agents made to the API server
//! (by verb and resource, from its audit log) against the budget per agent per second.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context;
use nodemedic_api::self_remediation::SelfNodeRemediationConfig;
use nodemedic_harness::{
    bench::{
        requests,
        usage::{self, Usage},
    },
    scenario::{self, NS},
};
use nodemedic_lab::{Event, Lab, LabConfig};
use serde::Serialize;
use serde_json::json;

use super::{Section, verdict};

const NODES: usize = 8;
const REST: Duration = Duration::from_secs(60);
const STORM: Duration = Duration::from_secs(30);

/// The agent executable measured: the cargo profile it was built with and its size.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Executable {
    build: String,
    mib: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Window {
    seconds: f64,
    /// The largest agent's resident set at the end of the window (MiB).
    max_rss_mib: f64,
    /// Of it, memory the agent allocated (heap, stacks) rather than its mapped binary (MiB).
    max_anon_mib: f64,
    max_peak_rss_mib: f64,
    mean_millicores: f64,
    max_millicores: f64,
}

pub(super) async fn run() -> anyhow::Result<Section> {
    let agent = scenario::sibling_executable(&nodemedic_harness::product::nodemedic()?, "nodemedic-agent")?;
    let agent_mib = std::fs::metadata(&agent)
        .with_context(|| format!("reading {}", agent.display()))?
        .len() as f64
        / (1024.0 * 1024.0);
    let executable = Executable {
        build: agent
            .parent()
            .and_then(|dir| dir.file_name())
            .map(|profile| profile.to_string_lossy().into_owned())
            .unwrap_or_default(),
        mib: agent_mib,
    };
    println!("==> footprint: {NODES} agents");
    let (lab, pids) = agents(scenario::FAST_CONFIG).await?;
    let rest = window(&pids, REST).await?;
    let since = jiff::Timestamp::now();
    lab.stop_apiserver().await?;
    let storm = window(&pids, STORM).await;
    lab.start_apiserver().await?;
    let storm = storm?;
    let fenced = lab
        .timeline()
        .entries()
        .iter()
        .filter(|e| e.at >= since && matches!(e.event, Event::WatchdogExpired { .. } | Event::Power { on: false, .. }))
        .count();
    drop(lab);
    println!("==> footprint: {NODES} agents with the peer failure detector");
    let (lab, pids) = agents(&scenario::with_detector(scenario::FAST_CONFIG)).await?;
    let detector = window(&pids, REST).await?;
    drop(lab);
    println!("==> footprint: {NODES} agents with the chart's defaults");
    let (lab, pids, config) = agents_with_chart_defaults().await?;
    let from = jiff::Timestamp::now();
    let defaults = window(&pids, REST).await?;
    let requests = agent_requests(&lab, &config, from, jiff::Timestamp::now()).await;
    drop(lab);
    let markdown = markdown(&executable, &rest, &storm, &detector, fenced) + &requests_markdown(&defaults, &requests);
    Ok(Section {
        name: "footprint",
        markdown,
        json: json!({"agents": NODES, "executable": executable, "rest": rest, "storm": storm, "restWithDetector": detector, "fencedDuringStorm": fenced,
            "restWithChartDefaults": defaults, "agentRequestsAtRest": requests}),
    })
}

/// The fleet the agents' requests at rest are budgeted for.
const FLEET: f64 = 5_000.0;
/// The budget, per agent: its licence read every apiCheckInterval (4 s with the chart's
/// defaults) and little else. At 5,000 nodes, 1,500 requests a second: what the kubelets' own
/// lease renewals (one per node every 10 s, 500 a second) cost three times over, each a small
/// read the API server answers from its watch cache.
const BUDGET_PER_AGENT_PER_SECOND: f64 = 0.3;

/// Requests of one kind in the window.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Rate {
    requests: u64,
    per_agent_per_second: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AgentRequests {
    seconds: f64,
    agents: usize,
    /// The configuration the agents ran with (the chart's defaults): how often each reads its
    /// licence, and whether the peer detector ran.
    api_check_interval: String,
    peer_detection: bool,
    /// Every agent's requests in the window by `verb resource` (a watch once, when opened).
    by_verb_and_resource: BTreeMap<String, Rate>,
    requests: u64,
    per_agent_per_second: f64,
    at_five_thousand_per_second: f64,
    budget_per_agent_per_second: f64,
    met: bool,
}

/// Every agent's requests in `[from, to)`, from the API server's audit log: the lab's agents
/// authenticate as their nodes.
async fn agent_requests(
    lab: &Lab,
    config: &SelfNodeRemediationConfig,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> AgentRequests {
    // The audit log is written as requests complete: give the last ones a moment to land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = std::fs::read_to_string(lab.audit_log()).unwrap_or_default();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let agents = lab.nodes();
    for node in &agents {
        let counted = requests::count(&log, &format!("system:node:{node}"), from, to);
        for (kind, n) in counted.by_verb_and_resource {
            *counts.entry(kind).or_insert(0) += n;
        }
    }
    let seconds = to.duration_since(from).as_secs_f64();
    let rate = |n: u64| n as f64 / agents.len().max(1) as f64 / seconds.max(1.0);
    let total: u64 = counts.values().sum();
    let per_agent_per_second = rate(total);
    AgentRequests {
        seconds,
        agents: agents.len(),
        api_check_interval: config.spec.api_check_interval.to_string(),
        peer_detection: config.spec.peer_detection.is_some(),
        by_verb_and_resource: counts
            .into_iter()
            .map(|(kind, n)| {
                let per_agent_per_second = rate(n);
                (
                    kind,
                    Rate {
                        requests: n,
                        per_agent_per_second,
                    },
                )
            })
            .collect(),
        requests: total,
        per_agent_per_second,
        at_five_thousand_per_second: per_agent_per_second * FLEET,
        budget_per_agent_per_second: BUDGET_PER_AGENT_PER_SECOND,
        met: per_agent_per_second <= BUDGET_PER_AGENT_PER_SECOND,
    }
}

/// [`agents`], with nodemedic installed from the chart's default values; with the configuration
/// the controller created from them.
async fn agents_with_chart_defaults() -> anyhow::Result<(Lab, Vec<u32>, SelfNodeRemediationConfig)> {
    let exe = nodemedic_harness::product::nodemedic()?;
    let lab = Lab::start(LabConfig::workers(NODES).alone())
        .await
        .context("starting the lab")?;
    let config = nodemedic_harness::chart_defaults::install(&lab, &exe, &[], scenario::free_port()?).await?;
    scenario::agents_settled(&lab).await?;
    let pids: Vec<u32> = lab
        .nodes()
        .iter()
        .filter_map(|n| lab.process_pid(&format!("{n}/agent")))
        .collect();
    anyhow::ensure!(pids.len() == NODES, "only {} of {NODES} agents run", pids.len());
    Ok((lab, pids, config))
}

fn requests_markdown(defaults: &Window, requests: &AgentRequests) -> String {
    let rows: String = requests
        .by_verb_and_resource
        .iter()
        .map(|(kind, rate)| {
            let (verb, resource) = kind.split_once(' ').unwrap_or((kind, ""));
            format!(
                "| {verb} | {resource} | {} | {:.4} |\n",
                rate.requests, rate.per_agent_per_second
            )
        })
        .collect();
    format!(
        "\n*Chart defaults*: another lab, nodemedic installed from the chart's default values (read from the rendered chart; apiCheckInterval {}, peer detector {}): \
         at rest RSS {:.1} MiB, CPU {:.1} mCPU (the busiest agent). Its {} agents' requests to the API server in {:.0} s at rest, from the audit log (a watch counts once, when opened):\n\n\
         | verb | resource | requests | per agent per second |\n|---|---|---|---|\n{rows}| all | | {} | {:.4} |\n\n\
         - API requests at rest: {:.3} per agent per second <= {BUDGET_PER_AGENT_PER_SECOND} (the budget; {:.0} a second at {FLEET} nodes <= {:.0}): {}\n",
        requests.api_check_interval,
        if requests.peer_detection { "on" } else { "off" },
        defaults.max_rss_mib,
        defaults.max_millicores,
        requests.agents,
        requests.seconds,
        requests.requests,
        requests.per_agent_per_second,
        requests.per_agent_per_second,
        requests.at_five_thousand_per_second,
        BUDGET_PER_AGENT_PER_SECOND * FLEET,
        verdict(requests.met),
    )
}

/// A lab of [`NODES`] with nodemedic and its agents (SelfNodeRemediationConfig `patch`), every
/// agent a member; the agents' pids.
async fn agents(patch: &str) -> anyhow::Result<(Lab, Vec<u32>)> {
    let exe = nodemedic_harness::product::nodemedic()?;
    let lab = Lab::start(LabConfig::workers(NODES).alone())
        .await
        .context("starting the lab")?;
    scenario::create_namespace(&lab.client(), NS).await?;
    let metrics = scenario::free_port()?;
    scenario::install_self_remediation(&lab, &exe, patch, metrics).await?;
    scenario::agents_settled(&lab).await?;
    let pids: Vec<u32> = lab
        .nodes()
        .iter()
        .filter_map(|n| lab.process_pid(&format!("{n}/agent")))
        .collect();
    anyhow::ensure!(pids.len() == NODES, "only {} of {NODES} agents run", pids.len());
    Ok((lab, pids))
}

async fn window(pids: &[u32], length: Duration) -> anyhow::Result<Window> {
    let before = samples(pids)?;
    tokio::time::sleep(length).await;
    let after = samples(pids)?;
    let seconds = length.as_secs_f64();
    let cpu: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| usage::millicores(b, a, seconds))
        .collect();
    let mib = |f: fn(&Usage) -> u64| after.iter().map(f).max().unwrap_or(0) as f64 / 1024.0;
    Ok(Window {
        seconds,
        max_rss_mib: mib(|u| u.rss_kib),
        max_anon_mib: mib(|u| u.anon_kib),
        max_peak_rss_mib: mib(|u| u.peak_rss_kib),
        mean_millicores: cpu.iter().sum::<f64>() / cpu.len().max(1) as f64,
        max_millicores: cpu.iter().copied().fold(0.0, f64::max),
    })
}

fn samples(pids: &[u32]) -> anyhow::Result<Vec<Usage>> {
    pids.iter()
        .map(|&pid| usage::sample(pid).with_context(|| format!("agent {pid} is gone")))
        .collect()
}

fn markdown(executable: &Executable, rest: &Window, storm: &Window, detector: &Window, fenced: usize) -> String {
    let row = |name: &str, w: &Window| {
        format!(
            "| {name} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            w.seconds, w.max_rss_mib, w.max_anon_mib, w.max_peak_rss_mib, w.mean_millicores, w.max_millicores
        )
    };
    format!(
        "## Agent footprint\n\n{NODES} agents (the lab's fast SelfNodeRemediationConfig), the `{}` build of `nodemedic-agent` ({:.1} MiB). *Peer storm*: the API server stopped, every agent asks all its peers at once. \
         RSS counts the pages of the binary the agent has mapped as well as what it allocated (*anon*).\n\n\
         *Detector*: another lab, the same configuration with `peerDetection: {{}}` (a probe every 400 ms per agent, each SWIM message a call on the agents' mutual-TLS channels).\n\n\
         | window | seconds | max RSS (MiB) | max anon (MiB) | max peak RSS (MiB) | mean CPU (mCPU) | max CPU (mCPU) |\n|---|---|---|---|---|---|---|\n{}{}{}\n\
         Nodes fenced during the storm (there must be none: every peer saw the API go too): {fenced}.\n\n\
         Targets:\n- RSS {:.1} MiB <= 15 MiB (storm peak {:.1} MiB): {}\n- CPU at rest {:.1} mCPU (the busiest agent) <= 5 mCPU: {}\n\
         - with the detector at rest: RSS {:.1} MiB <= 15 MiB, CPU {:.1} mCPU (the busiest agent) <= 5 mCPU: {}\n",
        executable.build,
        executable.mib,
        row("at rest", rest),
        row("peer storm", storm),
        row("at rest, detector on", detector),
        rest.max_rss_mib,
        storm.max_peak_rss_mib,
        verdict(rest.max_rss_mib <= 15.0 && storm.max_peak_rss_mib <= 15.0),
        rest.max_millicores,
        verdict(rest.max_millicores <= 5.0),
        detector.max_rss_mib,
        detector.max_millicores,
        verdict(detector.max_rss_mib <= 15.0 && detector.max_millicores <= 5.0),
    )
}
