//! JSON merge patches (RFC 7386) that also clear. A status type leaves its empty optional fields
//! out when serialized, and a merge patch that leaves a field out keeps the stored value: a
//! field the reconciler emptied would never be emptied on the server. Here every field the old
//! value had and the new one lacks is sent as `null`, which removes it, at every depth: a merge
//! patch merges nested objects (a map of node names, say) key by key, so a key dropped from a
//! nested map must be named too.

use serde::Serialize;
use serde_json::{Map, Value};

/// The merge patch that turns `before` into `after`: only what differs, with `null` for each
/// field `after` dropped. Arrays are sent whole (a merge patch replaces them whole). `{}` when
/// nothing differs.
pub(crate) fn between<T: Serialize>(before: &T, after: &T) -> Value {
    let before = serde_json::to_value(before).unwrap_or(Value::Null);
    let after = serde_json::to_value(after).unwrap_or(Value::Null);
    difference(&before, &after).unwrap_or_else(|| Value::Object(Map::new()))
}

/// The patch from `before` to `after`; `None` when they are equal.
fn difference(before: &Value, after: &Value) -> Option<Value> {
    if before == after {
        return None;
    }
    let (Value::Object(old), Value::Object(new)) = (before, after) else {
        return Some(after.clone());
    };
    let mut patch = Map::new();
    for (key, value) in new {
        let changed = match old.get(key) {
            Some(was) => difference(was, value),
            None => Some(value.clone()),
        };
        if let Some(changed) = changed {
            patch.insert(key.clone(), changed);
        }
    }
    for key in old.keys().filter(|key| !new.contains_key(*key)) {
        patch.insert(key.clone(), Value::Null);
    }
    Some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    #[derive(Serialize, Clone, Default)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(skip_serializing_if = "Option::is_none")]
        phase: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        wait_started_at: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        members: Option<Vec<&'static str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        fencing_means: Option<BTreeMap<&'static str, &'static str>>,
    }

    #[test]
    fn an_emptied_field_is_sent_as_null_and_an_unchanged_one_not_at_all() {
        let before = Status {
            phase: Some("Pre-Reboot-Completed"),
            wait_started_at: Some(7),
            ..Status::default()
        };
        let after = Status {
            wait_started_at: None,
            ..before.clone()
        };
        assert_eq!(between(&before, &after), json!({"waitStartedAt": null}));
    }

    #[test]
    fn nothing_is_sent_when_nothing_changed() {
        assert_eq!(between(&Status::default(), &Status::default()), json!({}));
        let some = Status {
            phase: Some("Running"),
            members: Some(vec!["w1"]),
            ..Status::default()
        };
        assert_eq!(between(&some, &some.clone()), json!({}));
    }

    #[test]
    fn a_key_dropped_from_a_nested_map_is_sent_as_null_and_the_kept_keys_only_when_changed() {
        let before = Status {
            fencing_means: Some(BTreeMap::from([("w1", "Softdog"), ("w2", "Softdog"), ("w3", "None")])),
            ..Status::default()
        };
        let after = Status {
            fencing_means: Some(BTreeMap::from([
                ("w1", "Softdog"),
                ("w3", "SoftwareReboot"),
                ("w4", "None"),
            ])),
            ..Status::default()
        };
        assert_eq!(
            between(&before, &after),
            json!({"fencingMeans": {"w2": null, "w3": "SoftwareReboot", "w4": "None"}})
        );
    }

    #[test]
    fn an_array_is_sent_whole_and_a_new_field_as_it_is() {
        let before = Status {
            members: Some(vec!["w1", "w2"]),
            ..Status::default()
        };
        let after = Status {
            members: Some(vec!["w1"]),
            phase: Some("Running"),
            ..Status::default()
        };
        assert_eq!(between(&before, &after), json!({"members": ["w1"], "phase": "Running"}));
    }

    #[test]
    fn applying_the_patch_to_the_old_value_gives_the_new_one() {
        let before = Status {
            phase: Some("A"),
            wait_started_at: Some(1),
            members: Some(vec!["w1"]),
            fencing_means: Some(BTreeMap::from([("w1", "Softdog"), ("w2", "None")])),
        };
        let after = Status {
            phase: Some("B"),
            wait_started_at: None,
            members: None,
            fencing_means: Some(BTreeMap::from([("w1", "Softdog")])),
        };
        let mut merged = serde_json::to_value(&before).expect("serializes");
        json_patch::merge(&mut merged, &between(&before, &after));
        assert_eq!(merged, serde_json::to_value(&after).expect("serializes"));
    }

    /// JSON without nulls (a status leaves its empty fields out), nested up to three levels.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            (0..4i64).prop_map(Value::from),
            "[ab]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map("[a-d]", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn object() -> impl Strategy<Value = Value> {
        prop::collection::btree_map("[a-d]", value(), 0..4).prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    proptest! {
        #[test]
        fn the_patch_turns_any_old_status_into_the_new_one(before in object(), after in object()) {
            let patch = between(&before, &after);
            let mut merged = before.clone();
            json_patch::merge(&mut merged, &patch);
            prop_assert_eq!(merged, after.clone());
            if before == after {
                prop_assert_eq!(patch, json!({}));
            }
        }
    }
}
