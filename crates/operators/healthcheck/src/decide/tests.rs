//! Every rule of the decision, and its invariants under arbitrary clusters.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use kube::core::Selector;
use nodemedic_api::names::labels;
use proptest::prelude::*;

use super::*;

use super::test_time::at;

const NOW: i64 = 10_000;
pub(super) const HOLDER: &str = "NodeHealthCheck-nhc";

fn template(kind: &str, name: &str) -> TemplateRef {
    TemplateRef {
        api_version: "self-node-remediation.medik8s.io/v1alpha1".into(),
        kind: kind.into(),
        namespace: Some("ns".into()),
        name: name.into(),
    }
}

fn check(steps: Vec<Step>) -> CheckSpec {
    CheckSpec {
        name: "nhc".into(),
        selector: Selector::from_iter([(labels::ROLE_WORKER, "")]),
        rules: ["False", "Unknown"]
            .iter()
            .map(|s| UnhealthyRule {
                type_: "Ready".into(),
                status: (*s).into(),
                duration: Duration::from_secs(300),
            })
            .collect(),
        budget: Budget::DefaultMinHealthy,
        storm_cooldown: None,
        steps,
        pause_requests: vec![],
        healthy_delay: HealthyDelay::None,
    }
}

pub(super) fn classic() -> CheckSpec {
    check(vec![Step {
        order: 0,
        template: template("SelfNodeRemediationTemplate", "snr"),
        timeout: None,
    }])
}

fn escalating() -> CheckSpec {
    check(vec![
        Step {
            order: 1,
            template: template("SelfNodeRemediationTemplate", "snr"),
            timeout: Some(Duration::from_secs(120)),
        },
        Step {
            order: 2,
            template: template("FenceAgentsRemediationTemplate", "far"),
            timeout: Some(Duration::from_secs(600)),
        },
    ])
}

pub(super) fn node(name: &str, ready: &str, since: i64) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: [(labels::ROLE_WORKER.to_owned(), String::new())].into(),
        conditions: vec![ConditionFacts {
            type_: "Ready".into(),
            status: ready.into(),
            since: at(since),
        }],
        confirmed_healthy: false,
        upgrading: None,
        machine: None,
    }
}

pub(super) fn control_plane(mut n: NodeFacts) -> NodeFacts {
    n.labels.insert(labels::ROLE_CONTROL_PLANE.into(), String::new());
    n
}

pub(super) fn cr(node: &str, kind: &str, created: i64) -> RemediationFacts {
    RemediationFacts {
        id: RemediationId {
            api_version: "self-node-remediation.medik8s.io/v1alpha1".into(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: node.into(),
        },
        uid: format!("uid-{node}-{kind}"),
        node: node.into(),
        template_name: None,
        owned: true,
        created: at(created),
        timed_out: None,
        healthy_since: None,
        succeeded: None,
        permanent_node_deletion_expected: false,
        control_plane: false,
        deleting: false,
        flagged_old: false,
    }
}

#[derive(Debug)]
pub(super) struct World {
    pub(super) check: CheckSpec,
    pub(super) nodes: Vec<NodeFacts>,
    pub(super) remediations: Vec<RemediationFacts>,
    pub(super) templates: BTreeMap<TemplateRef, TemplateState>,
    pub(super) leases: BTreeMap<String, LeaseFacts>,
    pub(super) memory: Memory,
    pub(super) alive: BTreeMap<String, liveness::Alive>,
    pub(super) outage: Option<outage::Window>,
    pub(super) kubelet_renewals: BTreeMap<String, Timestamp>,
    pub(super) upgrades: Vec<upgrade::Upgrade>,
    pub(super) machine_health_checks: Vec<conflict::MachineHealthCheckFacts>,
    pub(super) machines: BTreeMap<conflict::MachineKey, BTreeMap<String, String>>,
    pub(super) etcd: Option<Vec<nodemedic_kube::etcd::Member>>,
    pub(super) now: Timestamp,
}

impl World {
    pub(super) fn new(check: CheckSpec, nodes: Vec<NodeFacts>) -> Self {
        let templates = check
            .steps
            .iter()
            .map(|s| {
                (
                    s.template.clone(),
                    TemplateState::Ready {
                        spec: serde_json::json!({"remediationStrategy": "Automatic"}),
                        multiple_templates: false,
                    },
                )
            })
            .collect();
        Self {
            check,
            nodes,
            remediations: vec![],
            templates,
            leases: BTreeMap::new(),
            memory: Memory::default(),
            alive: BTreeMap::new(),
            outage: None,
            kubelet_renewals: BTreeMap::new(),
            upgrades: vec![],
            machine_health_checks: vec![],
            machines: BTreeMap::new(),
            etcd: None,
            now: at(NOW),
        }
    }

    fn decide(&self) -> Decision {
        let refs: Vec<&NodeFacts> = self.nodes.iter().collect();
        decide(&self.input(&refs))
    }

    /// The decision's input over this world, its nodes given as `refs`.
    pub(super) fn input<'a>(&'a self, refs: &'a [&'a NodeFacts]) -> Input<'a> {
        Input {
            now: self.now,
            check: &self.check,
            nodes: refs,
            remediations: &self.remediations,
            templates: &self.templates,
            leases: &self.leases,
            memory: &self.memory,
            lease_holder: HOLDER,
            alive: &self.alive,
            outage: self.outage,
            kubelet_renewals: &self.kubelet_renewals,
            upgrades: &self.upgrades,
            machine_health_checks: &self.machine_health_checks,
            machines: &self.machines,
            etcd: self.etcd.as_deref().map_or(EtcdView::NotRead, EtcdView::Members),
        }
    }
}

fn created_for(d: &Decision) -> Vec<&str> {
    d.create.iter().map(|c| c.node.as_str()).collect()
}

fn reasons(d: &Decision) -> Vec<&str> {
    d.notices.iter().map(|n| n.reason).collect()
}

