//! Names and counts of what plans do, for the report's fault summary and the dry run.

use nodemedic_lab::Fault;
use std::collections::BTreeMap;

use super::{
    Action, TrialPlan,
    episodes::{CRASH_AFTER_OUTAGE_MS, LONG_OUTAGE_MS},
};

pub const LONG_APISERVER_OUTAGE: &str = "long API server outage";
pub const LONG_ETCD_OUTAGE: &str = "long etcd outage";
pub const CRASH_AFTER_LONG_OUTAGE: &str = "a crash right after a long control-plane outage";
pub const NODE_REJOINS: &str = "node leaves and rejoins";
pub const EXTRA_NODE: &str = "extra node joins and leaves";
pub const CHURN_DURING_CRASH: &str = "membership change during a crash";
pub const CONTROLLER_RESTART_LOOP: &str = "controller restart loop";
pub const SLOW_NETWORK: &str = "slow lossy network";
pub const FULL_DISK: &str = "a node's disk fills up";
pub const STARVED_AGENT_CPU: &str = "an agent starved of CPU";
pub const STARVED_AGENT_MEMORY: &str = "an agent under memory pressure";
pub const SLOW_ETCD: &str = "slow etcd";
pub const SLOW_APISERVER: &str = "slow API server";
pub const ROLLING_UPGRADE: &str = "rolling upgrade (every node rebooted in turn)";

/// The action's kebab-case name, as in the JSON plan.
pub fn kind(action: &Action) -> String {
    serde_json::to_value(action)
        .ok()
        .and_then(|v| v["action"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The episodes of the kinds the membership and peer-detection work added, read back from the
/// steps: one entry per occurrence.
pub fn episodes(plan: &TrialPlan) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut stopped: Option<(&Action, u64)> = None;
    // When the last long outage ended.
    let mut long_ended: Option<u64> = None;
    let mut churn: Option<(u64, u64)> = None;
    for step in &plan.steps {
        let long = |since: u64| step.at_ms - since >= LONG_OUTAGE_MS.0;
        let right_after = |ended: Option<u64>| ended.is_some_and(|ended| step.at_ms - ended <= CRASH_AFTER_OUTAGE_MS.1);
        match &step.action {
            Action::Fault(Fault::StopApiserver) | Action::Fault(Fault::StopEtcd) => {
                stopped = Some((&step.action, step.at_ms))
            }
            Action::Fault(Fault::StartApiserver) => {
                if let Some((Action::Fault(Fault::StopApiserver), since)) = stopped.take()
                    && long(since)
                {
                    out.push(LONG_APISERVER_OUTAGE);
                    long_ended = Some(step.at_ms);
                }
            }
            Action::Fault(Fault::StartEtcd) => {
                if let Some((Action::Fault(Fault::StopEtcd), since)) = stopped.take()
                    && long(since)
                {
                    out.push(LONG_ETCD_OUTAGE);
                    long_ended = Some(step.at_ms);
                }
            }
            Action::Fault(Fault::Crash { .. }) if right_after(long_ended) => {
                long_ended = None;
                out.push(CRASH_AFTER_LONG_OUTAGE);
            }
            Action::RemoveNode { node } if *node < plan.shape.nodes => out.push(NODE_REJOINS),
            Action::AddNode { node } if *node == plan.shape.extra_slot() => out.push(EXTRA_NODE),
            Action::RestartControllerLoop { .. } => out.push(CONTROLLER_RESTART_LOOP),
            Action::Fault(Fault::SlowLinks { .. }) => out.push(SLOW_NETWORK),
            Action::Fault(Fault::FillDisk { .. }) => out.push(FULL_DISK),
            Action::Fault(Fault::StarveAgent { .. }) => out.push(STARVED_AGENT_CPU),
            Action::Fault(Fault::SqueezeAgent { .. }) => out.push(STARVED_AGENT_MEMORY),
            Action::Fault(Fault::SlowEtcd { .. }) => out.push(SLOW_ETCD),
            Action::Fault(Fault::SlowApiserver { .. }) => out.push(SLOW_APISERVER),
            Action::Upgrade { announced: true } => out.push(ROLLING_UPGRADE),
            _ => {}
        }
        if matches!(step.action, Action::AddNode { .. } | Action::RemoveNode { .. }) {
            let (first, _) = churn.unwrap_or((step.at_ms, step.at_ms));
            churn = Some((first, step.at_ms));
        }
    }
    if let Some((first, last)) = churn
        && plan
            .steps
            .iter()
            .any(|s| matches!(s.action, Action::Fault(Fault::Crash { .. })) && (first..=last).contains(&s.at_ms))
    {
        out.push(CHURN_DURING_CRASH);
    }
    out
}

/// How often each action kind and each episode of [`episodes`] occurs in the plans.
pub fn counts<'a>(plans: impl IntoIterator<Item = &'a TrialPlan>) -> Counts {
    let mut counts = Counts::default();
    for plan in plans {
        for step in &plan.steps {
            *counts.actions.entry(kind(&step.action)).or_default() += 1;
        }
        for episode in episodes(plan) {
            *counts.episodes.entry(episode).or_default() += 1;
        }
    }
    counts
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub actions: BTreeMap<String, usize>,
    pub episodes: BTreeMap<&'static str, usize>,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |m: Vec<(String, usize)>| {
            m.iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let actions = self.actions.iter().map(|(k, n)| (k.clone(), *n)).collect();
        let episodes: Vec<(String, usize)> = self.episodes.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        write!(f, "{}", list(actions))?;
        if !episodes.is_empty() {
            write!(f, "; episodes: {}", list(episodes))?;
        }
        Ok(())
    }
}
