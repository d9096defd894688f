//! `nodemedic bench`: time to safe recovery. For each path (self remediation with the lab
//! watchdog; fence agents through Redfish; through IPMI) and strategy (ResourceDeletion,
//! OutOfServiceTaint), one lab runs N trials: crash the node running a one-replica StatefulSet
//! with a ReadWriteOnce volume, read the story from the lab timeline, bring the node back, repeat.
//! Writes JSON and a markdown report; never asserts a time.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kube::Api;
use nodemedic::{
    bench::{self, Breakdown},
    scenario::{self, NS},
    story::{self, Milestone, Subject},
};
use nodemedic_api::{fence_agents::FenceAgentsRemediation, self_remediation::SelfNodeRemediation};
use nodemedic_lab::{BmcOptions, Lab, LabConfig, PowerDelays, wait, witness};
use serde_json::json;

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

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Trials per path and strategy.
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    #[arg(long = "path", value_enum)]
    pub paths: Vec<Path>,
    #[arg(long = "strategy", value_enum)]
    pub strategies: Vec<Strategy>,
    #[arg(long, value_enum, default_value = "fast")]
    pub profile: Profile,
    /// Where the JSON and markdown reports go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    nodemedic_kube::logging::init_with_default(false, "warn,kube_client=off");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

#[derive(serde::Serialize)]
struct Series {
    path: Path,
    strategy: Strategy,
    profile: Profile,
    trials: Vec<Breakdown>,
    failures: Vec<String>,
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let paths = if args.paths.is_empty() {
        vec![Path::SelfRemediation, Path::FenceRedfish, Path::FenceIpmi]
    } else {
        args.paths.clone()
    };
    let strategies = if args.strategies.is_empty() {
        vec![Strategy::ResourceDeletion, Strategy::OutOfServiceTaint]
    } else {
        args.strategies.clone()
    };
    let mut all = Vec::new();
    for path in &paths {
        for strategy in &strategies {
            println!(
                "==> {path:?} / {strategy:?} / {:?}: {} trials",
                args.profile, args.trials
            );
            all.push(series(*path, *strategy, args.profile, args.trials).await?);
        }
    }
    std::fs::create_dir_all(&args.out)?;
    let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    let machine = machine();
    let json_path = args.out.join(format!("recovery-{stamp}.json"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&json!({"machine": machine, "series": all}))?,
    )?;
    let md_path = args.out.join(format!("recovery-{stamp}.md"));
    std::fs::write(&md_path, markdown(&all, &machine))?;
    println!("{}", markdown(&all, &machine));
    println!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb / 1024 / 1024)
        .unwrap_or(0);
    format!(
        "{cpus} CPUs ({model}), {mem} GiB RAM, nodemedic {}",
        env!("CARGO_PKG_VERSION")
    )
}

fn markdown(all: &[Series], machine: &str) -> String {
    let mut out = format!(
        "# Time to safe recovery\n\nMachine: {machine}. Lab: real control plane, kwok nodes, the lab's fast failure detection (Ready=Unknown about 10 s after a node goes silent).\n\n\
         Seconds per phase, p50 / p90 / p99 over the trials. *controlled*: from the remediation's creation to the pod Running elsewhere (the part nodemedic controls); *total*: crash to Running.\n\n\
         | path | strategy | profile | trials | detection | health check | fencing | deletion | rescheduling | controlled | total |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
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
    for s in all.iter().filter(|s| !s.failures.is_empty()) {
        out.push_str(&format!("\nFailures ({:?} / {:?}):\n", s.path, s.strategy));
        for f in &s.failures {
            out.push_str(&format!("- {f}\n"));
        }
    }
    out
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
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let strategy_name = format!("{strategy:?}");
    let nhc = match path {
        Path::SelfRemediation => {
            let patch = match profile {
                Profile::Fast => scenario::FAST_CONFIG,
                Profile::Seed => scenario::SEED_TIMINGS_CONFIG,
            };
            let snr_config = scenario::configure_with(&lab, patch).await?;
            lab.apply_yaml(
                &json!({
                    "apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
                    "metadata": {"name": TEMPLATE, "namespace": NS},
                    "spec": {"template": {"spec": {"remediationStrategy": strategy_name}}}
                })
                .to_string(),
            )?;
            scenario::start_controller(
                &lab,
                &exe,
                "controller",
                metrics,
                &["--disable=fence-agents"],
                "info,kube=warn",
            )?;
            scenario::start_agents(&lab, &exe, &snr_config)?;
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
            scenario::start_controller(
                &lab,
                &exe,
                "controller",
                metrics,
                &["--disable=self-remediation"],
                "info,kube=warn",
            )?;
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
