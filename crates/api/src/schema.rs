//! Schema pieces the derive cannot express directly.

use schemars::Schema;
use serde_json::{Value, json};

type Object = serde_json::Map<String, Value>;

/// Appends CEL rules, keeping any the derive already put there.
fn validations(schema: &mut Schema, rules: Value) {
    validations_in(schema.ensure_object(), rules)
}

fn validations_in(schema: &mut Object, rules: Value) {
    let mut all = match schema.remove("x-kubernetes-validations") {
        Some(Value::Array(existing)) => existing,
        _ => Vec::new(),
    };
    if let Value::Array(new) = rules {
        all.extend(new);
    }
    schema.insert("x-kubernetes-validations".into(), Value::Array(all));
}

/// `watchdogFilePath` (of the SelfNodeRemediationConfig and the PoisonPillConfig): an absolute
/// path without `..` components. The agents refuse any other path without opening it (the
/// safe time trusts the watchdog an agent registers); the CRD refuses it before that.
pub fn watchdog_file_path_rule() -> kube::core::Rule {
    kube::core::Rule::new("self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')").message(
        "watchdogFilePath is not an absolute device path (it must start with / and have no .. component): \
         set an absolute device path such as /dev/watchdog",
    )
}

/// An int-or-string that is a count (>= 0) or a percentage 0%..100%, as medik8s accepts.
pub fn int_or_percent(schema: &mut Schema) {
    schema.insert("pattern".into(), json!(r"^((100|[0-9]{1,2})%|[0-9]+)$"));
    validations(
        schema,
        json!([{
            "rule": "type(self) != int || self >= 0",
            "message": "must be a count >= 0 or a percentage such as \"51%\""
        }]),
    );
}

const TEMPLATE_RULES: &str = "has(self.apiVersion) && has(self.kind) && has(self.name)";

/// A reference to a remediation template (any kind ending in `Template`).
pub fn template_reference(schema: &mut Schema) {
    validations(
        schema,
        json!([
            {
                "rule": TEMPLATE_RULES,
                "message": "a remediation template reference needs apiVersion, kind and name (and namespace for namespaced templates)"
            },
            {
                "rule": "!has(self.kind) || self.kind.endsWith('Template')",
                "message": "kind must name a template kind ending in 'Template'; the remediation object's kind is that name without the suffix"
            }
        ]),
    );
}

pub fn template_reference_required(schema: &mut Schema) {
    template_reference(schema)
}

fn bound_strings(item: &mut Object, fields: &[(&str, u64)]) {
    for (field, max) in fields {
        if let Some(Value::Object(prop)) = item.get_mut("properties").and_then(|p| p.get_mut(*field)) {
            prop.insert("maxLength".into(), json!(max));
        }
    }
}

fn with_items(schema: &mut Schema, max_items: u64, edit: impl FnOnce(&mut Object)) {
    schema.insert("maxItems".into(), json!(max_items));
    if let Some(Value::Object(items)) = schema.get_mut("items") {
        edit(items);
    }
}

