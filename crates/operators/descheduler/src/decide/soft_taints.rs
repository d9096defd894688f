//! The soft tainter's decision: which nodes are over-utilized, appropriately utilized or
//! under-utilized by the same thresholds the descheduler's LowNodeUtilization uses, and which
//! `PreferNoSchedule` taints that means for each node, so the scheduler prefers cooler nodes
//! before the descheduler has to move anything.

use std::collections::{BTreeMap, BTreeSet};

/// On over-utilized nodes.
pub const OVERUTILIZED: &str = "nodeutilization.descheduler.openshift.io/overutilized";
/// On over-utilized and appropriately utilized nodes.
pub const APPROPRIATE: &str = "nodeutilization.descheduler.openshift.io/appropriate";
pub(crate) const KEYS: [&str; 2] = [OVERUTILIZED, APPROPRIATE];

/// How the LowNodeUtilization thresholds are read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Thresholds {
    /// Percentages as they are.
    Fixed { low: f64, high: f64 },
    /// Percentage points below and above the average utilization.
    Deviation { below: f64, above: f64 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    /// Ready and selected by the profile's node selector.
    pub in_scope: bool,
    /// Not cordoned: the descheduler never counts a cordoned node as under-utilized (no pod
    /// could move there).
    pub schedulable: bool,
    /// The soft taint keys it carries now.
    pub taints: BTreeSet<String>,
    /// The Prometheus sample for it, in [0, 1].
    pub utilization: Option<f64>,
}

/// Percentage points of spread within which nodes count as equally utilized.
const BALANCED_SPREAD: f64 = 1.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Under,
    Appropriate,
    Over,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub node: String,
    pub add: Vec<&'static str>,
    pub remove: Vec<&'static str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The thresholds in effect, in percent, when nodes were classified.
    pub low: Option<f64>,
    pub high: Option<f64>,
    pub classes: BTreeMap<String, Class>,
    pub changes: Vec<Change>,
    /// Why nothing was classified this round.
    pub held: Option<String>,
}

/// What the tainter should do now. `active` is false when no KubeVirt profile runs in Automatic
/// mode: then every soft taint is removed (a Predictive run still reports its classes).
pub fn plan(nodes: &[NodeFacts], thresholds: Thresholds, active: bool) -> Plan {
    let mut plan = Plan::default();
    let scope: Vec<&NodeFacts> = nodes.iter().filter(|n| n.in_scope).collect();
    let missing: Vec<&str> = scope
        .iter()
        .filter(|n| n.utilization.is_none_or(|u| !(0.0..=1.0).contains(&u)))
        .map(|n| n.name.as_str())
        .collect();
    if scope.len() < 2 {
        plan.held = Some(format!("{} node(s) in scope: balancing needs at least 2", scope.len()));
    } else if !missing.is_empty() {
        plan.held = Some(format!(
            "no utilization sample in [0, 1] for {}: soft taints stay as they are",
            missing.join(", ")
        ));
    } else {
        classify(&scope, thresholds, &mut plan);
    }

    for node in nodes {
        let wanted: BTreeSet<&'static str> = if !active || !node.in_scope {
            BTreeSet::new()
        } else if plan.held.is_some() {
            // Without a fresh classification, keep what the node has.
            KEYS.into_iter().filter(|k| node.taints.contains(*k)).collect()
        } else {
            match plan.classes.get(&node.name) {
                Some(Class::Over) => BTreeSet::from([OVERUTILIZED, APPROPRIATE]),
                Some(Class::Appropriate) => BTreeSet::from([APPROPRIATE]),
                Some(Class::Under) | None => BTreeSet::new(),
            }
        };
        let add: Vec<_> = wanted.iter().copied().filter(|k| !node.taints.contains(*k)).collect();
        let remove: Vec<_> = KEYS
            .into_iter()
            .filter(|k| node.taints.contains(*k) && !wanted.contains(k))
            .collect();
        if !add.is_empty() || !remove.is_empty() {
            plan.changes.push(Change {
                node: node.name.clone(),
                add,
                remove,
            });
        }
    }
    plan
}

fn classify(scope: &[&NodeFacts], thresholds: Thresholds, plan: &mut Plan) {
    // Whole percent, as the descheduler rounds a Prometheus sample.
    let usage = |n: &NodeFacts| (n.utilization.unwrap_or(0.0) * 100.0).trunc();
    let (low, high) = match thresholds {
        Thresholds::Fixed { low, high } => (low, high),
        Thresholds::Deviation { below, above } => {
            let average = scope.iter().map(|n| usage(n)).sum::<f64>() / scope.len() as f64;
            ((average - below).clamp(0.0, 100.0), (average + above).clamp(0.0, 100.0))
        }
    };
    plan.low = Some(low);
    plan.high = Some(high);
    // Around an average, whole-percent rounding alone makes some node "above" it from one
    // sample to the next: nodes within a point of each other are balanced, and nothing is tainted
    // (else the appropriate taint would wander between equal nodes).
    let (least, most) = scope
        .iter()
        .map(|n| usage(n))
        .fold((f64::MAX, f64::MIN), |(lo, hi), u| (lo.min(u), hi.max(u)));
    let balanced = most - least <= BALANCED_SPREAD;
    for node in scope {
        let used = usage(node);
        let class = if (balanced || used <= low) && node.schedulable && used <= high {
            Class::Under
        } else if used > high {
            Class::Over
        } else {
            Class::Appropriate
        };
        plan.classes.insert(node.name.clone(), class);
    }
    // With no cooler node to prefer, an appropriate taint would only spread the preference
    // evenly: those nodes count as under-utilized.
    if !plan.classes.values().any(|c| *c == Class::Under) {
        for class in plan.classes.values_mut() {
            if *class == Class::Appropriate {
                *class = Class::Under;
            }
        }
    }
}

#[cfg(test)]
mod tests;
