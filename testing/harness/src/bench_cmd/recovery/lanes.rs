//! A recovery lab and its trials. A lane is one strategy's share of a lab: its nodes, its
//! health check, its remediation template and its workload. A lane alone has the seed lab and
//! manifests unchanged. Lanes that share a lab get three worker nodes each, told apart by a
//! label that the lane's health check selects (instead of the seed's control-plane nodes, which
//! the health check remediates one at a time across all checks) and its workload is pinned to,
//! so one lane's failure never touches another's budget, nodes or pod.

use std::time::Duration;

use anyhow::Context;
use kube::Api;
use nodemedic_api::self_remediation::{CONFIG_NAME, SelfNodeRemediationConfig};
use nodemedic_harness::{
    bench::{self, Breakdown},
    scenario::{self, NS},
    story::{self, Milestone, Subject},
};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, NodeSpec, Timings, wait, workloads::STATEFULSET};
use serde_json::{Map, Value, json};

use super::{Path, Profile, Strategy};

const LANE_LABEL: &str = "bench.nodemedic.io/lane";
const NODES_PER_LANE: usize = 3;

pub(super) struct Lane {
    pub strategy: Strategy,
    /// The lane's label value when it shares its lab; `None` when it is alone.
    shared_as: Option<String>,
}

impl Lane {
    pub(super) fn for_strategies(strategies: &[Strategy]) -> Vec<Lane> {
        let shared = strategies.len() > 1;
        strategies
            .iter()
            .map(|strategy| Lane {
                strategy: *strategy,
                shared_as: shared.then(|| strategy.label().to_owned()),
            })
            .collect()
    }

    fn suffixed(&self, base: &str) -> String {
        match &self.shared_as {
            Some(lane) => format!("{base}-{lane}"),
            None => base.to_owned(),
        }
    }

    fn template(&self) -> String {
        self.suffixed("bench")
    }

    fn workload(&self) -> String {
        self.suffixed("db")
    }

    fn pod(&self) -> String {
        format!("{}-0", self.workload())
    }

    fn strategy_name(&self) -> String {
        format!("{:?}", self.strategy)
    }
}

fn lane_selector(lane: &str) -> Value {
    let mut labels = Map::new();
    labels.insert(LANE_LABEL.into(), json!(lane));
    Value::Object(labels)
}

fn config(path: Path, profile: Profile, lanes: &[Lane]) -> LabConfig {
    let mut config = if lanes.len() == 1 {
        LabConfig::seed()
    } else {
        let nodes = lanes
            .iter()
            .enumerate()
            .flat_map(|(i, lane)| {
                (1..=NODES_PER_LANE).map(move |j| {
                    let mut spec = NodeSpec::worker(&format!("node-{}", i * NODES_PER_LANE + j));
                    if let Some(name) = &lane.shared_as {
                        spec.labels.insert(LANE_LABEL.into(), name.clone());
                    }
                    spec
                })
            })
            .collect();
        LabConfig::new(nodes)
    };
    if profile == Profile::Defaults {
        config = config.with_timings(Timings::kubernetes_defaults());
    }
    if path != Path::SelfRemediation {
        config = config.with_bmcs(BmcOptions::default());
    }
    config
}