/// `customDsTolerations`: each toleration checked on its own so CEL's cost stays bounded.
pub fn tolerations(schema: &mut Schema) {
    with_items(schema, 32, |item| {
        bound_strings(item, &[("key", 317), ("value", 63), ("operator", 16), ("effect", 32)]);
        validations_in(
            item,
            json!([
                { "rule": "!has(self.operator) || self.operator in ['Exists', 'Equal']",
                  "message": "customDsTolerations: operator must be Exists or Equal" },
                { "rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                  "message": "customDsTolerations: a toleration with operator Exists must not have a value" },
                { "rule": "!has(self.effect) || self.effect in ['', 'NoSchedule', 'PreferNoSchedule', 'NoExecute']",
                  "message": "customDsTolerations: effect must be NoSchedule, PreferNoSchedule or NoExecute" }
            ]),
        );
    });
}

/// `customDsNodeSelectorRequirements`, checked per requirement.
pub fn node_selector_requirements(schema: &mut Schema) {
    with_items(schema, 32, |item| {
        bound_strings(item, &[("key", 317), ("operator", 16)]);
        if let Some(Value::Object(values)) = item.get_mut("properties").and_then(|p| p.get_mut("values")) {
            values.insert("maxItems".into(), json!(64));
            if let Some(Value::Object(items)) = values.get_mut("items") {
                items.insert("maxLength".into(), json!(63));
            }
        }
        validations_in(
            item,
            json!([
                { "rule": "self.key != '' && self.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist', 'Gt', 'Lt']",
                  "message": "customDsNodeSelectorRequirements: key must be set and operator one of In, NotIn, Exists, DoesNotExist, Gt, Lt" },
                { "rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                  "message": "customDsNodeSelectorRequirements: Exists and DoesNotExist take no values" },
                { "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                  "message": "customDsNodeSelectorRequirements: In and NotIn need at least one value" },
                { "rule": "!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
                  "message": "customDsNodeSelectorRequirements: Gt and Lt take exactly one integer value" }
            ]),
        );
    });
}

/// `agent`: a fence agent that fences by cutting the power (or resetting the machine). Each rule
/// names one agent that does not and says why, so the refusal explains itself.
pub fn power_agent(schema: &mut Schema) {
    let rules: Vec<Value> = crate::fence_agents::NOT_BY_POWER
        .iter()
        .map(|(agent, why)| {
            json!({
                "rule": format!("self != '{agent}'"),
                "message": format!(
                    "{agent} {why}: remediation must know the node is off, so name the power agent of its BMC, hypervisor or cloud (fence_redfish, fence_ipmilan, fence_aws, ...)"
                )
            })
        })
        .collect();
    validations(schema, Value::Array(rules));
}

const OPTION_NAME_RULE: &str = "self.all(k, k.matches('^-{0,2}[A-Za-z0-9][A-Za-z0-9_-]*$'))";

/// `sharedparameters`: option name -> value.
pub fn shared_parameters(schema: &mut Schema) {
    schema.insert("maxProperties".into(), json!(64));
    if let Some(Value::Object(values)) = schema.get_mut("additionalProperties") {
        values.insert("maxLength".into(), json!(4096));
    }
    validations(
        schema,
        json!([
            { "rule": "['--action', 'action'].all(k, !(k in self) || self[k] in ['reboot', 'off'])",
              "message": "sharedparameters: --action must be reboot or off" },
            { "rule": OPTION_NAME_RULE, "message": "sharedparameters: keys are fence agent option names such as --ip" }
        ]),
    );
}

/// `nodeparameters`: option name -> node name -> value.
pub fn node_parameters(schema: &mut Schema) {
    schema.insert("maxProperties".into(), json!(64));
    if let Some(Value::Object(per_node)) = schema.get_mut("additionalProperties") {
        per_node.insert("maxProperties".into(), json!(5000));
        if let Some(Value::Object(values)) = per_node.get_mut("additionalProperties") {
            values.insert("maxLength".into(), json!(4096));
        }
    }
    validations(
        schema,
        json!([
            { "rule": "['--action', 'action'].all(k, !(k in self) || self[k].all(n, self[k][n] == 'reboot' || self[k][n] == 'off'))",
              "message": "nodeparameters: --action must be reboot or off" },
            { "rule": OPTION_NAME_RULE, "message": "nodeparameters: keys are fence agent option names such as --ip" }
        ]),
    );
}

/// An object of any shape (OpenShift's `unsupportedConfigOverrides` and `observedConfig`).
pub fn free_form_object(_: &mut schemars::SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A KubeDescheduler's `profiles`: each at most once, and no two that conflict.
pub fn descheduler_profiles(schema: &mut Schema) {
    let mut rules = vec![json!({
        "rule": "self.all(p, self.filter(x, x == p).size() == 1)",
        "message": "duplicate profiles are not allowed"
    })];
    for (a, b) in crate::descheduler::CONFLICTING_PROFILES {
        let (a, b) = (a.name(), b.name());
        rules.push(json!({
            "rule": format!("!('{a}' in self && '{b}' in self)"),
            "message": format!("cannot declare {a} and {b} profiles simultaneously")
        }));
    }
    validations(schema, Value::Array(rules));
}