#[test]
fn remediates_a_node_unhealthy_for_its_duration_not_before() {
    let nodes = vec![
        node("a", "Unknown", NOW - 299),
        node("b", "True", 0),
        node("c", "True", 0),
    ];
    let d = World::new(classic(), nodes).decide();
    assert!(d.create.is_empty());
    assert_eq!(
        d.requeue_after.map(|r| r.as_secs()),
        Some(1),
        "looks again when the duration expires"
    );

    let nodes = vec![
        node("a", "Unknown", NOW - 300),
        node("b", "True", 0),
        node("c", "True", 0),
    ];
    let d = World::new(classic(), nodes).decide();
    assert_eq!(created_for(&d), ["a"]);
    let new = &d.create[0];
    assert_eq!(
        (new.kind.as_str(), new.namespace.as_str(), new.name.as_deref()),
        ("SelfNodeRemediation", "ns", Some("a"))
    );
    assert_eq!(new.spec["remediationStrategy"], "Automatic");
    assert!(d.leases.contains(&LeaseAction::Request {
        node: "a".into(),
        duration: Duration::from_secs(660)
    }));
    assert!(reasons(&d).contains(&"DetectedUnhealthy") && reasons(&d).contains(&"RemediationCreated"));
    assert_eq!(d.status.phase, Phase::Remediating);
}

fn window(began: i64, counts_from: i64) -> Option<outage::Window> {
    Some(outage::Window {
        began: at(began),
        counts_from: at(counts_from),
        regained: Some(at(counts_from - 40)),
    })
}

#[test]
fn an_unknown_an_outage_may_explain_waits_until_the_node_could_renew() {
    let nodes = vec![
        node("a", "Unknown", NOW - 600),
        node("b", "True", 0),
        node("c", "True", 0),
        node("d", "False", NOW - 600),
        node("e", "Unknown", NOW - 2000),
    ];
    let mut w = World::new(classic(), nodes);
    w.check.budget = Budget::MaxUnhealthy(IntOrPercent::Int(3));
    w.outage = window(NOW - 1000, NOW - 100);
    let d = w.decide();
    assert_eq!(
        created_for(&d),
        ["d", "e"],
        "a False condition is the kubelet's own word; e was Unknown before the outage"
    );
    assert_eq!(d.deferred, BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        d.requeue_after.map(|r| r.as_secs()),
        Some(200),
        "looks again when the Unknown has held for its duration since the node could renew"
    );
    let about_a: Vec<_> = d
        .notices
        .iter()
        .filter(|n| n.node.as_deref() == Some("a"))
        .map(|n| n.reason)
        .collect();
    assert_eq!(about_a, ["DetectedUnhealthy", "RemediationDeferred"]);
    assert!(d.status.unhealthy.contains_key("a"), "still listed unhealthy");

    w.outage = window(NOW - 1000, NOW - 300);
    assert_eq!(created_for(&w.decide()), ["a", "d", "e"]);
}

/// A node heard from after the API came back (its kubelet renewed) is not excused by the
/// outage when it turns Unknown later: seed 47's trial 47 partitioned two nodes 11 s after an
/// API server outage, and waiting the window outlasted the partition.
#[test]
fn a_node_that_renewed_after_the_outage_is_not_excused_by_it() {
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", NOW - 600),
            node("b", "True", 0),
            node("c", "True", 0),
        ],
    );
    w.outage = window(NOW - 1000, NOW + 40);
    let regained = NOW;
    w.kubelet_renewals.insert("a".into(), at(regained - 1));
    assert!(
        created_for(&w.decide()).is_empty(),
        "its last renewal is from before the API answered again"
    );
    w.kubelet_renewals.insert("a".into(), at(regained + 1));
    assert_eq!(created_for(&w.decide()), ["a"]);
}

#[test]
fn an_escalation_waits_too_but_a_remediation_under_way_goes_on() {
    let nodes = vec![
        node("a", "Unknown", NOW - 600),
        node("b", "True", 0),
        node("c", "True", 0),
    ];
    let mut w = World::new(escalating(), nodes);
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - 400));
    let steady = w.decide();
    assert_eq!(created_for(&steady), ["a"], "the first step timed out: escalates");
    w.outage = window(NOW - 1000, NOW + 40);
    let d = w.decide();
    assert!(d.create.is_empty(), "the next step waits");
    assert_eq!(d.mark_timed_out, steady.mark_timed_out, "the timeout is the timeout");
    assert!(d.delete.is_empty());

    w.remediations[0].created = at(NOW - 10);
    let d = w.decide();
    assert!(d.create.is_empty() && d.delete.is_empty() && d.deferred.is_empty());
    assert!(
        d.leases
            .iter()
            .any(|l| matches!(l, LeaseAction::Request { node, .. } if node == "a")),
        "the lease is kept"
    );
}

#[test]
fn a_template_with_the_multiple_templates_annotation_gets_generated_names() {
    let mut w = World::new(
        classic(),
        vec![node("a", "False", 0), node("b", "True", 0), node("c", "True", 0)],
    );
    w.templates.insert(
        template("SelfNodeRemediationTemplate", "snr"),
        TemplateState::Ready {
            spec: serde_json::json!({}),
            multiple_templates: true,
        },
    );
    assert_eq!(w.decide().create[0].name, None);
}

#[test]
fn deletes_the_remediation_when_the_node_is_healthy_again_then_releases_the_lease() {
    let mut w = World::new(
        classic(),
        vec![node("a", "True", NOW - 5), node("b", "True", 0), node("c", "True", 0)],
    );
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - 100));
    let d = w.decide();
    assert_eq!(d.delete.len(), 1);
    assert!(reasons(&d).contains(&"RemediationRemoved"));
    w.remediations.clear();
    w.leases.insert(
        "a".into(),
        LeaseFacts {
            holder: HOLDER.into(),
            acquired: Some(at(NOW - 100)),
            renewed: at(NOW - 10),
            duration: Duration::from_secs(660),
        },
    );
    let d = w.decide();
    assert_eq!(d.leases, [LeaseAction::Release { node: "a".into() }]);
    assert_eq!(d.status.phase, Phase::Enabled);
}

