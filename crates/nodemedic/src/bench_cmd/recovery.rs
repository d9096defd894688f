//! Time to safe recovery. For each path (self remediation with the lab
//! watchdog; fence agents through Redfish; through IPMI) and strategy (ResourceDeletion,
//! OutOfServiceTaint), one lab runs N trials: crash the node running a one-replica StatefulSet
//! with a ReadWriteOnce volume, read the story from the lab timeline, bring the node back, repeat.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::ValueEnum;
use kube::Api;
use nodemedic::{
    bench::{self, Breakdown},
    scenario::{self, NS},
    story::{self, Milestone, Subject},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation,
    self_remediation::{CONFIG_NAME, SelfNodeRemediation, SelfNodeRemediationConfig},
};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, PowerDelays, wait, witness};
use serde_json::json;

use super::{BenchArgs, Section, verdict};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    SelfRemediation,
    FenceRedfish,
    FenceIpmi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum Strategy {
    ResourceDeletion,
    OutOfServiceTaint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// The lab's fast timings: health-check durations 5 s, the fast SelfNodeRemediationConfig.
    Fast,
    /// The seed manifests' own: health-check durations 10 s, the seed SelfNodeRemediationConfig
    /// (safe time 180 s).
    Seed,
}

#[derive(serde::Serialize)]
struct Series {
    path: Path,
    strategy: Strategy,
    profile: Profile,
    /// Self remediation: the safe time the manager used (seconds).
    safe_time: Option<f64>,
    trials: Vec<Breakdown>,
    failures: Vec<String>,
}

