//! The one status writer. A status is edited in memory and written only when the edit says it
//! changed something: as a merge patch locked to the resourceVersion it was computed from (a
//! status computed from an old read must not overwrite a newer one), with every field the edit
//! emptied sent as `null` so that it is removed rather than kept.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::object::HasStatus,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{CallContext, Result};

/// A status edit: changes the status in place and says whether it changed anything.
pub(crate) type Edit<'a, S> = Box<dyn FnOnce(&mut S, &Time) -> bool + Send + 'a>;

/// Applies `edit` to `object`'s status and writes the result when `edit` reports a change;
/// returns whether it wrote.
pub async fn write<K>(api: &Api<K>, object: &K, edit: impl FnOnce(&mut K::Status, &Time) -> bool) -> Result<bool>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
    K::Status: Clone + Default + Serialize,
{
    let before = object.status().cloned().unwrap_or_default();
    let mut status = before.clone();
    if !edit(&mut status, &crate::time::now()) {
        return Ok(false);
    }
    let status = crate::merge_patch::replacing(&before, &status);
    let patch = json!({"metadata": {"resourceVersion": object.resource_version()}, "status": status});
    api.patch_status(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing the status of {}", describe(object)))?;
    Ok(true)
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
