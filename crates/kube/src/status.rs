//! The one status writer. A status is edited in memory and written only when the edit says it
//! changed something: as a merge patch locked to the resourceVersion it was computed from (a
//! status computed from an old read must not overwrite a newer one), carrying only what changed,
//! with every field the edit emptied sent as `null` so that it is removed rather than kept.
//!
//! Every status nodemedic computes is written here and nowhere else: the workspace's
//! `clippy.toml` refuses `patch_status`, `replace_status` and the subresource writes everywhere
//! but in the few places allowed by name, each with its reason.
//!
//! A write locked to a version the server no longer has fails with a conflict (409,
//! [`crate::Error::is_conflict`]): the status was computed from an outdated read and must be
//! computed again from a fresh one. A reconcile does that by running again
//! ([`requeue_on_conflict`]); an edit that does not depend on the rest of the object (a
//! background task's report) is applied again to a fresh read by [`update`] itself.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::object::HasStatus,
    runtime::controller::Action,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{CallContext, Error, Result};

/// A status edit: changes the status in place and says whether it changed anything.
pub(crate) type Edit<'a, S> = Box<dyn FnOnce(&mut S, &Time) -> bool + Send + 'a>;

/// How soon a reconcile whose status write met a conflict runs again: the newer version is
/// already written, and this gives the watch time to bring it to the reconcile's cache.
pub const AFTER_CONFLICT: Duration = Duration::from_secs(1);

/// How many conflicting writes [`update`] reads afresh after before it gives up.
const ATTEMPTS: u32 = 8;

/// Applies `edit` to `object`'s status and writes the result when `edit` reports a change (and
/// the status differs); returns whether it wrote. Locked to `object`'s resourceVersion: a
/// conflict is an error ([`crate::Error::is_conflict`]).
pub async fn write<K>(api: &Api<K>, object: &K, edit: impl FnOnce(&mut K::Status, &Time) -> bool) -> Result<bool>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
    K::Status: Clone + Default + Serialize,
{
    write_built_in(api, object, object.status(), edit).await
}

/// Writes `status`, computed as a whole from `object`, when it differs from `object`'s; as
/// [`write`] otherwise.
pub async fn replace<K>(api: &Api<K>, object: &K, status: K::Status) -> Result<bool>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
    K::Status: Clone + Default + Serialize + PartialEq,
{
    write(api, object, |current, _| {
        let changed = *current != status;
        *current = status;
        changed
    })
    .await
}

/// [`write`] for an edit that stands on its own (it does not depend on the rest of the object,
/// such as a background task's report of what it did): on a conflict, the object is read again
/// and the edit applied to that version, a few times at most. `object` is the first version
/// tried (a cached one saves a read). A deleted object is not an error: there is nothing to
/// report on.
pub async fn update<K>(api: &Api<K>, object: &K, mut edit: impl FnMut(&mut K::Status, &Time) -> bool) -> Result<bool>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
    K::Status: Clone + Default + Serialize,
{
    let mut fresh: Option<K> = None;
    for _ in 0..ATTEMPTS {
        match write(api, fresh.as_ref().unwrap_or(object), &mut edit).await {
            Err(error) if error.is_conflict() => {}
            written => return written,
        }
        let newer = api
            .get_opt(&object.name_any())
            .await
            .with_context(|| format!("reading {} again after a conflicting status write", describe(object)))?;
        match newer {
            Some(newer) => fresh = Some(newer),
            None => return Ok(false),
        }
    }
    Err(Error::Conflict {
        what: format!("the status of {}", describe(object)),
        attempts: ATTEMPTS,
    })
}

/// [`write`] for a kind whose status kube cannot reach by itself (k8s-openapi's built-in kinds
/// do not implement `HasStatus`): `status` is `object`'s.
pub async fn write_built_in<K, S>(
    api: &Api<K>,
    object: &K,
    status: Option<&S>,
    edit: impl FnOnce(&mut S, &Time) -> bool,
) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Clone + Default + Serialize,
{
    let before = status.cloned().unwrap_or_default();
    let mut after = before.clone();
    if !edit(&mut after, &crate::time::now()) {
        return Ok(false);
    }
    let Some(patch) = patch(object, &before, &after) else {
        return Ok(false);
    };
    #[allow(
        clippy::disallowed_methods,
        reason = "the one status writer: every other goes through here"
    )]
    let written = api
        .patch_status(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    written.with_context(|| format!("writing the status of {}", describe(object)))?;
    Ok(true)
}

/// The merge patch from `before` to `after`, locked to `object`'s resourceVersion; `None` when
/// the two do not differ.
fn patch<K: Resource, S: Serialize>(object: &K, before: &S, after: &S) -> Option<serde_json::Value> {
    let status = crate::merge_patch::between(before, after);
    if status.as_object().is_some_and(serde_json::Map::is_empty) {
        return None;
    }
    Some(json!({"metadata": {"resourceVersion": object.resource_version()}, "status": status}))
}

/// A reconcile's answer to its failed status write. A conflict is no failure: the status was
/// computed from a version the server no longer has (typically the watch's copy from before the
/// last write), so the reconcile runs again shortly and computes it from what it reads then; not
/// at once (the newer version needs a moment to reach the cache) and not counted as an error.
/// Any other error stays one.
pub fn requeue_on_conflict<K, E>(object: &K, error: Error) -> std::result::Result<Action, E>
where
    K: Resource<DynamicType = ()>,
    E: From<Error>,
{
    if !error.is_conflict() {
        return Err(error.into());
    }
    tracing::debug!(object = %describe(object), "status computed from an outdated version; computing it again");
    Ok(Action::requeue(AFTER_CONFLICT))
}

/// `<Kind> <namespace>/<name>`, or `<Kind> <name>` for a cluster-scoped object: how errors and
/// logs name the object a request was for.
pub fn describe<K: Resource<DynamicType = ()>>(object: &K) -> String {
    let kind = K::kind(&());
    let name = object.name_any();
    match object.namespace() {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, NodeStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn node(version: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("w1".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn the_patch_is_locked_to_the_version_read_and_carries_only_the_change() {
        let before = NodeStatus {
            volumes_in_use: Some(vec!["v1".into()]),
            phase: Some("Running".into()),
            ..NodeStatus::default()
        };
        let after = NodeStatus {
            volumes_in_use: None,
            ..before.clone()
        };
        assert_eq!(
            patch(&node("42"), &before, &after),
            Some(json!({"metadata": {"resourceVersion": "42"}, "status": {"volumesInUse": null}}))
        );
    }

    #[test]
    fn an_edit_that_changes_nothing_writes_nothing() {
        let status = NodeStatus {
            phase: Some("Running".into()),
            ..NodeStatus::default()
        };
        assert_eq!(patch(&node("42"), &status, &status.clone()), None);
    }

    fn api_error(code: u16) -> Error {
        let status = kube::core::Status::failure("the object has been modified", "Conflict").with_code(code);
        Error::call("writing the status of Node w1", kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn a_conflict_requeues_shortly_and_any_other_error_stays_one() {
        let requeued: std::result::Result<Action, Error> = requeue_on_conflict(&node("1"), api_error(409));
        assert_eq!(requeued.expect("requeued"), Action::requeue(AFTER_CONFLICT));
        let failed: std::result::Result<Action, Error> = requeue_on_conflict(&node("1"), api_error(500));
        assert_eq!(failed.expect_err("an error").api_status(), Some(500));
    }
}
