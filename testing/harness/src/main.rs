//! `nodemedic-lab`: nodemedic's test tooling in one executable. A lab cluster on this machine
//! (real control plane, simulated nodes) and its faults, the demo, the benchmarks and the fault
//! campaign. It runs the product's `nodemedic` executables, built next to it; none of this ships.

use clap::{Parser, Subcommand};

mod bench_cmd;
mod chaos_cmd;
mod demo_cmd;
mod interruptible;
mod lab_cmd;

#[derive(Parser)]
#[command(
    name = "nodemedic-lab",
    version,
    about = "A lab cluster on this machine to try nodemedic in, its demo, benchmarks and fault campaign"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Lab(lab_cmd::LabCommand),
    /// A lab with nodemedic installed: a node dies, its stateful workload comes back elsewhere.
    Demo(demo_cmd::DemoArgs),
    /// Time to safe recovery, per path and strategy, over N crash trials (writes a report).
    Bench(bench_cmd::BenchArgs),
    /// The fault campaign: seeded random trials of mixed faults, each judged (writes a report).
    Chaos(chaos_cmd::ChaosArgs),
    /// The OLM bundle for OperatorHub (`make bundle`), from the chart and the built images.
    Bundle(BundleArgs),
}

#[derive(clap::Args)]
struct BundleArgs {
    /// Where to write it (manifests/, metadata/, bundle.Dockerfile).
    #[arg(long, default_value = "target/bundle")]
    out: std::path::PathBuf,
}

fn bundle(args: BundleArgs) -> anyhow::Result<()> {
    let images = nodemedic_harness::images::Images::of(&nodemedic_harness::product::nodemedic()?)?;
    nodemedic_harness::bundle::generate(&args.out, &images)?;
    println!("{}", args.out.display());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // One crypto provider for every TLS user in the process (kube, the BMCs' clients): ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Cli::parse().command {
        Command::Lab(command) => lab_cmd::run(command),
        Command::Demo(args) => demo_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Chaos(args) => chaos_cmd::run(args),
        Command::Bundle(args) => bundle(args),
    }
}
