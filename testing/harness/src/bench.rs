//! What the benchmarks compute, with no I/O: one crash trial's breakdown read from its story and
//! percentiles over trials (here), decision latency ([`decision`]), API requests from the audit
//! log ([`requests`]) and process usage from /proc ([`usage`]). `nodemedic-lab bench` runs the labs.

use serde::Serialize;

pub mod budget;
pub mod decision;
pub mod requests;
pub mod usage;

use crate::story::{Milestone, Reached};

/// One crash, split into the phases the benchmark reports (seconds).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    /// Power lost to NotReady (Kubernetes' node lifecycle controller).
    pub detection: f64,
    /// NotReady to the remediation created (the health check's unhealthy duration).
    pub health_check: f64,
    /// Remediation created to fencing proven (self remediation: the safe time; fence agents:
    /// power off confirmed).
    pub fencing: f64,
    /// Fencing proven to the old pod deleted.
    pub deletion: f64,
    /// Old pod deleted to the new one Running (scheduling, volume attach).
    pub rescheduling: f64,
    /// Power lost to the pod Running elsewhere.
    pub total: f64,
    /// The part nodemedic controls: remediation created to the pod Running elsewhere.
    pub controlled: f64,
}

/// The breakdown of a story that reached the workload Running elsewhere.
pub fn breakdown(story: &[Reached]) -> Option<Breakdown> {
    let at = |m: Milestone| story.iter().find(|r| r.milestone == m).map(|r| r.at);
    let secs = |a: jiff::Timestamp, b: jiff::Timestamp| (b - a).total(jiff::Unit::Second).unwrap_or(0.0);
    let lost = at(Milestone::PowerLost)?;
    // Detection ends at the first sign of failure the health check acts on: NotReady, or, with
    // the peer failure detector, the check finding the node unhealthy before it is NotReady.
    let not_ready = [at(Milestone::NotReady), at(Milestone::Unhealthy)]
        .into_iter()
        .flatten()
        .min()?;
    let created = at(Milestone::RemediationCreated)?;
    let fenced = at(Milestone::Fenced)?;
    let deleted = at(Milestone::WorkloadDeleted)?;
    let running = at(Milestone::WorkloadRunningElsewhere)?;
    Some(Breakdown {
        detection: secs(lost, not_ready),
        health_check: secs(not_ready, created),
        fencing: secs(created, fenced),
        deletion: secs(fenced, deleted),
        rescheduling: secs(deleted, running),
        total: secs(lost, running),
        controlled: secs(created, running),
    })
}

/// Nearest-rank percentile (`p` in 0..=100) of `values`; None when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

pub fn summary(values: &[f64]) -> Option<Summary> {
    Some(Summary {
        p50: percentile(values, 50.0)?,
        p90: percentile(values, 90.0)?,
        p99: percentile(values, 99.0)?,
    })
}

/// The value of the first sample in a Prometheus text exposition whose line starts with `prefix`.
pub fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 99.0), Some(10.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn a_story_splits_into_phases_that_add_up() {
        let at = |s| jiff::Timestamp::from_second(s).expect("time");
        let r = |m, s| Reached {
            milestone: m,
            at: at(s),
            revision: None,
            detail: String::new(),
        };
        let story = [
            r(Milestone::PowerLost, 100),
            r(Milestone::NotReady, 110),
            r(Milestone::RemediationCreated, 115),
            r(Milestone::Fenced, 131),
            r(Milestone::WorkloadDeleted, 132),
            r(Milestone::WorkloadRunningElsewhere, 140),
        ];
        let b = breakdown(&story).expect("complete");
        assert_eq!(b.total, 40.0);
        assert_eq!(b.controlled, 25.0);
        assert_eq!(
            b.detection + b.health_check + b.fencing + b.deletion + b.rescheduling,
            b.total
        );
        assert!(breakdown(&story[..5]).is_none());
    }

    proptest! {
        #[test]
        fn percentiles_are_members_and_ordered(v in proptest::collection::vec(0.0f64..1000.0, 1..50)) {
            let s = summary(&v).expect("non-empty");
            prop_assert!(v.contains(&s.p50) && v.contains(&s.p99));
            prop_assert!(s.p50 <= s.p90 && s.p90 <= s.p99);
        }
    }
}
