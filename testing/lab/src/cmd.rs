//! Running the system tools the lab drives (`ip`, `nft`), synchronously: they are quick, and
//! teardown must work from `Drop`.

use std::{io::Write, process::Command};

use crate::{Error, Result};

/// Runs `program args...`; returns stdout, or an error carrying stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    run_with_stdin(program, args, None)
}

pub(crate) fn run_with_stdin(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let command = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::Command {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(|e| Error::Command {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    }
    let out = child.wait_with_output().map_err(|e| Error::Command {
        command: command.clone(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            command,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Best effort, for teardown: failures are logged, not returned.
pub(crate) fn run_quietly(program: &str, args: &[&str]) {
    if let Err(error) = run(program, args) {
        tracing::debug!(%error, "teardown step failed");
    }
}