#[test]
fn healthy_delay_waits_then_deletes_and_negative_means_never() {
    let mut w = World::new(
        classic(),
        vec![node("a", "True", NOW - 5), node("b", "True", 0), node("c", "True", 0)],
    );
    w.check.healthy_delay = HealthyDelay::After(Duration::from_secs(60));
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - 100));
    let d = w.decide();
    assert!(d.delete.is_empty());
    assert_eq!(d.mark_healthy_since.len(), 1);
    assert!(d.status.unhealthy["a"].healthy_delayed);
    w.remediations[0].healthy_since = Some(at(NOW - 30));
    assert!(w.decide().delete.is_empty());
    w.remediations[0].healthy_since = Some(at(NOW - 60));
    assert_eq!(w.decide().delete.len(), 1);

    w.check.healthy_delay = HealthyDelay::Never;
    w.remediations[0].healthy_since = Some(at(0));
    assert!(w.decide().delete.is_empty());
    w.nodes[0].confirmed_healthy = true;
    assert_eq!(w.decide().delete.len(), 1, "manual confirmation overrides the delay");
}

#[test]
fn over_budget_no_new_remediation_and_it_says_why() {
    let nodes = vec![node("a", "Unknown", 0), node("b", "Unknown", 0), node("c", "True", 0)];
    let d = World::new(classic(), nodes).decide();
    assert!(d.create.is_empty());
    let skipped = d
        .notices
        .iter()
        .find(|n| n.reason == "RemediationSkipped")
        .expect("an event says why");
    assert!(
        skipped.message.contains("is 1 and should equal or exceed 2"),
        "{}",
        skipped.message
    );
    assert!(skipped.message.contains("2 unhealthy"), "{}", skipped.message);
    assert!(!d.status.remediation_allowed.0);
    assert!(
        d.status.remediation_allowed.2.contains("minHealthy 51% (the default"),
        "{}",
        d.status.remediation_allowed.2
    );
    assert_eq!(d.blocked_by_budget.len(), 2);
}

/// Issue 60: after a control-plane outage the node controller marked every node Unknown; two
/// of them renew their kubelet leases since, the third died. The budget counts the two renewing
/// ones healthy, and the dead one is remediated without waiting for their Ready.
#[test]
fn nodes_renewing_since_their_unknown_count_healthy_for_the_budget() {
    let since = NOW - 400;
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", since),
            node("b", "Unknown", since),
            node("c", "Unknown", since),
        ],
    );
    assert!(
        w.decide().create.is_empty(),
        "no renewals: every node unhealthy, over budget"
    );
    w.kubelet_renewals = [("a", since - 50), ("b", NOW - 5), ("c", NOW - 9)]
        .into_iter()
        .map(|(n, t)| (n.to_owned(), at(t)))
        .collect();
    // The controller's second pass: b and c are alive, their own remediations held back.
    for (n, renewed) in [("b", NOW - 5), ("c", NOW - 9)] {
        let alive = liveness::alive(at(since), at(renewed), at(NOW)).expect("alive");
        w.alive.insert(n.into(), alive);
    }
    let d = w.decide();
    assert_eq!(created_for(&d), ["a"]);
    assert_eq!(d.status.healthy, 2);
    assert!(
        d.status.remediation_allowed.2.contains("2 of 3 selected nodes are healthy (2 of them Ready=Unknown but renewing their kubelet lease since) and 1 unhealthy"),
        "{}",
        d.status.remediation_allowed.2
    );
    w.kubelet_renewals.insert("c".into(), at(NOW - 41));
    w.alive.remove("c");
    assert!(
        created_for(&w.decide()).is_empty(),
        "c's renewal expired: 1 healthy of 3"
    );
}

/// A renewal says the kubelet talks to the API server, nothing of the node's other conditions.
#[test]
fn a_renewal_does_not_excuse_another_unhealthy_condition_from_the_budget() {
    let since = NOW - 400;
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", since),
            node("b", "Unknown", since),
            node("c", "True", 0),
        ],
    );
    w.check.rules.push(UnhealthyRule {
        type_: "PeersReachable".into(),
        status: "False".into(),
        duration: Duration::ZERO,
    });
    w.nodes[1].conditions.push(ConditionFacts {
        type_: "PeersReachable".into(),
        status: "False".into(),
        since: at(NOW - 1),
    });
    w.kubelet_renewals.insert("b".into(), at(NOW - 5));
    let d = w.decide();
    assert!(
        d.create.is_empty(),
        "b counts unhealthy: {}",
        d.status.remediation_allowed.2
    );
    assert_eq!(d.status.healthy, 1);
}

#[test]
fn max_unhealthy_is_the_other_way_to_say_it() {
    let mut w = World::new(
        classic(),
        vec![node("a", "Unknown", 0), node("b", "Unknown", 0), node("c", "True", 0)],
    );
    w.check.budget = Budget::MaxUnhealthy(IntOrPercent::Int(2));
    assert_eq!(created_for(&w.decide()), ["a", "b"]);
}

