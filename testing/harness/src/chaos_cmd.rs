//! `nodemedic-lab chaos` (`make chaos SEED=.. TRIALS=..`): the fault campaign. Draws each trial's
//! plan from the seed, runs it in a lab (one lab per shape, reused while sound), judges it, and
//! writes `chaos-<stamp>.json` and `.md`. Exits non-zero when any trial found a violation or
//! could not run.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use nodemedic_harness::{
    bench,
    chaos::{
        self, Options,
        plan::{kind, summary},
        run::{Runner, TrialResult},
    },
    provenance::Source,
};
use serde_json::json;

#[derive(Args, Debug)]
pub(crate) struct ChaosArgs {
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 200)]
    pub trials: usize,
    /// Only labs of this many nodes.
    #[arg(long, value_parser = lab_size)]
    pub nodes: Option<usize>,
    /// Replay one trial (its index, as a violation names it).
    #[arg(long)]
    pub only_trial: Option<usize>,
    /// Run the trials from this index to `--trials` (e.g. to resume a campaign cut short, or to
    /// replay a run of trials in the lab they shared).
    #[arg(long, conflicts_with = "only_trial")]
    pub from_trial: Option<usize>,
    /// Where the JSON and markdown reports go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Draw plans as this plan version did (1 to the latest, the default): what a seed draws
    /// changes only with a new version, and every report names the version it ran.
    #[arg(long, default_value_t = chaos::plan::PLAN_VERSION, value_parser = clap::value_parser!(u32).range(1..=i64::from(chaos::plan::PLAN_VERSION)))]
    pub plan_version: u32,
    /// Print the trials' plans (JSON lines) and run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The agents' peer failure detector on in every lab (self remediation's agents, and agents
    /// beside fence agents), and every health check acting on its PeersReachable condition.
    #[arg(long)]
    pub peer_detection: bool,
    /// Labs of real nodes (kubelets, containerd, real pods; nodemedic installed by Helm from
    /// its images; the writer StatefulSet judged by the data witness too): three nodes unless
    /// `--nodes` says otherwise, self remediation and fence agents by turns, no membership
    /// churn, and node faults where the kwok campaign draws long control-plane outages or a
    /// full disk. The chart runs self remediation's agents on every node, so fence agents' labs
    /// have them too (a partitioned node's agent may reset it through its watchdog).
    #[arg(long)]
    pub real_nodes: bool,
    /// nodemedic as the chart's default values install it, read from the rendered chart (its
    /// default health check, on the trial's template, and its SelfNodeRemediationConfig, the
    /// peer detector on), in place of the lab's fast configuration and the seed's checks.
    #[arg(long, conflicts_with_all = ["peer_detection", "real_nodes"])]
    pub chart_defaults: bool,
}

fn lab_size(s: &str) -> Result<usize, String> {
    match s {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err("3 or 5".into()),
    }
}

/// Which trials of the seed's sequence to run.
fn trial_indices(args: &ChaosArgs) -> anyhow::Result<Vec<usize>> {
    Ok(match (args.only_trial, args.from_trial) {
        (Some(i), _) => vec![i],
        (None, Some(from)) if from >= args.trials => {
            bail!(
                "--from-trial {from} is past the last trial ({}): give --trials more than {from}",
                args.trials.saturating_sub(1)
            )
        }
        (None, from) => (from.unwrap_or(0)..args.trials).collect(),
    })
}

pub(crate) fn run(args: ChaosArgs) -> anyhow::Result<()> {
    crate::interruptible::run(campaign(args))
}

