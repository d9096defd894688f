//! The FenceAgentsRemediation reconciler, run by the shared step runner ([`steps`]): [`observe`]
//! reads what the decision needs, [`fencing::next`] decides, [`perform`] carries the answer out;
//! again until it is to wait. A remediation named after its Machine (a MachineHealthCheck's) first
//! has its node read from the Machine and recorded ([`machine`]).

mod machine;
mod observe;
mod perform;

use kube::{Api, ResourceExt};
use nodemedic_api::fence_agents::FenceAgentsRemediation;
use nodemedic_kube::{
    events::Events,
    machines::Resolved,
    steps::{self, Outcome},
};

use super::Context;
use crate::{
    Error, Result,
    decide::fencing::{self, Decision},
};

/// What one observation found.
pub enum Seen {
    /// Named after its Machine and its node not yet recorded; `None` while nothing is to be done
    /// (being deleted, or finished).
    Unresolved {
        current: Box<FenceAgentsRemediation>,
        resolved: Option<Resolved>,
    },
    Fencing(Box<observe::Observed>),
}

#[derive(Debug)]
pub enum Step {
    /// Record the Machine's node on the remediation, then fence it.
    RecordNode(String),
    /// The Machine names no node: nothing to fence (NodeNotFound).
    NoNode(String),
    Idle,
    Fence(Decision),
}

/// A Machine-named remediation's first step, over what resolving its Machine gave.
fn resolution_step(resolved: Option<&Resolved>) -> Step {
    match resolved {
        None => Step::Idle,
        Some(Resolved::Node(node)) => Step::RecordNode(node.clone()),
        Some(unresolved) => Step::NoNode(unresolved.why_no_node().unwrap_or_default()),
    }
}

impl steps::Operator for Context {
    type Object = FenceAgentsRemediation;
    type Observed = Seen;
    type Step = Step;
    type Error = Error;

    const NAME: &'static str = "fence agents remediation";
    const STEPS: usize = 16;

    fn api(&self, far: &FenceAgentsRemediation) -> Result<Api<FenceAgentsRemediation>> {
        let namespace = far.namespace().ok_or_else(|| Error::Unnamespaced(far.name_any()))?;
        Ok(Api::namespaced(self.client.clone(), &namespace))
    }

    async fn observe(&self, current: FenceAgentsRemediation) -> Result<Seen> {
        observe::observe(current, self).await
    }

    fn current(seen: &Seen) -> &FenceAgentsRemediation {
        match seen {
            Seen::Unresolved { current, .. } => current,
            Seen::Fencing(observed) => &observed.current,
        }
    }

    fn decide(&self, seen: &Seen) -> Step {
        match seen {
            Seen::Unresolved { resolved, .. } => resolution_step(resolved.as_ref()),
            Seen::Fencing(observed) => Step::Fence(fencing::next(&observed.facts)),
        }
    }

    fn routine(step: &Step) -> bool {
        matches!(step, Step::Idle | Step::Fence(Decision::Idle | Decision::AwaitRun))
    }

    async fn perform<'a>(
        &'a self,
        step: Step,
        seen: &'a Seen,
        api: &'a Api<FenceAgentsRemediation>,
    ) -> Result<Outcome<'a, Self>> {
        match (step, seen) {
            (Step::Fence(decision), Seen::Fencing(observed)) => perform::perform(decision, observed, api, self).await,
            (Step::RecordNode(node), Seen::Unresolved { current, .. }) => machine::record(current, node, self).await,
            (Step::NoNode(why), Seen::Unresolved { current, .. }) => Ok(machine::no_node(current, why, self)),
            _ => Ok(Outcome::await_change()),
        }
    }

    fn events(&self) -> &Events {
        &self.events
    }

    fn count_error(&self, error: &Error) {
        self.metrics.error(error.kind());
    }
}

#[cfg(test)]
mod tests {
    use nodemedic_api::machines::{MachineApi, MachineRef};

    use super::*;

    #[test]
    fn a_machine_named_remediation_records_its_node_or_says_why_there_is_none() {
        assert!(matches!(resolution_step(None), Step::Idle));
        assert!(matches!(
            resolution_step(Some(&Resolved::Node("w1".into()))),
            Step::RecordNode(node) if node == "w1"
        ));
        let machine = MachineRef {
            api: MachineApi::ClusterApi,
            version: "v1beta2".into(),
            namespace: "ns".into(),
            name: "m1".into(),
        };
        assert!(matches!(
            resolution_step(Some(&Resolved::MachineNotFound(machine))),
            Step::NoNode(why) if why.contains("ns/m1")
        ));
    }
}
