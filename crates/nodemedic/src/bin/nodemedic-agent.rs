//! `nodemedic-agent`: the self-remediation agent alone, the DaemonSet's command.
//!
//! Every node runs one, so its memory counts many times over. The all-in-one `nodemedic` binary
//! carries every operator; the pages of it an agent touches cost resident memory that this
//! executable, with only the agent linked in, does not.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodemedic-agent",
    version,
    about = "The self-remediation agent: watches its node's health and fences it when it is cut off"
)]
struct Cli {
    #[command(flatten)]
    agent: nodemedic::agent::AgentArgs,
}

fn main() -> anyhow::Result<()> {
    nodemedic::agent::run(Cli::parse().agent)
}
