//! Whether a control-plane node may go into maintenance without costing etcd its quorum. On plain
//! Kubernetes (kubeadm-style) each etcd member is a mirror pod `component=etcd` in kube-system,
//! so the cluster can see which members run and are ready.

use std::collections::BTreeSet;

/// One etcd member as the cluster shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub node: String,
    pub ready: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The node runs no etcd member: nothing to check.
    NotAMember,
    Allowed {
        healthy_after: usize,
        members: usize,
    },
    Refused {
        healthy_after: usize,
        members: usize,
    },
}

/// Taking `node` away leaves `healthy_after` ready members not in maintenance; etcd needs more
/// than half of all members.
pub(crate) fn check(members: &[Member], in_maintenance: &BTreeSet<String>, node: &str) -> Verdict {
    if !members.iter().any(|m| m.node == node) {
        return Verdict::NotAMember;
    }
    let healthy_after = members
        .iter()
        .filter(|m| m.ready && m.node != node && !in_maintenance.contains(&m.node))
        .count();
    let total = members.len();
    if healthy_after > total / 2 {
        Verdict::Allowed {
            healthy_after,
            members: total,
        }
    } else {
        Verdict::Refused {
            healthy_after,
            members: total,
        }
    }
}

/// The error a refused maintenance gets.
pub(crate) fn refusal(healthy_after: usize, members: usize) -> String {
    format!(
        "can not put this control-plane node into maintenance at this moment: etcd would keep {healthy_after} of {members} members ready, and needs more than {}; end another maintenance or wait for the unready members",
        members / 2
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn members(ready: &[bool]) -> Vec<Member> {
        ready
            .iter()
            .enumerate()
            .map(|(i, r)| Member {
                node: format!("cp-{i}"),
                ready: *r,
            })
            .collect()
    }

    #[test]
    fn one_of_three_may_go_two_may_not() {
        let three = members(&[true, true, true]);
        let none = BTreeSet::new();
        assert!(matches!(
            check(&three, &none, "cp-0"),
            Verdict::Allowed { healthy_after: 2, .. }
        ));
        let one_in = BTreeSet::from(["cp-1".to_owned()]);
        assert!(matches!(
            check(&three, &one_in, "cp-0"),
            Verdict::Refused { healthy_after: 1, .. }
        ));
        assert_eq!(check(&three, &none, "worker"), Verdict::NotAMember);
        let one_down = members(&[true, false, true]);
        assert!(matches!(check(&one_down, &none, "cp-0"), Verdict::Refused { .. }));
    }

    proptest! {
        /// Whatever the members' states, an allowed maintenance leaves a majority ready.
        #[test]
        fn allowed_keeps_a_majority(ready in proptest::collection::vec(any::<bool>(), 1..7), busy in proptest::collection::btree_set(0usize..7, 0..4), target in 0usize..7) {
            let all = members(&ready);
            let busy: BTreeSet<String> = busy.into_iter().map(|i| format!("cp-{i}")).collect();
            if let Verdict::Allowed { healthy_after, members } = check(&all, &busy, &format!("cp-{target}")) {
                prop_assert!(2 * healthy_after > members);
            }
        }
    }
}