#[test]
fn escalates_after_the_timeout_or_at_once_on_failure() {
    let mut w = World::new(
        escalating(),
        vec![node("a", "Unknown", 0), node("b", "True", 0), node("c", "True", 0)],
    );
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - 100));
    let d = w.decide();
    assert!(d.create.is_empty() && d.mark_timed_out.is_empty());
    assert_eq!(
        d.requeue_after.map(|r| r.as_secs()),
        Some(20),
        "looks again at the step's timeout"
    );

    w.remediations[0].created = at(NOW - 120);
    let d = w.decide();
    assert_eq!(d.mark_timed_out.len(), 1);
    assert_eq!(
        d.create[0].kind, "FenceAgentsRemediation",
        "the next template's object comes at once"
    );

    w.remediations[0].created = at(NOW - 10);
    w.remediations[0].succeeded = Some(false);
    let d = w.decide();
    assert_eq!(d.mark_timed_out.len(), 1, "Succeeded=False escalates without waiting");
    assert_eq!(d.create[0].kind, "FenceAgentsRemediation");

    w.remediations[0].timed_out = Some(at(NOW - 5));
    let mut far = cr("a", "FenceAgentsRemediation", NOW - 5);
    far.id.api_version = "self-node-remediation.medik8s.io/v1alpha1".into();
    w.remediations.push(far);
    let d = w.decide();
    assert!(
        d.create.is_empty() && d.mark_timed_out.is_empty(),
        "the second step runs"
    );

    w.remediations[1].timed_out = Some(at(NOW));
    w.remediations[1].created = at(NOW - 700);
    let d = w.decide();
    assert!(d.create.is_empty(), "nothing left to try: {d:?}");
}

#[test]
fn no_template_left_is_said_once_when_the_last_step_times_out() {
    let mut w = World::new(
        escalating(),
        vec![node("a", "Unknown", 0), node("b", "True", 0), node("c", "True", 0)],
    );
    let mut snr = cr("a", "SelfNodeRemediation", NOW - 500);
    snr.timed_out = Some(at(NOW - 380));
    let far = cr("a", "FenceAgentsRemediation", NOW - 600);
    w.remediations = vec![snr, far];
    let d = w.decide();
    assert!(reasons(&d).contains(&"NoTemplateLeft"));
    assert_eq!(d.mark_timed_out.len(), 1);
}

#[test]
fn paused_stops_new_remediation_not_running_ones() {
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", 0),
            node("b", "Unknown", NOW - 400),
            node("c", "True", 0),
            node("d", "True", 0),
            node("e", "True", 0),
        ],
    );
    w.check.pause_requests = vec!["upgrade".into()];
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - 100));
    let d = w.decide();
    assert!(d.create.is_empty());
    assert!(
        d.leases
            .iter()
            .any(|l| matches!(l, LeaseAction::Request { node, .. } if node == "a")),
        "a's remediation goes on"
    );
    assert_eq!(d.status.phase, Phase::Paused);
}

/// a: newly unhealthy; b: its self remediation timed out (escalates); c: healthy again with
/// its remediation left; d..g healthy. An upgrade under way.
fn upgrading_world() -> World {
    let mut w = World::new(
        escalating(),
        vec![
            node("a", "Unknown", NOW - 400),
            node("b", "Unknown", NOW - 900),
            node("c", "True", 0),
            node("d", "True", 0),
            node("e", "True", 0),
            node("f", "True", 0),
            node("g", "True", 0),
        ],
    );
    w.remediations.push(cr("b", "SelfNodeRemediation", NOW - 200));
    w.remediations.push(cr("c", "SelfNodeRemediation", NOW - 200));
    w.upgrades = vec![upgrade::Upgrade::everywhere(
        "ClusterVersion version is progressing towards 4.16.3",
    )];
    w
}

#[test]
fn an_upgrade_postpones_new_remediations_and_lets_those_under_way_go_on() {
    let w = upgrading_world();
    let d = w.decide();
    assert_eq!(created_for(&d), ["b"], "only b's escalation");
    assert_eq!(d.create[0].kind, "FenceAgentsRemediation");
    assert_eq!(d.delete.len(), 1, "c's remediation removed: c is healthy");
    let (allowed, reason, message) = &d.status.remediation_allowed;
    assert!(!allowed && *reason == UPGRADING);
    assert!(message.contains("progressing towards 4.16.3"), "{message}");
    let postponing: Vec<&Notice> = d.notices.iter().filter(|n| n.reason == "RemediationSkipped").collect();
    assert_eq!(postponing.len(), 2, "the check's and node a's: {postponing:?}");
    assert!(
        postponing
            .iter()
            .any(|n| n.node.is_none() && n.message.starts_with("Postponing potential remediations"))
    );
    assert!(
        postponing
            .iter()
            .any(|n| n.node.as_deref() == Some("a") && n.message.contains("cluster upgrade"))
    );
    assert!(
        d.status.reason.contains("wait for the cluster upgrade"),
        "{}",
        d.status.reason
    );

    let mut told = upgrading_world();
    told.memory.remediation_allowed = Some(false);
    told.memory.remediation_allowed_reason = Some(UPGRADING.into());
    told.memory.unhealthy = [("a".to_owned(), None), ("b".to_owned(), None)].into();
    let d = told.decide();
    assert!(
        !reasons(&d).contains(&"RemediationSkipped"),
        "said once: {:?}",
        d.notices
    );

    let over = World {
        upgrades: vec![],
        ..upgrading_world()
    };
    assert_eq!(
        created_for(&over.decide()),
        ["a", "b"],
        "the upgrade over, a is remediated"
    );
}

#[test]
fn a_node_unhealthy_since_before_the_upgrade_began_is_remediated_during_it() {
    let mut w = World::new(
        classic(),
        vec![
            node("early", "Unknown", NOW - 900),
            node("late", "Unknown", NOW - 400),
            node("c", "True", 0),
            node("d", "True", 0),
            node("e", "True", 0),
        ],
    );
    w.upgrades = vec![upgrade::Upgrade {
        since: Some(at(NOW - 600)),
        ..upgrade::Upgrade::everywhere("ClusterVersion version is progressing towards 4.16.3")
    }];
    assert_eq!(
        created_for(&w.decide()),
        ["early"],
        "late turned unhealthy during the upgrade"
    );
    w.upgrades[0].since = None;
    assert!(
        w.decide().create.is_empty(),
        "an upgrade that cannot say when it began holds both"
    );
}

