//! Scale: a fleet of simulated nodes (one kwok for all), the whole controller (every operator
//! on), one NodeHealthCheck over the fleet. At rest, then 1% and then 10% of the nodes silenced at
//! once: decision latency per node, the controller's CPU and memory, and every API request it
//! made, by verb, from the API server's audit log.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::Context;
use nodemedic_harness::{
    bench::{self, Summary, decision, requests, usage},
    fleet, scenario,
};
use nodemedic_lab::{Lab, LabConfig};
use serde::Serialize;
use serde_json::json;

use super::{Section, verdict};

const REST: Duration = Duration::from_secs(60);
/// Rest starts once the health check has been idle this long (or after `SETTLE_AT_MOST`).
const QUIET: Duration = Duration::from_secs(15);
const SETTLE_AT_MOST: Duration = Duration::from_secs(240);

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Window {
    seconds: f64,
    cpu_millicores: f64,
    rss_mib: f64,
    /// Of the RSS, what the controller allocated (RssAnon); the rest is its executable's and
    /// libraries' pages (what CI's footprint check, on debug builds, leaves out).
    anon_mib: f64,
    /// The highest RSS the controller has had so far (its VmHWM at the window's end).
    peak_rss_mib: f64,
    /// Health-check reconciles in the window, and the seconds they took together (from the
    /// controller's own histogram): what the controller was busy with.
    reconciles: f64,
    reconcile_seconds: f64,
    requests: requests::Requests,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Round {
    failed_percent: usize,
    failed_nodes: usize,
    /// p50 / p90 / p99 (nearest rank, [`bench::percentile`]) of `decision_latencies`.
    decision_seconds: Option<Summary>,
    /// Each remediated node's decision latency (seconds, to the millisecond): what
    /// `decision_seconds` is computed from, kept so that it can be computed again from the report.
    decision_latencies: BTreeMap<String, f64>,
    without_remediation: usize,
    window: Window,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Fleet {
    nodes: usize,
    rest: Window,
    rounds: Vec<Round>,
    peak_rss_mib: f64,
}

pub(super) async fn run(sizes: &[usize]) -> anyhow::Result<Section> {
    let mut fleets = Vec::new();
    for &nodes in sizes {
        println!("==> scale: {nodes} nodes");
        fleets.push(
            one_fleet(nodes)
                .await
                .with_context(|| format!("the {nodes}-node fleet"))?,
        );
    }
    Ok(Section {
        name: "scale",
        markdown: markdown(&fleets),
        json: json!({ "fleets": fleets }),
    })
}

async fn one_fleet(nodes: usize) -> anyhow::Result<Fleet> {
    let exe = nodemedic_harness::product::nodemedic()?;
    let lab = Lab::start(LabConfig::fleet(nodes).alone())
        .await
        .context("starting the lab")?;
    let metrics = scenario::free_port()?;
    fleet::start_controller(&lab, &exe, metrics).await?;
    fleet::all_healthy(&lab, nodes).await?;
    let pid = lab
        .process_pid(fleet::CONTROLLER)
        .context("the controller is not running")?;

    // Let the start-up's reconciles finish before calling it rest: every new node's first
    // heartbeats still change what the health check sees for a while after all are Ready.
    let settled_after = settle(metrics).await;
    println!("    settled {settled_after:.0} s after every node was healthy");
    let rest = window(&lab, pid, metrics, || async {
        tokio::time::sleep(REST).await;
        Ok(())
    })
    .await?;
    println!("    at rest: {}", describe(&rest));
    let mut rounds = Vec::new();
    for percent in [1, 10] {
        let failed = fleet::failing(&lab, percent);
        let since = jiff::Timestamp::now();
        let expected: BTreeSet<String> = failed.iter().cloned().collect();
        let window = window(&lab, pid, metrics, || async {
            lab.silence_fleet_nodes(&failed).await?;
            Ok(fleet::remediated(&lab, &expected, since).await?)
        })
        .await?;
        let decisions = decision::latencies(&lab.timeline().entries(), &expected, since, fleet::DURATION_SECONDS);
        let decision_latencies: BTreeMap<String, f64> = decisions
            .latencies
            .into_iter()
            .map(|(node, seconds)| (node, (seconds * 1000.0).round() / 1000.0))
            .collect();
        let round = Round {
            failed_percent: percent,
            failed_nodes: failed.len(),
            decision_seconds: bench::summary(&decision_latencies.values().copied().collect::<Vec<_>>()),
            decision_latencies,
            without_remediation: decisions.missing.len(),
            window,
        };
        println!("    {percent}% failed: {}", describe(&round.window));
        rounds.push(round);
        lab.revive_fleet_nodes(&failed).await?;
        fleet::all_healthy(&lab, nodes).await?;
    }
    let peak_rss_mib = usage::sample(pid).map_or(0.0, |u| u.peak_rss_kib as f64 / 1024.0);
    Ok(Fleet {
        nodes,
        rest,
        rounds,
        peak_rss_mib,
    })
}

/// The health check's reconciles so far and the seconds they took, from the controller's
/// histogram (zeros while it does not answer).
fn reconciled(metrics_port: u16) -> (f64, f64) {
    let text = scenario::metrics(metrics_port).unwrap_or_default();
    let total = |suffix: &str| {
        bench::sample(
            &text,
            &format!("nodemedic_healthcheck_decision_duration_seconds_{suffix}"),
        )
        .unwrap_or(0.0)
    };
    (total("count"), total("sum"))
}

/// Waits until the health check has not reconciled for `QUIET` (at most `SETTLE_AT_MOST`);
/// returns the seconds it took.
async fn settle(metrics_port: u16) -> f64 {
    let started = std::time::Instant::now();
    let count = || reconciled(metrics_port).0;
    let (mut last, mut quiet_since) = (count(), std::time::Instant::now());
    while started.elapsed() < SETTLE_AT_MOST && quiet_since.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = count();
        if now != last {
            (last, quiet_since) = (now, std::time::Instant::now());
        }
    }
    started.elapsed().as_secs_f64()
}

/// Runs `during`, measuring the controller's CPU, memory, reconciles and requests over it.
async fn window<F, Fut>(lab: &Lab, pid: u32, metrics_port: u16, during: F) -> anyhow::Result<Window>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let reconciled_before = reconciled(metrics_port);
    let before = usage::sample(pid).context("sampling the controller")?;
    let (from, started) = (jiff::Timestamp::now(), std::time::Instant::now());
    during().await?;
    let seconds = started.elapsed().as_secs_f64();
    let to = jiff::Timestamp::now();
    let after = usage::sample(pid).context("sampling the controller")?;
    let reconciled_after = reconciled(metrics_port);
    // The audit log is written as requests complete: give the last ones a moment to land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = std::fs::read_to_string(lab.audit_log()).unwrap_or_default();
    Ok(Window {
        seconds,
        cpu_millicores: usage::millicores(&before, &after, seconds),
        rss_mib: after.rss_kib as f64 / 1024.0,
        anon_mib: after.anon_kib as f64 / 1024.0,
        peak_rss_mib: after.peak_rss_kib as f64 / 1024.0,
        reconciles: reconciled_after.0 - reconciled_before.0,
        reconcile_seconds: reconciled_after.1 - reconciled_before.1,
        requests: requests::count(&log, fleet::CONTROLLER_USER, from, to),
    })
}

