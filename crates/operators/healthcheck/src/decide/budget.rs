//! Whether new remediation is allowed: the healthy-node budget, and storm protection.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

use super::{
    CONFLICTING_MHC, Health, UPGRADING, liveness,
    model::{Budget, Decision, Input, Memory, NodeFacts, RemediationFacts, Severity},
    node::Gate,
    upgrade,
};

/// The selected nodes the budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Count {
    pub observed: usize,
    /// No unhealthy condition at all (not even a pending one), or only a Ready=Unknown its
    /// kubelet has renewed since, and no remediation object left.
    pub healthy: usize,
    /// Of the healthy, those Ready=Unknown and renewing (see [`liveness::only_a_stale_unknown`]).
    pub renewing: usize,
    pub unhealthy: usize,
    /// The fewest healthy nodes that still allow remediation.
    pub min_healthy: usize,
    budget: Budget,
}

impl Count {
    pub(super) fn of(
        input: &Input<'_>,
        selected: &[&NodeFacts],
        health: &BTreeMap<&str, Health>,
        owned: &[&RemediationFacts],
    ) -> Self {
        let health_of = |n: &NodeFacts| &health[n.name.as_str()];
        let stale_unknown = |n: &NodeFacts| {
            *health_of(n) != Health::Healthy
                && liveness::only_a_stale_unknown(n, &input.check.rules, input.kubelet_renewals, input.now)
        };
        let unremediated = selected.iter().filter(|n| !owned.iter().any(|r| r.node == n.name));
        let renewing = unremediated.clone().filter(|n| stale_unknown(n)).count();
        let healthy = unremediated.filter(|n| *health_of(n) == Health::Healthy).count() + renewing;
        let unhealthy = selected
            .iter()
            .filter(|n| matches!(health_of(n), Health::Unhealthy { .. }) && !stale_unknown(n))
            .count();
        let observed = selected.len();
        let budget = input.check.budget;
        Self {
            observed,
            healthy,
            renewing,
            unhealthy,
            min_healthy: budget.min_healthy(observed),
            budget,
        }
    }

    pub(super) fn within_budget(&self) -> bool {
        self.healthy >= self.min_healthy
    }

    fn describe(&self) -> String {
        let Self {
            observed,
            healthy,
            renewing,
            unhealthy,
            min_healthy,
            budget,
        } = self;
        let renewing = match renewing {
            0 => String::new(),
            n => format!(" ({n} of them Ready=Unknown but renewing their kubelet lease since)"),
        };
        format!(
            "{healthy} of {observed} selected nodes are healthy{renewing} and {unhealthy} unhealthy; {} requires at least {min_healthy} healthy",
            budget.describe()
        )
    }
}

