//! Running the fence agents: finding them, reading their metadata once, and running one action
//! with medik8s's retries. Options go on standard input, so no secret is ever in argv; each
//! attempt runs in its own process group and the whole group is killed at the timeout (an agent
//! that shells out to ipmitool must not leave it behind).

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{io::AsyncWriteExt, process::Command};

use crate::decide::metadata::{self, Metadata};

/// Where Debian, RHEL and the medik8s image install the agents.
pub const DEFAULT_DIR: &str = "/usr/sbin";
const METADATA_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    #[error("fence agent {agent} is not installed in {dir}: use one that is (ls {dir}/fence_*)")]
    NotInstalled { agent: String, dir: String },
    #[error("fence agent {agent} did not describe its options (-o metadata): {why}")]
    Metadata { agent: String, why: String },
}

/// One run of an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// The agent's own verdict: its last error line, or its last output line.
    pub message: String,
    pub duration: Duration,
}

#[derive(Clone)]
pub struct Agents {
    dir: PathBuf,
    metadata: Arc<Mutex<HashMap<String, Arc<Metadata>>>>,
}

impl Agents {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            metadata: Arc::default(),
        }
    }

    pub fn path(&self, agent: &str) -> Result<PathBuf, AgentError> {
        let path = self.dir.join(agent);
        let valid_name = agent.starts_with("fence_") && !agent.contains('/');
        if valid_name && path.is_file() {
            Ok(path)
        } else {
            Err(AgentError::NotInstalled {
                agent: agent.to_owned(),
                dir: self.dir.display().to_string(),
            })
        }
    }

    pub async fn metadata(&self, agent: &str) -> Result<Arc<Metadata>, AgentError> {
        if let Some(known) = self.metadata.lock().ok().and_then(|m| m.get(agent).cloned()) {
            return Ok(known);
        }
        let path = self.path(agent)?;
        let failed = |why: String| AgentError::Metadata {
            agent: agent.to_owned(),
            why,
        };
        let output = tokio::time::timeout(
            METADATA_TIMEOUT,
            Command::new(&path)
                .args(["-o", "metadata"])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| failed("timed out".into()))?
        .map_err(|e| failed(e.to_string()))?;
        let meta = Arc::new(metadata::parse(&String::from_utf8_lossy(&output.stdout)).map_err(failed)?);
        if let Ok(mut cache) = self.metadata.lock() {
            cache.insert(agent.to_owned(), meta.clone());
        }
        Ok(meta)
    }

    /// One attempt: `stdin` is the agent's whole input; `secrets` are scrubbed from the message.
    pub async fn attempt(&self, agent: &str, stdin: &str, secrets: &BTreeSet<String>, timeout: Duration) -> Attempt {
        let started = Instant::now();
        let finish = |exit_code, timed_out, message: String| Attempt {
            exit_code,
            timed_out,
            message: scrub(&message, secrets),
            duration: started.elapsed(),
        };
        let path = match self.path(agent) {
            Ok(path) => path,
            Err(e) => return finish(None, false, e.to_string()),
        };
        let mut child = match spawn(&path).await {
            Ok(child) => child,
            Err(e) => return finish(None, false, format!("could not start {agent}: {e}")),
        };
        let group = GroupGuard(child.id().map(|id| Pid::from_raw(id as i32)));
        if let Some(mut input) = child.stdin.take() {
            // An agent that exits early closes the pipe; its exit code says why.
            let _ = input.write_all(stdin.as_bytes()).await;
        }
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(output)) => {
                group.disarm();
                finish(
                    output.status.code(),
                    false,
                    verdict(
                        &String::from_utf8_lossy(&output.stdout),
                        &String::from_utf8_lossy(&output.stderr),
                    ),
                )
            }
            Ok(Err(e)) => finish(None, false, format!("waiting for {agent}: {e}")),
            Err(_) => finish(None, true, format!("{agent} did not finish within {timeout:?}; killed")),
        }
    }
}

