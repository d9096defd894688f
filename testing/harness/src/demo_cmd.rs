//! `nodemedic-lab demo`: the seed blog's scenario in a lab. Three nodes (each control-plane and
//! worker), nodemedic installed (controller, an agent per node), the seed NodeHealthCheck, a
//! one-replica StatefulSet with a ReadWriteOnce volume (the stand-in for a VM) on one node. That
//! node loses power; the demo narrates each step as it happens, ends with the timeline and the
//! time to recovery, and writes the same timeline as JSON and as an HTML page with a chart.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Args;
use nodemedic_harness::{
    real_nodes,
    report::Report,
    scenario::{self, NS},
    story::{self, Milestone, Subject},
};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, Timings, data_witness::DataWitness, witness};
use serde_json::json;

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Fence through each node's Redfish BMC with the fence agents, instead of self remediation;
    /// the agents' peer failure detector tells the health check a node is gone in seconds.
    #[arg(long)]
    pub fence_agents: bool,
    /// Kubernetes' default failure detection (node lease 40 s, grace 50 s) and the seed
    /// manifests' own durations: minutes instead of about one.
    #[arg(long)]
    pub default_timings: bool,
    /// Real nodes (a kubelet, containerd and real pods each) with nodemedic installed by
    /// `helm install` from its images (`make image`), and a writer that really writes: the
    /// narration ends with its last record on the dead node and its first on the new one.
    #[arg(long)]
    pub real_nodes: bool,
    /// Where the report goes (timeline.json, timeline.html).
    #[arg(long, default_value = "nodemedic-demo")]
    pub report_dir: PathBuf,
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    crate::interruptible::run(demo(&args))
}

/// The NodeHealthCheck's `Ready` durations: shortened, or the check's own.
fn durations(manifest: &mut serde_json::Value, seconds: Option<u32>) {
    if let (Some(s), Some(conditions)) = (seconds, manifest["spec"]["unhealthyConditions"].as_array_mut()) {
        for c in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
            c["duration"] = json!(format!("{s}s"));
        }
    }
}

