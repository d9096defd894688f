//! The loop every remediation-like operator runs: observe the object and what it acts on, ask the
//! operator's pure decision for one step, perform that step, write the status and publish the
//! events the step returned as data; again, reading everything afresh, until a step says to wait.
//!
//! An operator supplies only its pieces ([`Operator`]): what it observes besides the object (which
//! the runner reads afresh before every step), how it decides, and how it performs a step. What a step leaves for afterwards ([`Outcome`]) runs in one fixed order:
//! the status edit, then the step's follow-up (work that must come after the status is written,
//! such as deleting what the status records, or dropping in-memory state the status now holds),
//! then the events. An event can be kept for when the status edit changed something, so a step
//! repeated on every pass says its piece once.

use std::{fmt::Debug, future::Future, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time};
use kube::{Api, Resource, ResourceExt, core::object::HasStatus, runtime::controller::Action};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    CallContext,
    events::{Events, Note},
    status::{self, Edit},
};

/// A back-off after a failed reconcile: short, since most failures are conflicts with a write
/// that has already landed and the next read sees it.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);
/// When a reconcile used up its steps: soon, reading everything afresh.
const RETRY_AFTER_STEPS: Duration = Duration::from_secs(1);

/// One operator's observe, decide and perform; [`reconcile`] and [`error_policy`] run them.
pub trait Operator: Send + Sync + 'static {
    type Object: Resource<DynamicType = ()>
        + HasStatus<Status: Clone + Default + Serialize + Send>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// What one observation found: the object as read now and the facts the decision needs.
    type Observed: Send + Sync;
    type Step: Debug + Send;
    type Error: From<crate::Error> + std::error::Error + Send + 'static;

    /// Names the operator's objects in logs ("fence agents remediation").
    const NAME: &'static str;
    /// More steps than one object's work takes; a reconcile hands back after this many.
    const STEPS: usize;

    /// The API the object is read and written through (namespaced or cluster-wide).
    fn api(&self, object: &Self::Object) -> Result<Api<Self::Object>, Self::Error>;

    /// Reads what the decision needs about `current`, the object as just read.
    fn observe(&self, current: Self::Object) -> impl Future<Output = Result<Self::Observed, Self::Error>> + Send;

    /// The object as the observation read it: the status edit is computed from and locked to it.
    fn current(seen: &Self::Observed) -> &Self::Object;

    /// The operator's pure decision over what was observed.
    fn decide(&self, seen: &Self::Observed) -> Self::Step;

    /// Whether a step is routine (a wait) and not worth a log line.
    fn routine(_step: &Self::Step) -> bool {
        false
    }

    /// Carries out one step: the only place the operator changes the cluster.
    fn perform<'a>(
        &'a self,
        step: Self::Step,
        seen: &'a Self::Observed,
        api: &'a Api<Self::Object>,
    ) -> impl Future<Output = Result<Outcome<'a, Self>, Self::Error>> + Send + 'a;

    /// Where the object's events go: the object itself unless the operator says otherwise.
    fn audience(&self, object: &Self::Object) -> Vec<ObjectReference> {
        vec![crate::events::reference(object)]
    }

    fn events(&self) -> &Events;

    /// Counts a failed reconcile (the operator's error metric).
    fn count_error(&self, error: &Self::Error);
}

/// A status edit, and the object version it is computed from and locked to when it is not the
/// observed one.
type StatusChange<'a, O> = (
    Option<<O as Operator>::Object>,
    Edit<'a, <<O as Operator>::Object as HasStatus>::Status>,
);

/// What a performed step asks of the runner: a status edit, a follow-up, events, and what next.
#[must_use]
pub struct Outcome<'a, O: Operator + ?Sized> {
    status: Option<StatusChange<'a, O>>,
    follow_up: Option<BoxFuture<'a, Result<(), O::Error>>>,
    events: Vec<(Note, When)>,
    next: Option<Action>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    Always,
    StatusChanged,
}

impl<'a, O: Operator + ?Sized> Outcome<'a, O> {
    /// Observe and decide again at once: the step changed what the next one reads.
    pub fn again() -> Self {
        Self {
            status: None,
            follow_up: None,
            events: Vec::new(),
            next: None,
        }
    }

    /// Hand back to the controller, which comes back after `action`.
    pub fn wait(action: Action) -> Self {
        Self {
            next: Some(action),
            ..Self::again()
        }
    }

    /// Wait for the next change to the object.
    pub fn await_change() -> Self {
        Self::wait(Action::await_change())
    }

    /// Look again after `after`.
    pub fn requeue(after: Duration) -> Self {
        Self::wait(Action::requeue(after))
    }

