//! `nodemedic`: one binary, one subcommand per role. The lab, demo, benchmarks and fault campaign
//! are the test tooling's `nodemedic-lab` (testing/harness), not part of what ships.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod doctor;
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
    /// Nodes, their health, remediations in flight and maintenance, in one table.
    Status(status::StatusArgs),
    /// Check the cluster for what nodemedic needs; print each problem with its fix.
    Doctor(doctor::DoctorArgs),
}

fn main() -> anyhow::Result<()> {
    // One crypto provider for every TLS user in the process (kube, tonic): ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli().command {
        Command::Controller(args) => nodemedic::controller::run(args),
        Command::Agent(args) => nodemedic::agent::run(args),
        Command::Crds { write } => crds(write),
        Command::Status(args) => status::run(args),
        Command::Doctor(args) => doctor::run(args),
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
