//! Whether new remediation is allowed: the healthy-node budget, and storm protection.

use std::time::Duration;

use jiff::Timestamp;

use super::model::{Decision, Memory, Severity};

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