async fn campaign(args: ChaosArgs) -> anyhow::Result<()> {
    let exe = nodemedic_harness::product::nodemedic()?;
    let options = Options {
        nodes: args.nodes,
        version: args.plan_version,
        real_nodes: args.real_nodes,
    };
    let indices = trial_indices(&args)?;
    if args.dry_run {
        let plans: Vec<_> = indices
            .iter()
            .map(|index| chaos::plan_with(args.seed, *index, options))
            .collect();
        for plan in &plans {
            println!("{}", serde_json::to_string(plan)?);
        }
        // On standard error, so standard output stays one JSON plan a line.
        eprintln!("{} plans: {}", plans.len(), summary::counts(&plans));
        return Ok(());
    }
    let mut runner = Runner::new(&exe, args.nodes, args.peer_detection).alone();
    if args.chart_defaults {
        runner = runner.with_chart_defaults();
    }
    let mut results = Vec::new();
    std::fs::create_dir_all(&args.out)?;
    let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    let machine = crate::bench_cmd::machine();
    let source = Source::of_working_directory();
    let planned = indices.len();
    for index in indices {
        let plan = chaos::plan_with(args.seed, index, options);
        let steps: Vec<String> = plan.steps.iter().map(|s| kind(&s.action)).collect();
        println!(
            "==> trial {index}: {} nodes, {:?}{}, {:?}: {}",
            plan.shape.nodes,
            plan.shape.path,
            if plan.shape.slow_bmc { " (slow BMC)" } else { "" },
            plan.strategy,
            steps.join(" ")
        );
        let result = runner.trial(&plan).await;
        for line in &result.log {
            println!("    {line}");
        }
        for v in &result.violations {
            println!("    VIOLATION {:?}: {}  (replay: {})", v.kind, v.detail, result.replay);
        }
        if let Some(e) = &result.error {
            println!("    ERROR: {e}  (replay: {})", result.replay);
        }
        if let Some(logs) = &result.logs {
            println!("    the lab's logs are kept in {}", logs.display());
        }
        results.push(result);
        // Written after every trial, so a campaign cut short still leaves what it found.
        write_report(&args, &stamp, (&machine, &source), planned, &results)?;
    }
    drop(runner);
    let (json_path, md_path) = write_report(&args, &stamp, (&machine, &source), planned, &results)?;
    let md = std::fs::read_to_string(&md_path)?;
    println!("{md}\nwrote {} and {}", json_path.display(), md_path.display());
    let failed = results
        .iter()
        .filter(|r| !r.violations.is_empty() || r.error.is_some())
        .count();
    if failed > 0 {
        bail!("{failed} of {} trials failed", results.len());
    }
    Ok(())
}

/// Writes the campaign's reports so far; `ran_on` is the machine and the source it ran from.
fn write_report(
    args: &ChaosArgs,
    stamp: &str,
    ran_on: (&str, &Source),
    planned: usize,
    results: &[TrialResult],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (machine, source) = ran_on;
    let json_path = args.out.join(format!("chaos-{stamp}.json"));
    let mut report = json!({
        "seed": args.seed,
        "planVersion": args.plan_version,
        "nodes": args.nodes,
        "peerDetection": args.peer_detection,
        "realNodes": args.real_nodes,
        "chartDefaults": args.chart_defaults,
        "machine": machine,
        "planned": planned,
        "trials": results,
    });
    if let Some(fields) = report.as_object_mut() {
        fields.extend(source.json_fields());
    }
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    let md_path = args.out.join(format!("chaos-{stamp}.md"));
    let mut md = markdown(args.seed, args.plan_version, ran_on, results);
    md.push_str(FALSE_FENCES);
    if args.real_nodes {
        md.push_str(
            "\nOn real nodes: a kubelet, containerd and real pods each; nodemedic installed by `helm install` from its images; the workload the writer StatefulSet, whose volume the data witness also reads after every trial (two writers, a synced record lost, a sequence skipped).\n",
        );
    }
    if args.chart_defaults {
        md.push_str(
            "\nWith the chart's default values, read from the rendered chart: its default health check on the trial's template, and its SelfNodeRemediationConfig (docs/defaults.md says what they are).\n",
        );
    }
    if args.peer_detection {
        md.push_str(
            "\nWith the peer failure detector on in every lab, and every health check also unhealthy on PeersReachable=False at once.\n",
        );
    }
    if results.len() < planned {
        md.push_str(&format!(
            "\n**Incomplete**: {} of the {planned} planned trials have run so far.\n",
            results.len()
        ));
    }
    std::fs::write(&md_path, &md)?;
    Ok((json_path, md_path))
}

/// How the false-fence check judges, in every report (`chaos::verdict::fences` has the why).
const FALSE_FENCES: &str = "\nA fence (a watchdog reset, a node's own sysrq reboot, a BMC power-off) counts as false unless \
(1) its self-remediation licence could have run out: the node cut off from the API server and from a majority of its peers \
(partitioned with a minority; or the API server or etcd away with too few peers up, an agent started meanwhile counting none) \
for at least L + W - R - F - 50 ms before the reset and the reset no later than R after the cut-off ended, where L is the licence, \
W the watchdog timeout, F its feed interval and R the longest between two renewals of a live agent, all from the trial's \
SelfNodeRemediationConfig; or frozen since W - F before; or booted W before and cut off since; or (2) a remediation of it was in \
flight (or removed shortly before) that came from an outage a health check could have seen: the node disconnected at least as \
long as the trial's quickest detection, the remediation created after that and within 10 s of its return, or escalating one \
that did. Every \
bound is widened by 1 s. A violation names the cut-off it found and the bound.\n";

