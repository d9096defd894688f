//! The lab's processes: spawned in their own process group (optionally inside a node's network
//! namespace), logged to a file each, and recorded on disk so a lab whose owner died can be
//! swept at the next start.

use std::{
    fs::OpenOptions,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use nix::{
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};

use crate::{Error, Result, error::io};

/// How to (re)start one process.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Run inside this network namespace (a node's).
    pub netns: Option<String>,
    /// Bytes written to the process's standard input at start (then closed).
    pub stdin: Option<String>,
    /// Run after the process is killed: what its kill does not reach (a container's own session).
    pub after_kill: Option<(String, Vec<String>)>,
    /// It moves itself into a cgroup of its own (a real node's boot): the lab's CPU share
    /// ([`crate::cpu_share`]) must not take it back.
    pub(crate) joins_own_cgroup: bool,
}

impl ProcessSpec {
    pub fn new(program: impl Into<PathBuf>, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            netns: None,
            stdin: None,
            after_kill: None,
            joins_own_cgroup: false,
        }
    }

    pub(crate) fn joining_its_own_cgroup(mut self) -> Self {
        self.joins_own_cgroup = true;
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

pub(crate) struct Supervised {
    pub name: String,
    pub spec: ProcessSpec,
    pub log: PathBuf,
    pid_file: PathBuf,
    /// The node's sysrq trigger, for a `<node>/<name>` process.
    sysrq_trigger: Option<PathBuf>,
    child: Option<Child>,
    /// Where this run's output starts in the log.
    log_start: u64,
    /// The lab's id (its directory's name), whose CPU share the process runs in.
    lab: Option<String>,
}

impl Supervised {
    pub(crate) fn new(name: &str, spec: ProcessSpec, dir: &Path) -> Self {
        let file = name.replace('/', "_");
        let sysrq_trigger = name
            .split_once('/')
            .map(|(node, _)| crate::sysrq::trigger_file(dir, node));
        Self {
            name: name.to_owned(),
            spec,
            log: dir.join("logs").join(format!("{file}.log")),
            pid_file: dir.join("pids").join(&file),
            sysrq_trigger,
            child: None,
            log_start: 0,
            lab: dir.file_name().map(|n| n.to_string_lossy().into_owned()),
        }
    }

    pub(crate) fn start(&mut self) -> Result<()> {
        if self.running() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(format!("opening {}", self.log.display())))?;
        self.log_start = log.metadata().map_or(0, |m| m.len());
        let log_err = log.try_clone().map_err(io("duplicating a log handle"))?;
        let mut command = match &self.spec.netns {
            Some(ns) => {
                // Fails closed: nothing runs in a node without the sysrq guard.
                let trigger = self.sysrq_trigger.as_deref().ok_or_else(|| {
                    Error::Invalid(format!(
                        "{}: a process in a node's namespace is named <node>/<name>, for its sysrq guard",
                        self.name
                    ))
                })?;
                crate::sysrq::prepare(trigger)?;
                let mut c = Command::new("ip");
                c.args(crate::sysrq::netns_exec(ns, trigger)).arg(&self.spec.program);
                c
            }
            None => Command::new(&self.spec.program),
        };
        command
            .args(&self.spec.args)
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.spec.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(log)
            .stderr(log_err)
            // Its own group, so a kill reaches whatever it forks too.
            .process_group(0);
        let mut child = command.spawn().map_err(|e| Error::Command {
            command: format!("{} {}", self.spec.program.display(), self.spec.args.join(" ")),
            detail: e.to_string(),
        })?;
        if !self.spec.joins_own_cgroup
            && let Some(lab) = self.lab.as_deref()
            && let Err(error) = crate::cpu_share::place(lab, child.id())
        {
            tracing::warn!(process = %self.name, %error, "it runs outside the lab's CPU share");
        }
        if let (Some(input), Some(mut pipe)) = (&self.spec.stdin, child.stdin.take()) {
            use std::io::Write;
            pipe.write_all(input.as_bytes())
                .map_err(io("writing a process's stdin"))?;
        }
        std::fs::write(
            &self.pid_file,
            format!("{}\n{}\n", child.id(), self.spec.program.display()),
        )
        .map_err(io("recording a pid"))?;
        self.child = Some(child);
        Ok(())
    }

    /// The node a `<node>/<process>` belongs to.
    pub(crate) fn node(&self) -> Option<&str> {
        self.name.split_once('/').map(|(node, _)| node)
    }

    pub(crate) fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// How this run ended; `None` while it runs, or once a kill took its child away.
    pub(crate) fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok()?
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL the whole group and reap it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = kill(pid, Signal::SIGKILL);
            let _ = child.wait();
        }
        if let Some((program, args)) = &self.spec.after_kill {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::cmd::run_quietly(program, &args);
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }

    /// Signals the whole group (e.g. SIGSTOP: a process that no longer answers).
    pub(crate) fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child {
            let _ = killpg(Pid::from_raw(child.id() as i32), signal);
        }
    }

    /// Reaps the child if it died on its own (a powered-off node's processes were killed by pid).
    pub(crate) fn reap(&mut self) {
        if let Some(child) = self.child.as_mut()
            && matches!(child.try_wait(), Ok(Some(_)))
        {
            self.child = None;
            let _ = std::fs::remove_file(&self.pid_file);
        }
    }

    /// Whether this run exited on its own with kwok 0.8's startup race: easycel's type cache, a Go
    /// map, written by two goroutines building their CEL environments at once (`fatal error:
    /// concurrent map writes`). A kill or a power-off is never taken for it.
    pub(crate) fn died_of_kwok_startup_race(&mut self) -> bool {
        let exited = self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if !exited {
            return false;
        }
        let output = std::fs::read(&self.log).unwrap_or_default();
        let this_run = String::from_utf8_lossy(output.get(self.log_start as usize..).unwrap_or_default());
        this_run.contains("fatal error: concurrent map writes") && this_run.contains("easycel")
    }

    pub(crate) fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Kills the processes a dead lab recorded under `dir/pids`, checking each pid still runs the
/// recorded program (pids are reused).
pub(crate) fn kill_recorded(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("pids")) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut lines = text.lines();
        let (Some(pid), Some(program)) = (lines.next().and_then(|p| p.parse::<i32>().ok()), lines.next()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(program) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(p: &mut Supervised) {
        for _ in 0..500 {
            if !p.running() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{} still runs", p.name);
    }

    #[test]
    fn only_a_run_that_died_of_the_race_is_taken_for_it() {
        let dir = std::env::temp_dir().join(format!("nodemedic-process-test-{}", std::process::id()));
        for sub in ["logs", "pids"] {
            std::fs::create_dir_all(dir.join(sub)).expect("dirs");
        }
        let race = "echo 'fatal error: concurrent map writes'; echo 'github.com/wzshiming/easycel.getTrait'; exit 2";
        let mut p = Supervised::new("kwok", ProcessSpec::new("sh", ["-c", race]), &dir);
        p.start().expect("start");
        exited(&mut p);
        assert!(p.died_of_kwok_startup_race());

        p.spec = ProcessSpec::new("sh", ["-c", "echo 'panic: something else'; exit 2"]);
        p.start().expect("start again");
        exited(&mut p);
        assert!(!p.died_of_kwok_startup_race(), "an earlier run's output does not count");

        p.spec = ProcessSpec::new("sh", ["-c", &format!("{race}; sleep 60")]);
        p.start().expect("start a third time");
        p.kill();
        assert!(!p.died_of_kwok_startup_race(), "a kill is no race");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
