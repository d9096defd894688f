//! What every long-running nodemedic process sets up before its work: one TLS crypto provider
//! for every TLS user in it (kube, tonic, the fence agents' clients: ring), logging, a
//! two-worker runtime (the controller's and the agents' work is timers and API round trips), and
//! its stop signals, listened for before anything else runs.

use std::future::Future;

use nodemedic_kube::shutdown::StopSignal;

pub(crate) fn run<E, W>(log_json: bool, work: impl FnOnce(StopSignal) -> W) -> anyhow::Result<()>
where
    W: Future<Output = Result<(), E>>,
    anyhow::Error: From<E>,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    nodemedic_kube::logging::init(log_json);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let stop = StopSignal::listen()?;
        work(stop).await.map_err(anyhow::Error::from)
    })
}
