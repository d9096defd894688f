//! A real node's cgroup: `/nodemedic/<lab>/<node>` in every v1 hierarchy (the boot script joins
//! it; the kubelet's `cgroupRoot` is under it, so every pod is too). The machine's power is
//! this subtree: a kubelet, containerd and the shims can die and leave their pods running
//! (reparented to PID 1, in network namespaces of their own), but nothing leaves the subtree.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{Error, Result, error::io};

const HIERARCHIES: &str = "/sys/fs/cgroup";
/// Every lab's nodes are under this cgroup, by lab id (what the stale-lab sweep looks for).
const LABS: &str = "nodemedic";

/// The node's cgroup path, the same in every hierarchy.
pub(crate) fn path(lab: &str, node: &str) -> String {
    format!("/{LABS}/{lab}/{node}")
}

/// A lab's cgroup path, above its nodes'.
pub(crate) fn lab_path(lab: &str) -> String {
    format!("/{LABS}/{lab}")
}

/// The lab ids that have a cgroup on this machine.
/// (A real node's lab has one in the freezer hierarchy, every lab one in the cpu hierarchy:
/// [`crate::cpu_share`].)
pub(crate) fn labs() -> Vec<String> {
    let mut labs: Vec<String> = ["freezer", "cpu"]
        .into_iter()
        .flat_map(|h| std::fs::read_dir(Path::new(HIERARCHIES).join(h).join(LABS)))
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    labs.sort();
    labs.dedup();
    labs
}

/// Each mounted hierarchy's root: the v1 controllers, the named `systemd` one and cgroup2.
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir(HIERARCHIES)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

fn freezer(path: &str) -> PathBuf {
    Path::new(HIERARCHIES)
        .join("freezer")
        .join(path.trim_start_matches('/'))
}

/// Freezes (or thaws) every task of the subtree, as a hung kernel would: the v1 freezer is
/// hierarchical, so the pods' cgroups below freeze too.
pub(crate) fn set_frozen(path: &str, frozen: bool) -> Result<()> {
    let state = freezer(path).join("freezer.state");
    if !state.exists() {
        // Not booted (or powered off): nothing runs to freeze.
        return Ok(());
    }
    let value = if frozen { "FROZEN" } else { "THAWED" };
    std::fs::write(&state, value).map_err(io(format!("writing {value} to {}", state.display())))
}

/// Every process in the subtree (from the freezer hierarchy, which every task is in).
pub(crate) fn pids(path: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let mut dirs = vec![freezer(path)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                dirs.push(entry.path());
            }
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        pids.extend(procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    pids
}

/// Pulls the node's power: freezes the subtree (nothing forks or exits meanwhile), kills every
/// task in it, thaws it so the kills land, waits until it is empty, and removes it from every
/// hierarchy. Overlay, shm and tmpfs mounts go with the node's mount namespace.
pub(crate) fn kill(path: &str) -> Result<()> {
    if !freezer(path).exists() {
        return remove(path);
    }
    set_frozen(path, true)?;
    for pid in pids(path) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    set_frozen(path, false)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = pids(path);
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::Invalid(format!(
                "cgroup {path}: {} processes outlived SIGKILL for 10 s: {left:?}",
                left.len()
            )));
        }
        for pid in left {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    remove(path)
}

/// Removes the (empty) subtree from every hierarchy, deepest first.
pub(crate) fn remove(path: &str) -> Result<()> {
    for root in hierarchies() {
        let top = root.join(path.trim_start_matches('/'));
        if !top.exists() {
            continue;
        }
        let mut dirs = Vec::new();
        let mut queue = vec![top];
        while let Some(dir) = queue.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.path().is_dir() {
                    queue.push(entry.path());
                }
            }
            dirs.push(dir);
        }
        // Children were pushed after their parents.
        for dir in dirs.iter().rev() {
            std::fs::remove_dir(dir).map_err(io(format!("removing cgroup {}", dir.display())))?;
        }
    }
    Ok(())
}
