//! An operator's finalizer on its own object: added before it changes anything on the object's
//! behalf, removed once it has undone what it did. Each patch carries the resourceVersion it was
//! computed from, so a concurrent change to the list (another controller's finalizer) makes it
//! fail with a conflict instead of being overwritten.

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{CallContext, Result};

/// Adds `finalizer` (if missing) and returns the updated object.
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    if has(object, finalizer) {
        return Ok(object.clone());
    }
    let mut all = object.finalizers().to_vec();
    all.push(finalizer.to_owned());
    write(api, object, all).await
}

/// Removes `finalizer`; says whether it was there. An object already gone has none left.
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    if !has(object, finalizer) {
        return Ok(false);
    }
    let kept = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    match write(api, object, kept).await {
        Ok(_) => Ok(true),
        Err(error) if error.api_status() == Some(404) => Ok(false),
        Err(error) => Err(error),
    }
}

pub fn has<K: Resource>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

async fn write<K>(api: &Api<K>, object: &K, finalizers: Vec<String>) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let name = object.name_any();
    let patch = json!({"metadata": {"resourceVersion": object.resource_version(), "finalizers": finalizers}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching the finalizers of {}", crate::status::describe(object)))
}
