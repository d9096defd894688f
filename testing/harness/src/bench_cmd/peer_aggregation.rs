//! The controller's share of peer failure detection at 5,000 members, measured in this process.
//! The scale suite's kwok fleet has no agents, so the agents' reports are simulated: which agents
//! report which silent member comes from the designation the agents use, and every agent sends
//! its reports once a second, as they refresh them. The controller's side is the real code
//! (`nodemedic-peer-detection`): receiving the reports, expiring old ones, and a verdict on every
//! reported member ten times a second.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use anyhow::Context;
use jiff::{SignedDuration, Timestamp};
use nodemedic_harness::bench::usage;
use nodemedic_peer_detection::{HostProbes, MemberFacts, Policy, Report, Reports, Verdict, designation, verdicts};
use serde::Serialize;
use serde_json::json;

use super::{Section, verdict};

const MEMBERS: usize = 5_000;
/// Designated observers per member: the verdict's 3, and 2 to spare.
const OBSERVERS: usize = 5;
const TICKS_PER_SECOND: usize = 10;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Run {
    scenario: &'static str,
    silent: usize,
    designated: bool,
    cluster_seconds: usize,
    reports_per_second: usize,
    reports_held: usize,
    unreachable: usize,
    /// Controller CPU per second of cluster time (mCPU).
    millicores: f64,
    slowest_tick_ms: f64,
    /// Memory the aggregation added (MiB of anonymous memory).
    anon_mib: f64,
}

pub(super) fn run() -> anyhow::Result<Section> {
    println!("==> peer aggregation: {MEMBERS} members");
    let runs = vec![
        measure("at rest", 0, true, 30)?,
        measure("1% silent", MEMBERS / 100, true, 30)?,
        measure("a zone silent (10%)", MEMBERS / 10, true, 30)?,
        // What designation saves: every agent that distrusts a member reporting it.
        measure("a zone silent, every agent reporting", MEMBERS / 10, false, 3)?,
    ];
    Ok(Section {
        name: "peer-aggregation",
        markdown: markdown(&runs),
        json: json!({"members": MEMBERS, "observersPerMember": OBSERVERS, "runs": runs}),
    })
}

fn name(i: usize) -> String {
    format!("node-{i:05}")
}

fn measure(scenario: &'static str, silent: usize, designated: bool, seconds: usize) -> anyhow::Result<Run> {
    let members: Vec<String> = (0..MEMBERS).map(name).collect();
    // Spread over the names, as a zone's nodes would be.
    let silent_set: BTreeSet<String> = (0..silent).map(|i| name(i * MEMBERS / silent.max(1))).collect();
    let alive: Vec<&str> = members
        .iter()
        .map(String::as_str)
        .filter(|m| !silent_set.contains(*m))
        .collect();
    let start = Timestamp::now();
    let batches = batches(&silent_set, &alive, designated, start);
    let reports_per_second = batches.values().map(Vec::len).sum();
    let host = HostProbes {
        last_answered: None,
        last_unanswered_sent: Some(start + SignedDuration::from_secs(1)),
    };
    let facts: BTreeMap<String, MemberFacts> = members
        .iter()
        .map(|m| {
            let host = if silent_set.contains(m) {
                host
            } else {
                HostProbes::default()
            };
            (
                m.clone(),
                MemberFacts {
                    lease_renewed: None,
                    host,
                },
            )
        })
        .collect();
    let senders: Vec<(&String, &Vec<Report>)> = batches.iter().collect();
    let policy = Policy::default();

    let me = std::process::id();
    let before = usage::sample(me).context("reading this process's usage")?;
    let began = Instant::now();
    let mut reports = Reports::default();
    let (mut slowest, mut unreachable) = (0f64, 0);
    for tick in 0..seconds * TICKS_PER_SECOND {
        let tick_began = Instant::now();
        let now = start + SignedDuration::from_millis((tick * 1000 / TICKS_PER_SECOND) as i64);
        // Each agent sends once a second, the agents spread over the second.
        for (i, (observer, batch)) in senders.iter().enumerate() {
            if i % TICKS_PER_SECOND == tick % TICKS_PER_SECOND {
                reports.receive(observer, batch, now);
            }
        }
        reports.expire(now, policy.report_ttl);
        let all = verdicts(&reports, &facts, now, &policy);
        unreachable = all
            .iter()
            .filter(|(_, v)| matches!(v, Verdict::Unreachable { .. }))
            .count();
        slowest = slowest.max(tick_began.elapsed().as_secs_f64() * 1000.0);
    }
    let measured = began.elapsed().as_secs_f64();
    let after = usage::sample(me).context("reading this process's usage")?;
    let run = Run {
        scenario,
        silent,
        designated,
        cluster_seconds: seconds,
        reports_per_second,
        reports_held: reports.len(),
        unreachable,
        millicores: (after.cpu_seconds - before.cpu_seconds).max(0.0) / seconds as f64 * 1000.0,
        slowest_tick_ms: slowest,
        anon_mib: after.anon_kib.saturating_sub(before.anon_kib) as f64 / 1024.0,
    };
    println!(
        "    {scenario}: {} reports/s, {:.1} mCPU, slowest tick {:.1} ms ({measured:.1} s measured)",
        run.reports_per_second, run.millicores, run.slowest_tick_ms
    );
    Ok(run)
}

/// What each agent sends every second: "unreachable since `start`" for each silent member it
/// observes (all of them, without designation).
fn batches(
    silent: &BTreeSet<String>,
    alive: &[&str],
    designated: bool,
    start: Timestamp,
) -> BTreeMap<String, Vec<Report>> {
    let mut batches: BTreeMap<String, Vec<Report>> = BTreeMap::new();
    for subject in silent {
        for observer in alive {
            if !designated || designation::observes(observer, subject, alive.iter().copied(), OBSERVERS) {
                batches.entry((*observer).to_owned()).or_default().push(Report {
                    subject: subject.clone(),
                    since: Some(start),
                });
            }
        }
    }
    batches
}

fn markdown(runs: &[Run]) -> String {
    let rows: String = runs
        .iter()
        .map(|r| {
            format!(
                "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
                r.scenario,
                r.silent,
                r.reports_per_second,
                r.reports_held,
                r.unreachable,
                r.millicores,
                r.slowest_tick_ms,
                r.anon_mib
            )
        })
        .collect();
    let zone = runs.iter().find(|r| r.designated && r.silent == MEMBERS / 10);
    let every_verdict = runs.iter().all(|r| r.unreachable == r.silent);
    format!(
        "## Peer detection: the controller's aggregation at {MEMBERS} members\n\n\
         Simulated reports (the scale fleet has no agents), real aggregation: every agent sends its reports once a second, each \
         silent member is reported by its {OBSERVERS} designated observers (the last row: by every agent), and the controller \
         receives them, expires old ones and computes a verdict on every reported member {TICKS_PER_SECOND} times a second, on one core.\n\n\
         | scenario | silent members | reports/s | reports held | unreachable | CPU (mCPU) | slowest tick (ms) | memory added (MiB) |\n\
         |---|---|---|---|---|---|---|---|\n{rows}\n\
         Every silent member found unreachable in every run: {}\n\
         A zone silent, with designation: {:.0} mCPU and {:.1} MiB for the controller.\n",
        verdict(every_verdict),
        zone.map_or(0.0, |r| r.millicores),
        zone.map_or(0.0, |r| r.anon_mib),
    )
}
