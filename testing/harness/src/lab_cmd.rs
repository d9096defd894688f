//! `nodemedic-lab ...`: a lab for people. `up` starts a detached `lab serve` process that owns
//! the lab; the other subcommands talk to it over a unix socket, one JSON line each way.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use nodemedic_harness::scenario::{self, NS};
use nodemedic_lab::{Fault, Lab, LabConfig, NodeSpec, Timings};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt},
    net::UnixListener,
};

const RUN_DIR: &str = "/run/nodemedic/lab-serve";

fn socket_path() -> PathBuf {
    Path::new(RUN_DIR).join("lab.sock")
}

#[derive(Subcommand, Debug)]
pub(crate) enum LabCommand {
    /// Start a lab in the background and print how to reach it.
    Up(UpArgs),
    /// Stop the lab and remove everything it made.
    Down,
    /// Nodes, their power and faults, and their Ready condition.
    Status,
    /// The lab's timeline so far.
    Timeline,
    /// The end of a lab process's log: controller, node-2/agent, node-2/kwok, kube-apiserver, ...
    Logs {
        process: String,
        /// How many lines from the end (0: all of it).
        #[arg(long, default_value_t = 60)]
        lines: usize,
    },
    /// Restart a process the lab runs (e.g. kube-scheduler, node-1/kwok).
    Restart { process: String },
    /// Undo a fault: `undo crash node-1` powers node-1 on, `undo partition node-1 node-2` heals
    /// both, `undo stop-etcd` starts etcd.
    Undo {
        #[command(subcommand)]
        fault: Fault,
    },
    #[command(flatten)]
    Inject(Fault),
    /// Runs the lab in the foreground (what `up` starts).
    #[command(hide = true)]
    Serve(UpArgs),
}

#[derive(Args, Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UpArgs {
    /// Number of nodes; each is control-plane and worker unless --workers.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Plain worker nodes instead of control-plane+worker ones.
    #[arg(long)]
    pub workers: bool,
    /// Kubernetes' default failure timings (node-monitor grace 50 s) instead of the fast ones.
    #[arg(long)]
    pub default_timings: bool,
    /// Give every node a BMC (Redfish over TLS on :443 and IPMI on :623 at its BMC address,
    /// user ansible, password n0tPassword), and install the seed's fence-agents template for them.
    #[arg(long)]
    pub bmcs: bool,
    /// Only the cluster: do not install nodemedic (controller, agents, configuration, templates)
    /// nor the stateful workload.
    #[arg(long)]
    pub bare: bool,
}

