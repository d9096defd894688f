//! The self-remediation agent's process: its runtime and logging around the agent library.
//! Shared by `nodemedic agent` and the agent-only `nodemedic-agent` executable.

pub use nodemedic_self_remediation::agent::AgentArgs;

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    // One crypto provider for every TLS user in the process (kube, tonic): ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    nodemedic_kube::logging::init(args.log_json);
    // Two workers: the agent's work is a few timers and small requests, and every node runs one.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(nodemedic_self_remediation::agent::run(args))?;
    Ok(())
}