#[test]
fn a_node_s_own_upgrade_postpones_only_the_checks_that_select_it() {
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", NOW - 400),
            node("b", "True", 0),
            node("c", "True", 0),
            node("d", "True", 0),
        ],
    );
    w.nodes[1].upgrading = Some("it is annotated nodemedic.medik8s.io/upgrade-in-progress=\"kured\"".into());
    let d = w.decide();
    assert!(d.create.is_empty());
    assert!(
        d.status.remediation_allowed.2.contains("node b: it is annotated"),
        "{:?}",
        d.status.remediation_allowed
    );

    w.nodes[1].labels.remove(labels::ROLE_WORKER);
    assert_eq!(
        created_for(&w.decide()),
        ["a"],
        "b is not selected: its upgrade is not this check's"
    );
}

#[test]
fn a_machine_health_check_covering_a_selected_node_disables_the_check_until_it_goes() {
    use nodemedic_api::machines::MachineApi;
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", NOW - 400),
            node("b", "True", 0),
            node("c", "True", 0),
        ],
    );
    w.nodes[0].machine = Some((MachineApi::ClusterApi, "default".into(), "m-a".into()));
    w.machines.insert(
        (MachineApi::ClusterApi, "default".into(), "m-a".into()),
        [("pool".to_owned(), "workers".to_owned())].into(),
    );
    let mhc = serde_json::json!({"metadata": {"namespace": "default", "name": "workers"},
        "spec": {"selector": {"matchLabels": {"pool": "workers"}},
            "checks": {"unhealthyNodeConditions": [{"type": "Ready", "status": "Unknown", "timeoutSeconds": 300}]}}});
    w.machine_health_checks = vec![conflict::machine_health_check(MachineApi::ClusterApi, &mhc).expect("readable")];
    let d = w.decide();
    assert!(d.create.is_empty());
    assert_eq!(d.status.phase, Phase::Disabled);
    let (disabled, reason, message) = d.status.disabled.clone().expect("condition");
    assert!(disabled && reason == CONFLICTING_MHC, "{reason}");
    assert!(
        message.contains("MachineHealthCheck default/workers") && message.contains("node a"),
        "{message}"
    );
    assert!(
        d.notices
            .iter()
            .any(|n| n.reason == "Disabled" && n.severity == Severity::Warning)
    );

    // A remediation already under way goes on (its lease kept), and nothing new starts.
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - 100));
    let d = w.decide();
    assert!(d.create.is_empty() && d.delete.is_empty());
    assert!(
        d.leases
            .iter()
            .any(|l| matches!(l, LeaseAction::Request { node, .. } if node == "a")),
        "{:?}",
        d.leases
    );
    assert_eq!(d.status.phase, Phase::Disabled);
    w.remediations.clear();

    w.machine_health_checks.clear();
    w.memory.disabled = Some(true);
    let d = w.decide();
    assert_eq!(created_for(&d), ["a"]);
    assert!(reasons(&d).contains(&"Enabled"));
}

#[test]
fn a_remediation_still_there_after_48_hours_is_flagged_once() {
    let hours = |h: i64| h * 3600;
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", NOW - hours(50)),
            node("b", "True", 0),
            node("c", "True", 0),
        ],
    );
    w.remediations.push(cr("a", "SelfNodeRemediation", NOW - hours(47)));
    let d = w.decide();
    assert!(d.flag_old.is_empty());
    assert!(
        d.requeue_after
            .is_some_and(|r| r <= std::time::Duration::from_secs(3600)),
        "looks again when it comes of age: {:?}",
        d.requeue_after
    );

    w.remediations[0].created = test_time::at(NOW - hours(49));
    let d = w.decide();
    assert_eq!(d.flag_old, [w.remediations[0].id.clone()]);
    assert!(reasons(&d).contains(&"OldRemediation"));

    w.remediations[0].flagged_old = true;
    let d = w.decide();
    assert!(
        d.flag_old.is_empty() && !reasons(&d).contains(&"OldRemediation"),
        "flagged once"
    );
}

#[test]
fn a_control_plane_node_is_remediated_only_if_etcd_keeps_its_quorum() {
    use nodemedic_kube::etcd::Member;
    // a is Unknown: its member's pod reads not ready whatever runs there.
    let member = |node: &str, ready: bool| Member {
        node: node.into(),
        ready: ready && node != "a",
        node_ready: node != "a",
    };
    let mut w = World::new(
        classic(),
        vec![
            control_plane(node("a", "Unknown", NOW - 400)),
            control_plane(node("b", "True", 0)),
            control_plane(node("c", "True", 0)),
        ],
    );
    // c's member is down: a's may still run, and taking it away would leave one of three.
    w.etcd = Some(vec![member("a", true), member("b", true), member("c", false)]);
    let d = w.decide();
    assert!(d.create.is_empty());
    let skipped = d
        .notices
        .iter()
        .find(|n| n.reason == "RemediationSkipped")
        .expect("said");
    assert!(
        skipped.message.contains("etcd would keep 1 of its 3 members ready"),
        "{}",
        skipped.message
    );
    assert!(d.requeue_after.is_some_and(|r| r <= std::time::Duration::from_secs(15)));

    w.etcd = Some(vec![member("a", true), member("b", true), member("c", true)]);
    assert_eq!(created_for(&w.decide()), ["a"], "two of three stay");
    let refs: Vec<&NodeFacts> = w.nodes.iter().collect();
    let unreadable = Input {
        etcd: EtcdView::Unreadable("etcd pods: connection refused"),
        ..w.input(&refs)
    };
    assert!(
        decide(&unreadable).create.is_empty(),
        "not without knowing etcd can spare it"
    );
    w.etcd = Some(vec![]);
    assert_eq!(created_for(&w.decide()), ["a"], "etcd outside the cluster");
}

