//! Time to safe recovery. For each path (self remediation with the lab
//! watchdog; fence agents through Redfish; through IPMI) and strategy (ResourceDeletion,
//! OutOfServiceTaint), a lab runs N trials: crash the node running a one-replica StatefulSet
//! with a ReadWriteOnce volume, read the story from the lab timeline, bring the node back, repeat.
//! Self remediation's two strategies share one lab ([`lanes`]): its trials wait out the safe
//! time, and side by side they cost half the hour.

mod lanes;
mod out_of_the_box;
mod real;

use anyhow::bail;
use clap::ValueEnum;
use nodemedic_harness::bench::{self, Breakdown};
use nodemedic_lab::witness;
use serde_json::json;

use self::{lanes::Lane, out_of_the_box::Variant};
use super::{BenchArgs, Section, verdict};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Path {
    SelfRemediation,
    FenceRedfish,
    FenceIpmi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub(crate) enum Strategy {
    ResourceDeletion,
    OutOfServiceTaint,
}

impl Strategy {
    /// A name fit for labels and object names.
    fn label(self) -> &'static str {
        match self {
            Strategy::ResourceDeletion => "resource-deletion",
            Strategy::OutOfServiceTaint => "out-of-service-taint",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Profile {
    /// The lab's fast timings: health-check durations 5 s, the fast SelfNodeRemediationConfig.
    Fast,
    /// The seed manifests' own: health-check durations 10 s, the seed SelfNodeRemediationConfig
    /// (safe time 180 s).
    Seed,
    /// Kubernetes' default node-monitor timings (40 s leases, 50 s grace) and the seed's own
    /// durations; fence agents through Redfish only, with the agents' peer failure detector and
    /// the example health check on its condition, and without it (the baseline).
    Defaults,
    /// What `helm install` gives: the chart's default values read from the rendered chart,
    /// Kubernetes' default timings, three worker nodes; self remediation alone, with a Redfish template
    /// added to the default check's escalation, and medik8s's defaults as the baseline.
    OutOfTheBox,
}

#[derive(serde::Serialize)]
struct Series {
    path: Path,
    strategy: Strategy,
    profile: Profile,
    /// The lab's nodes.
    nodes: usize,
    /// The lab's node timings: how long each node's lease lasts, and how long a node is silent
    /// before the node controller marks it Ready=Unknown.
    node_lease_seconds: u32,
    node_monitor_grace_seconds: f64,
    /// What nodemedic ran with: its configuration and health check, in words.
    configuration: String,
    /// Whether another strategy's series ran in the same lab at the same time.
    side_by_side: bool,
    /// Whether the agents' peer failure detector ran (read from the configuration the series
    /// installed), and a health check acted on its condition.
    detector: bool,
    /// Self remediation: the safe time the manager used (seconds).
    safe_time: Option<f64>,
    /// Real nodes (nodemedic installed by Helm, the writer on the lab's CSI volumes) rather
    /// than kwok's.
    real_nodes: bool,
    /// Real nodes: seconds from the crash to the writer's first record on its new node.
    first_record: Vec<f64>,
    /// The out-of-the-box profile's series.
    #[serde(skip_serializing_if = "Option::is_none")]
    variant: Option<Variant>,
    trials: Vec<Breakdown>,
    failures: Vec<String>,
}

/// What a series' lab ran nodemedic with, beyond its path, strategy and profile.
pub(super) struct Setup {
    /// The agents' peer failure detector on, and a health check acting on its condition.
    pub detector: bool,
    /// nodemedic's configuration and health check, in words, for the report.
    pub configuration: String,
    /// Each trial's crash comes right after an API server outage ([`lanes::Outage`]).
    pub after_outage: Option<lanes::Outage>,
}

/// The chosen ones, each once and in their first order, or all when none is chosen.
fn or_all<T: Clone + PartialEq>(chosen: &[T], all: Vec<T>) -> Vec<T> {
    if chosen.is_empty() {
        return all;
    }
    let mut once = Vec::new();
    for c in chosen {
        if !once.contains(c) {
            once.push(c.clone());
        }
    }
    once
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<Section> {
    if args.real_nodes {
        return run_beside_real_nodes(args).await;
    }
    let paths = or_all(
        &args.paths,
        vec![Path::SelfRemediation, Path::FenceRedfish, Path::FenceIpmi],
    );
    let strategies = or_all(
        &args.strategies,
        vec![Strategy::ResourceDeletion, Strategy::OutOfServiceTaint],
    );
    let profiles = or_all(&args.profiles, vec![Profile::Fast, Profile::Seed, Profile::Defaults]);
    let mut all = Vec::new();
    for profile in &profiles {
        let trials = match profile {
            Profile::Fast => args.trials,
            Profile::Seed => args.seed_trials,
            Profile::Defaults => args.defaults_trials,
            Profile::OutOfTheBox => {
                for variant in [
                    Variant::SelfRemediation,
                    Variant::AfterOutage,
                    Variant::WithRedfish,
                    Variant::Medik8sDefaults,
                ] {
                    let trials = match variant {
                        Variant::Medik8sDefaults => args.baseline_trials,
                        Variant::AfterOutage => args.outage_trials,
                        Variant::SelfRemediation | Variant::WithRedfish => args.trials,
                    };
                    println!("==> out of the box, {variant:?}: {trials} trials");
                    let (lab, setup) = out_of_the_box::start(variant).await?;
                    let mut series =
                        run_trials(&lab, variant.path(), &out_of_the_box::lane(), *profile, setup, trials).await?;
                    for s in &mut series {
                        s.variant = Some(variant);
                    }
                    all.extend(series);
                }
                continue;
            }
        };
        if *profile == Profile::Defaults {
            if paths.contains(&Path::FenceRedfish) {
                for detector in [false, true] {
                    println!("==> FenceRedfish / ResourceDeletion / Defaults, detector {detector}: {trials} trials");
                    all.extend(
                        series(
                            Path::FenceRedfish,
                            &[Strategy::ResourceDeletion],
                            *profile,
                            detector,
                            trials,
                        )
                        .await?,
                    );
                }
            }
            continue;
        }
        for path in &paths {
            let labs: Vec<Vec<Strategy>> = if *path == Path::SelfRemediation && strategies.len() > 1 {
                vec![strategies.clone()]
            } else {
                strategies.iter().map(|s| vec![*s]).collect()
            };
            for shared in labs {
                println!("==> {path:?} / {shared:?} / {profile:?}: {trials} trials");
                all.extend(series(*path, &shared, *profile, false, trials).await?);
            }
        }
    }
    Ok(Section {
        name: "recovery",
        json: json!({"series": all}),
        markdown: markdown(&all),
    })
}

/// The series real nodes run (self remediation; fence agents through Redfish with the peer
/// detector, the seed template's OutOfServiceTaint), each on kwok nodes and on real ones, the
/// lab's fast profile.
async fn run_beside_real_nodes(args: &BenchArgs) -> anyhow::Result<Section> {
    let mut all = Vec::new();
    let kwok_trials = args.kwok_trials.unwrap_or(args.trials);
    for (path, detector) in [(Path::SelfRemediation, false), (Path::FenceRedfish, true)] {
        println!("==> {path:?} / OutOfServiceTaint / Fast on kwok nodes: {kwok_trials} trials");
        all.extend(
            series(
                path,
                &[Strategy::OutOfServiceTaint],
                Profile::Fast,
                detector,
                kwok_trials,
            )
            .await?,
        );
        println!("==> {path:?} on real nodes (Helm, the writer): {} trials", args.trials);
        all.push(real::series(path, args.trials).await?);
    }
    Ok(Section {
        name: "recovery-real-nodes",
        json: json!({"series": all}),
        markdown: markdown(&all),
    })
}

fn markdown(all: &[Series]) -> String {
    let mut out = String::from(
        "## Time to safe recovery

Lab: a real control plane; each series' nodes (kwok or real), node timings and nodemedic's configuration are in the first table, as that series' lab ran them. \
         Profiles: *fast* = health-check durations 5 s and the lab's fast SelfNodeRemediationConfig; *seed* = the seed manifests' own (durations 10 s, the seed SelfNodeRemediationConfig); \
         *defaults* = Kubernetes' default node-monitor timings and the seed's durations, fence agents only, with the agents' peer failure detector and the example health check on PeersReachable and without (the baseline). \
         *OutOfTheBox* = the chart's default values exactly (its rendered default-check and configuration ConfigMaps; the controller creates the check and the configuration from them), Kubernetes' default timings, three worker nodes (labelled as OpenShift labels them, so that medik8s's check selects them too): \
         self remediation alone, the same with each crash 30 s after a three-minute API server outage ends (*AfterOutage*), with a Redfish template added as the check's first escalation (`--set defaultHealthCheck.fenceAgentsTemplate.name=...`), and `--set medik8sDefaults=true` (medik8s's check and configuration, the baseline). \
         *detector*: whether the series' agents ran the peer failure detector (read from the configuration it installed) and a health check acted on PeersReachable; with it, *detection* ends at PeersReachable=False when that comes before NotReady.\n\n\
         | nodes | path | strategy | profile | node lease (s) | Unknown after silence (s) | detector | nodemedic's configuration |\n|---|---|---|---|---|---|---|---|\n",
    );
    for s in all {
        out.push_str(&format!(
            "| {} {} | {:?} | {:?} | {} | {} | {:.0} | {} | {} |\n",
            s.nodes,
            if s.real_nodes { "real" } else { "kwok" },
            s.path,
            s.strategy,
            profile_name(s),
            s.node_lease_seconds,
            s.node_monitor_grace_seconds,
            if s.detector { "yes" } else { "no" },
            s.configuration,
        ));
    }
    out.push_str(
        "\nSeconds per phase, p50 / p90 / p99 over the trials. *controlled*: from the remediation's creation to the pod Running elsewhere (the part nodemedic controls); *total*: crash to Running.\n\n\
         On *real* nodes (a kubelet, containerd and real pods each; the stateful stand-in a writer on the lab's CSI volumes) \
         *first record* is the crash to the writer's first record on its new node, read from its volume.\n\n\
         | nodes | path | strategy | profile | detector | trials | detection | health check | fencing | deletion | rescheduling | controlled | total | first record |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in all {
        let col = |f: fn(&Breakdown) -> f64| {
            let values: Vec<f64> = s.trials.iter().map(f).collect();
            bench::summary(&values).map_or("-".into(), |v| format!("{:.1} / {:.1} / {:.1}", v.p50, v.p90, v.p99))
        };
        let first_record = bench::summary(&s.first_record)
            .map_or("-".into(), |v| format!("{:.1} / {:.1} / {:.1}", v.p50, v.p90, v.p99));
        out.push_str(&format!(
            "| {} | {:?} | {:?} | {:?} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            if s.real_nodes { "real" } else { "kwok" },
            s.path,
            s.strategy,
            profile_name(s),
            if s.detector { "yes" } else { "no" },
            s.trials.len(),
            if s.failures.is_empty() {
                String::new()
            } else {
                format!(" ({} failed)", s.failures.len())
            },
            col(|b| b.detection),
            col(|b| b.health_check),
            col(|b| b.fencing),
            col(|b| b.deletion),
            col(|b| b.rescheduling),
            col(|b| b.controlled),
            col(|b| b.total),
            first_record,
        ));
    }
    if let Some(shared) = all.iter().find(|s| s.side_by_side) {
        out.push_str(&format!(
            "\nThe {:?} series of both strategies ran side by side in one lab of {} worker nodes: each strategy had half the nodes, \
             a copy of the seed health check selecting them (the seed's own selects the control-plane nodes, which are remediated one at a time), \
             its own template and StatefulSet, and each trial crashed one node of each at once.\n",
            shared.path, shared.nodes
        ));
    }
    out.push_str("\nTargets:\n");
    for s in all {
        if let Some(line) = target(s, all) {
            out.push_str(&format!("- {line}\n"));
        }
    }
    for line in [detector_ratio(all), out_of_the_box_ratio(all)].into_iter().flatten() {
        out.push_str(&format!("- {line}\n"));
    }
    for s in all.iter().filter(|s| !s.failures.is_empty()) {
        out.push_str(&format!(
            "\nFailures ({:?} / {:?} / {:?}):\n",
            s.path, s.strategy, s.profile
        ));
        for f in &s.failures {
            out.push_str(&format!("- {f}\n"));
        }
    }
    out
}

/// The series' profile, and its variant for the out-of-the-box profile.
fn profile_name(s: &Series) -> String {
    match s.variant {
        Some(variant) => format!("OutOfTheBox ({variant:?})"),
        None => format!("{:?}", s.profile),
    }
}

/// Crash to Running with the peer failure detector on Kubernetes' default timings: the issue's
/// targets, in seconds.
const DETECTOR_P50_TARGET: f64 = 10.0;
const DETECTOR_P99_TARGET: f64 = 15.0;

/// The target for a series (of `all`, the run's), with the measured figure.
fn target(s: &Series, all: &[Series]) -> Option<String> {
    let p = |f: fn(&Breakdown) -> f64, q: f64| bench::percentile(&s.trials.iter().map(f).collect::<Vec<_>>(), q);
    let name = format!("{:?} / {:?} / {:?}", s.path, s.strategy, s.profile);
    match (s.path, s.profile) {
        (_, Profile::OutOfTheBox) => out_of_the_box_target(s, all),
        (Path::FenceRedfish, Profile::Defaults) if s.detector => {
            let (p50, p99) = (p(|b| b.total, 50.0)?, p(|b| b.total, 99.0)?);
            Some(format!(
                "{name} with the peer failure detector: crash to Running p50 {p50:.1} s <= \
                 {DETECTOR_P50_TARGET} s, p99 {p99:.1} s <= {DETECTOR_P99_TARGET} s: {}",
                verdict(p50 <= DETECTOR_P50_TARGET && p99 <= DETECTOR_P99_TARGET)
            ))
        }
        (_, Profile::Defaults) => None,
        (Path::FenceRedfish | Path::FenceIpmi, Profile::Fast) => {
            let p99 = p(|b| b.controlled, 99.0)?;
            Some(format!(
                "{name}: controlled p99 {p99:.1} s <= 5 s: {}",
                verdict(p99 <= 5.0)
            ))
        }
        (Path::SelfRemediation, _) => {
            let p99 = p(|b| b.controlled, 99.0)?;
            let safe = s.safe_time?;
            Some(format!(
                "{name}: controlled p99 {p99:.1} s <= safe time {safe:.0} s + 5 s: {}",
                verdict(p99 <= safe + 5.0)
            ))
        }
        (Path::FenceRedfish, Profile::Seed) => {
            let p50 = p(|b| b.total, 50.0)?;
            Some(format!(
                "{name} (nhc-far-3node, 10 s durations): crash to Running p50 {p50:.1} s <= 30 s: {}",
                verdict(p50 <= 30.0)
            ))
        }
        _ => None,
    }
}

/// The targets for `helm install` with nothing changed, crash to Running in seconds.
const OUT_OF_THE_BOX_SR_P50: f64 = 20.0;
const OUT_OF_THE_BOX_SR_P99: f64 = 30.0;
const OUT_OF_THE_BOX_REDFISH_P50: f64 = 5.0;

/// How much later than at rest the workload may run again after an outage (issue 60).
const AFTER_OUTAGE_SLACK: f64 = 5.0;

fn out_of_the_box_target(s: &Series, all: &[Series]) -> Option<String> {
    let totals: Vec<f64> = s.trials.iter().map(|b| b.total).collect();
    let p50 = bench::percentile(&totals, 50.0)?;
    let p99 = bench::percentile(&totals, 99.0)?;
    match s.variant? {
        Variant::SelfRemediation => Some(format!(
            "out of the box, self remediation alone: crash to Running p50 {p50:.1} s <= {OUT_OF_THE_BOX_SR_P50} s, \
             p99 {p99:.1} s <= {OUT_OF_THE_BOX_SR_P99} s (safe time {}): {}",
            s.safe_time.map_or("-".into(), |t| format!("{t:.0} s")),
            verdict(p50 <= OUT_OF_THE_BOX_SR_P50 && p99 <= OUT_OF_THE_BOX_SR_P99)
        )),
        Variant::WithRedfish => Some(format!(
            "out of the box with a Redfish template first: crash to Running p50 {p50:.1} s <= {OUT_OF_THE_BOX_REDFISH_P50} s: {}",
            verdict(p50 <= OUT_OF_THE_BOX_REDFISH_P50)
        )),
        Variant::AfterOutage => {
            // Issue 60: after an outage as fast as at any other time, within 5 s, the same run.
            let at_rest = all
                .iter()
                .find(|other| other.variant == Some(Variant::SelfRemediation))
                .and_then(|other| bench::percentile(&other.trials.iter().map(|b| b.total).collect::<Vec<_>>(), 50.0))?;
            Some(format!(
                "out of the box, a crash 30 s after a three-minute API server outage: crash to Running p50 {p50:.1} s \
                 <= the same run's p50 at rest {at_rest:.1} s + {AFTER_OUTAGE_SLACK} s: {}",
                verdict(p50 <= at_rest + AFTER_OUTAGE_SLACK)
            ))
        }
        Variant::Medik8sDefaults => None,
    }
}

/// How much sooner the chart's defaults bring the workload back than medik8s's (the same run).
fn out_of_the_box_ratio(all: &[Series]) -> Option<String> {
    let p50 = |variant: Variant| {
        let s = all.iter().find(|s| s.variant == Some(variant))?;
        bench::percentile(&s.trials.iter().map(|b| b.total).collect::<Vec<_>>(), 50.0)
    };
    let baseline = p50(Variant::Medik8sDefaults)?;
    let mut line = format!("medik8s's defaults (the baseline), crash to Running p50 {baseline:.1} s");
    for (variant, name) in [
        (Variant::SelfRemediation, "the chart's defaults"),
        (Variant::WithRedfish, "with a Redfish template"),
    ] {
        if let Some(p) = p50(variant) {
            line.push_str(&format!("; {name} {p:.1} s, {:.1}x sooner", baseline / p.max(0.001)));
        }
    }
    Some(line)
}

/// How much sooner the workload is back with the detector than without, on Kubernetes' default
/// timings (both series of the same run).
fn detector_ratio(all: &[Series]) -> Option<String> {
    let p50 = |detector: bool| {
        let s = all
            .iter()
            .find(|s| s.profile == Profile::Defaults && s.detector == detector)?;
        bench::percentile(&s.trials.iter().map(|b| b.total).collect::<Vec<_>>(), 50.0)
    };
    let (without, with) = (p50(false)?, p50(true)?);
    Some(format!(
        "Kubernetes' default timings, crash to Running p50: {without:.1} s without the detector, {with:.1} s with it: {:.1}x sooner",
        without / with.max(0.001)
    ))
}

/// One lab, one lane per strategy; every trial crashes each lane's node at once.
async fn series(
    path: Path,
    strategies: &[Strategy],
    profile: Profile,
    detector: bool,
    trials: usize,
) -> anyhow::Result<Vec<Series>> {
    let lanes = Lane::for_strategies(strategies);
    let lab = lanes::start(path, profile, detector, &lanes).await?;
    let setup = Setup {
        detector,
        configuration: lanes::configuration(path, profile, detector),
        after_outage: None,
    };
    run_trials(&lab, path, &lanes, profile, setup, trials).await
}

/// `trials` trials of `lanes` in a started lab.
async fn run_trials(
    lab: &nodemedic_lab::Lab,
    path: Path,
    lanes: &[Lane],
    profile: Profile,
    setup: Setup,
    trials: usize,
) -> anyhow::Result<Vec<Series>> {
    let detector = setup.detector;
    let timings = &lab.config().timings;
    let mut out: Vec<Series> = lanes
        .iter()
        .map(|lane| Series {
            path,
            strategy: lane.strategy,
            profile,
            nodes: lab.nodes().len(),
            node_lease_seconds: timings.node_lease_seconds,
            node_monitor_grace_seconds: timings.node_monitor_grace.as_secs_f64(),
            configuration: setup.configuration.clone(),
            side_by_side: lanes.len() > 1,
            detector,
            safe_time: None,
            real_nodes: lab.config().nodes.iter().all(|n| n.real),
            first_record: Vec::new(),
            variant: None,
            trials: Vec::new(),
            failures: Vec::new(),
        })
        .collect();
    for trial in 1..=trials {
        match lanes::one_trial(lab, path, lanes, setup.after_outage).await {
            Ok(measured) => {
                for (series, result) in out.iter_mut().zip(measured) {
                    match result {
                        Ok(b) => {
                            println!(
                                "    trial {trial} ({:?}): total {:.1}s, controlled {:.1}s",
                                series.strategy, b.total, b.controlled
                            );
                            if detector && profile == Profile::Defaults && b.total > DETECTOR_P99_TARGET {
                                // An outlier to explain: its lab's logs stay on disk after the run.
                                let logs = lab.keep_logs();
                                println!(
                                    "      over the {DETECTOR_P99_TARGET} s target: the lab's logs are kept in {}",
                                    logs.display()
                                );
                            }
                            series.trials.push(b);
                        }
                        Err(e) => {
                            println!("    trial {trial} ({:?}) failed: {e:#}", series.strategy);
                            series.failures.push(format!("trial {trial}: {e:#}"));
                        }
                    }
                }
            }
            Err(e) => {
                println!("    trial {trial}: the lab could not be brought back: {e:#}");
                for series in &mut out {
                    series
                        .failures
                        .push(format!("trial {trial}: the lab could not be brought back: {e:#}"));
                }
                break;
            }
        }
    }
    if path == Path::SelfRemediation {
        let safe_time = lanes::safe_time(lab).await;
        for series in &mut out {
            series.safe_time = safe_time;
        }
    }
    let violations = witness::check(&lab.timeline().entries());
    if !violations.is_empty() {
        bail!("the at-most-one witness failed: {violations:?}");
    }
    Ok(out)
}
