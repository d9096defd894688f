//! Objects nodemedic creates from its release's defaults (the default health check, the
//! SelfNodeRemediationConfig) and moves to a later release's defaults, unless someone edited
//! them. Each such object carries a record of what nodemedic last asked for and the
//! `metadata.generation` its own write produced: the API server raises the generation on every
//! change of the spec, so a generation other than the recorded one means a person (or a tool)
//! changed it, and it is left alone. Comparing generations rather than specs keeps the API
//! server's own defaulting from looking like an edit.

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::{CallContext, Result};

/// The annotation holding the [`Record`].
pub const RECORD: &str = "nodemedic.medik8s.io/applied-defaults";

/// What nodemedic last wrote into an object it keeps at its defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The spec nodemedic asked for, as the release rendered it.
    pub spec: Value,
    /// The object's generation right after that write.
    pub generation: i64,
}

/// What to do with an object kept at the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// It does not exist: create it.
    Create,
    /// Nobody edited it and the release asks for another spec: write it.
    Update,
    /// Nobody edited it and the release asks for what it has.
    Unchanged,
    /// Someone changed its spec since nodemedic wrote it: leave it.
    KeepEdited,
    /// It carries no record (written by a user, or by a release that kept none): leave it.
    KeepUnrecorded,
}

/// The live object as far as the decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Live {
    pub(crate) generation: Option<i64>,
    pub(crate) record: Option<Record>,
}

/// Pure: what to do, given the live object (if any) and the spec the release asks for, as the
/// release states it (`wanted`, compared with the recorded one). `may_update`: whether an
/// unedited object may be moved to it (not when the release states no defaults of its own).
pub(crate) fn decide(live: Option<&Live>, wanted: &Value, may_update: bool) -> Step {
    let Some(live) = live else {
        return Step::Create;
    };
    let Some(record) = &live.record else {
        return Step::KeepUnrecorded;
    };
    if live.generation != Some(record.generation) {
        Step::KeepEdited
    } else if &record.spec == wanted || !may_update {
        Step::Unchanged
    } else {
        Step::Update
    }
}

/// The live object's generation and record; a record that cannot be read counts as none.
pub(crate) fn live<K: Resource>(object: &K) -> Live {
    Live {
        generation: object.meta().generation,
        record: object
            .annotations()
            .get(RECORD)
            .and_then(|text| serde_json::from_str(text).ok()),
    }
}

fn set_record<K: Resource>(object: &mut K, record: &Record) {
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(RECORD.to_owned(), serde_json::to_string(record).unwrap_or_default());
}

/// What the release asks for: the object to write and its spec as the release states it (the
/// record; it may differ from the object's, e.g. where the controller resolves a value).
pub struct Wanted<'a, K> {
    pub object: &'a K,
    pub stated: Value,
    /// Whether an unedited object may be moved to it (see [`decide`]).
    pub may_update: bool,
}

/// Brings `wanted` about as [`decide`] says, replacing a live object's spec with `set_spec`;
/// returns the step taken. The record goes in the same write: generation 1 on a create; on a
/// replace the next generation, corrected by a second write in the rare case the API server did
/// not raise it. A conflicting write (the object changed under it) is an error, for the caller
/// to try again.
pub async fn apply<K>(api: &Api<K>, wanted: Wanted<'_, K>, set_spec: impl Fn(&mut K, &K)) -> Result<Step>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = wanted.object.name_any();
    let kind = K::kind(&());
    let existing = api
        .get_opt(&name)
        .await
        .with_context(|| format!("reading {kind} {name}"))?;
    let step = decide(existing.as_ref().map(live).as_ref(), &wanted.stated, wanted.may_update);
    let mut record = Record {
        spec: wanted.stated,
        generation: 1,
    };
    let written = match (step, existing) {
        (Step::Create, _) => {
            let mut object = wanted.object.clone();
            object.meta_mut().resource_version = None;
            set_record(&mut object, &record);
            api.create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("creating {kind} {name}"))?
        }
        (Step::Update, Some(mut object)) => {
            set_spec(&mut object, wanted.object);
            record.generation = object.meta().generation.unwrap_or(0) + 1;
            set_record(&mut object, &record);
            api.replace(&name, &PostParams::default(), &object)
                .await
                .with_context(|| format!("writing the new defaults into {kind} {name}"))?
        }
        _ => return Ok(step),
    };
    if let Some(generation) = written.meta().generation.filter(|g| *g != record.generation) {
        record.generation = generation;
        let text = serde_json::to_string(&record).unwrap_or_default();
        let patch = serde_json::json!({"metadata": {"annotations": {RECORD: text}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("recording the defaults written into {kind} {name}"))?;
    }
    Ok(step)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn recorded(spec: Value, generation: i64, live_generation: i64) -> Live {
        Live {
            generation: Some(live_generation),
            record: Some(Record { spec, generation }),
        }
    }

    #[test]
    fn each_case_of_the_decision() {
        let a = json!({"minHealthy": "51%"});
        let b = json!({"minHealthy": "34%"});
        assert_eq!(decide(None, &a, true), Step::Create);
        let unrecorded = Live {
            generation: Some(1),
            record: None,
        };
        assert_eq!(decide(Some(&unrecorded), &a, true), Step::KeepUnrecorded);
        assert_eq!(decide(Some(&recorded(a.clone(), 1, 1)), &a, true), Step::Unchanged);
        assert_eq!(decide(Some(&recorded(a.clone(), 1, 1)), &b, true), Step::Update);
        assert_eq!(
            decide(Some(&recorded(a.clone(), 1, 1)), &b, false),
            Step::Unchanged,
            "a release without defaults of its own moves nothing"
        );
        assert_eq!(decide(None, &b, false), Step::Create);
        assert_eq!(decide(Some(&recorded(a, 1, 2)), &b, true), Step::KeepEdited);
    }

    #[test]
    fn an_unreadable_record_counts_as_none() {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.generation = Some(3);
        cm.metadata.annotations = Some([(RECORD.to_owned(), "not json".to_owned())].into());
        assert_eq!(live(&cm).record, None);
        let record = Record {
            spec: json!({"x": 1}),
            generation: 3,
        };
        cm.metadata.annotations = Some([(RECORD.to_owned(), serde_json::to_string(&record).expect("json"))].into());
        assert_eq!(live(&cm).record, Some(record));
    }

    proptest! {
        /// A spec changed by anyone but nodemedic is never written over, whatever the release
        /// asks for; an object nodemedic alone wrote always ends at the release's defaults.
        #[test]
        fn edits_are_kept_and_unedited_objects_follow_the_release(
            generation in 1i64..100, bumps in 0i64..3, old in 0u8..4, new in 0u8..4,
        ) {
            let (old, new) = (json!({"v": old}), json!({"v": new}));
            let step = decide(Some(&recorded(old.clone(), generation, generation + bumps)), &new, true);
            if bumps > 0 {
                prop_assert_eq!(step, Step::KeepEdited);
            } else if old == new {
                prop_assert_eq!(step, Step::Unchanged);
            } else {
                prop_assert_eq!(step, Step::Update);
            }
        }
    }
}