#[test]
fn excluded_and_maintenance_leased_nodes_are_left_alone() {
    let mut w = World::new(
        classic(),
        vec![
            node("a", "Unknown", 0),
            node("b", "Unknown", 0),
            node("c", "True", 0),
            node("d", "True", 0),
            node("e", "True", 0),
        ],
    );
    w.nodes[0]
        .labels
        .insert(labels::EXCLUDE_FROM_REMEDIATION.into(), "true".into());
    w.leases.insert(
        "b".into(),
        LeaseFacts {
            holder: "node-maintenance".into(),
            acquired: None,
            renewed: at(NOW - 10),
            duration: Duration::from_secs(3600),
        },
    );
    let d = w.decide();
    assert!(d.create.is_empty(), "{:?}", d.create);
    assert_eq!(reasons(&d).iter().filter(|r| **r == "RemediationSkipped").count(), 2);
    w.leases.get_mut("b").expect("lease").renewed = at(NOW - 4000);
    assert_eq!(
        created_for(&w.decide()),
        ["b"],
        "an expired maintenance lease does not block"
    );
}

/// Five control-plane nodes, `a` and `b` Ready=Unknown.
fn control_plane_a_and_b_unknown() -> World {
    let nodes: Vec<NodeFacts> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| control_plane(node(n, "True", 0)))
        .collect();
    let mut w = World::new(classic(), nodes);
    w.nodes[0] = control_plane(node("a", "Unknown", 0));
    w.nodes[1] = control_plane(node("b", "Unknown", 0));
    w
}

#[test]
fn a_living_node_is_held_back_and_keeps_no_control_plane_node_waiting() {
    let mut w = control_plane_a_and_b_unknown();
    w.alive.insert(
        "a".into(),
        liveness::Alive {
            unknown_since: at(0),
            renewed: at(NOW - 1),
        },
    );
    let d = w.decide();
    assert_eq!(
        created_for(&d),
        ["b"],
        "the dead control-plane node does not wait for the living one"
    );
    assert!(
        !d.leases
            .iter()
            .any(|l| matches!(l, LeaseAction::Request { node, .. } if node == "a"))
    );
    assert_eq!(d.held_back_alive, BTreeSet::from(["a".to_owned()]));
    let about_a: Vec<_> = d
        .notices
        .iter()
        .filter(|n| n.node.as_deref() == Some("a"))
        .map(|n| n.reason)
        .collect();
    assert!(about_a.contains(&"RemediationHeldBack"), "{about_a:?}");
    assert!(!about_a.contains(&"RemediationCreated"), "{about_a:?}");
    assert!(d.requeue_after.is_some_and(|r| r <= liveness::LOOK_AGAIN));
    w.alive.clear();
    w.nodes[1] = control_plane(node("b", "True", 0));
    let d = w.decide();
    assert_eq!(
        created_for(&d),
        ["a"],
        "once the renewals stop, the remediation goes ahead"
    );
}

#[test]
fn one_control_plane_node_at_a_time() {
    let mut w = control_plane_a_and_b_unknown();
    let d = w.decide();
    assert_eq!(created_for(&d), ["a"]);
    assert!(d.create[0].control_plane);
    let mut existing = cr("a", "SelfNodeRemediation", NOW);
    existing.control_plane = true;
    w.remediations.push(existing);
    assert!(w.decide().create.is_empty(), "b waits while a is remediated");
    w.remediations[0].deleting = true;
    assert_eq!(
        created_for(&w.decide()),
        ["b"],
        "b goes once a's remediation is being removed"
    );
}

#[test]
fn a_missing_template_disables_the_check_naming_it_and_it_recovers() {
    let mut w = World::new(classic(), vec![node("a", "Unknown", 0)]);
    let t = template("SelfNodeRemediationTemplate", "snr");
    w.templates.insert(t.clone(), TemplateState::KindMissing);
    let d = w.decide();
    assert_eq!(d.status.phase, Phase::Disabled);
    assert!(d.create.is_empty());
    let (disabled, reason, message) = d.status.disabled.clone().expect("condition");
    assert!(
        disabled && reason == "RemediationTemplateNotFound" && message.contains("SelfNodeRemediationTemplate"),
        "{message}"
    );
    assert_eq!(d.requeue_after, Some(TEMPLATE_RETRY));

    w.memory.disabled = Some(true);
    w.templates.insert(
        t,
        TemplateState::Ready {
            spec: serde_json::json!({}),
            multiple_templates: false,
        },
    );
    let d = w.decide();
    assert!(reasons(&d).contains(&"Enabled"));
    assert_eq!(d.status.disabled.as_ref().map(|c| c.0), Some(false));
}

#[test]
fn a_template_kind_discovery_could_not_answer_for_decides_nothing_until_it_can() {
    let mut w = World::new(
        classic(),
        vec![node("a", "Unknown", 0), node("b", "True", 0), node("c", "True", 0)],
    );
    let t = template("SelfNodeRemediationTemplate", "snr");
    let failed = "discovery of SelfNodeRemediationTemplate failed: forbidden";
    for disabled_before in [None, Some(true), Some(false)] {
        w.memory.disabled = disabled_before;
        w.templates.insert(t.clone(), TemplateState::KindUnknown(failed.into()));
        let d = w.decide();
        assert!(
            d.undecided.as_deref().is_some_and(|why| why.contains(failed)),
            "{:?}",
            d.undecided
        );
        assert!(d.create.is_empty() && d.delete.is_empty() && d.leases.is_empty() && d.notices.is_empty());
        assert_eq!(d.requeue_after, Some(KIND_LOOK_AGAIN));
    }
    // Discovery answers: the check acts as it would have.
    w.memory.disabled = None;
    w.templates.insert(
        t,
        TemplateState::Ready {
            spec: serde_json::json!({}),
            multiple_templates: false,
        },
    );
    let d = w.decide();
    assert_eq!(d.undecided, None);
    assert!(!d.create.is_empty(), "remediated once the kind is known to be served");
}