    /// Edits the status as observed; written only when the edit reports a change.
    pub fn status(
        mut self,
        edit: impl FnOnce(&mut <O::Object as HasStatus>::Status, &Time) -> bool + Send + 'a,
    ) -> Self {
        self.status = Some((None, Box::new(edit)));
        self
    }

    /// Edits the status of `object`, a newer version than the observed one (the step itself
    /// patched the object, e.g. its finalizers, and the status write is locked to that version).
    pub fn status_of(
        mut self,
        object: O::Object,
        edit: impl FnOnce(&mut <O::Object as HasStatus>::Status, &Time) -> bool + Send + 'a,
    ) -> Self {
        self.status = Some((Some(object), Box::new(edit)));
        self
    }

    /// Work that must come after the status write and before the events.
    pub fn then(mut self, follow_up: impl Future<Output = Result<(), O::Error>> + Send + 'a) -> Self {
        self.follow_up = Some(Box::pin(follow_up));
        self
    }

    pub fn event(mut self, note: Note) -> Self {
        self.events.push((note, When::Always));
        self
    }

    /// An event published only when the status edit changed something.
    pub fn event_if_changed(mut self, note: Note) -> Self {
        self.events.push((note, When::StatusChanged));
        self
    }
}

/// A controller's reconcile: observe, decide and perform until a step says to wait.
pub async fn reconcile<O: Operator>(object: Arc<O::Object>, operator: Arc<O>) -> Result<Action, O::Error> {
    let api = operator.api(&object)?;
    let name = object.name_any();
    for _ in 0..O::STEPS {
        // Read afresh: the controller's copy may predate the last step's writes.
        let Some(current) = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading {}", status::describe(object.as_ref())))?
        else {
            return Ok(Action::await_change());
        };
        let seen = operator.observe(current).await?;
        let step = operator.decide(&seen);
        if !O::routine(&step) {
            tracing::info!(object = %status::describe(O::current(&seen)), ?step, "{} step", O::NAME);
        }
        let outcome = operator.perform(step, &seen, &api).await?;
        if let Some(action) = carry_out(operator.as_ref(), O::current(&seen), &api, outcome).await? {
            return Ok(action);
        }
    }
    Ok(Action::requeue(RETRY_AFTER_STEPS))
}

/// A controller's error policy: counted, logged, retried shortly.
pub fn error_policy<O: Operator>(object: Arc<O::Object>, error: &O::Error, operator: Arc<O>) -> Action {
    operator.count_error(error);
    retry(object.as_ref(), error, RETRY_AFTER_ERROR)
}

/// A failed reconcile of `object`, logged; tried again after `after`. Every controller's error
/// policy ends here.
pub fn retry<K: Resource<DynamicType = ()>>(object: &K, error: &dyn std::fmt::Display, after: Duration) -> Action {
    tracing::warn!(object = %status::describe(object), %error, retry_seconds = after.as_secs_f64(), "reconcile failed; retrying");
    Action::requeue(after)
}

async fn carry_out<O: Operator>(
    operator: &O,
    current: &O::Object,
    api: &Api<O::Object>,
    outcome: Outcome<'_, O>,
) -> Result<Option<Action>, O::Error> {
    let Outcome {
        status,
        follow_up,
        events,
        next,
    } = outcome;
    let changed = match status {
        Some((newer, edit)) => status::write(api, newer.as_ref().unwrap_or(current), edit).await?,
        None => false,
    };
    if let Some(follow_up) = follow_up {
        follow_up.await?;
    }
    let due = due(events, changed);
    if !due.is_empty() {
        let audience = operator.audience(current);
        for note in &due {
            for on in &audience {
                operator.events().record(on, note).await;
            }
        }
    }
    Ok(next)
}

/// The events to publish, in order: those kept for a status change only when it changed.
fn due(events: Vec<(Note, When)>, status_changed: bool) -> Vec<Note> {
    events
        .into_iter()
        .filter(|(_, when)| status_changed || *when == When::Always)
        .map(|(note, _)| note)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_kept_for_a_status_change_is_published_only_with_one() {
        let events = || {
            vec![
                (Note::normal("Started", "a"), When::Always),
                (Note::warning("Stuck", "b"), When::StatusChanged),
                (Note::normal("Again", "c"), When::Always),
            ]
        };
        let reasons = |notes: Vec<Note>| notes.into_iter().map(|n| n.reason).collect::<Vec<_>>();
        assert_eq!(reasons(due(events(), true)), ["Started", "Stuck", "Again"]);
        assert_eq!(reasons(due(events(), false)), ["Started", "Again"]);
    }
}
