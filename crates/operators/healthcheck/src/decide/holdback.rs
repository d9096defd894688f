//! The rules that hold back remediating an unhealthy node, each a plain function of the facts that
//! says why as data ([`HoldBack`]); [`record`] turns a reason into what the decision records and
//! says. Two rules concern the node whatever its remediation's state ([`NODE_RULES`]); the others
//! only the creation of a new remediation object ([`CREATION_RULES`]), asked in order, the first
//! that holds winning.

use jiff::Timestamp;
use nodemedic_api::names::labels;

use super::{
    Decision, Health, Input, NodeFacts, Severity, TemplateState,
    budget::until,
    health, liveness,
    model::{LeaseFacts, Step},
};

/// Why new remediation may be held back for every node.
pub(super) struct Gate {
    /// A MachineHealthCheck covers a selected node ([`super::conflict`]).
    pub conflict: Option<String>,
    pub paused: bool,
    /// A cluster upgrade under way ([`super::upgrade::in_progress`]).
    pub upgrade: Option<super::upgrade::Hold>,
    pub over_budget: bool,
}

/// An unhealthy node, and the escalation step whose object would be created next.
pub(super) struct Candidate<'a> {
    pub input: &'a Input<'a>,
    pub node: &'a NodeFacts,
    pub gate: &'a Gate,
    pub step: &'a Step,
    /// Control-plane nodes being remediated, this one included once it is.
    pub control_plane_busy: &'a [String],
}

/// Why the node is not remediated now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum HoldBack {
    /// Said (RemediationSkipped) when the node has just turned unhealthy.
    Skipped(String),
    /// Counted in the status's budget condition instead.
    OverBudget,
    /// An outage of the API may explain the node's Unknown: wait until it no longer can.
    Deferred { at: Timestamp },
    /// The node's kubelet renews its lease: the Unknown is stale.
    Alive(liveness::Alive),
    /// The template is not usable; the check's own condition says why.
    TemplateNotReady,
    /// Remediating the control-plane node would cost etcd its quorum: said when the node has
    /// just turned unhealthy, and looked at again (the members are not watched).
    WaitsForQuorum(String),
}

/// How often a control-plane node held back for etcd's quorum is looked at again.
const QUORUM_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(15);

