//! The stop signals every nodemedic process obeys.

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
pub async fn signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
