//! The lab a shape runs in, and what the runner reads of the cluster: whether it is healthy,
//! and what remediation left behind.

use std::{path::Path, time::Duration};

use anyhow::Context;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{Api, api::ListParams};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    healthcheck::NodeHealthCheck,
    names::leases,
    self_remediation::{CONFIG_NAME, SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_kube::node_lease;
use nodemedic_lab::{BmcOptions, Lab, LabConfig, NodeSpec, PowerDelays, data_witness::DataWitness};
use nodemedic_self_remediation::manager::daemonset;
use serde_json::json;

use super::UNHEALTHY_FOR;
use crate::{
    chaos::{
        plan::{PathKind, Shape, Strategy},
        verdict::{AgentTimings, NodeSnapshot, Snapshot},
    },
    chart_defaults, real_nodes,
    scenario::{self, NS},
};

const TEMPLATE: &str = "chaos";

/// Every node powered on and Ready, db-0 Running (not being deleted), no remediation object.
/// Ready alone is the API's word, and kwok answers for a node between two reboots (a trial once
/// started while a node its agent was rebooting had been off for 0.6 s,
/// bench/results/chaos-20261208T025746Z.trial-45/); the lab knows the power.
pub(super) async fn healthy(lab: &Lab) -> nodemedic_lab::Result<Option<()>> {
    if !lab
        .nodes()
        .iter()
        .all(|node| lab.condition(node).is_ok_and(|c| c.powered))
    {
        return Ok(None);
    }
    let client = lab.client();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            return Ok(None);
        }
    }
    let pod = Api::<Pod>::namespaced(client.clone(), "vm").get_opt("db-0").await?;
    let running = pod.is_some_and(|p| {
        p.metadata.deletion_timestamp.is_none() && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
    });
    let left = Api::<SelfNodeRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len()
        + Api::<FenceAgentsRemediation>::all(client)
            .list(&ListParams::default())
            .await?
            .items
            .len();
    Ok((running && left == 0).then_some(()))
}

pub(super) async fn snapshot(client: &kube::Client) -> nodemedic_lab::Result<Snapshot> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let spec = n.spec.unwrap_or_default();
            NodeSnapshot {
                name: n.metadata.name.unwrap_or_default(),
                taints: spec.taints.unwrap_or_default().into_iter().map(|t| t.key).collect(),
                unschedulable: spec.unschedulable.unwrap_or(false),
            }
        })
        .collect();
    let named = |kind: &str, name: Option<String>| format!("{kind}/{}", name.unwrap_or_default());
    let mut remediations: Vec<String> = Api::<SelfNodeRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|r| named("SelfNodeRemediation", r.metadata.name))
        .collect();
    remediations.extend(
        Api::<FenceAgentsRemediation>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|r| named("FenceAgentsRemediation", r.metadata.name)),
    );
    let now = jiff::Timestamp::now();
    let leases = Api::<Lease>::namespaced(client.clone(), leases::NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|l| {
            let view = node_lease::view(l);
            let holder = node_lease::valid_holder(Some(&view), now)?;
            Some(format!("{} ({holder})", l.metadata.name.clone().unwrap_or_default()))
        })
        .collect();
    Ok(Snapshot {
        nodes,
        remediations,
        leases,
    })
}

/// A lab of the shape with nodemedic installed (as the bench installs it), the workload
/// running and the seed health check for the path watching every node; with `peer_detection`,
/// the agents' detector on and the health check also unhealthy on its condition at once; `alone`,
/// with no other lab beside it.
pub(super) async fn setup(exe: &Path, shape: Shape, peer_detection: bool, alone: bool) -> anyhow::Result<Lab> {
    // Every node control-plane and worker, as in the seed topology, so the seed health checks'
    // selector takes them all, also with five.
    let nodes = (1..=shape.nodes)
        .map(|i| NodeSpec::control_plane_worker(&format!("node-{i}")))
        .collect();
    let mut config = LabConfig::new(nodes);
    if shape.path == PathKind::FenceRedfish {
        config = config.with_bmcs(bmc_options(shape));
    }
    if alone {
        config = config.alone();
    }
    let lab = Lab::start(config).await.context("starting the lab")?;
    scenario::create_namespace(&lab.client(), NS).await?;
    let metrics = scenario::free_port()?;
    match shape.path {
        PathKind::SelfRemediation => {
            apply_template(&lab, shape.path, Strategy::OutOfServiceTaint)?;
            scenario::install_self_remediation(&lab, exe, &scenario::fast_config(peer_detection), metrics).await?;
            scenario::deploy_workload(&lab).await?;
            scenario::agents_settled(&lab).await?;
        }
        PathKind::FenceRedfish => {
            if peer_detection {
                scenario::install_fence_agents_with_detection(
                    &lab,
                    exe,
                    &scenario::with_detector(scenario::FAST_CONFIG),
                    metrics,
                )
                .await?;
            } else {
                scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
                scenario::start_fence_agents_controller(&lab, exe, metrics)?;
            }
            apply_template(&lab, shape.path, Strategy::OutOfServiceTaint)?;
            scenario::deploy_workload(&lab).await?;
        }
    }
    apply_health_check(&lab, shape.path, peer_detection)?;
    Ok(lab)
}