/// A lab of simulated nodes with nodemedic's processes: the lab, the workload's node and the
/// controller's metrics port.
async fn simulated(args: &DemoArgs, shortened: Option<u32>) -> anyhow::Result<(Lab, String, Option<u16>)> {
    let exe = nodemedic_harness::product::nodemedic()?;
    let mut config = LabConfig::seed();
    if args.default_timings {
        config = config.with_timings(Timings::kubernetes_defaults());
    }
    if args.fence_agents {
        config = config.with_bmcs(BmcOptions::default());
    }
    println!(
        "==> starting a lab: a real control plane and three simulated nodes{}",
        if args.fence_agents {
            ", each with a Redfish BMC"
        } else {
            ""
        }
    );
    let lab = Lab::start(config).await.context("starting the lab")?;
    let client = lab.client();
    scenario::create_namespace(&client, NS).await?;
    let metrics = scenario::free_port()?;
    let patch = self_remediation_config(args);
    if args.fence_agents {
        println!(
            "==> installing nodemedic (controller, an agent per node with the peer failure detector) and the seed fence agents template (fence_redfish)"
        );
        scenario::install_fence_agents_with_detection(&lab, &exe, &patch, metrics).await?;
        scenario::deploy_workload(&lab).await?;
    } else {
        println!("==> installing nodemedic: the controller, an agent per node, the seed configuration");
        println!(
            "    (SelfNodeRemediationConfig: {})",
            patch.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        scenario::install_self_remediation(&lab, &exe, &patch, metrics).await?;
        scenario::deploy_workload(&lab).await?;
        println!(
            "==> waiting until every agent is a member (seconds: a membership change needs a majority's acknowledgement)"
        );
        scenario::agents_settled(&lab).await?;
    }
    let pod = scenario::running_pod(&client, &[], Duration::from_secs(180)).await?;
    let node = scenario::node_of(&pod);
    let ready_after = shortened.map_or("the check's durations".into(), |s| format!("{s}s"));
    if args.fence_agents {
        scenario::apply_peer_detection_check(&lab, |m| durations(m, shortened))?;
        println!(
            "==> NodeHealthCheck peer-detection (examples/peer-detection) watches the nodes: unhealthy as soon as PeersReachable is False, or NotReady for {ready_after}"
        );
    } else {
        scenario::apply_seed(&lab, "000-nhc-master-test.yaml", |m| durations(m, shortened))?;
        println!(
            "==> NodeHealthCheck nhc-master-test watches the control-plane nodes (unhealthy after {ready_after} NotReady)"
        );
    }
    println!("==> the \"VM\" (StatefulSet db, pod db-0, ReadWriteOnce volume) runs on {node}");
    Ok((lab, node, Some(metrics)))
}

/// The self remediation configuration of the demo's timings (with the peer failure detector for
/// fence agents).
fn self_remediation_config(args: &DemoArgs) -> String {
    let timings = if args.default_timings {
        scenario::SEED_TIMINGS_CONFIG
    } else {
        scenario::FAST_CONFIG
    };
    if args.fence_agents {
        scenario::with_detector(timings)
    } else {
        timings.to_owned()
    }
}

/// A lab of real nodes with nodemedic installed by Helm, and the writer running: the lab, the
/// writer's node and the witness of its volume.
async fn real(args: &DemoArgs, shortened: Option<u32>) -> anyhow::Result<(Lab, String, DataWitness)> {
    if args.default_timings {
        bail!("--real-nodes runs on the lab's fast timings; leave out --default-timings");
    }
    let exe = nodemedic_harness::product::nodemedic()?;
    let mut config = real_nodes::config(&exe).context("real nodes import the images `make image` builds")?;
    if args.fence_agents {
        config = config.with_bmcs(BmcOptions::default());
    }
    println!(
        "==> starting a lab: a real control plane and three real nodes (a kubelet, containerd and runc each){}",
        if args.fence_agents {
            ", each with a Redfish BMC"
        } else {
            ""
        }
    );
    let lab = Lab::start(config).await.context("starting the lab")?;
    let values = real_nodes::values(&self_remediation_config(args), args.fence_agents)?;
    println!("==> helm install nodemedic charts/nodemedic, from its images, with:");
    for value in &values {
        println!("    --set-json {value}");
    }
    real_nodes::helm_install(&lab, &values).await?;
    println!("==> the controller's two replicas and an agent on every node run as pods");
    if args.fence_agents {
        scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
        scenario::apply_seed(&lab, "002-far-template.yaml", |m| scenario::adapt_far_template(&lab, m))?;
        scenario::apply_peer_detection_check(&lab, |m| durations(m, shortened))?;
        println!(
            "==> the seed fence agents template (fence_redfish) and NodeHealthCheck peer-detection (examples/peer-detection)"
        );
    } else {
        println!("==> the chart's default NodeHealthCheck nhc-worker-default watches the workers");
    }
    let (node, witness) = real_nodes::start_writer(&lab).await?;
    println!(
        "==> the \"VM\" (StatefulSet db, pod db-0, a ReadWriteOnce volume of the lab's CSI driver) runs on {node}, appending a synced record every 100 ms"
    );
    Ok((lab, node, witness))
}

async fn demo(args: &DemoArgs) -> anyhow::Result<()> {
    let shortened = (!args.default_timings).then_some(5);
    let (lab, node, metrics, mut data) = if args.real_nodes {
        let (lab, node, witness) = real(args, shortened).await?;
        (lab, node, None, Some(witness))
    } else {
        let (lab, node, metrics) = simulated(args, shortened).await?;
        (lab, node, metrics, None)
    };
    let first_writer = data
        .as_mut()
        .and_then(|w| w.look().0.first().map(|r| r.instance.clone()));

    let subject = Subject {
        node: node.clone(),
        pod: "vm/db-0".into(),
    };
    lab.crash(&node).await?;
    let started = Instant::now();
    let deadline = Duration::from_secs(if args.default_timings { 1200 } else { 300 });
    let mut told = 0;
    let mut powered_on = false;
    let story = loop {
        let reached = story::milestones(&lab.timeline().entries(), &subject);
        let origin = reached.first().map(|r| r.at);
        for r in reached.iter().skip(told) {
            let after = origin
                .map(|o| (r.at - o).total(jiff::Unit::Second).unwrap_or(0.0))
                .unwrap_or(0.0);
            println!(
                "  +{after:>6.1}s  {}   [{}]",
                r.milestone.describe(&subject.node, &subject.pod),
                r.detail
            );
        }
        told = told.max(reached.len());
        // Self remediation leaves a node that lost power off (its watchdog cannot boot it);
        // as in the blog, someone switches it on again once the workload is safe elsewhere.
        if !args.fence_agents
            && !powered_on
            && reached
                .iter()
                .any(|r| r.milestone == Milestone::WorkloadRunningElsewhere)
        {
            powered_on = true;
            println!("==> {node} is switched back on (as the blog's operator does)");
            lab.power_on(&node).await?;
        }
        if reached.iter().any(|r| r.milestone == Milestone::RemediationRemoved) {
            break reached;
        }
        if started.elapsed() > deadline {
            println!("==> gave up waiting after {}s", deadline.as_secs());
            break reached;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    let entries = lab.timeline().entries();
    let violations: Vec<String> = witness::check(&entries).iter().map(|v| v.to_string()).collect();
    let report = Report {
        title: format!(
            "nodemedic-lab demo: {node} dies, {} brings db-0 back",
            if args.fence_agents {
                "fence agents (Redfish)"
            } else {
                "self remediation"
            }
        ),
        subject,
        nodes: lab.nodes(),
        entries,
        milestones: story.clone(),
        violations: violations.clone(),
    };
    println!("\n{}", report.text());
    std::fs::create_dir_all(&args.report_dir).with_context(|| format!("creating {}", args.report_dir.display()))?;
    let html = args.report_dir.join("timeline.html");
    std::fs::write(&html, report.html())?;
    std::fs::write(
        args.report_dir.join("timeline.json"),
        serde_json::to_string_pretty(&report.json())?,
    )?;
    println!("report: {} (and timeline.json beside it)", html.display());
    if !violations.is_empty() {
        for v in &violations {
            println!("VIOLATION: {v}");
        }
        bail!("the witness saw two writers");
    }
    println!("witness: db-0 and its volume never ran on two nodes at once");
    if let (Some(witness), Some(first)) = (data.as_mut(), first_writer) {
        let (records, data_violations) = witness.look();
        if !data_violations.is_empty() {
            bail!("{}", real_nodes::violated(witness, &data_violations));
        }
        if let Some((last, next)) = real_nodes::handover(&records, &first) {
            println!(
                "data: the writer's last record on {node} was #{} at {}; its first on the new node #{} at {} ({:.1} s later); {} records, none lost, never two writers",
                last.sequence,
                jiff::Timestamp::from_nanosecond(i128::from(last.nanos))
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                next.sequence,
                jiff::Timestamp::from_nanosecond(i128::from(next.nanos))
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                (next.nanos - last.nanos) as f64 / 1e9,
                records.len()
            );
        }
    }
    if let Err(why) = story::in_safe_order(&story) {
        bail!("the recovery is incomplete or out of order: {why}");
    }
    match metrics {
        Some(port) => println!("controller metrics were at http://127.0.0.1:{port}/metrics; the lab is torn down now"),
        None => println!("the lab is torn down now"),
    }
    Ok(())
}
