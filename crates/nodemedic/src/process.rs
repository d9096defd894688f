//! What every long-running nodemedic process sets up before its work: one TLS crypto provider
//! for every TLS user in it (kube, tonic, the fence agents' clients: ring), logging, and a
//! two-worker runtime (the controller's and the agents' work is timers and API round trips).

use std::future::Future;

pub(crate) fn run<E>(log_json: bool, work: impl Future<Output = Result<(), E>>) -> anyhow::Result<()>
where
    anyhow::Error: From<E>,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    nodemedic_kube::logging::init(log_json);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(work)?;
    Ok(())
}
