//! The guard of the software reboot. Every process the lab starts inside a node's network
//! namespace runs with a lab-owned regular file bind-mounted over `/proc/sysrq-trigger` in its
//! own mount namespace (`ip netns exec` gives each command one, a slave of the host's, so the
//! mount never reaches the host). A `b` written there is the node's software reboot: the lab
//! power-cycles the node, never the host.
//!
//! The guard fails closed: a process whose bind mount cannot be made, or does not show the lab's
//! file afterwards, is not started. The one exception is a kernel built without sysrq
//! (`CONFIG_MAGIC_SYSRQ` off: no `/proc/sysrq-trigger` and no `/proc/sys/kernel/sysrq`), where
//! there is nothing to reach and nothing to mount over (procfs cannot create the file, nor be
//! overlaid); there a software reboot from a node cannot be caught.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::task::JoinHandle;

use crate::{Error, Lab, Result, cmd, error::io, lab::Inner, timeline::Event};

/// The kernel's trigger, which the guard covers.
pub const SYSRQ_TRIGGER: &str = "/proc/sysrq-trigger";

/// What the guard says on standard error when it refuses to start a process.
const REFUSAL: &str = "nodemedic lab: refusing to start";

/// `sh -c` script: `$1` the path to cover, `$2` the lab's file, then the program and its arguments.
const GUARD: &str = r#"target=$1 trigger=$2
shift 2
refuse() { echo "nodemedic lab: refusing to start $program: $*" >&2; exit 125; }
program=$1
if [ -e "$target" ]; then
    mount --bind "$trigger" "$target" || refuse "cannot bind-mount $trigger over $target"
    [ "$(stat -L -c %d:%i -- "$target")" = "$(stat -L -c %d:%i -- "$trigger")" ] ||
        refuse "$target is not $trigger after the bind mount"
elif [ -e /proc/sys/kernel/sysrq ] || [ "$(stat -f -c %T /proc)" != proc ]; then
    refuse "$target is missing, yet the kernel may have sysrq"
fi
exec "$@""#;

/// The lab's file that stands for the node's `/proc/sysrq-trigger`.
pub(crate) fn trigger_file(dir: &Path, node: &str) -> PathBuf {
    dir.join("nodes").join(format!("{node}.sysrq-trigger"))
}

/// Creates the node's trigger file if it is not there (root-only, like the kernel's).
pub(crate) fn prepare(trigger: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(trigger)
        .map(drop)
        .map_err(io(format!("creating {}", trigger.display())))
}

/// `ip` arguments that run a program (appended by the caller) in `ns` behind the guard.
pub(crate) fn netns_exec(ns: &str, trigger: &Path) -> Vec<String> {
    guarded(ns, SYSRQ_TRIGGER, trigger)
}

fn guarded(ns: &str, target: &str, trigger: &Path) -> Vec<String> {
    [
        "netns",
        "exec",
        ns,
        "/bin/sh",
        "-c",
        GUARD,
        "nodemedic-lab-guard",
        target,
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([trigger.display().to_string()])
    .collect()
}

/// Runs `program args` in `ns` behind the guard; whether it succeeded. A refusal of the guard is
/// an error, not a failure of the program.
pub(crate) fn exec(ns: &str, trigger: &Path, program: &str, args: &[&str]) -> Result<bool> {
    prepare(trigger)?;
    let mut all = netns_exec(ns, trigger);
    all.push(program.to_owned());
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    match cmd::run("ip", &all) {
        Ok(_) => Ok(true),
        Err(Error::Command { command, detail }) if detail.contains(REFUSAL) => Err(Error::Command { command, detail }),
        Err(_) => Ok(false),
    }
}

/// How often the nodes' trigger files are looked at: a real sysrq `b` is immediate, and the
/// writer should not outlive it by much.
const POLL: Duration = Duration::from_millis(20);

/// Watches every node's trigger file and power-cycles the node whose file gets a `b`.
pub(crate) fn watch(inner: Arc<Inner>) -> Result<JoinHandle<()>> {
    if !Path::new(SYSRQ_TRIGGER).exists() {
        tracing::info!("this kernel has no sysrq: a software reboot from a node cannot be caught");
    }
    for node in inner.nodes.names() {
        prepare(&trigger_file(&inner.resources.dir, &node))?;
    }
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        loop {
            tick.tick().await;
            // The nodes of this moment: nodes join and leave a running lab.
            for node in inner.nodes.names() {
                let file = trigger_file(&inner.resources.dir, &node);
                if std::fs::metadata(&file).is_ok_and(|m| m.len() > 0) {
                    take_commands(&inner, &node, &file);
                }
            }
        }
    }))
}