/// The `RemediationAllowed` condition (the first of a conflict, an upgrade, the budget and a
/// storm that holds new remediation back), and the events when the budget or an upgrade starts
/// to.
pub(super) fn allowance(input: &Input<'_>, count: &Count, gate: &Gate, storm: Storm, decision: &mut Decision) {
    let budget_text = count.describe();
    decision.status.remediation_allowed = if let Some(why) = &gate.conflict {
        (
            false,
            CONFLICTING_MHC,
            format!("No new remediation: {why}; remediations under way go on"),
        )
    } else if let Some(upgrade::Hold { why, .. }) = &gate.upgrade {
        (
            false,
            UPGRADING,
            format!(
                "No new remediation while the cluster upgrades ({why}); remediations under way go on. {budget_text}"
            ),
        )
    } else if !count.within_budget() {
        (
            false,
            "TooFewHealthyNodes",
            format!("No new remediation: {budget_text}"),
        )
    } else if storm.blocks {
        (
            false,
            "StormRecovery",
            format!("No new remediation until the storm cooldown ends: {budget_text}"),
        )
    } else {
        (true, "WithinBudget", format!("Remediation allowed: {budget_text}"))
    };
    if !count.within_budget() && input.memory.remediation_allowed != Some(false) {
        let Count {
            healthy, min_healthy, ..
        } = count;
        decision.notice(
            None,
            Severity::Warning,
            "RemediationSkipped",
            format!("Skipped remediation because the number of healthy nodes selected by the selector is {healthy} and should equal or exceed {min_healthy} ({budget_text})"),
        );
    }
    if let Some(upgrade::Hold { why, .. }) = &gate.upgrade
        && input.memory.remediation_allowed_reason.as_deref() != Some(UPGRADING)
    {
        decision.notice(
            None,
            Severity::Normal,
            "RemediationSkipped",
            format!("Postponing potential remediations because of ongoing cluster upgrade: {why}"),
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Storm {
    pub since: Option<Timestamp>,
    pub cooldown_since: Option<Timestamp>,
    /// New remediation is held back by the storm or its cooldown.
    pub blocks: bool,
}

/// Storm protection (only with `stormCooldownDuration`): while too few nodes are healthy a storm
/// is on; once the budget is met again, new remediation waits for the cooldown.
pub(super) fn storm(
    cooldown: Option<Duration>,
    within_budget: bool,
    memory: &Memory,
    now: Timestamp,
    decision: &mut Decision,
) -> Storm {
    let Some(cooldown) = cooldown else {
        return Storm {
            since: None,
            cooldown_since: None,
            blocks: false,
        };
    };
    if !within_budget {
        if memory.storm_since.is_none() {
            decision.notice(None, Severity::Warning, "StormRecoveryStarted", "Too many nodes are unhealthy at once: storm recovery started, no new remediation until the budget is met and the cooldown has passed".into());
        }
        return Storm {
            since: Some(memory.storm_since.unwrap_or(now)),
            cooldown_since: None,
            blocks: true,
        };
    }
    let Some(since) = memory.storm_since else {
        return Storm {
            since: None,
            cooldown_since: None,
            blocks: false,
        };
    };
    let cooldown_since = memory.cooldown_since.unwrap_or_else(|| {
        decision.notice(
            None,
            Severity::Warning,
            "StormRecoveryCooldownStarted",
            format!(
                "Enough nodes are healthy again: new remediation resumes after a {}s cooldown",
                cooldown.as_secs()
            ),
        );
        now
    });
    let ends = cooldown_since + cooldown;
    if now >= ends {
        decision.notice(
            None,
            Severity::Normal,
            "StormRecoveryEnded",
            "Storm recovery ended: new remediation is allowed again".into(),
        );
        return Storm {
            since: None,
            cooldown_since: None,
            blocks: false,
        };
    }
    decision.requeue(until(now, ends));
    Storm {
        since: Some(since),
        cooldown_since: Some(cooldown_since),
        blocks: true,
    }
}

/// Time from `now` until `then` (zero if past), plus a small margin so the requeue lands after it.
pub(super) fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now)).unwrap_or(Duration::ZERO) + Duration::from_millis(50)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::model::{Budget, IntOrPercent};
    use crate::decide::test_time::at;

    #[test]
    fn percentages_round_up_like_medik8s() {
        assert_eq!(
            Budget::MinHealthy(IntOrPercent::Percent(51)).min_healthy(6),
            4,
            "the seed document's six workers need four healthy"
        );
        assert_eq!(Budget::MinHealthy(IntOrPercent::Percent(51)).min_healthy(3), 2);
        assert_eq!(Budget::DefaultMinHealthy.min_healthy(3), 2);
        assert_eq!(
            Budget::MaxUnhealthy(IntOrPercent::Percent(34)).min_healthy(3),
            1,
            "34% of 3 rounds up to 2 unhealthy allowed"
        );
        assert_eq!(Budget::MaxUnhealthy(IntOrPercent::Int(5)).min_healthy(3), 0);
        assert_eq!(Budget::MinHealthy(IntOrPercent::Int(2)).min_healthy(10), 2);
    }

    #[test]
    fn a_storm_blocks_until_the_budget_is_met_and_the_cooldown_passed() {
        let cooldown = Some(Duration::from_secs(60));
        let mut d = Decision::default();
        let started = storm(cooldown, false, &Memory::default(), at(100), &mut d);
        assert!(started.blocks && started.since == Some(at(100)));
        assert_eq!(d.notices[0].reason, "StormRecoveryStarted");

        let memory = Memory {
            storm_since: started.since,
            ..Memory::default()
        };
        let mut d = Decision::default();
        let cooling = storm(cooldown, true, &memory, at(200), &mut d);
        assert!(cooling.blocks && cooling.cooldown_since == Some(at(200)));
        assert!(d.requeue_after.is_some_and(|r| r >= Duration::from_secs(60)));

        let memory = Memory {
            storm_since: cooling.since,
            cooldown_since: cooling.cooldown_since,
            ..Memory::default()
        };
        let mut d = Decision::default();
        let ended = storm(cooldown, true, &memory, at(260), &mut d);
        assert!(!ended.blocks && ended.since.is_none());
        assert_eq!(d.notices[0].reason, "StormRecoveryEnded");
    }

    #[test]
    fn without_a_cooldown_there_is_no_storm() {
        let mut d = Decision::default();
        assert!(!storm(None, false, &Memory::default(), at(1), &mut d).blocks);
        assert!(d.notices.is_empty());
    }
}
