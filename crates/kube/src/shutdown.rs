//! The stop signals every nodemedic process obeys.
//!
//! A process listens from its first moment, not from when it first waits: in a container it is
//! PID 1, and the kernel drops a SIGTERM sent to PID 1 while it has no handler. A stop asked
//! during start-up would be lost, and the kubelet would kill the process at the end of its grace
//! period without its orderly stop (an agent's watchdog left armed, its node reset).

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM (the kubelet stopping the pod) and SIGINT (Ctrl-C), recorded from [`Self::listen`] on.
pub struct StopSignal {
    terminate: Signal,
    interrupt: Signal,
}

impl StopSignal {
    /// Starts recording stop signals; call it first thing in the runtime.
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves once a stop was asked, also when it was asked before this was awaited.
    pub async fn received(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {},
            _ = self.interrupt.recv() => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The point of listening early: a signal that came before anyone waited is not lost.
    #[tokio::test]
    async fn a_stop_asked_before_anyone_waits_is_received() {
        let mut stop = StopSignal::listen().expect("listening");
        let sent = std::process::Command::new("kill")
            .args(["-s", "TERM", &std::process::id().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill: {sent}");
        tokio::time::timeout(std::time::Duration::from_secs(10), stop.received())
            .await
            .expect("the earlier SIGTERM is received");
    }
}
