//! `nodemedic demo`: a 3-node lab with nodemedic installed, a one-replica StatefulSet with a
//! ReadWriteOnce volume (the stand-in for a VM) on one node; that node dies, nodemedic fences it
//! and the workload comes back on another node. Prints the timeline and the witness's verdict.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nodemedic::scenario::{self, NS};
use nodemedic_lab::{Lab, LabConfig, witness};

pub fn run() -> anyhow::Result<()> {
    // The demo speaks for itself on stdout; the lab's start-up and teardown retries are noise.
    nodemedic_kube::logging::init_with_default(false, "warn,kube_client=off");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(demo())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn demo() -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the nodemedic binary")?;
    println!("==> starting a lab: a real control plane and three simulated nodes");
    let lab = Lab::start(LabConfig::seed()).await.context("starting the lab")?;
    let client = lab.client();
    scenario::create_namespace(&client, NS).await?;
    println!("==> installing nodemedic: the controller, an agent per node, the seed configuration");
    println!(
        "    (fast timings: {})",
        scenario::FAST_CONFIG.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    let config = scenario::configure(&lab).await?;
    scenario::apply_seed(&lab, "004-snr-template-automatic.yaml", |_| {})?;
    let metrics = free_port()?;
    scenario::start_controller(&lab, &exe, "controller", metrics, &[], "info,kube=warn")?;
    scenario::start_agents(&lab, &exe, &config)?;
    scenario::deploy_workload(&lab).await?;
    let pod = scenario::running_pod(&client, &[], Duration::from_secs(180)).await?;
    let node = scenario::node_of(&pod);
    println!("==> the \"VM\" (StatefulSet db, pod db-0, ReadWriteOnce volume) runs on {node}");
    println!(
        "==> waiting until every agent's registration counts ({}s)",
        scenario::VIEW.as_secs()
    );
    scenario::agents_settled(&lab).await?;
    scenario::apply_seed(&lab, "002-nhc-snr-3node.yaml", |_| {})?;
    println!("==> {node} loses power");
    let crashed = Instant::now();
    lab.crash(&node).await?;
    let moved = scenario::running_pod(&client, &[&node], Duration::from_secs(300)).await?;
    println!(
        "==> db-0 is Running on {} {:.1}s after {node} died",
        scenario::node_of(&moved),
        crashed.elapsed().as_secs_f64()
    );
    println!("\n{}", lab.timeline().render());
    let violations = witness::check(&lab.timeline().entries());
    if !violations.is_empty() {
        for v in &violations {
            println!("VIOLATION: {v}");
        }
        bail!("the witness saw two writers");
    }
    println!("witness: db-0 and its volume never ran on two nodes at once");
    println!("controller metrics were at http://127.0.0.1:{metrics}/metrics; the lab is torn down now");
    Ok(())
}
