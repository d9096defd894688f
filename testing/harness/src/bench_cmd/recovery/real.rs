//! Time to safe recovery on real nodes (`--real-nodes`): three real kubelets, nodemedic installed
//! by `helm install` from its images, the writer StatefulSet on the lab's CSI volumes. Each trial
//! crashes the writer's node; the phases come from the timeline as for kwok nodes, and the end is
//! the writer's first record on its new node, read from its volume.

use std::time::Duration;

use anyhow::{Context, bail};
use nodemedic_harness::{product, real_nodes, scenario, story::Subject};
use nodemedic_lab::{BmcOptions, Lab, data_witness::DataWitness, witness};

use super::{Path, Profile, Series, Strategy, lanes};

const LONG: Duration = Duration::from_secs(300);

/// A lab of real nodes for `path` (self remediation, or fence agents through Redfish with the
/// peer detector) with nodemedic installed and the writer running: the lab, the writer's node
/// and its volume's witness.
async fn start(path: Path) -> anyhow::Result<(Lab, String, DataWitness)> {
    let fence = path == Path::FenceRedfish;
    let mut config = real_nodes::config(&product::nodemedic()?)?;
    if fence {
        config = config.with_bmcs(BmcOptions::default());
    }
    let lab = Lab::start(config).await.context("starting a lab of real nodes")?;
    let values = real_nodes::values(&scenario::fast_config(fence), fence)?;
    real_nodes::helm_install(&lab, &values).await?;
    if fence {
        scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
        scenario::apply_seed(&lab, "002-far-template.yaml", |m| scenario::adapt_far_template(&lab, m))?;
        scenario::apply_peer_detection_check(&lab, scenario::shorten_durations)?;
    }
    let (node, witness) = real_nodes::start_writer(&lab).await?;
    Ok((lab, node, witness))
}

/// What [`start`] installs for `path`, in words for the report.
fn configuration(path: Path) -> String {
    let common = "nodemedic installed by Helm from its images, the lab's fast SelfNodeRemediationConfig";
    if path == Path::FenceRedfish {
        format!(
            "{common} and the peer detector, the default health check off; fence agents (the seed's Redfish template), \
             the example health check on PeersReachable, durations {}",
            scenario::TEST_CONDITION_DURATION
        )
    } else {
        format!(
            "{common}, the default health check's durations {}",
            scenario::TEST_CONDITION_DURATION
        )
    }
}

/// One series of `trials` crashes on real nodes.
pub(super) async fn series(path: Path, trials: usize) -> anyhow::Result<Series> {
    let (lab, mut node, mut witness) = start(path).await?;
    let mut series = Series {
        path,
        strategy: Strategy::OutOfServiceTaint,
        profile: Profile::Fast,
        nodes: lab.nodes().len(),
        node_lease_seconds: lab.config().timings.node_lease_seconds,
        node_monitor_grace_seconds: lab.config().timings.node_monitor_grace.as_secs_f64(),
        configuration: configuration(path),
        side_by_side: false,
        detector: path == Path::FenceRedfish,
        safe_time: None,
        real_nodes: true,
        first_record: Vec::new(),
        variant: None,
        trials: Vec::new(),
        failures: Vec::new(),
    };
    for trial in 1..=trials {
        match one_trial(&lab, path, &node, &mut witness, trial + 1).await {
            Ok((breakdown, first_record, moved_to)) => {
                println!(
                    "    trial {trial}: total {:.1}s, controlled {:.1}s, the writer's first record on {moved_to} {first_record:.1}s after the crash",
                    breakdown.total, breakdown.controlled
                );
                series.trials.push(breakdown);
                series.first_record.push(first_record);
                node = moved_to;
            }
            Err(e) => {
                println!("    trial {trial} failed: {e:#}");
                series.failures.push(format!("trial {trial}: {e:#}"));
                break;
            }
        }
    }
    if path == Path::SelfRemediation {
        series.safe_time = lanes::safe_time(&lab).await;
    }
    let violations = witness::check(&lab.timeline().entries());
    if !violations.is_empty() {
        bail!("the at-most-one witness failed: {violations:?}");
    }
    Ok(series)
}

/// Crashes `node`, measures until the writer's `writers`-th instance writes on another node,
/// brings `node` back and waits until every remediation is removed. Returns the breakdown, the
/// seconds from the crash to the new instance's first record, and the writer's new node.
async fn one_trial(
    lab: &Lab,
    path: Path,
    node: &str,
    witness: &mut DataWitness,
    writers: usize,
) -> anyhow::Result<(nodemedic_harness::bench::Breakdown, f64, String)> {
    let before = witness.look().0;
    let previous = before
        .last()
        .map(|r| r.instance.clone())
        .context("the writer has written")?;
    let since = jiff::Timestamp::now();
    lab.crash(node).await?;
    let subject = Subject {
        node: node.to_owned(),
        pod: "vm/db-0".into(),
    };
    let breakdown = lanes::measure(lab, &subject, since).await?;
    let records = real_nodes::records(witness, before.len(), writers, LONG).await?;
    let (_, first) = real_nodes::handover(&records, &previous).context("the writer's handover")?;
    let first_record = (i128::from(first.nanos) - since.as_nanosecond()) as f64 / 1e9;
    let moved_to = lab.writer_running(Some(node), LONG).await?;
    if path == Path::SelfRemediation {
        lab.power_on(node).await?;
    }
    lab.wait_ready_status(node, "True", LONG).await?;
    scenario::every_remediation_removed(lab, LONG).await?;
    Ok((breakdown, first_record, moved_to))
}
