//! Running a lab-driving command (demo, bench, chaos) so that Ctrl-C or SIGTERM tears its lab
//! down: the work is dropped, and with it every lab it holds.

use std::future::Future;

/// Runs `work` on a two-worker runtime until it ends or the process is interrupted.
pub(crate) fn run<F>(work: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    // The commands speak for themselves on stdout; the lab's start-up and teardown retries are noise.
    nodemedic_kube::logging::init_with_default(false, "warn,kube_client=off");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        tokio::select! {
            result = work => result,
            _ = interrupted() => {
                println!("\n==> interrupted: tearing the lab down");
                Ok(())
            }
        }
    })
}

/// SIGTERM or Ctrl-C.
async fn interrupted() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
