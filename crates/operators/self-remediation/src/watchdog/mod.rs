//! The watchdog that resets a node whose agent stops feeding it, and the reboot an agent asks for
//! when it must fence at once.
//!
//! Two implementations: the Linux device (`/dev/watchdog`, the only code with `unsafe`, in
//! [`linux`]) and the lab's (`lab:<socket>`), a host-side timer that power-cycles a simulated
//! node. **No lab configuration can reach the real reboot**: that needs a real device *and*
//! `--software-reboot`, and is refused whenever `NODEMEDIC_LAB` is set, which the lab sets for
//! every process it runs.

mod lab;
mod linux;

use std::{path::PathBuf, time::Duration};

pub use lab::LabWatchdog;
pub use linux::LinuxWatchdog;

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("watchdog {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("watchdog {path}: {why}")]
    Unusable { path: PathBuf, why: String },
    #[error("software reboot refused: {0}")]
    RebootRefused(&'static str),
}

pub trait Watchdog: Send {
    /// How long after the last feed the device resets the node.
    fn timeout(&self) -> Duration;
    fn feed(&mut self) -> Result<(), WatchdogError>;
    /// The magic close: stop the timer. Only for a deliberate, safe shutdown of the agent.
    fn disarm(&mut self) -> Result<(), WatchdogError>;
    /// Reset the node now (fencing at once). The lab simulates it; on a real node it is the
    /// software reboot, which needs explicit configuration.
    fn reboot_now(&mut self) -> Result<(), WatchdogError>;
    fn describe(&self) -> String;
}

/// Opens the watchdog named by `spec`: `lab:<socket path>` (whose timeout the lab sets), or a
/// device path, programmed with `timeout` unless it is zero.
pub fn open(spec: &str, software_reboot: bool, timeout: Duration) -> Result<Box<dyn Watchdog>, WatchdogError> {
    match spec.strip_prefix("lab:") {
        Some(path) => Ok(Box::new(LabWatchdog::connect(path.into())?)),
        None => {
            let reboot = if software_reboot && std::env::var_os("NODEMEDIC_LAB").is_none() {
                linux::Reboot::Sysrq
            } else {
                linux::Reboot::Refused
            };
            Ok(Box::new(LinuxWatchdog::open(spec.into(), reboot, timeout)?))
        }
    }
}

/// How often to feed: a third of the timeout (as medik8s), at most once a second.
pub fn feed_interval(timeout: Duration) -> Duration {
    (timeout / 3)
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(100))
}
