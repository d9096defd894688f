//! End-to-end tests of nodemedic's executables against lab clusters. The product's `nodemedic`
//! is run from the same target directory: build it first (`cargo build -p nodemedic --bins`;
//! `make test` does).

#![allow(
    clippy::disallowed_methods,
    reason = "tests set the statuses other components would (a node's conditions, a Machine's phase, a stale remediation) to make their cases; nodemedic's one-status-writer rule is for what nodemedic ships"
)]

mod bundle;
mod chaos;
mod chart;
mod defaults;
mod demo;
mod descheduler;
mod doctor;
mod fenceagents;
mod fencing_means;
mod footprint;
mod healthcheck;
mod images;
mod lab_cli;
mod machine_layer;
mod machines;
mod maintenance;
mod membership;
mod network_policy;
mod on_real_nodes;
mod out_of_the_box;
mod outages;
mod peer_detection;
mod safety_nets;
mod selfremediation;
mod status;
pub mod support;
mod webhooks;

use std::{
    path::PathBuf,
    process::{Command, Output},
};

/// The product's all-in-one executable.
pub fn nodemedic_exe() -> PathBuf {
    nodemedic_harness::product::nodemedic().expect("the product's nodemedic executable is built")
}

/// The test tooling's executable: the lab playground, demo, bench and chaos.
pub fn nodemedic_lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodemedic-lab"))
        .args(args)
        .output()
        .expect("nodemedic-lab runs")
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