#[test]
fn the_same_kind_twice_needs_generated_names_and_self_remediation_templates_have_them() {
    let mut spec = escalating();
    spec.steps[0].template = template("FenceAgentsRemediationTemplate", "far-1");
    let w = World::new(spec, vec![node("a", "Unknown", 0)]);
    let d = w.decide();
    assert_eq!(d.status.disabled.map(|c| c.1), Some("RemediationTemplateInvalid"));

    // A user's own self-remediation template escalating beside the default one, unannotated.
    let mut spec = escalating();
    spec.steps[1].template = template("SelfNodeRemediationTemplate", "snr-2");
    let w = World::new(
        spec,
        vec![node("a", "Unknown", 0), node("b", "True", 0), node("c", "True", 0)],
    );
    let d = w.decide();
    assert_eq!(d.status.disabled.as_ref().map(|c| c.0), Some(false));
    assert_eq!(created_for(&d), ["a"]);
    assert_eq!(
        d.create[0].name, None,
        "a generated name: the next step's object must not collide"
    );
}

#[test]
fn orphaned_objects_are_removed_unless_their_node_is_meant_to_go() {
    let mut w = World::new(classic(), vec![node("b", "True", 0)]);
    w.remediations.push(cr("gone", "SelfNodeRemediation", 0));
    let mut expected = cr("replaced", "SelfNodeRemediation", 0);
    expected.permanent_node_deletion_expected = true;
    w.remediations.push(expected);
    let d = w.decide();
    assert_eq!(d.delete.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["gone"]);
}

#[test]
fn a_storm_holds_new_remediation_through_the_cooldown() {
    let mut w = World::new(
        classic(),
        vec![node("a", "Unknown", 0), node("b", "True", 0), node("c", "True", 0)],
    );
    w.check.storm_cooldown = Some(Duration::from_secs(60));
    w.memory.storm_since = Some(at(NOW - 100));
    let d = w.decide();
    assert!(d.create.is_empty(), "budget met again, but the cooldown runs");
    assert_eq!(d.status.remediation_allowed.1, "StormRecovery");
    w.memory.cooldown_since = Some(at(NOW - 60));
    assert_eq!(created_for(&w.decide()), ["a"]);
}

// === Invariants ===

fn arb_node(i: usize) -> impl Strategy<Value = NodeFacts> {
    (
        prop_oneof!["True", "False", "Unknown"],
        0i64..NOW,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(ready, since, cp, excluded, confirmed)| {
            let mut n = node(&format!("n{i}"), &ready, since);
            if cp {
                n.labels.insert(labels::ROLE_MASTER.into(), String::new());
            }
            if excluded {
                n.labels.insert(labels::EXCLUDE_FROM_REMEDIATION.into(), "true".into());
            }
            n.confirmed_healthy = confirmed;
            n
        })
}

