use proptest::prelude::*;

use super::*;

fn node(name: &str, utilization: f64, taints: &[&str]) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        in_scope: true,
        schedulable: true,
        taints: taints.iter().map(|t| (*t).to_owned()).collect(),
        utilization: Some(utilization),
    }
}

const ASYMMETRIC_LOW: Thresholds = Thresholds::Deviation {
    below: 0.0,
    above: 10.0,
};

fn apply(nodes: &mut [NodeFacts], plan: &Plan) {
    for change in &plan.changes {
        let node = nodes
            .iter_mut()
            .find(|n| n.name == change.node)
            .expect("planned node exists");
        for key in &change.remove {
            node.taints.remove(*key);
        }
        for key in &change.add {
            node.taints.insert((*key).to_owned());
        }
    }
}

#[test]
fn a_hot_node_gets_both_taints_the_average_ones_the_appropriate_one_and_the_cool_ones_none() {
    // Average 40 %: high = 50 %, low = 40 %.
    let nodes = [
        node("hot", 0.80, &[]),
        node("warm", 0.45, &[]),
        node("cool", 0.20, &[]),
        node("idle", 0.15, &[]),
    ];
    let plan = plan(&nodes, ASYMMETRIC_LOW, true);
    assert_eq!((plan.low, plan.high), (Some(40.0), Some(50.0)));
    assert_eq!(plan.classes["hot"], Class::Over);
    assert_eq!(plan.classes["warm"], Class::Appropriate);
    assert_eq!(plan.classes["cool"], Class::Under);
    assert_eq!(
        plan.changes,
        vec![
            Change {
                node: "hot".into(),
                add: vec![APPROPRIATE, OVERUTILIZED],
                remove: vec![]
            },
            Change {
                node: "warm".into(),
                add: vec![APPROPRIATE],
                remove: vec![]
            },
        ]
    );
}

#[test]
fn a_node_that_cools_down_loses_its_taints() {
    let nodes = [
        node("was-hot", 0.30, &[OVERUTILIZED, APPROPRIATE]),
        node("other", 0.30, &[]),
    ];
    let plan = plan(&nodes, ASYMMETRIC_LOW, true);
    assert_eq!(
        plan.changes,
        vec![Change {
            node: "was-hot".into(),
            add: vec![],
            remove: vec![OVERUTILIZED, APPROPRIATE]
        }]
    );
}

#[test]
fn without_a_sample_for_every_node_nothing_is_added_and_nothing_kept_is_removed() {
    let mut nodes = vec![node("hot", 0.9, &[APPROPRIATE]), node("cool", 0.1, &[])];
    nodes.push(NodeFacts {
        utilization: None,
        ..node("silent", 0.0, &[])
    });
    let plan = plan(&nodes, ASYMMETRIC_LOW, true);
    assert!(plan.changes.is_empty(), "{plan:?}");
    assert!(plan.held.as_deref().is_some_and(|h| h.contains("silent")));
}

#[test]
fn an_inactive_tainter_or_a_node_out_of_scope_is_cleaned_up() {
    let nodes = [node("a", 0.9, &[OVERUTILIZED, APPROPRIATE]), node("b", 0.1, &[])];
    let inactive = plan(&nodes, ASYMMETRIC_LOW, false);
    assert_eq!(inactive.classes["a"], Class::Over, "the classes are still reported");
    assert_eq!(
        inactive.changes,
        vec![Change {
            node: "a".into(),
            add: vec![],
            remove: vec![OVERUTILIZED, APPROPRIATE]
        }]
    );

    let mut nodes = nodes.to_vec();
    nodes[0].in_scope = false;
    let out = plan(&nodes, ASYMMETRIC_LOW, true);
    assert!(out.held.is_some(), "one node in scope balances nothing");
    assert_eq!(out.changes.len(), 1);
    assert_eq!(out.changes[0].remove, vec![OVERUTILIZED, APPROPRIATE]);
}

#[test]
fn nodes_within_a_point_of_each_other_are_balanced_and_untainted() {
    // 20.4 % reads 20, 19.9 % reads 19: above the 19.67 average, yet nothing to rebalance.
    let nodes = [
        node("a", 0.204, &[APPROPRIATE]),
        node("b", 0.199, &[]),
        node("c", 0.199, &[]),
    ];
    let plan = plan(&nodes, ASYMMETRIC_LOW, true);
    assert!(plan.classes.values().all(|c| *c == Class::Under), "{plan:?}");
    assert_eq!(
        plan.changes,
        vec![Change {
            node: "a".into(),
            add: vec![],
            remove: vec![APPROPRIATE]
        }]
    );
}

