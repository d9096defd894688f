//! Go-style duration strings (`300s`, `1m30s`, `1.5h`), as the medik8s CRDs carry them.
//!
//! The original text is kept verbatim so a manifest read and written back is unchanged; the value
//! is parsed where a decision needs it.

use std::{borrow::Cow, fmt, str::FromStr, time::Duration};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The pattern medik8s puts on its non-negative durations.
pub(crate) const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
/// The same, allowing a leading minus (only `healthyDelay` uses it).
pub(crate) const SIGNED_DURATION_PATTERN: &str = r"^-?([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a duration: {why}; write it like 300s, 1m30s or 1.5h")]
pub struct DurationError {
    text: String,
    why: &'static str,
}

/// Parses a Go duration into whole nanoseconds, keeping its sign.
pub(crate) fn parse_go_duration(text: &str) -> Result<i128, DurationError> {
    let err = |why| DurationError {
        text: text.to_owned(),
        why,
    };
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err("it is empty"));
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(err("a number must come before each unit"));
        }
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(err("a unit (ns, us, ms, s, m, h) must follow each number")),
            _ => return Err(err("the unit is not one of ns, us, ms, s, m, h")),
        };
        // Stricter than Go (which takes ".5s" and "5.s") so that exactly the texts the CRD
        // schema pattern admits are accepted.
        let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
        let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(whole) || !all_digits(fraction) {
            return Err(err("a number is malformed"));
        }
        let whole: i128 = whole.parse().map_err(|_| err("a number is too large"))?;
        let mut value = whole.checked_mul(unit_nanos).ok_or_else(|| err("it is too large"))?;
        let mut scale = unit_nanos;
        for digit in fraction.bytes().take(18) {
            scale /= 10;
            value += i128::from(digit - b'0') * scale;
        }
        total = total.checked_add(value).ok_or_else(|| err("it is too large"))?;
        if total > i128::from(i64::MAX) {
            return Err(err("it is too large"));
        }
        rest = next;
    }
    Ok(if negative { -total } else { total })
}

/// Formats a duration the way Go's `time.Duration.String()` does for whole milliseconds and up.
pub(crate) fn format_go_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".into();
    }
    let (h, rem) = (total_ms / 3_600_000, total_ms % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    let (s, ms) = (rem / 1000, rem % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if total_ms < 1000 {
        out.push_str(&format!("{ms}ms"));
    } else if ms == 0 {
        if s > 0 {
            out.push_str(&format!("{s}s"));
        }
    } else {
        let frac = format!("{ms:03}");
        out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
    }
    out
}

macro_rules! duration_type {
    ($(#[$doc:meta])* $name:ident, $pattern:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The text as written.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": "string", "pattern": $pattern })
            }
        }
    };
}

duration_type!(
    /// A non-negative Go duration such as `300s`.
    GoDuration,
    DURATION_PATTERN
);
duration_type!(
    /// A Go duration that may be negative (`-1s` means "never" for `healthyDelay`).
    SignedGoDuration,
    SIGNED_DURATION_PATTERN
);

impl GoDuration {
    pub fn from_duration(d: Duration) -> Self {
        Self(format_go_duration(d))
    }

    pub fn duration(&self) -> Result<Duration, DurationError> {
        let nanos = parse_go_duration(&self.0)?;
        u64::try_from(nanos)
            .map(Duration::from_nanos)
            .map_err(|_| DurationError {
                text: self.0.clone(),
                why: "it must not be negative",
            })
    }
}

impl FromStr for GoDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let d = Self(s.to_owned());
        d.duration()?;
        Ok(d)
    }
}

impl SignedGoDuration {
    /// Nanoseconds, negative when the text is.
    pub fn nanos(&self) -> Result<i128, DurationError> {
        parse_go_duration(&self.0)
    }
}

impl FromStr for SignedGoDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_go_duration(s)?;
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_forms_medik8s_manifests_use() {
        let secs = |s: &str| parse_go_duration(s).map(|n| n as f64 / 1e9);
        assert_eq!(secs("300s"), Ok(300.0));
        assert_eq!(secs("1m30s"), Ok(90.0));
        assert_eq!(secs("1.5h"), Ok(5400.0));
        assert_eq!(secs("15m"), Ok(900.0));
        assert_eq!(secs("10ms"), Ok(0.01));
        assert_eq!(secs("-1s"), Ok(-1.0));
        assert_eq!(secs("0"), Ok(0.0));
    }

    #[test]
    fn rejects_what_go_rejects_with_a_hint() {
        for bad in ["", "10", "s", "1x", "1..5s", "abc"] {
            let err = parse_go_duration(bad).expect_err(bad);
            assert!(err.to_string().contains("300s"), "{err}");
        }
        assert!(GoDuration::from_str("-5s").is_err());
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            let text = format_go_duration(d);
            prop_assert_eq!(parse_go_duration(&text).map(|n| n as u128), Ok(d.as_nanos()));
        }

        #[test]
        fn parser_never_panics(s in "\\PC{0,16}") {
            let _ = parse_go_duration(&s);
        }

        #[test]
        fn accepted_texts_match_the_schema_pattern(s in "-?[0-9]{0,4}(\\.[0-9]{0,3})?(ns|us|ms|s|m|h|x)?([0-9]{1,3}(s|ms))?") {
            let pattern = regex::Regex::new(SIGNED_DURATION_PATTERN).expect("pattern compiles");
            // "0" alone is Go's special case; the schema pattern wants a unit.
            prop_assume!(s != "0" && s != "-0");
            prop_assert_eq!(parse_go_duration(&s).is_ok(), pattern.is_match(&s), "{}", s);
        }
    }
}