fn arb_world() -> impl Strategy<Value = World> {
    (1usize..9)
        .prop_flat_map(|count| {
            (
                (0..count).map(arb_node).collect::<Vec<_>>(),
                proptest::collection::vec((0..count, any::<bool>(), 0i64..NOW, any::<bool>()), 0..4),
                proptest::collection::vec((0..count, any::<bool>(), 0i64..NOW), 0..4),
                prop_oneof![
                    Just(Budget::DefaultMinHealthy),
                    (0u32..=100).prop_map(|p| Budget::MinHealthy(IntOrPercent::Percent(p))),
                    (0u32..6).prop_map(|n| Budget::MaxUnhealthy(IntOrPercent::Int(n)))
                ],
                any::<bool>(),
                any::<bool>(),
                proptest::option::of((0i64..NOW, 0i64..NOW + 100)),
            )
        })
        .prop_map(|(nodes, crs, leases, budget, escalate, paused, counts_from)| {
            let mut w = World::new(if escalate { escalating() } else { classic() }, nodes);
            w.outage = counts_from.and_then(|(began, from)| window(began, from));
            w.check.budget = budget;
            if paused {
                w.check.pause_requests = vec!["p".into()];
            }
            for (i, cp, created, deleting) in crs {
                let name = w.nodes[i].name.clone();
                if w.remediations.iter().any(|r| r.node == name) {
                    continue;
                }
                let mut r = cr(&name, "SelfNodeRemediation", created);
                r.control_plane = cp && node::is_control_plane(&w.nodes[i]);
                r.deleting = deleting;
                w.remediations.push(r);
            }
            for (i, maintenance, renewed) in leases {
                let holder = if maintenance { "node-maintenance" } else { HOLDER };
                w.leases.insert(
                    w.nodes[i].name.clone(),
                    LeaseFacts {
                        holder: holder.into(),
                        acquired: Some(at(renewed)),
                        renewed: at(renewed),
                        duration: Duration::from_secs(3600),
                    },
                );
            }
            w
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn creates_only_within_budget_and_never_when_paused(w in arb_world()) {
        let d = w.decide();
        if !d.create.is_empty() {
            prop_assert!(d.status.healthy >= d.status.min_healthy, "created over budget: {:?}", d.status);
            prop_assert!(w.check.pause_requests.is_empty());
        }
    }

    /// Renewals only ever add to the healthy count, and only nodes whose kubelet renewed after
    /// their Ready turned Unknown, believably and recently.
    #[test]
    fn only_renewals_after_an_unknown_count_healthy(
        w in arb_world(),
        renewals in proptest::collection::vec(0i64..NOW + 10, 8),
    ) {
        let without = w.decide().status.healthy;
        let mut w = w;
        w.kubelet_renewals = w.nodes.iter().zip(&renewals).map(|(n, r)| (n.name.clone(), at(*r))).collect();
        let with = w.decide().status.healthy;
        let renewing_after_unknown = w
            .nodes
            .iter()
            .filter(|n| {
                let (Some(since), Some(renewed)) = (liveness::unknown_since(n), w.kubelet_renewals.get(&n.name)) else {
                    return false;
                };
                since < *renewed && *renewed <= at(NOW + 5) && at(NOW) < *renewed + Duration::from_secs(40)
            })
            .count();
        prop_assert!(with >= without, "renewals lowered the healthy count: {with} < {without}");
        prop_assert!(with - without <= renewing_after_unknown, "{with} - {without} > {renewing_after_unknown}");
    }

    #[test]
    fn never_two_control_plane_nodes_at_once(w in arb_world()) {
        let busy_before: BTreeSet<&str> = w.remediations.iter().filter(|r| r.control_plane && !r.deleting).map(|r| r.node.as_str()).collect();
        prop_assume!(busy_before.len() <= 1);
        let d = w.decide();
        let mut busy: BTreeSet<&str> = busy_before.clone();
        busy.extend(d.create.iter().filter(|c| c.control_plane).map(|c| c.node.as_str()));
        prop_assert!(busy.len() <= 1, "control-plane nodes remediated together: {busy:?}");
    }

    #[test]
    fn never_remediates_an_excluded_leased_or_healthy_node(w in arb_world()) {
        let d = w.decide();
        for new in &d.create {
            let n = w.nodes.iter().find(|n| n.name == new.node).expect("a real node");
            prop_assert!(n.labels.get(labels::EXCLUDE_FROM_REMEDIATION).is_none_or(|v| v != "true"), "excluded node {}", n.name);
            let leased = w.leases.get(&n.name).is_some_and(|l| l.holder != HOLDER && l.valid_at(w.now));
            prop_assert!(!leased, "node {} leased to maintenance", n.name);
            prop_assert!(matches!(health::classify(n, &w.check.rules, w.now, w.outage), Health::Unhealthy { .. }), "healthy node {}, or an Unknown the API's loss explains", n.name);
        }
        for gone in &d.delete {
            let r = w.remediations.iter().find(|r| &r.id == gone).expect("an existing object");
            if let Some(n) = w.nodes.iter().find(|n| n.name == r.node) {
                prop_assert_eq!(health::classify(n, &w.check.rules, w.now, None), Health::Healthy, "deleted the remediation of an unhealthy node");
            }
        }
    }

    #[test]
    fn losing_the_api_only_defers_new_remediations(w in arb_world()) {
        let deferred = w.decide();
        let steady = World { outage: None, ..w }.decide();
        prop_assert_eq!(deferred.delete, steady.delete);
        prop_assert_eq!(deferred.mark_timed_out, steady.mark_timed_out);
        prop_assert_eq!(&deferred.status.unhealthy.keys().collect::<Vec<_>>(), &steady.status.unhealthy.keys().collect::<Vec<_>>());
        for new in &deferred.create {
            let held = steady.create.iter().any(|c| c.node == new.node) || new.control_plane;
            prop_assert!(held, "{} created only because the outage deferred another node", new.node);
        }
    }

    #[test]
    fn an_upgrade_starts_no_first_remediation_and_changes_nothing_else(w in arb_world()) {
        let steady = w.decide();
        let upgrading = World { upgrades: vec![upgrade::Upgrade::everywhere("ClusterVersion version is progressing")], ..w };
        let d = upgrading.decide();
        for new in &d.create {
            let escalation = upgrading.remediations.iter().any(|r| r.owned && r.node == new.node);
            prop_assert!(escalation, "a first remediation of {} during an upgrade", new.node);
        }
        prop_assert_eq!(d.delete, steady.delete);
        prop_assert_eq!(d.mark_timed_out, steady.mark_timed_out);
        prop_assert_eq!(d.status.unhealthy.keys().collect::<Vec<_>>(), steady.status.unhealthy.keys().collect::<Vec<_>>());
    }

    #[test]
    fn never_remediates_a_control_plane_node_etcd_cannot_spare(w in arb_world(), ready in proptest::collection::vec(any::<bool>(), 9)) {
        let members: Vec<nodemedic_kube::etcd::Member> = w
            .nodes
            .iter()
            .filter(|n| node::is_control_plane(n))
            .zip(&ready)
            .map(|(n, r)| {
                let node_ready = n.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
                nodemedic_kube::etcd::Member { node: n.name.clone(), ready: *r && node_ready, node_ready }
            })
            .collect();
        let busy: BTreeSet<String> = w.remediations.iter().filter(|r| r.control_plane && !r.deleting).map(|r| r.node.clone()).collect();
        let w = World { etcd: Some(members.clone()), ..w };
        for new in w.decide().create.iter().filter(|c| c.control_plane) {
            let verdict = nodemedic_kube::etcd::check(&members, &busy, &new.node);
            prop_assert!(!matches!(verdict, nodemedic_kube::etcd::Verdict::Refused { .. }), "{} remediated: {verdict:?}", new.node);
        }
    }

    #[test]
    fn same_input_same_output(w in arb_world()) {
        prop_assert_eq!(w.decide(), w.decide());
    }
}

#[test]
fn a_selector_matching_no_node_warns_once_naming_it_and_the_label_to_use() {
    let mut seed_style = classic();
    seed_style.selector = Selector::from_iter([("node-role.kubernetes.io/master", "")]);
    let nodes = vec![control_plane(node("a", "True", 0)), control_plane(node("b", "True", 0))];
    let mut w = World::new(seed_style, nodes);
    w.nodes.iter_mut().for_each(|n| {
        n.labels.remove("node-role.kubernetes.io/master");
    });
    let d = w.decide();
    let (selected, reason, message) = d.status.nodes_selected.clone().expect("condition");
    assert!(!selected && reason == "NoNodesSelected");
    assert!(message.contains("node-role.kubernetes.io/master") && message.contains("none of the cluster's 2 nodes"));
    assert!(message.contains("node-role.kubernetes.io/control-plane"), "{message}");
    assert_eq!(d.notices.iter().filter(|n| n.reason == "NoNodesSelected").count(), 1);

    w.memory.nodes_selected = Some(false);
    let d = w.decide();
    assert!(!reasons(&d).contains(&"NoNodesSelected"), "said once");

    let selecting = World::new(classic(), vec![node("a", "True", 0)]);
    assert_eq!(selecting.decide().status.nodes_selected.map(|c| c.0), Some(true));
}