/// A lab of the shape with nodemedic installed from the chart's default values
/// ([`chart_defaults`]): its default health check, on the trial's template (self remediation's,
/// or fence agents' first, escalating to self remediation's default), and its
/// SelfNodeRemediationConfig; the workload running.
pub(super) async fn setup_with_chart_defaults(exe: &Path, shape: Shape, alone: bool) -> anyhow::Result<Lab> {
    let nodes = (1..=shape.nodes)
        .map(|i| NodeSpec::control_plane_worker(&format!("node-{i}")))
        .collect();
    let mut config = LabConfig::new(nodes);
    if shape.path == PathKind::FenceRedfish {
        config = config.with_bmcs(bmc_options(shape));
    }
    if alone {
        config = config.alone();
    }
    let lab = Lab::start(config).await.context("starting the lab")?;
    scenario::create_namespace(&lab.client(), NS).await?;
    let value = match shape.path {
        PathKind::SelfRemediation => "defaultHealthCheck.remediationTemplate.name",
        PathKind::FenceRedfish => {
            scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
            "defaultHealthCheck.fenceAgentsTemplate.name"
        }
    };
    apply_template(&lab, shape.path, Strategy::OutOfServiceTaint)?;
    chart_defaults::install(
        &lab,
        exe,
        &[format!("--set={value}={TEMPLATE}")],
        scenario::free_port()?,
    )
    .await?;
    scenario::deploy_workload(&lab).await?;
    scenario::agents_settled(&lab).await?;
    Ok(lab)
}

/// The shortest `Ready` duration of the health checks in the lab: the verdict's wait for a
/// node whose peers do not report it before it must be remediated.
pub(super) async fn ready_duration(lab: &Lab) -> Option<std::time::Duration> {
    Api::<NodeHealthCheck>::all(lab.client())
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .iter()
        .flat_map(|c| c.spec.unhealthy_conditions.iter())
        .filter(|c| c.type_ == "Ready")
        .filter_map(|c| c.duration.duration().ok())
        .min()
}

/// The agents' timings in force: the lab's SelfNodeRemediationConfig's licence and watchdog
/// timeout (the lab device's own when the config sets none); None where no agent runs.
pub(super) async fn agent_timings(lab: &Lab) -> anyhow::Result<Option<AgentTimings>> {
    let Some(config) = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS)
        .get_opt(CONFIG_NAME)
        .await
        .context("reading the SelfNodeRemediationConfig")?
    else {
        return Ok(None);
    };
    let settings = daemonset::licence_settings(&config.spec)?;
    let watchdog = match &config.spec.watchdog_timeout {
        Some(timeout) => timeout.duration()?,
        None => lab.config().timings.watchdog_timeout,
    };
    Ok(Some(AgentTimings::new(&settings, watchdog)))
}

/// How soon a silent node can get a remediation through the peer failure detector, where the
/// agents run it and a health check acts on its PeersReachable=False: a direct probe's
/// round-trip time and the suspicion's wait, plus the condition's duration.
pub(super) async fn peer_detection_after(lab: &Lab) -> anyhow::Result<Option<Duration>> {
    let config = Api::<SelfNodeRemediationConfig>::namespaced(lab.client(), NS)
        .get_opt(CONFIG_NAME)
        .await
        .context("reading the SelfNodeRemediationConfig")?;
    let Some(detection) = config.and_then(|c| c.spec.peer_detection) else {
        return Ok(None);
    };
    let detected = detection.probe_rtt.duration()? + detection.suspect_to_down_after.duration()?;
    let checks = Api::<NodeHealthCheck>::all(lab.client())
        .list(&ListParams::default())
        .await
        .context("listing the health checks")?;
    Ok(checks
        .items
        .iter()
        .flat_map(|c| c.spec.unhealthy_conditions.iter())
        .filter(|c| c.type_ == "PeersReachable" && c.status == "False")
        .filter_map(|c| c.duration.duration().ok())
        .min()
        .map(|duration| detected + duration))
}