/// Starts an agent in its own process group. "Text file busy" is retried: it means an agent file
/// was just written (a package upgrade) and another thread's fork still holds it open for writing
/// for the instant before that child execs.
async fn spawn(path: &std::path::Path) -> std::io::Result<tokio::process::Child> {
    let mut tries = 0;
    loop {
        let spawned = Command::new(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}

/// Kills the attempt's whole process group when dropped armed (timeout or cancellation).
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
        }
    }
}

/// The line that says what happened: the agent's last `ERROR`/`Failed` line, else its last line
/// of output, else its last stderr line that is not a Python warning.
pub fn verdict(stdout: &str, stderr: &str) -> String {
    let lines = |s: &str| {
        s.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (out, err) = (lines(stdout), lines(stderr));
    let is_error = |l: &&String| l.starts_with("ERROR") || l.starts_with("Failed");
    err.iter()
        .chain(&out)
        .rfind(is_error)
        .or_else(|| out.last())
        .or_else(|| {
            err.iter()
                .rfind(|l| !l.contains("Warning") && !l.starts_with("import "))
        })
        .cloned()
        .unwrap_or_else(|| "no output".into())
}

/// Replaces every secret value in `text`.
pub(crate) fn scrub(text: &str, secrets: &BTreeSet<String>) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_line_wins_over_warnings() {
        let stderr = "/usr/sbin/fence_ipmilan:12: DeprecationWarning: 'pipes' is deprecated\n  import pipes\n\
                      2026-11-22 ERROR: Failed: Unable to obtain correct plug status\n";
        assert_eq!(
            verdict("", stderr),
            "2026-11-22 ERROR: Failed: Unable to obtain correct plug status"
        );
        assert_eq!(verdict("Status: OFF\n", ""), "Status: OFF");
        assert_eq!(verdict("", "DeprecationWarning: x\n"), "no output");
    }

    #[test]
    fn secrets_never_survive_scrubbing() {
        let secrets = BTreeSet::from(["n0tPassword".to_owned()]);
        assert_eq!(
            scrub("login ansible/n0tPassword failed", &secrets),
            "login ansible/*** failed"
        );
    }

    fn script(dir: &std::path::Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("test setup");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("test setup");
    }

    #[tokio::test]
    async fn a_hung_agent_and_its_children_are_killed_at_the_timeout() {
        let dir = std::env::temp_dir().join(format!("nodemedic-agent-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test setup");
        let marker = dir.join("child.pid");
        script(
            &dir,
            "fence_hang",
            &format!("sleep 300 & echo $! > {}\nwait", marker.display()),
        );
        let agents = Agents::new(&dir);
        let attempt = agents
            .attempt(
                "fence_hang",
                "action=status\n",
                &BTreeSet::new(),
                Duration::from_millis(500),
            )
            .await;
        assert!(attempt.timed_out, "{attempt:?}");
        let child: i32 = std::fs::read_to_string(&marker)
            .expect("test setup")
            .trim()
            .parse()
            .expect("test setup");
        // The grandchild is gone (or a zombie of init's): signal 0 fails or the process is dead.
        let deadline = Instant::now() + Duration::from_secs(5);
        while nix::sys::signal::kill(Pid::from_raw(child), None).is_ok() {
            let state = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            if state.contains(") Z") || state.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "child {child} survived the timeout");
            std::thread::yield_now();
        }
        std::fs::remove_dir_all(&dir).expect("test setup");
    }

    #[tokio::test]
    async fn options_arrive_on_stdin_and_the_exit_code_is_kept() {
        let dir = std::env::temp_dir().join(format!("nodemedic-agent-stdin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test setup");
        script(&dir, "fence_echo", "cat >&2; echo \"argv:$#\"; exit 2");
        let agents = Agents::new(&dir);
        let secrets = BTreeSet::from(["s3cret".to_owned()]);
        let attempt = agents
            .attempt("fence_echo", "password=s3cret\n", &secrets, Duration::from_secs(5))
            .await;
        assert_eq!(attempt.exit_code, Some(2), "{attempt:?}");
        assert_eq!(attempt.message, "argv:0");
        assert!(agents.path("fence_missing").is_err());
        assert!(agents.path("../fence_echo").is_err());
        std::fs::remove_dir_all(&dir).expect("test setup");
    }
}
