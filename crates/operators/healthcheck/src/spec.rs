//! From the NodeHealthCheck object to the decision's [`CheckSpec`]: everything the schema cannot
//! check (selector syntax) is checked here, with an error that says what to fix.

use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::util::intstr::IntOrString};
use kube::core::Selector;
use nodemedic_api::healthcheck::NodeHealthCheck;

use crate::decide::{Budget, CheckSpec, HealthyDelay, IntOrPercent, Step, TemplateRef, UnhealthyRule};

pub fn parse(nhc: &NodeHealthCheck) -> Result<CheckSpec, String> {
    let name = nhc.metadata.name.clone().unwrap_or_default();
    let spec = &nhc.spec;
    let selector = Selector::try_from(spec.selector.clone())
        .map_err(|e| format!("spec.selector is not a valid label selector: {e}"))?;
    if selector.selects_all() {
        return Err("spec.selector selects every node; give it matchLabels or matchExpressions".into());
    }
    let rules = spec
        .unhealthy_conditions
        .iter()
        .map(|c| {
            let duration = c
                .duration
                .duration()
                .map_err(|e| format!("spec.unhealthyConditions {}={}: {e}", c.type_, c.status))?;
            Ok(UnhealthyRule {
                type_: c.type_.clone(),
                status: c.status.clone(),
                duration,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let budget = match (&spec.min_healthy, &spec.max_unhealthy) {
        (Some(_), Some(_)) => return Err("set either minHealthy or maxUnhealthy, not both".into()),
        (Some(v), None) => Budget::MinHealthy(int_or_percent(v, "minHealthy")?),
        (None, Some(v)) => Budget::MaxUnhealthy(int_or_percent(v, "maxUnhealthy")?),
        (None, None) => Budget::DefaultMinHealthy,
    };
    let steps = match (&spec.remediation_template, &spec.escalating_remediations) {
        (Some(t), None) => vec![Step {
            order: 0,
            template: template(t, "remediationTemplate")?,
            timeout: None,
        }],
        (None, Some(esc)) if !esc.is_empty() => esc
            .iter()
            .map(|e| {
                let timeout = e
                    .timeout
                    .duration()
                    .map_err(|err| format!("escalatingRemediations order {}: {err}", e.order))?;
                Ok(Step {
                    order: e.order,
                    template: template(&e.remediation_template, "escalatingRemediations[].remediationTemplate")?,
                    timeout: Some(timeout),
                })
            })
            .collect::<Result<Vec<_>, String>>()?,
        _ => return Err("set exactly one of remediationTemplate or escalatingRemediations".into()),
    };
    let storm_cooldown = spec
        .storm_cooldown_duration
        .as_ref()
        .map(|d| d.duration())
        .transpose()
        .map_err(|e| format!("stormCooldownDuration: {e}"))?;
    let healthy_delay = match spec
        .healthy_delay
        .as_ref()
        .map(|d| d.nanos())
        .transpose()
        .map_err(|e| format!("healthyDelay: {e}"))?
    {
        None | Some(0) => HealthyDelay::None,
        Some(n) if n < 0 => HealthyDelay::Never,
        Some(n) => HealthyDelay::After(std::time::Duration::from_nanos(n as u64)),
    };
    Ok(CheckSpec {
        name,
        selector,
        rules,
        budget,
        storm_cooldown,
        steps,
        pause_requests: spec.pause_requests.clone().unwrap_or_default(),
        healthy_delay,
    })
}

fn int_or_percent(v: &IntOrString, field: &str) -> Result<IntOrPercent, String> {
    match v {
        IntOrString::Int(n) if *n >= 0 => Ok(IntOrPercent::Int(*n as u32)),
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|p| *p <= 100)
            .map(IntOrPercent::Percent)
            .ok_or_else(|| format!("{field} {s:?} must be a count or a percentage such as \"51%\"")),
        IntOrString::Int(n) => Err(format!("{field} {n} must not be negative")),
    }
}

fn template(r: &ObjectReference, field: &str) -> Result<TemplateRef, String> {
    let missing = |what: &str| format!("{field} has no {what}");
    Ok(TemplateRef {
        api_version: r.api_version.clone().ok_or_else(|| missing("apiVersion"))?,
        kind: r.kind.clone().ok_or_else(|| missing("kind"))?,
        namespace: r.namespace.clone().filter(|n| !n.is_empty()),
        name: r.name.clone().ok_or_else(|| missing("name"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(file: &str) -> NodeHealthCheck {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../fixtures/seed-manifests")
            .join(file);
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("seed manifest")).expect("parses")
    }

    #[test]
    fn parses_every_seed_health_check() {
        let snr = parse(&seed("002-nhc-snr-3node.yaml")).expect("valid");
        assert_eq!(snr.steps[0].template.remediation_kind(), "SelfNodeRemediation");
        assert_eq!(snr.rules[0].duration.as_secs(), 10);
        assert_eq!(snr.budget, Budget::MinHealthy(IntOrPercent::Percent(51)));
        let far = parse(&seed("002-nhc-far-3node.yaml")).expect("valid");
        assert_eq!(far.steps[0].template.kind, "FenceAgentsRemediationTemplate");
        let master = parse(&seed("000-nhc-master-test.yaml")).expect("valid");
        assert_eq!(master.rules[1].duration.as_secs(), 150);
        let worker = parse(&seed("001-nhc-worker-default.yaml")).expect("valid");
        assert_eq!(worker.steps[0].template.remediation_kind(), "PoisonPillRemediation");
        assert!(worker.pause_requests.is_empty());
    }
}