/// The seed health check of `path` on the trial's template, its durations [`UNHEALTHY_FOR`],
/// with `peer_detection` also unhealthy on PeersReachable=False at once.
fn apply_health_check(lab: &Lab, path: PathKind, peer_detection: bool) -> anyhow::Result<()> {
    let nhc = match path {
        PathKind::SelfRemediation => "002-nhc-snr-3node.yaml",
        PathKind::FenceRedfish => "002-nhc-far-3node.yaml",
    };
    scenario::apply_seed(lab, nhc, |m| {
        m["spec"]["remediationTemplate"]["name"] = json!(TEMPLATE);
        if let Some(conditions) = m["spec"]["unhealthyConditions"].as_array_mut() {
            for c in conditions.iter_mut() {
                c["duration"] = json!(format!("{}s", UNHEALTHY_FOR.as_secs()));
            }
            if peer_detection {
                conditions.push(json!({"type": "PeersReachable", "status": "False", "duration": "0s"}));
            }
        }
    })?;
    Ok(())
}

/// A lab of real nodes of the shape: nodemedic installed by `helm install` from its images
/// (controller and agents as pods, self remediation's agents on every node whatever the
/// path), the writer StatefulSet running, and the seed health check for the path in place of
/// the chart's default one, so the trial chooses the template's strategy. Returns the lab and
/// the witness of the writer's volume.
pub(super) async fn setup_real(
    exe: &Path,
    shape: Shape,
    peer_detection: bool,
    alone: bool,
) -> anyhow::Result<(Lab, DataWitness)> {
    let mut config = real_nodes::config(exe)?;
    config.nodes = (1..=shape.nodes)
        .map(|i| NodeSpec::control_plane_worker(&format!("node-{i}")).real())
        .collect();
    if shape.path == PathKind::FenceRedfish {
        config = config.with_bmcs(bmc_options(shape));
    }
    if alone {
        config = config.alone();
    }
    let lab = Lab::start(config).await.context("starting a lab of real nodes")?;
    // The default check off whatever the path: the campaign's own check replaces it.
    let values = real_nodes::values(&scenario::fast_config(peer_detection), true)?;
    real_nodes::helm_install(&lab, &values).await?;
    if shape.path == PathKind::FenceRedfish {
        scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
    }
    apply_template(&lab, shape.path, Strategy::OutOfServiceTaint)?;
    let (_, witness) = real_nodes::start_writer(&lab).await?;
    apply_health_check(&lab, shape.path, peer_detection)?;
    Ok((lab, witness))
}

fn bmc_options(shape: Shape) -> BmcOptions {
    let delays = if shape.slow_bmc {
        PowerDelays::Realistic
    } else {
        PowerDelays::None
    };
    BmcOptions {
        delays,
        ..BmcOptions::default()
    }
}

/// The path's template, named [`TEMPLATE`], with the trial's strategy. Fence agents: the seed
/// template adapted to the lab, with attempts short enough that a hung BMC fails one within
/// a trial (the seed's 5 x 60 s would outlast it), yet long enough for a slow BMC's 1-11 s.
pub(super) fn apply_template(lab: &Lab, path: PathKind, strategy: Strategy) -> anyhow::Result<()> {
    let strategy = format!("{strategy:?}");
    match path {
        PathKind::SelfRemediation => {
            lab.apply_yaml(&scenario::self_remediation_template(TEMPLATE, &strategy).to_string())?;
        }
        PathKind::FenceRedfish => scenario::apply_seed(lab, "002-far-template.yaml", |m| {
            scenario::adapt_far_template(lab, m);
            m["metadata"]["name"] = json!(TEMPLATE);
            let spec = &mut m["spec"]["template"]["spec"];
            spec["remediationStrategy"] = json!(strategy);
            spec["retrycount"] = json!(3);
            spec["retryinterval"] = json!("2s");
            spec["timeout"] = json!("30s");
        })?,
    }
    Ok(())
}
