//! `watchdogFilePath` is refused by the CRDs unless it is an absolute path without `..`
//! components: the agents never open anything else (the lab's former `lab:<socket>` included).
//! The lab's validation test applies the same cases to a real API server.

use kube::CustomResourceExt;
use nodemedic_api::{poison_pill::PoisonPillConfig, self_remediation::SelfNodeRemediationConfig};
use serde_json::Value;

/// The `x-kubernetes-validations` of `spec.watchdogFilePath` in `crd`'s one version.
fn rules(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Vec<Value> {
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema");
    schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["watchdogFilePath"]["x-kubernetes-validations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Evaluates a rule made of `self.startsWith('..')`, `!self.contains('..')` and
/// `!self.endsWith('..')` joined by `&&` (all the rule uses), as CEL would; panics on anything
/// else, so a changed rule cannot pass unevaluated.
fn evaluate(rule: &str, value: &str) -> bool {
    let clause = regex::Regex::new(r"^(!?)self\.(startsWith|contains|endsWith)\('([^']*)'\)$").expect("regex");
    rule.split("&&").map(str::trim).all(|part| {
        let found = clause
            .captures(part)
            .unwrap_or_else(|| panic!("{part:?} is not a clause this test evaluates"));
        let argument = &found[3];
        let holds = match &found[2] {
            "startsWith" => value.starts_with(argument),
            "contains" => value.contains(argument),
            _ => value.ends_with(argument),
        };
        let negated = &found[1] == "!";
        holds != negated
    })
}

#[test]
fn both_configs_refuse_a_watchdog_path_that_is_not_absolute_or_has_a_parent_component() {
    for crd in [SelfNodeRemediationConfig::crd(), PoisonPillConfig::crd()] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let rules = rules(&crd);
        assert_eq!(rules.len(), 1, "{name}: {rules:?}");
        let message = rules[0]["message"].as_str().expect("a message");
        for fragment in [
            "watchdogFilePath is not an absolute device path",
            "such as /dev/watchdog",
        ] {
            assert!(message.contains(fragment), "{name}: {message}");
        }
        let rule = rules[0]["rule"].as_str().expect("a rule");
        for accepted in [
            "/dev/watchdog",
            "/dev/watchdog1",
            "/run/lab/nodes/node-1-dev/watchdog",
            "/dev/./watchdog",
        ] {
            assert!(evaluate(rule, accepted), "{name} refuses {accepted}");
        }
        for refused in [
            "lab:/x",
            "lab:/tmp/lab/nodes/node-1.watchdog",
            "dev/watchdog",
            "watchdog",
            "./watchdog",
            "/dev/../watchdog",
            "/dev/..",
        ] {
            assert!(!evaluate(rule, refused), "{name} accepts {refused}");
        }
    }
}