#[test]
fn a_cordoned_cool_node_is_not_where_pods_should_go() {
    let mut nodes = [
        node("hot", 0.9, &[]),
        node("cordoned", 0.1, &[]),
        node("cool", 0.1, &[]),
    ];
    nodes[1].schedulable = false;
    let plan = plan(&nodes, ASYMMETRIC_LOW, true);
    assert_eq!(plan.classes["cordoned"], Class::Appropriate);
    assert_eq!(plan.classes["cool"], Class::Under);
}

#[test]
fn fixed_thresholds_with_no_cool_node_taint_only_the_hot_ones() {
    let nodes = [node("a", 0.60, &[]), node("b", 0.90, &[])];
    let plan = plan(&nodes, Thresholds::Fixed { low: 20.0, high: 70.0 }, true);
    assert_eq!(
        plan.classes["a"],
        Class::Under,
        "no node under 20 %: appropriate counts as under"
    );
    assert_eq!(
        plan.changes,
        vec![Change {
            node: "b".into(),
            add: vec![APPROPRIATE, OVERUTILIZED],
            remove: vec![]
        }]
    );
}

fn nodes_strategy() -> impl Strategy<Value = Vec<NodeFacts>> {
    prop::collection::vec(
        (0.0f64..=1.0, any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        0..12,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (utilization, in_scope, schedulable, over, appropriate))| {
                let mut taints = BTreeSet::new();
                if over {
                    taints.insert(OVERUTILIZED.to_owned());
                }
                if appropriate {
                    taints.insert(APPROPRIATE.to_owned());
                }
                NodeFacts {
                    name: format!("node-{i}"),
                    in_scope,
                    schedulable,
                    taints,
                    utilization: Some(utilization),
                }
            })
            .collect()
    })
}

fn thresholds_strategy() -> impl Strategy<Value = Thresholds> {
    prop_oneof![
        (0u32..=30, 0u32..=30).prop_map(|(below, above)| Thresholds::Deviation {
            below: below.into(),
            above: above.into()
        }),
        (0u32..=100, 0u32..=100).prop_map(|(a, b)| Thresholds::Fixed {
            low: a.min(b).into(),
            high: a.max(b).into()
        }),
    ]
}

proptest! {
    #[test]
    fn planning_again_after_applying_changes_nothing(mut nodes in nodes_strategy(), thresholds in thresholds_strategy(), active in any::<bool>()) {
        let first = plan(&nodes, thresholds, active);
        apply(&mut nodes, &first);
        let second = plan(&nodes, thresholds, active);
        prop_assert!(second.changes.is_empty(), "{:?}", second.changes);
    }

    #[test]
    fn an_overutilized_taint_never_goes_without_the_appropriate_one(mut nodes in nodes_strategy(), thresholds in thresholds_strategy()) {
        let p = plan(&nodes, thresholds, true);
        apply(&mut nodes, &p);
        if p.held.is_none() {
            for n in &nodes {
                prop_assert!(!n.taints.contains(OVERUTILIZED) || n.taints.contains(APPROPRIATE), "{n:?}");
            }
        }
    }

    #[test]
    fn with_deviation_thresholds_some_node_in_scope_stays_untainted(mut nodes in nodes_strategy(), below in 0u32..=30, above in 0u32..=30) {
        let p = plan(&nodes, Thresholds::Deviation { below: below.into(), above: above.into() }, true);
        apply(&mut nodes, &p);
        if p.held.is_none() {
            prop_assert!(nodes.iter().any(|n| n.in_scope && n.taints.is_empty()));
        }
    }

    #[test]
    fn nodes_out_of_scope_or_an_inactive_tainter_end_with_no_soft_taint(mut nodes in nodes_strategy(), thresholds in thresholds_strategy(), active in any::<bool>()) {
        let p = plan(&nodes, thresholds, active);
        apply(&mut nodes, &p);
        for n in nodes.iter().filter(|n| !active || !n.in_scope) {
            prop_assert!(n.taints.is_empty(), "{n:?}");
        }
    }
}
