//! `nodemedic-controller`: the operators alone, the Deployment's command.
//!
//! The all-in-one `nodemedic` binary also carries the agent, `status` and `crds`; the pages of it
//! the controller touches add to its resident memory, which this executable, with only the
//! operators linked in, does not (at 5,000 nodes the controller's memory target is 64 MiB).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodemedic-controller",
    version,
    about = "The nodemedic operators: health check, self remediation, fence agents, maintenance"
)]
struct Cli {
    #[command(flatten)]
    controller: nodemedic::controller::ControllerArgs,
}

fn main() -> anyhow::Result<()> {
    nodemedic::controller::run(Cli::parse().controller)
}
