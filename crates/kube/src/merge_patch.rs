//! JSON merge patches (RFC 7386) that also clear. A status type leaves its empty optional fields
//! out when serialized, and a merge patch that leaves a field out keeps the stored value: a
//! field the reconciler emptied would never be emptied on the server. Here every top-level
//! field the old value had and the new one lacks is sent as `null`, which removes it.

use serde::Serialize;
use serde_json::{Map, Value};

/// `after` as a merge patch over `before`, with `null` for each top-level field `after` dropped.
pub(crate) fn replacing<T: Serialize>(before: &T, after: &T) -> Value {
    let before = serde_json::to_value(before).unwrap_or(Value::Null);
    let mut after = serde_json::to_value(after).unwrap_or(Value::Null);
    if let (Value::Object(old), Value::Object(new)) = (&before, &mut after) {
        let dropped: Vec<String> = old.keys().filter(|k| !new.contains_key(*k)).cloned().collect();
        for key in dropped {
            new.insert(key, Value::Null);
        }
    } else if after.is_null() {
        after = Value::Object(Map::new());
    }
    after
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Serialize)]
    struct Status {
        #[serde(skip_serializing_if = "Option::is_none")]
        phase: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        wait_started_at: Option<u32>,
    }

    #[test]
    fn an_emptied_field_is_sent_as_null_and_the_rest_as_they_are() {
        let before = Status {
            phase: Some("Pre-Reboot-Completed"),
            wait_started_at: Some(7),
        };
        let after = Status {
            phase: Some("Pre-Reboot-Completed"),
            wait_started_at: None,
        };
        assert_eq!(
            replacing(&before, &after),
            json!({"phase": "Pre-Reboot-Completed", "wait_started_at": null})
        );
    }

    #[test]
    fn nothing_is_cleared_that_was_not_there() {
        let empty = Status {
            phase: None,
            wait_started_at: None,
        };
        assert_eq!(replacing(&empty, &empty), json!({}));
    }
}
