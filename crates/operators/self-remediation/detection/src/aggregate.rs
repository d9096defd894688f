//! The controller's side: the latest report of every observer about every member, and the
//! verdicts over the whole cluster.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

use crate::{HostProbes, Observation, Policy, Report, Verdict, signed, verdict};

/// Every observer's latest report, by subject. A withdrawal removes the observer's report; so
/// does expiry, so an observer that stopped refreshing (crashed, cut off) holds no memory.
#[derive(Clone, Debug, Default)]
pub struct Reports {
    by_subject: BTreeMap<String, BTreeMap<String, Observation>>,
}

/// What the controller knows of a member besides the reports: its kubelet lease and its own
/// probes of the member's host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberFacts {
    pub lease_renewed: Option<Timestamp>,
    pub host: HostProbes,
}

impl Reports {
    /// `observer`'s batch of reports, received at `at` on the controller's clock. A member's
    /// report about itself says nothing and is dropped.
    pub fn receive(&mut self, observer: &str, reports: &[Report], at: Timestamp) {
        for report in reports.iter().filter(|r| r.subject != observer) {
            match report.since {
                Some(since) => {
                    let observation = Observation {
                        observer: observer.to_owned(),
                        unreachable_since: since,
                        reported_at: at,
                    };
                    self.by_subject
                        .entry(report.subject.clone())
                        .or_default()
                        .insert(observer.to_owned(), observation);
                }
                None => {
                    if let Some(observers) = self.by_subject.get_mut(&report.subject) {
                        observers.remove(observer);
                        if observers.is_empty() {
                            self.by_subject.remove(&report.subject);
                        }
                    }
                }
            }
        }
    }

    /// `member` left the cluster: the reports about it and its own go.
    pub fn forget(&mut self, member: &str) {
        self.by_subject.remove(member);
        self.by_subject.retain(|_, observers| {
            observers.remove(member);
            !observers.is_empty()
        });
    }

    /// Drops the reports received more than `ttl` before `now`: they are no evidence any more.
    pub fn expire(&mut self, now: Timestamp, ttl: Duration) {
        let ttl = signed(ttl);
        self.by_subject.retain(|_, observers| {
            observers.retain(|_, o| now.duration_since(o.reported_at) <= ttl);
            !observers.is_empty()
        });
    }

    /// How many reports are held.
    pub fn len(&self) -> usize {
        self.by_subject.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_subject.is_empty()
    }

    /// The reports held about `subject`, one per observer.
    pub fn about(&self, subject: &str) -> Vec<Observation> {
        self.by_subject
            .get(subject)
            .map(|observers| observers.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// The verdict on every member some other member reports, in name order; every other member is
/// `Reachable` with no observer. Only members' reports count: a node that left the cluster, or an
/// agent that is not a member, observes nothing.
pub fn verdicts(
    reports: &Reports,
    members: &BTreeMap<String, MemberFacts>,
    now: Timestamp,
    policy: &Policy,
) -> Vec<(String, Verdict)> {
    let other_members = members.len().saturating_sub(1);
    reports
        .by_subject
        .iter()
        .filter_map(|(subject, observers)| {
            let facts = members.get(subject)?;
            let observations: Vec<Observation> = observers
                .values()
                .filter(|o| members.contains_key(&o.observer))
                .cloned()
                .collect();
            let verdict = verdict(
                subject,
                &observations,
                other_members,
                facts.lease_renewed,
                facts.host,
                now,
                policy,
            );
            Some((subject.clone(), verdict))
        })
        .collect()
}

#[cfg(test)]
mod tests;
