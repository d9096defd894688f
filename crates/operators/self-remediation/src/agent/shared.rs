//! The agent's protocol state, shared by its tasks and the watchdog feeder.
//!
//! The feeder reads what it needs (when the licence ends, whether the node is fenced) without
//! taking the lock. A task holding the lock can be descheduled on a busy node (starved of CPU,
//! blocked writing a log line); a real-time feeder waiting for that lock would feed no sooner
//! than the task runs again, and the watchdog would reset a node whose licence was valid all
//! along. Every change goes through [`Guard`], which publishes the two when it is released, so
//! the feeder sees exactly what a reader of the locked state would.

use std::{
    ops::{Deref, DerefMut},
    sync::{
        Mutex, MutexGuard, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    Result,
    protocol::agent::{AgentState, FenceReason},
};

/// The agent's state behind its lock, with the feeding permit published beside it.
pub(crate) struct SharedState {
    state: Mutex<AgentState<Instant>>,
    permit: FeedPermit,
}

/// What the feeder needs, readable without a lock.
struct FeedPermit {
    /// The moment the licence's end is counted from.
    base: Instant,
    /// The licence's end in nanoseconds after `base` (at least 1); 0 while there is none.
    until: AtomicU64,
    /// Set when the agent fences. The protocol never lifts a fence, so it is set once.
    fence: OnceLock<FenceReason>,
}

impl FeedPermit {
    fn publish(&self, state: &AgentState<Instant>) {
        if let Some(why) = state.fenced() {
            // First, so a feeder that still sees the old licence end then sees the fence.
            let _ = self.fence.set(why);
        }
        let until = state.licence_until().map_or(0, |until| {
            let nanos = until.saturating_duration_since(self.base).as_nanos();
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1)
        });
        self.until.store(until, Ordering::Release);
    }
}

impl SharedState {
    pub(crate) fn new(state: AgentState<Instant>) -> Self {
        let permit = FeedPermit {
            base: Instant::now(),
            until: AtomicU64::new(0),
            fence: OnceLock::new(),
        };
        permit.publish(&state);
        Self {
            state: Mutex::new(state),
            permit,
        }
    }

    /// The state, for reading and changing; what changed is published when the guard drops.
    pub(crate) fn lock(&self) -> Result<Guard<'_>> {
        let state = self.state.lock().map_err(|_| crate::Error::Poisoned)?;
        Ok(Guard {
            state,
            permit: &self.permit,
        })
    }

    /// [`AgentState::may_feed`], without the lock.
    pub(crate) fn may_feed(&self, now: Instant, margin: Duration) -> bool {
        let until = self.permit.until.load(Ordering::Acquire);
        until != 0
            && self.fenced().is_none()
            && now.saturating_duration_since(self.permit.base) + margin < Duration::from_nanos(until)
    }

    /// [`AgentState::fenced`], without the lock.
    pub(crate) fn fenced(&self) -> Option<FenceReason> {
        self.permit.fence.get().copied()
    }
}

/// The locked state. Releasing it publishes the feeding permit.
pub(crate) struct Guard<'a> {
    state: MutexGuard<'a, AgentState<Instant>>,
    permit: &'a FeedPermit,
}

impl Deref for Guard<'_> {
    type Target = AgentState<Instant>;

    fn deref(&self) -> &Self::Target {
        &self.state
    }
}

impl DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.state
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Still under the lock: publications follow the changes in the lock's order.
        self.permit.publish(&self.state);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::protocol::{
        agent::{ApiRead, Intent},
        membership::Configuration,
        rounds::Rounds,
    };

    const MARGIN: Duration = Duration::from_millis(50);

    /// An agent whose licence runs for `secs` from now.
    fn licensed_for(secs: u64) -> SharedState {
        let shared = SharedState::new(AgentState::new("node-1", Duration::from_secs(4)));
        shared
            .lock()
            .expect("state")
            .inherit(Some(Instant::now() + Duration::from_secs(secs)));
        shared
    }

    #[test]
    fn a_fresh_agent_has_nothing_to_feed_on() {
        let shared = SharedState::new(AgentState::new("node-1", Duration::from_secs(4)));
        assert!(!shared.may_feed(Instant::now(), MARGIN));
        assert_eq!(shared.fenced(), None);
    }

    #[test]
    fn the_feeder_reads_the_licence_while_a_task_holds_the_lock() {
        let shared = licensed_for(4);
        let held = shared.lock().expect("state");
        assert!(
            shared.may_feed(Instant::now(), MARGIN),
            "the permit is read without waiting for the lock"
        );
        drop(held);
    }

    #[test]
    fn a_fence_stops_feeding_for_good() {
        let shared = licensed_for(60);
        shared.lock().expect("state").inherit(None);
        assert_eq!(shared.fenced(), Some(FenceReason::InheritedLapse));
        assert!(!shared.may_feed(Instant::now(), MARGIN));
    }

    /// One change to the state, as the licence loop, the voter and the shutdown make them.
    #[derive(Clone, Debug)]
    enum Change {
        Inherit(Option<u64>),
        Read { sent_ms: u64, own_remediation: bool },
        StopVoting,
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => proptest::option::weighted(0.9, 0u64..20_000).prop_map(Change::Inherit),
            4 => (0u64..20_000, proptest::bool::weighted(0.1))
                .prop_map(|(sent_ms, own_remediation)| Change::Read { sent_ms, own_remediation }),
            1 => Just(Change::StopVoting),
        ]
    }

    fn apply(state: &mut AgentState<Instant>, start: Instant, change: &Change) {
        let at = |ms: u64| start + Duration::from_millis(ms);
        match change {
            Change::Inherit(until) => state.inherit(until.map(at)),
            Change::Read {
                sent_ms,
                own_remediation,
            } => {
                let intents = own_remediation
                    .then(|| Intent {
                        node: "node-1".into(),
                        uid: "uid-1".into(),
                        released: None,
                    })
                    .into_iter()
                    .collect();
                let read = ApiRead {
                    sent: at(*sent_ms),
                    intents,
                    configuration: Some(Configuration::new(1, ["node-1", "node-2", "node-3"])),
                };
                Rounds::default().on_intents(Some(&read), state);
            }
            Change::StopVoting => state.stop_voting(),
        }
    }

    proptest! {
        /// After any sequence of changes, the lock-free answer is the locked state's, at any
        /// moment the feeder may ask.
        #[test]
        fn the_published_permit_answers_as_the_locked_state(
            changes in proptest::collection::vec(change(), 0..12),
            asked_ms in proptest::collection::vec(0u64..25_000, 1..8),
        ) {
            let shared = SharedState::new(AgentState::new("node-1", Duration::from_secs(4)));
            let start = shared.permit.base;
            for change in &changes {
                apply(&mut shared.lock().expect("state"), start, change);
            }
            let state = shared.lock().expect("state").clone();
            prop_assert_eq!(shared.fenced(), state.fenced());
            for ms in asked_ms {
                let now = start + Duration::from_millis(ms);
                prop_assert_eq!(shared.may_feed(now, MARGIN), state.may_feed(now, MARGIN));
            }
        }
    }
}
