//! The self-remediation agent's process: the agent library in a [`crate::process`].
//! Shared by `nodemedic agent` and the agent-only `nodemedic-agent` executable.

pub use nodemedic_self_remediation::agent::AgentArgs;

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    crate::process::run(args.log_json, |stop| nodemedic_self_remediation::agent::run(args, stop))
}
