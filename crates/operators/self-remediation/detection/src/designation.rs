//! Which agents observe a member: a few, the same ones whoever asks.
//!
//! If every agent that distrusts a member probed and reported it, an outage of f nodes in a
//! cluster of n would cost every agent f probes a period and the controller n × f reports a
//! second: the work per agent would grow with the cluster, which SWIM was chosen to avoid. So each
//! member has a few designated observers, chosen by rendezvous hashing: among the members an agent
//! believes alive, those with the highest affinity to the member. Every agent computes the same
//! affinities, so agents that agree on who is alive agree on the observers; where their views
//! differ, the choice moves by at most the members they disagree on. The detector itself still
//! probes and gossips as SWIM does; designation only decides who confirms a suspicion with its
//! own probes and reports it.

use std::hash::Hasher;

/// How strongly `candidate` is drawn to observe `subject`: the same number on every agent, and
/// unrelated between subjects, so each agent observes about its share of them.
pub fn affinity(subject: &str, candidate: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(subject.as_bytes());
    // A separator no name contains, so ("ab", "c") and ("a", "bc") differ.
    hasher.write_u8(0);
    hasher.write(candidate.as_bytes());
    spread(hasher.finish())
}

/// FNV's low bits depend little on the last bytes; the finalizer of splitmix64 spreads every
/// input bit over the whole word, so similar names ("node-1", "node-2") rank independently.
fn spread(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Whether `me` is one of `subject`'s `observers` designated observers, as `me` sees the
/// cluster: fewer than `observers` of the members it believes alive (`believed_alive`, which may
/// or may not name `me` and `subject`) have a higher affinity to `subject` (ties broken by name).
/// Cheap for most agents: the count stops at `observers`, and an agent far down the ranking
/// meets that many above it within a few members.
pub fn observes<'a>(
    me: &str,
    subject: &str,
    believed_alive: impl IntoIterator<Item = &'a str>,
    observers: usize,
) -> bool {
    if me == subject {
        return false;
    }
    let mine = (affinity(subject, me), me);
    let above = believed_alive
        .into_iter()
        .filter(|member| *member != me && *member != subject)
        .filter(|member| (affinity(subject, member), *member) > mine)
        .take(observers)
        .count();
    above < observers
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn affinity_is_a_fixed_function_of_the_pair() {
        // Agents of different builds and versions must agree: the values are part of the
        // protocol (FNV-1a, then splitmix64's finalizer; computed independently).
        assert_eq!(affinity("node-1", "node-2"), 0x75ad_c810_dd5d_85bd);
        assert_eq!(affinity("node-2", "node-1"), 0x21c0_36b9_4b29_eed9);
        assert_ne!(affinity("ab", "c"), affinity("a", "bc"));
    }

    #[test]
    fn a_member_never_observes_itself() {
        let members = names(5);
        assert!(!observes("node-1", "node-1", members.iter().map(String::as_str), 10));
    }

    #[test]
    fn each_agent_observes_about_its_share_of_the_members() {
        let members = names(100);
        let alive: Vec<&str> = members.iter().map(String::as_str).collect();
        let observed: Vec<usize> = members
            .iter()
            .map(|me| {
                members
                    .iter()
                    .filter(|subject| observes(me, subject, alive.iter().copied(), 3))
                    .count()
            })
            .collect();
        // 100 subjects x 3 observers over 100 agents: 3 each on average.
        assert_eq!(observed.iter().sum::<usize>(), 300);
        let busiest = observed.iter().max().copied().unwrap_or(0);
        assert!(busiest <= 12, "one agent observes {busiest} members: {observed:?}");
    }

    proptest! {
        /// Agents that agree on who is alive designate exactly `observers` of them (all, when
        /// fewer are left), and never the subject.
        #[test]
        fn a_shared_view_designates_exactly_the_number_asked(
            alive in proptest::collection::btree_set(0usize..40, 0..40),
            subject in 0usize..40,
            observers in 1usize..6,
        ) {
            let alive: BTreeSet<String> = alive.into_iter().map(|i| format!("node-{i}")).collect();
            let subject = format!("node-{subject}");
            let view: Vec<&str> = alive.iter().map(String::as_str).collect();
            let designated: Vec<&str> = view
                .iter()
                .copied()
                .filter(|me| observes(me, &subject, view.iter().copied(), observers))
                .collect();
            let candidates = alive.iter().filter(|m| **m != subject).count();
            prop_assert_eq!(designated.len(), observers.min(candidates));
            prop_assert!(!designated.contains(&subject.as_str()));
        }

        /// An agent that believes fewer members alive designates itself at least as readily:
        /// losing observers to an outage recruits others, never the reverse.
        #[test]
        fn fewer_members_alive_never_dismisses_an_observer(
            alive in proptest::collection::btree_set(0usize..30, 1..30),
            lost in proptest::collection::btree_set(0usize..30, 0..10),
            me in 0usize..30,
            subject in 0usize..30,
        ) {
            let me = format!("node-{me}");
            let subject = format!("node-{subject}");
            let all: Vec<String> = alive.iter().map(|i| format!("node-{i}")).collect();
            let fewer: Vec<String> = alive.iter().filter(|i| !lost.contains(i)).map(|i| format!("node-{i}")).collect();
            if observes(&me, &subject, all.iter().map(String::as_str), 3) {
                prop_assert!(observes(&me, &subject, fewer.iter().map(String::as_str), 3));
            }
        }
    }
}
