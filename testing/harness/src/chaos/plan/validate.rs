//! What makes a plan sound: every step applies to the state the steps before it leave, and the
//! last one leaves the lab as the trial found it (trials of a block share a lab).

use super::{
    Action, PathKind, Slot, Step, TrialPlan,
    episodes::{SHORT_OUTAGE_MAX_MS, SLOW_DELAY_MS, SLOW_LOSS_PERMILLE_MAX},
};
use nodemedic_lab::Fault;

/// What a plan leaves each node in, step by step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NodeState {
    off: bool,
    frozen: bool,
    cut: bool,
    bmc_hung: bool,
    disk_full: bool,
    /// Its agent short of CPU or memory: the node stays healthy.
    starved: bool,
    /// Not in the lab: removed, or the extra node before it joins.
    gone: bool,
}

impl NodeState {
    fn faulted(&self) -> bool {
        self.off || self.frozen || self.cut
    }
}

/// The slot, if its node is in the lab.
fn here(nodes: &[NodeState], s: Slot) -> Result<Slot, String> {
    if nodes.get(s).is_some_and(|st| !st.gone) {
        Ok(s)
    } else {
        Err(format!("slot {s} is not in the lab at the time"))
    }
}

/// The API server or etcd stopped.
struct Outage {
    etcd: bool,
    since: u64,
    /// A node was faulted when it began (none can be faulted while it lasts).
    during_node_fault: bool,
}

/// Checks the plan's invariants: sorted steps that end by `end_ms`; only nodes in the lab at the
/// time; minority partitions; node faults, restarts and membership changes only while the API
/// server and etcd run, and control-plane outages longer than a few seconds only while every
/// node is healthy; BMC faults only with BMCs and inside a fault of their node; agent restarts
/// only on unfaulted nodes; a controller restart loop only inside a crash, which lasts until
/// the loop is over; nodes removed and added only in labs without BMCs, never slot 0 (the
/// workload's) nor a faulted node, with the nodes gone or faulted a minority of the lab at
/// every moment; each fault undone by a later step, and at the end everything healed and the
/// lab's nodes exactly those it started with.
pub fn validate(plan: &TrialPlan) -> Result<(), String> {
    let n = plan.shape.nodes;
    let mut state = State {
        nodes: vec![NodeState::default(); n + 1],
        outage: None,
        looping_until: None,
        slow: false,
        control_plane_slow: false,
        upgrading: false,
    };
    state.nodes[plan.shape.extra_slot()].gone = true;
    if plan.steps.windows(2).any(|w| w[0].at_ms > w[1].at_ms) {
        return Err("steps out of order".into());
    }
    if plan.steps.last().is_some_and(|s| s.at_ms > plan.end_ms) {
        return Err("a step after the trial's end".into());
    }
    for step in &plan.steps {
        state
            .apply(plan, step)
            .map_err(|why| format!("{:?} at {} ms: {why}", step.action, step.at_ms))?;
    }
    if state.outage.is_some() {
        return Err("the control plane is left stopped at the end".into());
    }
    if state.slow {
        return Err("the links are left slow at the end".into());
    }
    if state.control_plane_slow {
        return Err("the control plane is left slow at the end".into());
    }
    if state.upgrading {
        return Err("the upgrade is left announced at the end".into());
    }
    if state.nodes[..n].iter().any(|s| *s != NodeState::default()) || !state.nodes[n].gone {
        return Err("a fault is left in place, or the lab's nodes changed, at the end".into());
    }
    Ok(())
}

struct State {
    /// By slot, the extra node's included.
    nodes: Vec<NodeState>,
    outage: Option<Outage>,
    /// When a controller restart loop's last restart is due.
    looping_until: Option<u64>,
    /// The links are slowed.
    slow: bool,
    /// etcd or the API server is starved of CPU.
    control_plane_slow: bool,
    /// A cluster upgrade is announced.
    upgrading: bool,
}