impl UpArgs {
    fn config(&self) -> LabConfig {
        let nodes = (1..=self.nodes)
            .map(|i| {
                let name = format!("node-{i}");
                if self.workers {
                    NodeSpec::worker(&name)
                } else {
                    NodeSpec::control_plane_worker(&name)
                }
            })
            .collect();
        let timings = if self.default_timings {
            Timings::kubernetes_defaults()
        } else {
            Timings::fast()
        };
        let config = LabConfig::new(nodes).with_timings(timings);
        if self.bmcs {
            config.with_bmcs(nodemedic_lab::BmcOptions::default())
        } else {
            config
        }
    }
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Request {
    Status,
    Timeline,
    Logs { process: String, lines: usize },
    Down,
    Inject { fault: Fault },
    Undo { fault: Fault },
    Restart { process: String },
}

#[derive(Serialize, Deserialize, Debug)]
struct Response {
    ok: bool,
    text: String,
}

pub(crate) fn run(command: LabCommand) -> anyhow::Result<()> {
    let request = match command {
        LabCommand::Up(args) => return up(&args),
        LabCommand::Serve(args) => return serve(args),
        LabCommand::Down => Request::Down,
        LabCommand::Status => Request::Status,
        LabCommand::Timeline => Request::Timeline,
        LabCommand::Logs { process, lines } => Request::Logs { process, lines },
        LabCommand::Inject(fault) => Request::Inject { fault },
        LabCommand::Undo { fault } => Request::Undo { fault },
        LabCommand::Restart { process } => Request::Restart { process },
    };
    let down = matches!(request, Request::Down);
    let response = send(&request)?;
    println!("{}", response.text);
    if !response.ok {
        bail!("the lab refused: {}", response.text);
    }
    if down {
        // The serving process exits once the lab is torn down.
        for _ in 0..300 {
            if !socket_path().exists() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the lab did not stop within 30 s");
    }
    Ok(())
}

fn send(request: &Request) -> anyhow::Result<Response> {
    let mut stream = UnixStream::connect(socket_path()).with_context(|| {
        format!(
            "no lab is running here (no {}): start one with `nodemedic-lab up`",
            socket_path().display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(180)))?;
    writeln!(stream, "{}", serde_json::to_string(request)?)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    serde_json::from_str(&line).context("the lab answered something unreadable")
}

fn up(args: &UpArgs) -> anyhow::Result<()> {
    nodemedic_lab::preflight()?;
    if socket_path().exists() && send(&Request::Status).is_ok() {
        bail!("a lab is already up (`nodemedic-lab status`; `nodemedic-lab down` stops it)");
    }
    std::fs::create_dir_all(RUN_DIR)?;
    let log = Path::new(RUN_DIR).join("serve.log");
    let out = std::fs::File::create(&log)?;
    let mut serve = std::process::Command::new(std::env::current_exe()?);
    serve.args(["serve", "--nodes", &args.nodes.to_string()]);
    for (set, flag) in [
        (args.workers, "--workers"),
        (args.default_timings, "--default-timings"),
        (args.bmcs, "--bmcs"),
        (args.bare, "--bare"),
    ] {
        if set {
            serve.arg(flag);
        }
    }
    // Detached: its own session, so closing this terminal does not stop the lab.
    let mut child = serve
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()?;
    let ready = Path::new(RUN_DIR).join("kubeconfig");
    let _ = std::fs::remove_file(&ready);
    // Installing nodemedic waits for every agent to be a member: seconds, rarely a minute.
    for _ in 0..UP_TIMEOUT_TENTHS {
        if let Some(status) = child.try_wait()? {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "the lab did not start ({status}):\n{}",
                tail.lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        if ready.exists() {
            let kubeconfig = std::fs::read_to_string(&ready)?;
            let kubectl = std::fs::read_to_string(Path::new(RUN_DIR).join("kubectl")).unwrap_or_default();
            print!("{}", next_steps(args, kubeconfig.trim(), kubectl.trim()));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Not left behind to come up later holding the machine's lab lock with nobody to stop it.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    bail!(
        "the lab did not become ready within {} minutes; see {}",
        UP_TIMEOUT_TENTHS / 600,
        log.display()
    )
}

const UP_TIMEOUT_TENTHS: u32 = 3 * 600;

/// What `up` prints: how to reach the lab and what to try in it.
fn next_steps(args: &UpArgs, kubeconfig: &str, kubectl: &str) -> String {
    let mut out = format!("lab up: {} nodes", args.nodes);
    if args.bmcs {
        out.push_str(", each with a Redfish and an IPMI BMC");
    }
    if args.bare {
        out.push_str(" (bare: nodemedic is not installed)\n");
    } else {
        out.push_str(&format!(
            "\nnodemedic is installed in namespace {NS}: the controller, an agent per node, the SelfNodeRemediationConfig and templates{}, and a StatefulSet db (pod db-0, a ReadWriteOnce volume) in namespace vm\n",
            if args.bmcs { ", the fence-agents template for the BMCs" } else { "" }
        ));
    }
    out.push_str(&format!(
        "\n  export KUBECONFIG={kubeconfig}\n  alias kubectl={kubectl}   # the lab's own, if you have none\n\nThen, for example:\n"
    ));
    if !args.bare {
        out.push_str(
            "  kubectl apply -f examples/try-it/nodehealthcheck.yaml   # a health check of the worker nodes
  nodemedic status --watch                                 # in another terminal
  kubectl -n vm get pod db-0 -o wide                      # where the \"VM\" runs
  nodemedic-lab crash <that node>                         # and watch it come back elsewhere
  nodemedic-lab logs controller                           # or node-2/agent, kube-apiserver, ...
  nodemedic-lab timeline
",
        );
    }
    out.push_str("  nodemedic-lab status | crash | freeze | partition | slow-links | fill-disk | stop-etcd | hang-bmc | ... (nodemedic-lab --help)\n  nodemedic-lab undo <fault>                              # e.g. undo partition node-1\n  nodemedic-lab down\n");
    out
}

fn serve(args: UpArgs) -> anyhow::Result<()> {
    nodemedic_kube::logging::init(false);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let lab = Lab::start(args.config()).await?;
        if !args.bare {
            let exe = nodemedic_harness::product::nodemedic()?;
            let patch = if args.default_timings {
                scenario::SEED_TIMINGS_CONFIG
            } else {
                scenario::FAST_CONFIG
            };
            let metrics = scenario::free_port()?;
            scenario::install_playground(&lab, &exe, patch, metrics).await?;
            tracing::info!(metrics = %format!("http://127.0.0.1:{metrics}/metrics"), "nodemedic installed");
        }
        std::fs::create_dir_all(RUN_DIR)?;
        let _ = std::fs::remove_file(socket_path());
        let listener = UnixListener::bind(socket_path())?;
        // Also reachable at a stable path while up.
        let stable = Path::new(RUN_DIR).join("admin.kubeconfig");
        std::fs::copy(lab.kubeconfig(), &stable)?;
        std::fs::write(
            Path::new(RUN_DIR).join("kubectl"),
            lab.kubectl_path().display().to_string(),
        )?;
        // Written last: `up` waits for this file.
        std::fs::write(Path::new(RUN_DIR).join("kubeconfig"), stable.display().to_string())?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let (read, mut write) = stream.into_split();
                    let mut line = String::new();
                    if tokio::io::BufReader::new(read).read_line(&mut line).await.is_err() {
                        continue;
                    }
                    let (response, stop) = match serde_json::from_str::<Request>(&line) {
                        Ok(Request::Down) => (Response { ok: true, text: "stopping the lab".into() }, true),
                        Ok(request) => (handle(&lab, request).await, false),
                        Err(e) => (Response { ok: false, text: format!("bad request: {e}") }, false),
                    };
                    let _ = write.write_all(format!("{}\n", serde_json::to_string(&response)?).as_bytes()).await;
                    if stop {
                        break;
                    }
                }
            }
        }
        drop(lab);
        for file in ["lab.sock", "kubeconfig", "admin.kubeconfig", "kubectl"] {
            let _ = std::fs::remove_file(Path::new(RUN_DIR).join(file));
        }
        anyhow::Ok(())
    })
}

