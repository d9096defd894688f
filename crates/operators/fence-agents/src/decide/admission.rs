//! What the webhook answers for a FenceAgentsRemediation or its template, given each node's
//! options as they would be built now (medik8s's webhook builds them for every node the spec
//! names, or a stand-in node when it names none).

use nodemedic_kube::admission::Verdict;

use super::parameters::Unusable;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Made by the health check mid-outage: one whose Secret is missing is admitted and waits
    /// for it (`Processing=True/WaitingForSecret`), since a refusal would leave its node with no
    /// remediation at all until someone noticed.
    Remediation,
    /// Made by an administrator ahead of any failure: everything it needs must already be there
    /// (medik8s's rule), so a mistake is found now rather than during an outage.
    Template,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Remediation => "FenceAgentsRemediation",
            Kind::Template => "FenceAgentsRemediationTemplate",
        }
    }
}

/// The verdict on `name`, from each node's outcome (how to name the node, what building its
/// options gave).
pub(crate) fn judge(kind: Kind, name: &str, nodes: &[(String, Result<(), Unusable>)]) -> Verdict {
    let refused: Vec<String> = nodes
        .iter()
        .filter_map(|(node, outcome)| match (kind, outcome) {
            (_, Ok(())) | (Kind::Remediation, Err(Unusable::SecretMissing(_))) => None,
            (_, Err(why)) => Some(format!("for {node}: {why}")),
        })
        .collect();
    if refused.is_empty() {
        return Verdict::Allowed;
    }
    Verdict::Denied(format!("{} {name} cannot fence: {}", kind.name(), refused.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn missing() -> Result<(), Unusable> {
        Err(Unusable::SecretMissing("Secret creds does not exist".into()))
    }

    fn invalid() -> Result<(), Unusable> {
        Err(Unusable::Invalid("fence_redfish has no option --hostname".into()))
    }

    #[test]
    fn a_template_needs_its_secrets_now_and_a_remediation_may_wait_for_them() {
        let nodes = [
            ("node node-1".to_owned(), Ok(())),
            ("node node-2".to_owned(), missing()),
        ];
        let Verdict::Denied(why) = judge(Kind::Template, "far", &nodes) else {
            panic!("a template whose Secret is missing is refused");
        };
        assert!(why.contains("node-2") && why.contains("Secret creds"), "{why}");
        assert_eq!(judge(Kind::Remediation, "node-2", &nodes), Verdict::Allowed);
    }

    #[test]
    fn options_that_cannot_be_built_are_refused_for_both_and_every_node_is_named() {
        let nodes = [
            ("node node-1".to_owned(), invalid()),
            ("node node-2".to_owned(), invalid()),
        ];
        for kind in [Kind::Template, Kind::Remediation] {
            let Verdict::Denied(why) = judge(kind, "x", &nodes) else {
                panic!("{kind:?} with unbuildable options is refused");
            };
            assert!(
                why.contains("node-1") && why.contains("node-2") && why.contains("--hostname"),
                "{why}"
            );
        }
    }

    proptest! {
        /// Refused exactly when some node's options are unusable, a missing Secret counting only
        /// against a template.
        #[test]
        fn refused_exactly_when_some_node_cannot_fence(outcomes in proptest::collection::vec(0..3u8, 0..5), template in any::<bool>()) {
            let kind = if template { Kind::Template } else { Kind::Remediation };
            let nodes: Vec<(String, Result<(), Unusable>)> = outcomes
                .iter()
                .enumerate()
                .map(|(i, o)| (format!("node-{i}"), match o { 0 => Ok(()), 1 => missing(), _ => invalid() }))
                .collect();
            let refuse = outcomes.iter().any(|o| *o == 2 || (*o == 1 && template));
            prop_assert_eq!(matches!(judge(kind, "x", &nodes), Verdict::Denied(_)), refuse);
        }
    }
}
