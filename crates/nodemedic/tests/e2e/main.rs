//! End-to-end tests of the `nodemedic` binary against lab clusters.

mod chaos;
mod chart;
mod demo;
mod fenceagents;
mod fencing_means;
mod healthcheck;
mod lab_cli;
mod maintenance;
mod membership;
mod outages;
mod selfremediation;
mod status;
pub mod support;

use std::process::{Command, Output};

pub fn nodemedic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodemedic"))
        .args(args)
        .output()
        .expect("nodemedic runs")
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
