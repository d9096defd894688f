//! The detector's settings (SelfNodeRemediationConfig `peerDetection`) and their bounds.

use std::time::Duration;

/// How the agents probe each other (SWIM: one direct probe per period to a member chosen in
/// shuffled round-robin; if it is not acknowledged within the round-trip time, `indirect_probes`
/// other members probe it on the prober's behalf; a member nobody reached is suspected, and
/// declared down unless it refutes the suspicion in time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectorSettings {
    pub probe_period: Duration,
    pub probe_rtt: Duration,
    pub indirect_probes: u8,
    pub suspect_to_down_after: Duration,
}

impl Default for DetectorSettings {
    /// Chosen in simulation (the crate's `simulation` tests): a crashed member is declared down
    /// within 1.4 s at the median and 2.6 s at the 99th percentile in clusters of 3 to 10, and a
    /// network with 200 ms ± 100 ms one-way delay and 5% loss declares no live member down.
    fn default() -> Self {
        Self {
            probe_period: Duration::from_millis(400),
            probe_rtt: Duration::from_millis(200),
            indirect_probes: 3,
            suspect_to_down_after: Duration::from_secs(1),
        }
    }
}

/// Settings the detector cannot work with, each with what to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error(
        "probePeriod {0:?} is below 100ms: set it to 100ms or more (probing that often costs CPU and traffic on every node)"
    )]
    PeriodTooShort(Duration),
    #[error("probePeriod {0:?} is above 60s: set it to 60s or less (a dead node would go unnoticed for minutes)")]
    PeriodTooLong(Duration),
    #[error(
        "probeRtt {rtt:?} is more than half of probePeriod {period:?}: set it to half or less, the indirect probes need the rest of the period"
    )]
    RttTooLong { rtt: Duration, period: Duration },
    #[error("numIndirectProbes is 0: set it to 1 or more, or a single lost packet makes a healthy node suspect")]
    NoIndirectProbes,
    #[error("numIndirectProbes {0} is above 10: a few are enough and each costs traffic on every probe that fails")]
    TooManyIndirectProbes(u8),
    #[error(
        "suspectToDownAfter {suspect:?} is shorter than probePeriod {period:?}: a suspected node needs at least a period to refute the suspicion"
    )]
    SuspicionTooShort { suspect: Duration, period: Duration },
}

impl DetectorSettings {
    /// Every problem with these settings (empty when they are usable).
    pub fn validate(&self) -> Vec<SettingsError> {
        let mut problems = Vec::new();
        if self.probe_period < Duration::from_millis(100) {
            problems.push(SettingsError::PeriodTooShort(self.probe_period));
        }
        if self.probe_period > Duration::from_secs(60) {
            problems.push(SettingsError::PeriodTooLong(self.probe_period));
        }
        if self.probe_rtt > self.probe_period / 2 {
            problems.push(SettingsError::RttTooLong {
                rtt: self.probe_rtt,
                period: self.probe_period,
            });
        }
        match self.indirect_probes {
            0 => problems.push(SettingsError::NoIndirectProbes),
            k if k > 10 => problems.push(SettingsError::TooManyIndirectProbes(k)),
            _ => {}
        }
        if self.suspect_to_down_after < self.probe_period {
            problems.push(SettingsError::SuspicionTooShort {
                suspect: self.suspect_to_down_after,
                period: self.probe_period,
            });
        }
        problems
    }

    /// How long a silent node typically goes undeclared: the probe that finds it comes within
    /// about two periods (each member probes one other per period, in shuffled round-robin, so
    /// with n members a given one escapes a whole period with probability (1 - 1/(n-1))^(n-1),
    /// about 1/e), then the suspicion runs out. Not a bound: a run of unlucky draws is longer.
    pub fn typical_detection(&self) -> Duration {
        self.probe_period
            .saturating_mul(2)
            .saturating_add(self.suspect_to_down_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_defaults_are_valid_and_detect_within_three_seconds() {
        let defaults = DetectorSettings::default();
        assert_eq!(defaults.validate(), vec![]);
        assert!(defaults.typical_detection() <= Duration::from_secs(3));
    }

    #[test]
    fn each_mistake_is_named_with_its_fix() {
        let bad = DetectorSettings {
            probe_period: Duration::from_millis(50),
            probe_rtt: Duration::from_millis(40),
            indirect_probes: 0,
            suspect_to_down_after: Duration::from_millis(10),
        };
        let problems = bad.validate();
        assert_eq!(problems.len(), 4, "{problems:?}");
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(text[0].contains("set it to 100ms or more"), "{text:?}");
        assert!(text[1].contains("more than half of probePeriod"), "{text:?}");
        assert!(text[2].contains("set it to 1 or more"), "{text:?}");
        assert!(text[3].contains("at least a period to refute"), "{text:?}");
    }

    proptest! {
        #[test]
        fn valid_settings_leave_room_for_indirect_probes_and_refutation(
            period_ms in 1u64..120_000,
            rtt_ms in 0u64..120_000,
            k in 0u8..20,
            suspect_ms in 0u64..120_000,
        ) {
            let s = DetectorSettings {
                probe_period: Duration::from_millis(period_ms),
                probe_rtt: Duration::from_millis(rtt_ms),
                indirect_probes: k,
                suspect_to_down_after: Duration::from_millis(suspect_ms),
            };
            if s.validate().is_empty() {
                prop_assert!(s.probe_rtt * 2 <= s.probe_period);
                prop_assert!(s.indirect_probes >= 1);
                prop_assert!(s.suspect_to_down_after >= s.probe_period);
            } else {
                let rtt_too_long = s.probe_rtt > s.probe_period / 2;
                let period_out_of_range = s.probe_period < Duration::from_millis(100) || s.probe_period > Duration::from_secs(60);
                let bad_k = s.indirect_probes == 0 || s.indirect_probes > 10;
                let suspicion_too_short = s.suspect_to_down_after < s.probe_period;
                prop_assert!(rtt_too_long || period_out_of_range || bad_k || suspicion_too_short);
            }
        }
    }
}