pub(super) type NodeRule = fn(&Input<'_>, &NodeFacts) -> Option<HoldBack>;
pub(super) type CreationRule = fn(&Candidate<'_>) -> Option<HoldBack>;

pub(super) const NODE_RULES: [NodeRule; 2] = [excluded, leased_elsewhere];

pub(super) const CREATION_RULES: [CreationRule; 10] = [
    standing_back,
    paused,
    upgrading,
    over_budget,
    // Before the control-plane rule: a node whose Unknown an outage may explain, or that is
    // alive, is not being remediated and must not keep another control-plane node waiting.
    deferred_by_outage,
    alive,
    control_plane_busy,
    etcd_quorum,
    template_not_ready,
    name_taken,
];

pub(super) fn for_node(input: &Input<'_>, node: &NodeFacts) -> Option<HoldBack> {
    NODE_RULES.iter().find_map(|rule| rule(input, node))
}

pub(super) fn for_creation(candidate: &Candidate<'_>) -> Option<HoldBack> {
    CREATION_RULES.iter().find_map(|rule| rule(candidate))
}

pub(super) fn is_control_plane(node: &NodeFacts) -> bool {
    node.labels.contains_key(labels::ROLE_CONTROL_PLANE) || node.labels.contains_key(labels::ROLE_MASTER)
}

/// The node's valid lease, when someone other than this check holds it.
pub(super) fn foreign_lease<'a>(input: &'a Input<'_>, node: &str) -> Option<&'a LeaseFacts> {
    input
        .leases
        .get(node)
        .filter(|l| l.valid_at(input.now) && l.holder != input.lease_holder)
}

/// Labelled out of remediation (a node under maintenance).
fn excluded(_: &Input<'_>, node: &NodeFacts) -> Option<HoldBack> {
    let label = node.labels.get(labels::EXCLUDE_FROM_REMEDIATION)?;
    (label == "true").then(|| {
        HoldBack::Skipped(format!(
            "Skipped remediation of node {}: it is labelled {}=true (node maintenance)",
            node.name,
            labels::EXCLUDE_FROM_REMEDIATION
        ))
    })
}

/// Its node lease is held by someone else (a maintenance, another check).
fn leased_elsewhere(input: &Input<'_>, node: &NodeFacts) -> Option<HoldBack> {
    let held = foreign_lease(input, &node.name)?;
    Some(HoldBack::Skipped(format!(
        "Skipped remediation of node {} because node lease is already taken by {}",
        node.name, held.holder
    )))
}

/// A MachineHealthCheck remediates these nodes: nothing new is started beside it, escalation
/// included (its remediator and this check's would act on one node).
fn standing_back(c: &Candidate<'_>) -> Option<HoldBack> {
    c.gate.conflict.as_ref().map(|why| {
        HoldBack::Skipped(format!(
            "Skipped remediation of node {}: the health check stands back ({why})",
            c.node.name
        ))
    })
}

fn paused(c: &Candidate<'_>) -> Option<HoldBack> {
    c.gate.paused.then(|| {
        HoldBack::Skipped(format!(
            "Skipped remediation of node {}: the health check is paused ({})",
            c.node.name,
            c.input.check.pause_requests.join(",")
        ))
    })
}

/// A cluster upgrade postpones the first remediation of a node that turned unhealthy during it;
/// the escalation of one under way goes on, and a node unhealthy since before the upgrade began
/// is not the upgrade's doing (and may be what holds the upgrade up).
fn upgrading(c: &Candidate<'_>) -> Option<HoldBack> {
    let hold = c.gate.upgrade.as_ref()?;
    let first_order = c.input.check.steps.iter().map(|s| s.order).min();
    if first_order != Some(c.step.order) {
        return None;
    }
    let unhealthy_since = match health::classify(c.node, &c.input.check.rules, c.input.now, None) {
        Health::Unhealthy { since, .. } => since,
        Health::Healthy | Health::Soon { .. } => c.input.now,
    };
    hold.holds(unhealthy_since).then(|| {
        HoldBack::Skipped(format!(
            "Postponing remediation of node {} because of an ongoing cluster upgrade: {}",
            c.node.name, hold.why
        ))
    })
}

fn over_budget(c: &Candidate<'_>) -> Option<HoldBack> {
    c.gate.over_budget.then_some(HoldBack::OverBudget)
}

/// The node's unhealthy condition counts as held for its duration only later than now, once the
/// outage window is taken into account.
fn deferred_by_outage(c: &Candidate<'_>) -> Option<HoldBack> {
    let input = c.input;
    let window = input
        .outage?
        .for_node(input.kubelet_renewals.get(&c.node.name).copied())?;
    match health::classify(c.node, &input.check.rules, input.now, Some(window)) {
        Health::Soon { at } => Some(HoldBack::Deferred { at }),
        Health::Healthy | Health::Unhealthy { .. } => None,
    }
}

/// Its kubelet renewed its lease after its Ready=Unknown: that Unknown is stale. The renewal
/// says nothing of a condition that turned unhealthy after it, which still stands: after a
/// control-plane outage every node is marked Unknown at once, and one that dies right after is
/// found by the peer detector (PeersReachable=False weighs the renewals itself) while its last
/// renewal is still recent (issue 60: 40 s held back).
fn alive(c: &Candidate<'_>) -> Option<HoldBack> {
    let evidence = c.input.alive.get(&c.node.name).copied()?;
    let since_renewed = health::unhealthy_since(c.node, &c.input.check.rules, c.input.now, evidence.renewed);
    (!since_renewed).then_some(HoldBack::Alive(evidence))
}

/// Control-plane nodes are remediated one at a time.
fn control_plane_busy(c: &Candidate<'_>) -> Option<HoldBack> {
    let name = c.node.name.as_str();
    if !is_control_plane(c.node) {
        return None;
    }
    let busy = c.control_plane_busy.iter().find(|n| n.as_str() != name)?;
    Some(HoldBack::Skipped(format!(
        "Skipped remediation of control-plane node {name}: control-plane node {busy} is being remediated, one at a time"
    )))
}

/// A control-plane node whose loss would take etcd below quorum waits (medik8s's etcd guard on
/// OpenShift; here also kubeadm's mirror pods). Its member already down costs nothing more.
fn etcd_quorum(c: &Candidate<'_>) -> Option<HoldBack> {
    let name = c.node.name.as_str();
    let members = match c.input.etcd {
        super::EtcdView::NotRead => return None,
        super::EtcdView::Members(members) => members,
        super::EtcdView::Unreadable(why) => {
            return Some(HoldBack::WaitsForQuorum(format!(
                "Skipped remediation of control-plane node {name}: etcd's members could not be read ({why}), and it is remediated only if etcd keeps its quorum"
            )));
        }
    };
    let busy: std::collections::BTreeSet<String> = c
        .control_plane_busy
        .iter()
        .filter(|n| n.as_str() != name)
        .cloned()
        .collect();
    match nodemedic_kube::etcd::check(members, &busy, name) {
        nodemedic_kube::etcd::Verdict::Refused { healthy_after, members } => Some(HoldBack::WaitsForQuorum(format!(
            "Skipped remediation of control-plane node {name}: etcd would keep {healthy_after} of its {members} members ready, and needs more than {}; it is remediated once enough members are ready again",
            members / 2
        ))),
        _ => None,
    }
}

fn template_not_ready(c: &Candidate<'_>) -> Option<HoldBack> {
    match c.input.templates.get(&c.step.template) {
        Some(TemplateState::Ready { .. }) => None,
        _ => Some(HoldBack::TemplateNotReady),
    }
}

/// The object's fixed name (the node's) is taken by an object this check does not own.
fn name_taken(c: &Candidate<'_>) -> Option<HoldBack> {
    let name = c.node.name.as_str();
    let Some(TemplateState::Ready {
        multiple_templates: false,
        ..
    }) = c.input.templates.get(&c.step.template)
    else {
        return None;
    };
    let template = &c.step.template;
    if super::node::shares_its_kind(c.input, template) {
        return None;
    }
    let namespace = template.namespace.as_deref().unwrap_or_default();
    let taken = c.input.remediations.iter().any(|r| {
        !r.owned && r.id.kind == template.remediation_kind() && r.id.namespace == namespace && r.id.name == name
    });
    taken.then(|| {
        HoldBack::Skipped(format!(
            "Skipped remediation of node {name}: a {} named {name} owned by someone else already exists",
            template.remediation_kind()
        ))
    })
}

/// Records a hold-back in the decision: its status entry, its event, when to look again.
pub(super) fn record(hold: HoldBack, node: &str, newly: bool, now: Timestamp, d: &mut Decision) {
    match hold {
        HoldBack::Skipped(why) => {
            if newly {
                d.notice(Some(node), Severity::Warning, "RemediationSkipped", why);
            }
        }
        HoldBack::OverBudget => {
            d.blocked_by_budget.insert(node.to_owned());
        }
        HoldBack::Deferred { at } => {
            d.deferred.insert(node.to_owned());
            d.notice(
                Some(node),
                Severity::Normal,
                "RemediationDeferred",
                format!(
                    "Node {node} turned Unknown after the health check last heard from the API server before losing it, when no node could renew its lease: its remediation waits until {at}, a lease duration after the API answered again plus the condition's duration, in case the node renews meanwhile"
                ),
            );
            d.requeue(until(now, at));
        }
        HoldBack::Alive(alive) => {
            d.held_back_alive.insert(node.to_owned());
            d.notice(
                Some(node),
                Severity::Normal,
                "RemediationHeldBack",
                format!(
                    "Node {node} is Ready=Unknown since {}, but its kubelet renewed its node lease at {}, after that: the status is stale (as after a control-plane outage), so no remediation is created while the renewals go on",
                    alive.unknown_since, alive.renewed
                ),
            );
            d.requeue(liveness::LOOK_AGAIN);
        }
        HoldBack::TemplateNotReady => {}
        HoldBack::WaitsForQuorum(why) => {
            if newly {
                d.notice(Some(node), Severity::Warning, "RemediationSkipped", why);
            }
            d.requeue(QUORUM_LOOK_AGAIN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::tests::{HOLDER, World, classic, control_plane, cr, node},
        *,
    };
    use crate::decide::{
        model::{ConditionFacts, TemplateState, UnhealthyRule},
        test_time::at,
    };

    fn gate() -> Gate {
        Gate {
            conflict: None,
            paused: false,
            upgrade: None,
            over_budget: false,
        }
    }

    /// The first creation rule that holds for node `name` of `world` at the check's first step.
    fn creation(world: &World, name: &str, gate: &Gate, busy: &[String]) -> Option<HoldBack> {
        let refs: Vec<&NodeFacts> = world.nodes.iter().collect();
        let input = world.input(&refs);
        let node = world.nodes.iter().find(|n| n.name == name).expect("node in world");
        for_creation(&Candidate {
            input: &input,
            node,
            gate,
            step: &world.check.steps[0],
            control_plane_busy: busy,
        })
    }

    fn skipped(hold: Option<HoldBack>) -> String {
        match hold {
            Some(HoldBack::Skipped(why)) => why,
            other => panic!("expected a skip, got {other:?}"),
        }
    }

    #[test]
    fn an_excluded_node_is_skipped_and_only_true_excludes() {
        let mut world = World::new(classic(), vec![node("w1", "False", 0)]);
        let refs: Vec<&NodeFacts> = world.nodes.iter().collect();
        assert_eq!(for_node(&world.input(&refs), &world.nodes[0]), None);
        world.nodes[0]
            .labels
            .insert(labels::EXCLUDE_FROM_REMEDIATION.into(), "yes".into());
        let refs: Vec<&NodeFacts> = world.nodes.iter().collect();
        assert_eq!(for_node(&world.input(&refs), &world.nodes[0]), None);
        world.nodes[0]
            .labels
            .insert(labels::EXCLUDE_FROM_REMEDIATION.into(), "true".into());
        let refs: Vec<&NodeFacts> = world.nodes.iter().collect();
        assert!(skipped(for_node(&world.input(&refs), &world.nodes[0])).contains("labelled"));
    }

    #[test]
    fn a_lease_held_by_someone_else_skips_the_node_and_ours_does_not() {
        let mut world = World::new(classic(), vec![node("w1", "False", 0)]);
        let lease = |holder: &str| LeaseFacts {
            holder: holder.into(),
            acquired: Some(at(9_000)),
            renewed: at(9_900),
            duration: std::time::Duration::from_secs(600),
        };
        world.leases.insert("w1".into(), lease(HOLDER));
        let refs: Vec<&NodeFacts> = world.nodes.iter().collect();
        assert_eq!(for_node(&world.input(&refs), &world.nodes[0]), None);
        world.leases.insert("w1".into(), lease("node-maintenance"));
        let refs: Vec<&NodeFacts> = world.nodes.iter().collect();
        assert!(skipped(for_node(&world.input(&refs), &world.nodes[0])).contains("node-maintenance"));
    }

    #[test]
    fn paused_comes_before_the_budget_and_names_the_requests() {
        let mut world = World::new(classic(), vec![node("w1", "False", 0)]);
        world.check.pause_requests = vec!["upgrade".into()];
        let both = Gate {
            conflict: None,
            paused: true,
            upgrade: None,
            over_budget: true,
        };
        assert!(skipped(creation(&world, "w1", &both, &[])).contains("paused (upgrade)"));
        let budget_only = Gate {
            conflict: None,
            paused: false,
            upgrade: None,
            over_budget: true,
        };
        assert_eq!(creation(&world, "w1", &budget_only, &[]), Some(HoldBack::OverBudget));
        assert_eq!(creation(&world, "w1", &gate(), &[]), None);
    }

    #[test]
    fn a_living_node_is_held_back() {
        let mut world = World::new(classic(), vec![node("w1", "Unknown", 0)]);
        let alive = liveness::Alive {
            unknown_since: at(0),
            renewed: at(9_990),
        };
        world.alive.insert("w1".into(), alive);
        assert_eq!(creation(&world, "w1", &gate(), &[]), Some(HoldBack::Alive(alive)));
    }

    /// Issue 60: Ready=Unknown since the control plane came back, a renewal, then the node dies
    /// and its peers lose it: the renewal does not hold back what the detector found after it.
    #[test]
    fn a_renewal_holds_back_a_stale_unknown_but_not_what_turned_unhealthy_after_it() {
        let mut world = World::new(classic(), vec![node("w1", "Unknown", 0)]);
        world.check.rules.push(UnhealthyRule {
            type_: "PeersReachable".into(),
            status: "False".into(),
            duration: std::time::Duration::ZERO,
        });
        let alive = liveness::Alive {
            unknown_since: at(0),
            renewed: at(9_990),
        };
        world.alive.insert("w1".into(), alive);
        world.nodes[0].conditions.push(ConditionFacts {
            type_: "PeersReachable".into(),
            status: "False".into(),
            since: at(9_980),
        });
        assert_eq!(
            creation(&world, "w1", &gate(), &[]),
            Some(HoldBack::Alive(alive)),
            "lost by its peers before it renewed: held back"
        );
        world.nodes[0].conditions[1].since = at(9_995);
        assert_eq!(
            creation(&world, "w1", &gate(), &[]),
            None,
            "lost after its last renewal"
        );
    }

    #[test]
    fn one_control_plane_node_at_a_time_and_workers_do_not_wait() {
        let world = World::new(
            classic(),
            vec![control_plane(node("a", "False", 0)), node("w1", "False", 0)],
        );
        let busy = vec!["b".to_owned()];
        assert!(skipped(creation(&world, "a", &gate(), &busy)).contains("control-plane node b"));
        assert_eq!(creation(&world, "a", &gate(), &["a".to_owned()]), None);
        assert_eq!(creation(&world, "w1", &gate(), &busy), None);
    }

    #[test]
    fn a_template_not_ready_holds_back_silently() {
        let mut world = World::new(classic(), vec![node("w1", "False", 0)]);
        let template = world.check.steps[0].template.clone();
        world.templates.insert(template, TemplateState::NotFound);
        assert_eq!(creation(&world, "w1", &gate(), &[]), Some(HoldBack::TemplateNotReady));
    }

    #[test]
    fn a_fixed_name_taken_by_someone_else_skips_the_node() {
        let mut world = World::new(classic(), vec![node("w1", "False", 0)]);
        let mut foreign = cr("w1", "SelfNodeRemediation", 0);
        foreign.owned = false;
        world.remediations.push(foreign);
        assert!(skipped(creation(&world, "w1", &gate(), &[])).contains("owned by someone else"));
    }

    #[test]
    fn recording_a_skip_says_it_only_when_the_node_just_turned_unhealthy() {
        let mut d = Decision::default();
        record(HoldBack::Skipped("why".into()), "w1", false, at(0), &mut d);
        assert!(d.notices.is_empty());
        record(HoldBack::Skipped("why".into()), "w1", true, at(0), &mut d);
        assert_eq!(d.notices.len(), 1);
        record(HoldBack::OverBudget, "w1", true, at(0), &mut d);
        assert!(d.blocked_by_budget.contains("w1"));
    }
}