/// A lab with nodemedic, each lane's template, workload and health check; with `detector`, the
/// agents' peer failure detector and the example health check on its condition (fence agents
/// through Redfish, one lane).
pub(super) async fn start(path: Path, profile: Profile, detector: bool, lanes: &[Lane]) -> anyhow::Result<Lab> {
    let exe = nodemedic_harness::product::nodemedic()?;
    let lab = Lab::start(config(path, profile, lanes).alone())
        .await
        .context("starting the lab")?;
    scenario::create_namespace(&lab.client(), NS).await?;
    let metrics = scenario::free_port()?;
    if detector {
        scenario::install_fence_agents_with_detection(
            &lab,
            &exe,
            &scenario::with_detector(scenario::SEED_TIMINGS_CONFIG),
            metrics,
        )
        .await?;
        deploy_workloads(&lab, lanes).await?;
        scenario::apply_peer_detection_check(&lab, |m| {
            // The seed check's Ready durations, as the baseline's.
            if let Some(conditions) = m["spec"]["unhealthyConditions"].as_array_mut() {
                for c in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
                    c["duration"] = json!("10s");
                }
            }
        })?;
        return Ok(lab);
    }
    let nhc = match path {
        Path::SelfRemediation => {
            let patch = match profile {
                Profile::Fast => scenario::FAST_CONFIG,
                Profile::Seed | Profile::Defaults | Profile::OutOfTheBox => scenario::SEED_TIMINGS_CONFIG,
            };
            for lane in lanes {
                lab.apply_yaml(
                    &scenario::self_remediation_template(&lane.template(), &lane.strategy_name()).to_string(),
                )?;
            }
            scenario::install_self_remediation(&lab, &exe, patch, metrics).await?;
            deploy_workloads(&lab, lanes).await?;
            scenario::agents_settled(&lab).await?;
            "002-nhc-snr-3node.yaml"
        }
        Path::FenceRedfish | Path::FenceIpmi => {
            scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
            for lane in lanes {
                if path == Path::FenceRedfish {
                    scenario::apply_seed(&lab, "002-far-template.yaml", |m| {
                        scenario::adapt_far_template(&lab, m);
                        m["metadata"]["name"] = json!(lane.template());
                        m["spec"]["template"]["spec"]["remediationStrategy"] = json!(lane.strategy_name());
                    })?;
                } else {
                    let template = scenario::ipmi_far_template(
                        &lab,
                        &lane.template(),
                        "fence-agents-credentials-shared-sm-bmc",
                        &lane.strategy_name(),
                    );
                    lab.apply_yaml(&template.to_string())?;
                }
            }
            scenario::start_fence_agents_controller(&lab, &exe, metrics)?;
            deploy_workloads(&lab, lanes).await?;
            "002-nhc-far-3node.yaml"
        }
    };
    for lane in lanes {
        scenario::apply_seed(&lab, nhc, |m| {
            m["spec"]["remediationTemplate"]["name"] = json!(lane.template());
            if let Some(name) = &lane.shared_as {
                let seed_name = m["metadata"]["name"].as_str().unwrap_or("bench").to_owned();
                m["metadata"]["name"] = json!(format!("{seed_name}-{name}"));
                m["spec"]["selector"] = json!({"matchLabels": lane_selector(name)});
            }
            if profile == Profile::Fast
                && let Some(conditions) = m["spec"]["unhealthyConditions"].as_array_mut()
            {
                for c in conditions {
                    c["duration"] = json!("5s");
                }
            }
        })?;
    }
    Ok(lab)
}

/// What [`start`] installs for `path`, `profile` and `detector`, in words for the report.
pub(super) fn configuration(path: Path, profile: Profile, detector: bool) -> String {
    let durations = if profile == Profile::Fast { "5 s" } else { "10 s" };
    if detector {
        return format!(
            "fence agents (the seed's Redfish template); agents with the seed's SelfNodeRemediationConfig and the peer detector; \
             the example health check on PeersReachable, Ready durations {durations}"
        );
    }
    match path {
        Path::SelfRemediation => {
            let config = if profile == Profile::Fast {
                "the lab's fast SelfNodeRemediationConfig"
            } else {
                "the seed's SelfNodeRemediationConfig"
            };
            format!("{config}; the seed's health check nhc-snr-3node, durations {durations}")
        }
        Path::FenceRedfish | Path::FenceIpmi => {
            let template = if path == Path::FenceRedfish {
                "the seed's Redfish template"
            } else {
                "an IPMI template"
            };
            format!(
                "fence agents ({template}), no agents; the seed's health check nhc-far-3node, durations {durations}"
            )
        }
    }
}

/// The lab's StatefulSet; a shared lane's copy is named after the lane and pinned to its nodes.
async fn deploy_workloads(lab: &Lab, lanes: &[Lane]) -> anyhow::Result<()> {
    scenario::create_namespace(&lab.client(), "vm").await?;
    for lane in lanes {
        let mut workload: Value = serde_saphyr::from_str(STATEFULSET).context("the lab's StatefulSet")?;
        if let Some(name) = &lane.shared_as {
            let app = lane.workload();
            workload["metadata"]["name"] = json!(app);
            workload["spec"]["serviceName"] = json!(app);
            workload["spec"]["selector"]["matchLabels"]["app"] = json!(app);
            workload["spec"]["template"]["metadata"]["labels"]["app"] = json!(app);
            workload["spec"]["template"]["spec"]["nodeSelector"] = lane_selector(name);
        }
        lab.apply_yaml(&workload.to_string())?;
    }
    Ok(())
}

