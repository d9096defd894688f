//! Whether a control-plane node may go into maintenance without costing etcd its quorum: the
//! check is [`nodemedic_kube::etcd::check`], shared with the health check.

pub(crate) use nodemedic_kube::etcd::Verdict;

/// The error a refused maintenance gets.
pub(crate) fn refusal(healthy_after: usize, members: usize) -> String {
    format!(
        "can not put this control-plane node into maintenance at this moment: etcd would keep {healthy_after} of {members} members ready, and needs more than {}; end another maintenance or wait for the unready members",
        members / 2
    )
}