/// Reads and empties the node's trigger; a `b` among the commands reboots the node. As the
/// kernel's trigger, only the first byte is a command unless the write starts with `_`.
fn take_commands(inner: &Arc<Inner>, node: &str, file: &Path) {
    let written = std::fs::read(file).unwrap_or_default();
    if written.is_empty() {
        return;
    }
    if let Err(error) = std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .and_then(|f| f.set_len(0))
    {
        tracing::warn!(%error, %node, "emptying the node's sysrq trigger failed");
    }
    let commands = match written.split_first() {
        Some((b'_', rest)) => rest,
        _ => &written[..1],
    };
    if !commands.contains(&b'b') {
        inner.timeline.note(format!(
            "node {node}: sysrq {:?} ignored (the lab acts only on b)",
            String::from_utf8_lossy(commands)
        ));
        return;
    }
    inner.timeline.record(Event::SoftwareReboot { node: node.to_owned() });
    tracing::info!(%node, "software reboot (sysrq b): power-cycling the node");
    let inner = inner.clone();
    let node = node.to_owned();
    tokio::spawn(async move {
        if let Err(error) = inner.power_off(&node, "software-reboot") {
            tracing::warn!(%error, %node, "software reboot power-off failed");
        }
        if let Err(error) = inner.power_on(&node, "software-reboot").await {
            tracing::warn!(%error, %node, "software reboot power-on failed");
        }
    });
}

impl Lab {
    /// The lab's file bind-mounted over `/proc/sysrq-trigger` for every process of the node: a
    /// `b` written to it power-cycles the node.
    pub fn sysrq_trigger_path(&self, node: &str) -> PathBuf {
        trigger_file(self.dir(), node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard's own mechanics in a private mount namespace, on a stand-in target (never the
    /// kernel's trigger): bound, checked, and nothing started when the bind cannot be made.
    #[test]
    fn the_guard_binds_the_file_over_the_target_or_refuses_to_start() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("nodemedic-guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (target, trigger) = (dir.join("target"), dir.join("trigger"));
        std::fs::write(&target, "").expect("target");
        prepare(&trigger).expect("trigger");
        let run = |trigger: &Path, script: &str| {
            let args = guarded("unused", &target.display().to_string(), trigger);
            std::process::Command::new("unshare")
                .args(["--mount", "--propagation", "slave", "/bin/sh", "-c", GUARD])
                .args(&args[6..])
                .args(["/bin/sh", "-c", script])
                .output()
                .expect("unshare")
        };
        let same = format!(
            r#"[ "$(stat -c %d:%i {})" = "$(stat -c %d:%i {})" ] && grep -q " {} " /proc/self/mountinfo"#,
            target.display(),
            trigger.display(),
            target.display()
        );
        let out = run(&trigger, &same);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = run(&dir.join("missing"), "echo started");
        assert_eq!(out.status.code(), Some(125));
        assert!(out.stdout.is_empty(), "the program must not start");
        assert!(String::from_utf8_lossy(&out.stderr).contains(REFUSAL));
        assert_eq!(
            std::fs::read(&target).expect("target"),
            b"",
            "the host's target untouched"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