/// An API server outage before a trial's crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outage {
    /// How long the API server is down.
    pub length: Duration,
    /// How long after it answers again the crash comes.
    pub crash_after: Duration,
}

impl Outage {
    /// Three minutes, long enough for every backoff (kube-runtime's, client-go's: 30 s at most)
    /// to reach its cap; the crash 30 s after, while one asleep at its cap would not be back yet.
    pub(super) const AFTER_OUTAGE: Outage = Outage {
        length: Duration::from_secs(180),
        crash_after: Duration::from_secs(30),
    };

    /// Stops the API server for the outage's length and starts it again; returns once the
    /// crash is due.
    async fn hold(self, lab: &Lab) -> anyhow::Result<()> {
        lab.stop_apiserver().await?;
        tokio::time::sleep(self.length).await;
        lab.start_apiserver().await?;
        tokio::time::sleep(self.crash_after).await;
        Ok(())
    }
}

/// Crash each lane's pod's node at once (after `outage` when one is given), measure until each
/// pod runs elsewhere, then bring the nodes back and wait until nothing of the remediations is
/// left. One measurement per lane; the error is the lab's, when it could not be brought back for
/// the next trial.
pub(super) async fn one_trial(
    lab: &Lab,
    path: Path,
    lanes: &[Lane],
    outage: Option<Outage>,
) -> anyhow::Result<Vec<anyhow::Result<Breakdown>>> {
    let client = lab.client();
    let mut subjects = Vec::new();
    for lane in lanes {
        let pod = scenario::running_pod_named(&client, &lane.pod(), &[], Duration::from_secs(300)).await?;
        subjects.push(Subject {
            node: scenario::node_of(&pod),
            pod: format!("vm/{}", lane.pod()),
        });
    }
    if let Some(outage) = outage {
        outage.hold(lab).await?;
    }
    let since = jiff::Timestamp::now();
    for subject in &subjects {
        lab.crash(&subject.node).await?;
    }
    let mut measured = Vec::new();
    for subject in &subjects {
        measured.push(measure(lab, subject, since).await);
    }
    for subject in &subjects {
        if path == Path::SelfRemediation {
            lab.power_on(&subject.node).await?;
        }
    }
    for subject in &subjects {
        lab.wait_ready_status(&subject.node, "True", Duration::from_secs(300))
            .await?;
    }
    scenario::every_remediation_removed(lab, Duration::from_secs(300)).await?;
    Ok(measured)
}

/// How long a trial may take from the crash to its pod running elsewhere before it counts as
/// failed: medik8s's defaults, the out-of-the-box profile's baseline, take over ten minutes (50 s
/// for the node controller, 300 s in the health check, a safe time of 258 s, then the pod's
/// restart), so the deadline is twice that.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(1200);

/// The subject's story since the crash, until its pod runs elsewhere.
pub(super) async fn measure(lab: &Lab, subject: &Subject, since: jiff::Timestamp) -> anyhow::Result<Breakdown> {
    let story = wait::until(&format!("{} Running elsewhere", subject.pod), RECOVERY_DEADLINE, || {
        let entries: Vec<_> = lab.timeline().entries().into_iter().filter(|e| e.at >= since).collect();
        let story = story::milestones(&entries, subject);
        async move {
            Ok(story
                .iter()
                .any(|r| r.milestone == Milestone::WorkloadRunningElsewhere)
                .then_some(story))
        }
    })
    .await?;
    bench::breakdown(&story).context("an incomplete story")
}

/// The safe time the manager waits: the configured one, or the provable minimum when larger.
pub(super) async fn safe_time(lab: &Lab) -> Option<f64> {
    let config = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS)
        .get(CONFIG_NAME)
        .await
        .ok()?;
    let minimum = config.status.as_ref()?.minimum_safe_time_seconds? as f64;
    let configured = config
        .spec
        .safe_time_to_assume_node_rebooted_seconds
        .map(f64::from)
        .unwrap_or(0.0);
    Some(minimum.max(configured))
}
