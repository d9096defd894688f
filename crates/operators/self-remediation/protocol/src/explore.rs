//! The model checkers' search: every state reachable from a start, each checked once.

use std::{
    collections::HashSet,
    hash::{DefaultHasher, Hash, Hasher},
};

/// Explores depth-first every state reachable from `start`, checking each; returns how many
/// there are, or the first violation `check` or `successors` reports. States are remembered by
/// fingerprint, so a very unlucky collision could skip one: a bound worth millions of states of
/// memory.
pub(crate) fn explore<S: Hash>(
    start: S,
    check: impl Fn(&S) -> Result<(), String>,
    successors: impl Fn(&S) -> Result<Vec<S>, String>,
) -> Result<usize, String> {
    let fingerprint = |s: &S| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    let mut seen: HashSet<u64> = HashSet::new();
    let mut stack = vec![start];
    while let Some(s) = stack.pop() {
        if !seen.insert(fingerprint(&s)) {
            continue;
        }
        check(&s)?;
        stack.extend(successors(&s)?.into_iter().filter(|x| !seen.contains(&fingerprint(x))));
    }
    Ok(seen.len())
}

/// How far a model check's state count may drift from its documented figure before the check
/// fails: a refactoring that keeps the model may reorder or merge a few states, but a model that
/// silently stops exploring (a successor dropped, a bound shrunk) loses far more.
const DRIFT: f64 = 0.02;

/// Where the figures are documented, and the steps to update them when the model changes on
/// purpose.
const DOCUMENTED_IN: &str = "docs/self-remediation-protocol.md, \"Model check\"";

/// Fails unless `explored` is within [`DRIFT`] of `documented`, the figure the documentation
/// states for the check `what`.
pub(crate) fn assert_coverage(what: &str, explored: usize, documented: usize) {
    let drift = explored.abs_diff(documented) as f64 / documented as f64;
    assert!(
        drift <= DRIFT,
        "{what}: the model explored {explored} states where {DOCUMENTED_IN} states {documented} \
         ({:.1}% apart, at most {:.0}% allowed). A model that stops exploring proves nothing; if \
         the model grew or shrank on purpose, put the new figure in the test and in {DOCUMENTED_IN}",
        drift * 100.0,
        DRIFT * 100.0
    );
}

/// `1234567` as the documentation writes it: `1,234,567`.
pub(crate) fn with_commas(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The protocol's documentation, whose figures the model checks' constants must match.
pub(crate) const PROTOCOL_DOC: &str = include_str!("../../../../../docs/self-remediation-protocol.md");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_written_with_thousands_separators() {
        assert_eq!(with_commas(7), "7");
        assert_eq!(with_commas(306_371), "306,371");
        assert_eq!(with_commas(3_488_283), "3,488,283");
        assert_eq!(with_commas(1_000), "1,000");
    }

    #[test]
    fn coverage_within_the_drift_passes() {
        assert_coverage("a check", 1_010_000, 1_000_000);
        assert_coverage("a check", 990_000, 1_000_000);
    }

    #[test]
    #[should_panic(expected = "A model that stops exploring proves nothing")]
    fn a_model_that_stopped_exploring_fails() {
        assert_coverage("a check", 1_001, 306_371);
    }

    #[test]
    #[should_panic(expected = "grew or shrank on purpose")]
    fn a_model_that_grew_fails_too() {
        assert_coverage("a check", 400_000, 306_371);
    }
}