impl State {
    #[expect(
        clippy::too_many_lines,
        reason = "the plan's rules as one table, an arm per action with its guard, and one error for every step that fits none"
    )]
    fn apply(&mut self, plan: &TrialPlan, step: &Step) -> Result<(), String> {
        let n = plan.shape.nodes;
        let nodes = &mut self.nodes;
        let up = self.outage.is_none();
        let churns = plan.shape.churns();
        match &step.action {
            Action::Fault(Fault::Crash { node: s }) if up && !nodes[here(nodes, *s)?].off => nodes[*s].off = true,
            Action::Fault(Fault::PowerOn { node: s }) if nodes[here(nodes, *s)?].off => {
                if self.looping_until.is_some_and(|until| step.at_ms < until) {
                    return Err("powered on while the controller restart loop runs".into());
                }
                nodes[*s].off = false;
            }
            Action::Fault(Fault::Freeze { node: s }) if up && !nodes[here(nodes, *s)?].faulted() => {
                nodes[*s].frozen = true
            }
            Action::Fault(Fault::Thaw { node: s }) if nodes[here(nodes, *s)?].frozen => nodes[*s].frozen = false,
            Action::Fault(Fault::Partition { nodes: set }) if up => {
                if set.is_empty() || set.len() * 2 >= n {
                    return Err("not a minority".into());
                }
                for s in set {
                    if nodes[here(nodes, *s)?].cut {
                        return Err("already cut".into());
                    }
                    nodes[*s].cut = true;
                }
            }
            Action::Fault(Fault::IsolateFromApi { node: s }) if up && !nodes[here(nodes, *s)?].cut => {
                nodes[*s].cut = true
            }
            Action::Fault(Fault::Heal { node: s }) if nodes[here(nodes, *s)?].cut => nodes[*s].cut = false,
            Action::Fault(Fault::StopApiserver) | Action::Fault(Fault::StopEtcd) if up => {
                self.outage = Some(Outage {
                    etcd: step.action == Action::Fault(Fault::StopEtcd),
                    since: step.at_ms,
                    during_node_fault: nodes.iter().any(|s| !s.gone && s.faulted()),
                });
            }
            Action::Fault(Fault::StartApiserver) | Action::Fault(Fault::StartEtcd)
                if self
                    .outage
                    .as_ref()
                    .is_some_and(|o| o.etcd == (step.action == Action::Fault(Fault::StartEtcd))) =>
            {
                if let Some(o) = self.outage.take()
                    && o.during_node_fault
                    && step.at_ms - o.since > SHORT_OUTAGE_MAX_MS
                {
                    return Err("a long control-plane outage during a node fault".into());
                }
            }
            Action::Fault(Fault::RestartEtcd) | Action::RestartController { .. } if up => {}
            Action::RestartControllerLoop { restarts, every_ms } if up => {
                if !(3..=8).contains(restarts) || !(5_000..=8_000).contains(every_ms) {
                    return Err("not 3-8 restarts 5-8 s apart".into());
                }
                if !nodes.iter().any(|s| !s.gone && s.off) {
                    return Err("not during a crash".into());
                }
                self.looping_until = Some(step.at_ms + u64::from(restarts - 1) * every_ms);
            }
            Action::RestartAgent { node: s, .. }
                if plan.shape.path == PathKind::SelfRemediation && up && !nodes[here(nodes, *s)?].faulted() => {}
            Action::Fault(Fault::HangBmc { node: s })
                if plan.shape.path == PathKind::FenceRedfish
                    && nodes[here(nodes, *s)?].faulted()
                    && !nodes[*s].bmc_hung =>
            {
                nodes[*s].bmc_hung = true
            }
            Action::Fault(Fault::ResumeBmc { node: s }) if nodes[here(nodes, *s)?].bmc_hung && nodes[*s].faulted() => {
                nodes[*s].bmc_hung = false
            }
            Action::Fault(Fault::FillDisk { node: s }) if up && !nodes[here(nodes, *s)?].disk_full => {
                nodes[*s].disk_full = true
            }
            Action::Fault(Fault::FreeDisk { node: s }) if up && nodes[here(nodes, *s)?].disk_full => {
                nodes[*s].disk_full = false
            }
            Action::RemoveNode { node: s } if churns && up && *s != 0 && !nodes[here(nodes, *s)?].faulted() => {
                nodes[*s].gone = true;
            }
            Action::AddNode { node: s } if churns && up && nodes.get(*s).is_some_and(|st| st.gone) => {
                nodes[*s] = NodeState::default();
            }
            Action::Fault(Fault::SlowLinks {
                delay_ms,
                jitter_ms,
                loss_permille,
                nodes: every,
            }) if up && !self.slow && every.is_empty() && nodes.iter().all(|s| s.gone || !s.faulted()) => {
                if !(SLOW_DELAY_MS.0..=SLOW_DELAY_MS.1).contains(delay_ms)
                    || *jitter_ms > *delay_ms
                    || *loss_permille > SLOW_LOSS_PERMILLE_MAX
                {
                    return Err("slower or lossier than the lab's timings allow".into());
                }
                self.slow = true;
            }
            Action::Fault(Fault::RestoreLinks { nodes: every }) if self.slow && every.is_empty() => self.slow = false,
            Action::Fault(Fault::StarveAgent { node: s, percent })
                if up && !nodes[here(nodes, *s)?].faulted() && !nodes[*s].starved =>
            {
                if !(1..=100).contains(percent) {
                    return Err("not a share of a CPU".into());
                }
                nodes[*s].starved = true
            }
            Action::Fault(Fault::SqueezeAgent { node: s, .. })
                if up && !nodes[here(nodes, *s)?].faulted() && !nodes[*s].starved =>
            {
                nodes[*s].starved = true
            }
            Action::Fault(Fault::FeedAgent { node: s }) | Action::Fault(Fault::RelieveAgent { node: s })
                if nodes[here(nodes, *s)?].starved =>
            {
                nodes[*s].starved = false
            }
            Action::Fault(Fault::SlowEtcd { .. }) | Action::Fault(Fault::SlowApiserver { .. })
                if up && !self.control_plane_slow =>
            {
                self.control_plane_slow = true
            }
            Action::Fault(Fault::UnthrottleEtcd) | Action::Fault(Fault::UnthrottleApiserver)
                if self.control_plane_slow =>
            {
                self.control_plane_slow = false
            }
            Action::Upgrade { announced } if up && *announced != self.upgrading => self.upgrading = *announced,
            _ => return Err("does not apply to the state before it".into()),
        }
        let removed = nodes[..n].iter().filter(|s| s.gone).count();
        let faulted = nodes.iter().filter(|s| !s.gone && s.faulted()).count();
        if (removed + faulted) * 2 >= n {
            return Err("leaves no majority of the lab's nodes in the lab and healthy".into());
        }
        Ok(())
    }
}