fn or_all<T: Clone>(chosen: &[T], all: Vec<T>) -> Vec<T> {
    if chosen.is_empty() { all } else { chosen.to_vec() }
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Section> {
    let paths = or_all(
        &args.paths,
        vec![Path::SelfRemediation, Path::FenceRedfish, Path::FenceIpmi],
    );
    let strategies = or_all(
        &args.strategies,
        vec![Strategy::ResourceDeletion, Strategy::OutOfServiceTaint],
    );
    let profiles = or_all(&args.profiles, vec![Profile::Fast, Profile::Seed]);
    let mut all = Vec::new();
    for profile in &profiles {
        let trials = match profile {
            Profile::Fast => args.trials,
            Profile::Seed => args.seed_trials,
        };
        for path in &paths {
            for strategy in &strategies {
                println!("==> {path:?} / {strategy:?} / {profile:?}: {trials} trials");
                all.push(series(*path, *strategy, *profile, trials).await?);
            }
        }
    }
    Ok(Section {
        name: "recovery",
        json: json!({"series": all}),
        markdown: markdown(&all),
    })
}

fn markdown(all: &[Series]) -> String {
    let mut out = String::from(
        "## Time to safe recovery

Lab: real control plane, kwok nodes, the lab's fast failure detection (Ready=Unknown about 10 s after a node goes silent). \
         Profiles: *fast* = health-check durations 5 s and the lab's fast SelfNodeRemediationConfig; *seed* = the seed manifests' own (durations 10 s, the seed SelfNodeRemediationConfig).\n\n\
         Seconds per phase, p50 / p90 / p99 over the trials. *controlled*: from the remediation's creation to the pod Running elsewhere (the part nodemedic controls); *total*: crash to Running.\n\n\
         | path | strategy | profile | trials | detection | health check | fencing | deletion | rescheduling | controlled | total |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in all {
        let col = |f: fn(&Breakdown) -> f64| {
            let values: Vec<f64> = s.trials.iter().map(f).collect();
            bench::summary(&values).map_or("-".into(), |v| format!("{:.1} / {:.1} / {:.1}", v.p50, v.p90, v.p99))
        };
        out.push_str(&format!(
            "| {:?} | {:?} | {:?} | {}{} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.path,
            s.strategy,
            s.profile,
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
        ));
    }
    out.push_str("\nTargets:\n");
    for s in all {
        if let Some(line) = target(s) {
            out.push_str(&format!("- {line}\n"));
        }
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

/// The target for a series, with the measured figure.
fn target(s: &Series) -> Option<String> {
    let p = |f: fn(&Breakdown) -> f64, q: f64| bench::percentile(&s.trials.iter().map(f).collect::<Vec<_>>(), q);
    let name = format!("{:?} / {:?} / {:?}", s.path, s.strategy, s.profile);
    match (s.path, s.profile) {
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

const TEMPLATE: &str = "bench";

async fn series(path: Path, strategy: Strategy, profile: Profile, trials: usize) -> anyhow::Result<Series> {
    let exe = std::env::current_exe().context("locating the nodemedic binary")?;
    let mut config = LabConfig::seed();
    if path != Path::SelfRemediation {
        config = config.with_bmcs(BmcOptions {
            delays: PowerDelays::None,
            ..BmcOptions::default()
        });
    }
    let lab = Lab::start(config).await.context("starting the lab")?;
    scenario::create_namespace(&lab.client(), NS).await?;
    let metrics = scenario::free_port()?;
    let strategy_name = format!("{strategy:?}");
    let nhc = match path {
        Path::SelfRemediation => {
            let patch = match profile {
                Profile::Fast => scenario::FAST_CONFIG,
                Profile::Seed => scenario::SEED_TIMINGS_CONFIG,
            };
            lab.apply_yaml(&scenario::self_remediation_template(TEMPLATE, &strategy_name).to_string())?;
            scenario::install_self_remediation(&lab, &exe, patch, metrics).await?;
            scenario::deploy_workload(&lab).await?;
            scenario::agents_settled(&lab).await?;
            "002-nhc-snr-3node.yaml"
        }
        Path::FenceRedfish | Path::FenceIpmi => {
            scenario::apply_seed(&lab, "002-far-credentials-secret.yaml", |_| {})?;
            if path == Path::FenceRedfish {
                scenario::apply_seed(&lab, "002-far-template.yaml", |m| {
                    scenario::adapt_far_template(&lab, m);
                    m["metadata"]["name"] = json!(TEMPLATE);
                    m["spec"]["template"]["spec"]["remediationStrategy"] = json!(strategy_name);
                })?;
            } else {
                let template = scenario::ipmi_far_template(
                    &lab,
                    TEMPLATE,
                    "fence-agents-credentials-shared-sm-bmc",
                    &strategy_name,
                );
                lab.apply_yaml(&template.to_string())?;
            }
            scenario::start_fence_agents_controller(&lab, &exe, metrics)?;
            scenario::deploy_workload(&lab).await?;
            "002-nhc-far-3node.yaml"
        }
    };
    scenario::apply_seed(&lab, nhc, |m| {
        m["spec"]["remediationTemplate"]["name"] = json!(TEMPLATE);
        if profile == Profile::Fast
            && let Some(conditions) = m["spec"]["unhealthyConditions"].as_array_mut()
        {
            for c in conditions {
                c["duration"] = json!("5s");
            }
        }
    })?;
    let mut out = Series {
        path,
        strategy,
        profile,
        safe_time: None,
        trials: Vec::new(),
        failures: Vec::new(),
    };
    for trial in 1..=trials {
        match one_trial(&lab, path).await {
            Ok(b) => {
                println!(
                    "    trial {trial}: total {:.1}s, controlled {:.1}s",
                    b.total, b.controlled
                );
                out.trials.push(b);
            }
            Err(e) => {
                println!("    trial {trial} failed: {e:#}");
                out.failures.push(format!("trial {trial}: {e:#}"));
                break;
            }
        }
    }
    if path == Path::SelfRemediation {
        out.safe_time = safe_time(&lab).await;
    }
    let violations = witness::check(&lab.timeline().entries());
    if !violations.is_empty() {
        bail!("the at-most-one witness failed: {violations:?}");
    }
    Ok(out)
}

/// Crash the pod's node, measure until the pod runs elsewhere, then bring the node back and
/// wait until nothing of the remediation is left.
async fn one_trial(lab: &Lab, path: Path) -> anyhow::Result<Breakdown> {
    let client = lab.client();
    let pod = scenario::running_pod(&client, &[], Duration::from_secs(300)).await?;
    let node = scenario::node_of(&pod);
    let subject = Subject {
        node: node.clone(),
        pod: "vm/db-0".into(),
    };
    let since = jiff::Timestamp::now();
    lab.crash(&node).await?;
    let story = wait::until("db-0 Running elsewhere", Duration::from_secs(600), || {
        let entries: Vec<_> = lab.timeline().entries().into_iter().filter(|e| e.at >= since).collect();
        let story = story::milestones(&entries, &subject);
        async move {
            Ok(story
                .iter()
                .any(|r| r.milestone == Milestone::WorkloadRunningElsewhere)
                .then_some(story))
        }
    })
    .await?;
    let breakdown = bench::breakdown(&story).context("an incomplete story")?;
    if path == Path::SelfRemediation {
        lab.power_on(&node).await?;
    }
    lab.wait_ready_status(&node, "True", Duration::from_secs(300)).await?;
    let snrs = Api::<SelfNodeRemediation>::namespaced(client.clone(), NS);
    let fars = Api::<FenceAgentsRemediation>::namespaced(client.clone(), NS);
    wait::until("every remediation removed", Duration::from_secs(300), || {
        let (snrs, fars) = (snrs.clone(), fars.clone());
        async move {
            let left =
                snrs.list(&Default::default()).await?.items.len() + fars.list(&Default::default()).await?.items.len();
            Ok((left == 0).then_some(()))
        }
    })
    .await?;
    Ok(breakdown)
}

/// The safe time the manager waits: the configured one, or the provable minimum when larger.
async fn safe_time(lab: &Lab) -> Option<f64> {
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