fn markdown(seed: u64, plan_version: u32, (machine, source): (&str, &Source), results: &[TrialResult]) -> String {
    let faults = summary::counts(results.iter().map(|r| &r.plan));
    let violations: usize = results.iter().map(|r| r.violations.len()).sum();
    let errors = results.iter().filter(|r| r.error.is_some()).count();
    let pct = |f: fn(&TrialResult) -> Option<f64>| {
        let v: Vec<f64> = results.iter().filter_map(f).collect();
        bench::summary(&v).map_or("-".into(), |s| format!("{:.1} / {:.1} / {:.1}", s.p50, s.p90, s.p99))
    };
    let mut out = format!(
        "# Fault campaign\n\nSeed {seed} (plan version {plan_version}), {} on {machine}. Commit: {}.\n\nViolations: {violations}; trials that could not run: {errors}.\n\n\
         Recovery, seconds from the first fault (p50 / p90 / p99): workload Running again {}; every node healthy and nothing left behind {}.\n\n\
         Faults injected: {}.\n\n\
         | trial | nodes | path | strategy | faults | violations | workload back (s) | all healthy (s) |\n|---|---|---|---|---|---|---|---|\n",
        match results.len() {
            1 => "1 trial".to_owned(),
            n => format!("{n} trials"),
        },
        source.describe(),
        pct(|r| r.workload_back_seconds),
        pct(|r| r.all_healthy_seconds),
        faults,
    );
    let secs = |v: Option<f64>| v.map_or("-".into(), |s| format!("{s:.1}"));
    for r in results {
        let p = &r.plan;
        out.push_str(&format!(
            "| {} | {} | {:?}{} | {:?} | {} | {} | {} | {} |\n",
            p.index,
            p.shape.nodes,
            p.shape.path,
            if p.shape.slow_bmc { " (slow BMC)" } else { "" },
            p.strategy,
            p.steps.iter().map(|s| kind(&s.action)).collect::<Vec<_>>().join(" "),
            r.violations.len() + usize::from(r.error.is_some()),
            secs(r.workload_back_seconds),
            secs(r.all_healthy_seconds),
        ));
    }
    let bad: Vec<&TrialResult> = results
        .iter()
        .filter(|r| !r.violations.is_empty() || r.error.is_some())
        .collect();
    if !bad.is_empty() {
        out.push_str("\n## Violations\n\n");
        for r in bad {
            out.push_str(&format!("Trial {} (replay: `{}`):\n", r.plan.index, r.replay));
            for v in &r.violations {
                out.push_str(&format!("- {:?}: {}\n", v.kind, v.detail));
            }
            if let Some(e) = &r.error {
                out.push_str(&format!("- could not run: {e}\n"));
            }
            if let Some(logs) = &r.logs {
                out.push_str(&format!(
                    "- the lab's logs (on the machine that ran it): `{}`\n",
                    logs.display()
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        chaos: ChaosArgs,
    }

    fn indices(args: &[&str]) -> anyhow::Result<Vec<usize>> {
        let cli = Cli::try_parse_from(std::iter::once("chaos").chain(args.iter().copied()))?;
        trial_indices(&cli.chaos)
    }

    #[test]
    fn the_campaign_runs_every_trial_one_trial_or_the_trials_from_one_on() {
        assert_eq!(indices(&["--trials", "3"]).expect("all"), vec![0, 1, 2]);
        assert_eq!(
            indices(&["--trials", "50", "--only-trial", "29"]).expect("one"),
            vec![29]
        );
        assert_eq!(
            indices(&["--trials", "30", "--from-trial", "27"]).expect("from"),
            vec![27, 28, 29]
        );
    }

    #[test]
    fn a_start_past_the_last_trial_or_beside_only_trial_is_refused() {
        let past = indices(&["--trials", "30", "--from-trial", "30"]).expect_err("past the end");
        assert!(past.to_string().contains("give --trials more than 30"), "{past}");
        assert!(indices(&["--only-trial", "3", "--from-trial", "2"]).is_err());
    }
}
