//! `nodemedic-lab bench`: the benchmarks, each in its own lab with no other lab beside it. Every
//! suite returns its JSON and a markdown section with its targets met or missed; one report holds
//! them all. Nothing here asserts a time.

mod footprint;
mod images;
mod peer_aggregation;
mod recovery;
mod scale;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use nodemedic_harness::provenance::Source;
use serde_json::json;

pub(crate) use recovery::{Path, Profile, Strategy};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Suite {
    /// Time to safe recovery per path, strategy and timing profile.
    Recovery,
    /// Fleets of 1,000 and 5,000 nodes: decision latency, controller memory, CPU and requests.
    Scale,
    /// The agent's memory and CPU at rest and during a peer storm.
    Footprint,
    /// The OCI images' sizes, as `make image` measured them.
    Images,
    /// Peer failure detection: the controller's aggregation of the agents' reports at 5,000
    /// members (simulated reports, real aggregation; no lab).
    PeerAggregation,
}

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Suites to run (all by default).
    #[arg(long = "suite", value_enum)]
    pub suites: Vec<Suite>,
    /// Recovery trials per path and strategy with the fast profile.
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    /// Recovery trials per path and strategy with the seed profile.
    #[arg(long, default_value_t = 3)]
    pub seed_trials: usize,
    /// Recovery trials of each series with Kubernetes' default timings (fence agents through
    /// Redfish, with the peer failure detector and without).
    #[arg(long, default_value_t = 10)]
    pub defaults_trials: usize,
    /// Recovery trials of the out-of-the-box profile's baseline (medik8s's defaults: about ten
    /// minutes each); its other series run `--trials`.
    #[arg(long, default_value_t = 3)]
    pub baseline_trials: usize,
    /// Recovery trials of the out-of-the-box profile's series after an outage (each crash 30 s
    /// after a three-minute API server outage ends: about five minutes each).
    #[arg(long, default_value_t = 5)]
    pub outage_trials: usize,
    #[arg(long = "path", value_enum)]
    pub paths: Vec<Path>,
    #[arg(long = "strategy", value_enum)]
    pub strategies: Vec<Strategy>,
    /// Timing profiles (all by default).
    #[arg(long = "profile", value_enum)]
    pub profiles: Vec<Profile>,
    /// Fleet sizes for the scale suite.
    #[arg(long = "fleet", default_values_t = [1000, 5000])]
    pub fleets: Vec<usize>,
    /// The recovery suite on real nodes (nodemedic installed by Helm, a writer that really
    /// writes), self remediation and fence agents with the detector, beside the same series on
    /// kwok nodes.
    #[arg(long)]
    pub real_nodes: bool,
    /// With `--real-nodes`: trials of each kwok series beside them (`--trials` by default).
    #[arg(long)]
    pub kwok_trials: Option<usize>,
    /// Where the JSON and markdown reports go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::interruptible::run(bench(args))
}

/// One suite's results: its JSON and its markdown section.
pub(crate) struct Section {
    pub name: &'static str,
    pub json: serde_json::Value,
    pub markdown: String,
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let suites = if args.suites.is_empty() {
        vec![
            Suite::Recovery,
            Suite::Scale,
            Suite::Footprint,
            Suite::Images,
            Suite::PeerAggregation,
        ]
    } else {
        args.suites.clone()
    };
    // Read before the first lab: the tree as the run found it.
    let source = Source::of_working_directory();
    let started = std::time::Instant::now();
    let mut sections = Vec::new();
    for suite in suites {
        let section = match suite {
            Suite::Recovery => recovery::run(&args).await?,
            Suite::Scale => scale::run(&args.fleets).await?,
            Suite::Footprint => footprint::run().await?,
            Suite::Images => images::run()?,
            Suite::PeerAggregation => peer_aggregation::run()?,
        };
        println!("{}", section.markdown);
        sections.push(section);
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    std::fs::create_dir_all(&args.out)?;
    let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    let names: Vec<&str> = sections.iter().map(|s| s.name).collect();
    let base = format!("{}-{stamp}", names.join("-"));
    let machine = machine();
    let mut json = json!({"machine": machine, "minutes": minutes});
    json.as_object_mut()
        .context("the report is an object")?
        .extend(source.json_fields());
    let mut markdown = format!(
        "# nodemedic benchmarks\n\nMachine: {machine}. Commit: {}. The whole run took {minutes:.1} minutes.\n",
        source.describe()
    );
    for s in sections {
        json[s.name] = s.json;
        markdown.push('\n');
        markdown.push_str(&s.markdown);
    }
    let json_path = args.out.join(format!("{base}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)?;
    let md_path = args.out.join(format!("{base}.md"));
    std::fs::write(&md_path, markdown)?;
    println!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// The machine the numbers come from.
pub(crate) fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb / 1024 / 1024)
        .unwrap_or(0);
    format!(
        "{cpus} CPUs ({model}), {mem} GiB RAM, nodemedic {}",
        env!("CARGO_PKG_VERSION")
    )
}

/// "met" or "MISSED", for target lines.
pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**MISSED**" }
}
