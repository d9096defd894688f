//! The software reboot as a watchdog: where a node has no watchdog device, the agent's feeder
//! thread keeps the timer itself and reboots the node (sysrq) once it goes unfed for its
//! timeout. It is only as sure as the agent process: a hung or killed agent reboots nothing,
//! which is why a device is preferred and this means is reported as such.
//!
//! The timer arms at the first feed, not at start: an agent that has not yet earned a licence
//! (its certificate, its first API read) has run no workload for this boot's licence to cover.

use std::time::{Duration, Instant};

use super::{Reboot, Watchdog, WatchdogError};

pub(crate) struct SoftwareTimer {
    timeout: Duration,
    last_fed: Option<Instant>,
    reboot: Reboot,
    fired: bool,
}

impl SoftwareTimer {
    pub(crate) fn new(timeout: Duration, reboot: Reboot) -> Self {
        Self {
            timeout,
            last_fed: None,
            reboot,
            fired: false,
        }
    }

    /// Whether the timer ran out at `now`.
    fn expired(&self, now: Instant) -> bool {
        self.last_fed.is_some_and(|fed| now.duration_since(fed) > self.timeout)
    }
}

impl Watchdog for SoftwareTimer {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn feed(&mut self) -> Result<(), WatchdogError> {
        self.last_fed = Some(Instant::now());
        Ok(())
    }

    fn disarm(&mut self) -> Result<(), WatchdogError> {
        self.last_fed = None;
        Ok(())
    }

    fn reboot_now(&mut self) -> Result<(), WatchdogError> {
        self.fired = true;
        self.reboot.now()
    }

    fn poll(&mut self) -> Result<(), WatchdogError> {
        if !self.fired && self.expired(Instant::now()) {
            tracing::warn!(timeout = ?self.timeout, "the software watchdog ran out: rebooting");
            return self.reboot_now();
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("the agent's own timer ({}s)", self.timeout.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_arms_at_the_first_feed_and_runs_out_after_its_timeout() {
        let mut t = SoftwareTimer::new(Duration::from_millis(50), Reboot::Refused);
        let start = Instant::now();
        assert!(
            !t.expired(start + Duration::from_secs(10)),
            "unarmed before the first feed"
        );
        t.feed().expect("feed");
        let fed = t.last_fed.expect("fed");
        assert!(!t.expired(fed + Duration::from_millis(40)));
        assert!(t.expired(fed + Duration::from_millis(60)));
        t.disarm().expect("disarm");
        assert!(!t.expired(fed + Duration::from_secs(10)), "the magic close stops it");
    }
}
