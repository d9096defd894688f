//! What a drain does with each pod on the node, as `kubectl drain --force --ignore-daemonsets
//! --delete-emptydir-data` does (medik8s's settings), and the progress medik8s reports.

/// The facts about one pod that decide its fate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodFacts {
    pub namespace: String,
    pub name: String,
    /// Owned by a DaemonSet: its controller would put it straight back.
    pub daemon_set: bool,
    /// A static pod's mirror: the kubelet owns it, the API cannot remove it.
    pub mirror: bool,
    /// Succeeded or Failed: nothing runs any more.
    pub finished: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Left on the node (DaemonSet and mirror pods).
    Stay,
    /// Through the Eviction API, so PodDisruptionBudgets are honoured.
    Evict,
    /// Deleted outright: finished pods hold nothing a budget protects.
    Delete,
}

pub(crate) fn fate(pod: &PodFacts) -> Fate {
    if pod.daemon_set || pod.mirror {
        Fate::Stay
    } else if pod.finished {
        Fate::Delete
    } else {
        // Unmanaged pods go too (medik8s drains with --force); through eviction, so a budget
        // that selects them still holds.
        Fate::Evict
    }
}

/// The pods the drain must see gone, in a stable order (the controller keeps each with its Pod:
/// `Observed::to_remove`).
#[cfg(test)]
fn to_remove(pods: &[PodFacts]) -> Vec<&PodFacts> {
    let mut out: Vec<&PodFacts> = pods.iter().filter(|p| fate(p) != Fate::Stay).collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// medik8s's drainProgress: the share of the pods selected at the start that are gone, in percent.
pub(crate) fn progress(selected_at_start: usize, pending: usize) -> i32 {
    if selected_at_start == 0 {
        return 100;
    }
    let done = selected_at_start.saturating_sub(pending);
    (done * 100 / selected_at_start) as i32
}

/// How long to wait before the next pass when budgets blocked the last `blocked_passes` passes in a
/// row: a budget frees up as soon as a replacement pod is ready, so start at a second, and back
/// off (to medik8s's fixed 5 s and a little beyond) while nothing moves.
pub(crate) fn retry_after(blocked_passes: u32) -> std::time::Duration {
    const CAP_SECS: u64 = 10;
    std::time::Duration::from_secs(
        1u64.checked_shl(blocked_passes.saturating_sub(1))
            .unwrap_or(CAP_SECS)
            .min(CAP_SECS),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pod(name: &str) -> PodFacts {
        PodFacts {
            namespace: "app".into(),
            name: name.into(),
            daemon_set: false,
            mirror: false,
            finished: false,
        }
    }

    #[test]
    fn daemon_set_and_mirror_pods_stay_the_rest_goes() {
        let ds = PodFacts {
            daemon_set: true,
            ..pod("ds")
        };
        let mirror = PodFacts {
            mirror: true,
            ..pod("etcd")
        };
        let done = PodFacts {
            finished: true,
            ..pod("job")
        };
        // An unmanaged pod is evicted like any other (nothing recreates it, as with --force).
        let bare = pod("bare");
        assert_eq!(fate(&ds), Fate::Stay);
        assert_eq!(fate(&mirror), Fate::Stay);
        assert_eq!(fate(&done), Fate::Delete);
        assert_eq!(fate(&bare), Fate::Evict);
        assert_eq!(fate(&pod("web")), Fate::Evict);
        let all = [ds, mirror, done, bare, pod("web")];
        let names: Vec<&str> = to_remove(&all).iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["bare", "job", "web"]);
    }

    #[test]
    fn progress_as_medik8s_reports_it() {
        assert_eq!(progress(0, 0), 100);
        assert_eq!(progress(4, 4), 0);
        assert_eq!(progress(4, 1), 75);
        assert_eq!(progress(3, 0), 100);
    }

    #[test]
    fn blocked_drains_back_off_to_a_cap() {
        let secs: Vec<u64> = (0..7).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(secs, [1, 1, 2, 4, 8, 10, 10]);
        assert_eq!(retry_after(u32::MAX).as_secs(), 10);
    }

    proptest! {
        #[test]
        fn progress_stays_in_range_and_grows_as_pods_go(start in 0usize..500, a in 0usize..600, b in 0usize..600) {
            let (fewer, more) = (a.min(b), a.max(b));
            let p = progress(start, more);
            prop_assert!((0..=100).contains(&p));
            prop_assert!(progress(start, fewer) >= p);
            prop_assert_eq!(progress(start, 0), 100);
        }
    }
}
