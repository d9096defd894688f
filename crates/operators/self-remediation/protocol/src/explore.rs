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
