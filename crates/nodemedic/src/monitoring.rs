//! The metric families the binary exports, so the alert rules and the dashboard shipped with the
//! chart can be checked against them.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prometheus_client::registry::Registry;

    use nodemedic::controller::OperatorMetrics;

    /// Every family the controller and the agent register. Empty families are left out of the
    /// exposition until they get a series, so the registry's descriptors are read instead.
    fn exported() -> BTreeSet<String> {
        let mut registry = Registry::default();
        let _controller = OperatorMetrics::register(&mut registry);
        nodemedic_self_remediation::agent::Metrics::default().register(&mut registry);
        let described = format!("{registry:?}");
        let re = regex::Regex::new(r#"name: "([a-z_]+)""#).expect("regex");
        re.captures_iter(&described).map(|c| c[1].to_owned()).collect()
    }

    /// The family a series name in a query belongs to (`_total`, `_bucket`, ... are added by
    /// the exposition format).
    fn family(series: &str) -> &str {
        ["_total", "_bucket", "_count", "_sum", "_created"]
            .iter()
            .find_map(|suffix| series.strip_suffix(suffix))
            .unwrap_or(series)
    }

    fn named_in(text: &str) -> BTreeSet<String> {
        let re = regex::Regex::new(r"\b(?:nodemedic|nodehealthcheck)_[a-z_]+\b").expect("regex");
        re.find_iter(text).map(|m| m.as_str().to_owned()).collect()
    }

    fn chart_file(name: &str) -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/nodemedic/files/");
        std::fs::read_to_string(format!("{path}{name}")).expect("chart file")
    }

    #[test]
    fn alerts_and_dashboard_name_only_metrics_the_binary_exports() {
        let exported = exported();
        assert!(exported.contains("nodemedic_maintenance_blocked_pods"), "{exported:?}");
        let alerts = chart_file("alerts.yaml");
        let dashboard = chart_file("dashboard.json");
        let _: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
        let rules: serde_json::Value = serde_saphyr::from_str(&alerts).expect("the alert rules are YAML");
        assert!(
            rules["groups"][0]["rules"].as_array().is_some_and(|r| r.len() >= 5),
            "{rules}"
        );
        for (what, text) in [("alerts.yaml", &alerts), ("dashboard.json", &dashboard)] {
            let named = named_in(text);
            assert!(!named.is_empty(), "{what} names no metric");
            for series in &named {
                assert!(
                    exported.contains(family(series)),
                    "{what} names {series}, which the binary does not export; exported: {exported:?}"
                );
            }
        }
        // What the issue asks the views to cover: unhealthy nodes, remediation duration,
        // failures and blocked budgets.
        for needed in [
            "nodemedic_healthcheck_unhealthy_nodes",
            "nodemedic_self_remediation_recovery_seconds_bucket",
            "nodemedic_fence_remediations_total",
            "nodemedic_healthcheck_budget_blocks_total",
        ] {
            assert!(alerts.contains(needed) && dashboard.contains(needed), "{needed}");
        }
    }
}
