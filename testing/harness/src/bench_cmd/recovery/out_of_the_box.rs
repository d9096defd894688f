//! `--profile out-of-the-box`: what `helm install` gives a user who changes nothing, installed
//! from the rendered chart ([`chart_defaults`]), so the values measured are the chart's own;
//! Kubernetes' default timings, three workers. Four series: self remediation alone, the same with
//! each crash right after an API server outage, fence agents through Redfish added as the check's
//! first escalation (one `--set`), and medik8s's defaults (`--set medik8sDefaults=true`), the
//! baseline.

use anyhow::Context;
use nodemedic_harness::{
    chart_defaults,
    scenario::{self, NS},
};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, NodeSpec, Timings};
use serde_json::Value;

use super::{
    Path, Setup, Strategy,
    lanes::{Lane, Outage},
};

/// A series of the profile: which path, and the chart values that make it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Variant {
    /// The chart as shipped: self remediation alone.
    SelfRemediation,
    /// The chart as shipped, each crash right after an API server outage ([`Outage::AFTER_OUTAGE`]).
    AfterOutage,
    /// The chart with a FenceAgentsRemediationTemplate added to the default check's escalation.
    WithRedfish,
    /// `medik8sDefaults=true`: medik8s's health check and configuration.
    Medik8sDefaults,
}

/// The FenceAgentsRemediationTemplate the user adds (the seed's, adapted to the lab's BMCs).
const TEMPLATE: &str = "bmcs";

impl Variant {
    pub(super) fn path(self) -> Path {
        match self {
            Variant::WithRedfish => Path::FenceRedfish,
            Variant::SelfRemediation | Variant::AfterOutage | Variant::Medik8sDefaults => Path::SelfRemediation,
        }
    }

    /// What the variant installs, in words for the report.
    fn describe(self) -> &'static str {
        match self {
            Variant::SelfRemediation => "the chart's default values (`helm install` with nothing set)",
            Variant::AfterOutage => {
                "the chart's default values; each crash 30 s after a three-minute API server outage ends"
            }
            Variant::WithRedfish => {
                "the chart's default values and a Redfish template (the seed's) as the default check's first escalation"
            }
            Variant::Medik8sDefaults => {
                "the chart with `medik8sDefaults=true`: medik8s's health check (Ready False or Unknown for 300 s) and SelfNodeRemediationConfig"
            }
        }
    }

    fn values(self) -> Vec<String> {
        match self {
            Variant::SelfRemediation | Variant::AfterOutage => Vec::new(),
            Variant::WithRedfish => vec![format!("--set=defaultHealthCheck.fenceAgentsTemplate.name={TEMPLATE}")],
            Variant::Medik8sDefaults => vec!["--set=medik8sDefaults=true".into()],
        }
    }
}

/// A lab of three workers on Kubernetes' default timings with nodemedic installed from the
/// chart's defaults (`variant`'s values), the StatefulSet running and the agents settled; and
/// what it runs: the detector is on when the configuration the controller created from the
/// values has it (the chart's defaults do, medik8s's do not).
pub(super) async fn start(variant: Variant) -> anyhow::Result<(Lab, Setup)> {
    let exe = nodemedic_harness::product::nodemedic()?;
    // Workers labelled as OpenShift labels them, so medik8s's check (workers by that label)
    // watches them too; the chart's `workers` selector then picks the label.
    let nodes = (1..=3).map(|i| NodeSpec::worker(&format!("node-{i}"))).collect();
    let mut config = LabConfig::new(nodes).with_timings(Timings::kubernetes_defaults());
    if variant == Variant::WithRedfish {
        config = config.with_bmcs(BmcOptions::default());
    }
    let lab = Lab::start(config.alone()).await.context("starting the lab")?;
    if variant == Variant::WithRedfish {
        scenario::create_namespace(&lab.client(), NS).await?;
        scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
        scenario::apply_seed(&lab, "002-far-template.yaml", |m| {
            scenario::adapt_far_template(&lab, m);
            m["metadata"]["name"] = Value::from(TEMPLATE);
        })?;
    }
    let config = chart_defaults::install(&lab, &exe, &variant.values(), scenario::free_port()?).await?;
    scenario::deploy_workload(&lab).await?;
    scenario::agents_settled(&lab).await?;
    let setup = Setup {
        after_outage: (variant == Variant::AfterOutage).then_some(Outage::AFTER_OUTAGE),
        detector: config.spec.peer_detection.is_some(),
        configuration: format!(
            "{}; apiCheckInterval {}, peer detector {}",
            variant.describe(),
            config.spec.api_check_interval,
            if config.spec.peer_detection.is_some() {
                "on"
            } else {
                "off"
            }
        ),
    };
    Ok((lab, setup))
}

/// The lane of a series: the one StatefulSet, the chart's template strategy (Automatic, which
/// takes the out-of-service taint on these clusters).
pub(super) fn lane() -> Vec<Lane> {
    Lane::for_strategies(&[Strategy::OutOfServiceTaint])
}