fn describe(w: &Window) -> String {
    format!(
        "{:.0} s, {:.0} mCPU, RSS {:.1} MiB ({:.1} allocated, peak {:.1}), {:.0} reconciles, {} requests ({} beyond watches and leases)",
        w.seconds,
        w.cpu_millicores,
        w.rss_mib,
        w.anon_mib,
        w.peak_rss_mib,
        w.reconciles,
        w.requests.total(),
        w.requests.other
    )
}

fn verbs(r: &requests::Requests) -> String {
    r.by_verb
        .iter()
        .map(|(v, n)| format!("{v} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn markdown(fleets: &[Fleet]) -> String {
    let mut out = String::from(
        "## Scale\n\nOne kwok process simulates the fleet (leases renewed every 30 s, Unknown after 60 s of silence); the controller runs every operator, one NodeHealthCheck covers the fleet (durations 10 s, minHealthy 51%); *at rest* is a minute once the health check has been idle for 15 s after start-up (at most 4 minutes' wait). \
         *Decision*: from a node's unhealthy condition having lasted 10 s (its lastTransitionTime, one-second resolution, plus 10 s: when the check's rule fires) to the lab's watch seeing its remediation object (p50 / p90 / p99 seconds, nearest rank; every node's latency is in the JSON, `decisionLatencies`). *Peak RSS*: the highest so far (VmHWM at the window's end). *Reconciles*: the health check's, and the seconds they took together. Requests: the controller's, from the API server's audit log.\n\n\
         | nodes | window | seconds | decision | CPU (mCPU) | RSS (MiB) | peak RSS (MiB) | reconciles (s) | requests by verb | beyond watches and leases |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for f in fleets {
        out.push_str(&format!(
            "| {} | at rest | {:.0} | - | {:.0} | {:.1} | {:.1} | {:.0} ({:.1}) | {} | {} |\n",
            f.nodes,
            f.rest.seconds,
            f.rest.cpu_millicores,
            f.rest.rss_mib,
            f.rest.peak_rss_mib,
            f.rest.reconciles,
            f.rest.reconcile_seconds,
            verbs(&f.rest.requests),
            f.rest.requests.other
        ));
        for r in &f.rounds {
            out.push_str(&format!(
                "| {} | {}% failed ({} nodes{}) | {:.0} | {} | {:.0} | {:.1} | {:.1} | {:.0} ({:.1}) | {} | {} |\n",
                f.nodes,
                r.failed_percent,
                r.failed_nodes,
                if r.without_remediation > 0 {
                    format!(", {} without remediation", r.without_remediation)
                } else {
                    String::new()
                },
                r.window.seconds,
                r.decision_seconds
                    .as_ref()
                    .map_or("-".into(), |s| format!("{:.2} / {:.2} / {:.2}", s.p50, s.p90, s.p99)),
                r.window.cpu_millicores,
                r.window.rss_mib,
                r.window.peak_rss_mib,
                r.window.reconciles,
                r.window.reconcile_seconds,
                verbs(&r.window.requests),
                r.window.requests.other
            ));
        }
    }
    for f in fleets.iter().filter(|f| f.rest.requests.other > 0) {
        let kinds: Vec<String> = f
            .rest
            .requests
            .other_by_kind
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        let probes = match f.rest.requests.probes {
            0 => String::new(),
            n => format!(
                " ({n} of them the health check's outage probe, one kubelet lease read after 5 s in which no watch said anything: kwok renews a small fleet's leases in bursts)"
            ),
        };
        out.push_str(&format!(
            "\nAt rest with {} nodes, beyond watches and leases: {}{probes}.\n",
            f.nodes,
            kinds.join(", ")
        ));
    }
    if let Some(f) = fleets.iter().max_by_key(|f| f.nodes) {
        let p99 = f
            .rounds
            .iter()
            .filter_map(|r| r.decision_seconds.as_ref().map(|s| s.p99))
            .fold(0.0, f64::max);
        out.push_str(&format!(
            "\nTargets at {} nodes:\n- decision latency p99 {p99:.2} s <= 1 s: {}\n- controller peak RSS {:.1} MiB <= 64 MiB: {}\n- requests at rest beyond watches and lease renewal: {}: {}\n",
            f.nodes,
            verdict(p99 <= 1.0),
            f.peak_rss_mib,
            verdict(f.peak_rss_mib <= 64.0),
            f.rest.requests.other,
            verdict(f.rest.requests.other == 0)
        ));
    }
    out
}
