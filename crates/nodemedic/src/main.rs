//! `nodemedic`: one binary, one subcommand per role.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod bench_cmd;
mod chaos_cmd;
mod demo_cmd;
mod interruptible;
mod lab_cmd;
mod monitoring;
mod status;

#[derive(Parser)]
#[command(
    name = "nodemedic",
    version,
    about = "Fence unhealthy Kubernetes nodes and bring their stateful workloads back elsewhere"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operators (health check, self remediation, ...): the Deployment's command.
    Controller(nodemedic::controller::ControllerArgs),
    /// The self-remediation agent, one per node: the DaemonSet's command.
    Agent(nodemedic_self_remediation::agent::AgentArgs),
    /// Print every CustomResourceDefinition (or write one file per CRD into a directory).
    Crds {
        /// Write `<plural>.<group>.yaml` files into this directory instead of printing.
        #[arg(long)]
        write: Option<PathBuf>,
    },
    /// A lab with nodemedic installed: a node dies, its stateful workload comes back elsewhere.
    Demo(demo_cmd::DemoArgs),
    /// Time to safe recovery, per path and strategy, over N crash trials (writes a report).
    Bench(bench_cmd::BenchArgs),
    /// The fault campaign: seeded random trials of mixed faults, each judged (writes a report).
    Chaos(chaos_cmd::ChaosArgs),
    /// Nodes, their health, remediations in flight and maintenance, in one table.
    Status(status::StatusArgs),
    /// A lab cluster on this machine (real control plane, simulated nodes) and its faults.
    Lab {
        #[command(subcommand)]
        command: lab_cmd::LabCommand,
    },
}

fn main() -> anyhow::Result<()> {
    // One crypto provider for every TLS user in the process (kube, tonic): ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli().command {
        Command::Controller(args) => nodemedic::controller::run(args),
        Command::Agent(args) => nodemedic::agent::run(args),
        Command::Crds { write } => crds(write),
        Command::Lab { command } => lab_cmd::run(command),
        Command::Demo(args) => demo_cmd::run(args),
        Command::Status(args) => status::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Chaos(args) => chaos_cmd::run(args),
    }
}

/// Installed (or linked) as `kubectl-nodemedic`, the binary is a kubectl plugin:
/// `kubectl nodemedic [--watch] [-o json|yaml]` is `nodemedic status ...`.
fn cli() -> Cli {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned());
    if invoked_as.as_deref() == Some("kubectl-nodemedic") {
        args.insert(1, "status".into());
    }
    Cli::parse_from(args)
}

fn crds(write: Option<PathBuf>) -> anyhow::Result<()> {
    match write {
        None => print!("{}", nodemedic_api::crds::rendered_stream()?),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (file, yaml) in nodemedic_api::crds::rendered()? {
                let path = dir.join(file);
                std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(())
}