async fn handle(lab: &Lab, request: Request) -> Response {
    let result = match request {
        Request::Status => {
            return Response {
                ok: true,
                text: status(lab).await,
            };
        }
        Request::Timeline => {
            return Response {
                ok: true,
                text: lab.timeline().render(),
            };
        }
        Request::Logs { process, lines } => return logs(lab, &process, lines),
        Request::Down => Ok(()),
        Request::Inject { fault } => lab.inject(&fault).await,
        Request::Undo { fault } => lab.undo(&fault).await,
        Request::Restart { process } => lab.restart_process(&process),
    };
    match result {
        Ok(()) => Response {
            ok: true,
            text: "done".into(),
        },
        Err(e) => Response {
            ok: false,
            text: e.to_string(),
        },
    }
}

fn logs(lab: &Lab, process: &str, lines: usize) -> Response {
    match std::fs::read_to_string(lab.log_path(process)) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let from = if lines == 0 { 0 } else { all.len().saturating_sub(lines) };
            Response {
                ok: true,
                text: all[from..].join("\n"),
            }
        }
        Err(_) => {
            let mut known: Vec<String> = std::fs::read_dir(lab.dir().join("logs"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    Some(name.strip_suffix(".log")?.replacen('_', "/", 1))
                })
                .filter(|name| name != "audit")
                .collect();
            known.sort();
            Response {
                ok: false,
                text: format!("the lab has no process {process}; its logs: {}", known.join(", ")),
            }
        }
    }
}

async fn status(lab: &Lab) -> String {
    use k8s_openapi::api::core::v1::Node;
    let nodes = kube::Api::<Node>::all(lab.client())
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut out = format!(
        "lab {} - kubeconfig {}\n{:<10} {:<8} {:<8} {:<12} {:<6} {:<10} {}\n",
        lab.id(),
        lab.kubeconfig().display(),
        "NODE",
        "POWER",
        "FROZEN",
        "NETWORK",
        "DISK",
        "READY",
        "IP"
    );
    for name in lab.nodes() {
        let c = lab.condition(&name).unwrap_or_default();
        let network = if c.partitioned {
            "partitioned"
        } else if c.api_isolated {
            "api-isolated"
        } else {
            "ok"
        };
        let ready = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|n| {
                n.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| c.status.clone())
            })
            .unwrap_or_else(|| "?".into());
        let ip = lab.node_ip(&name).map(|i| i.to_string()).unwrap_or_default();
        let bmc = lab.bmc(&name).map(|b| format!(" bmc {}", b.ip)).unwrap_or_default();
        out.push_str(&format!(
            "{name:<10} {:<8} {:<8} {network:<12} {:<6} {ready:<10} {ip}{bmc}\n",
            if c.powered { "on" } else { "off" },
            c.frozen,
            if c.disk_full { "full" } else { "ok" }
        ));
    }
    out
}
