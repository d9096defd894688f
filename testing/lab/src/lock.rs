//! Which labs run side by side on a machine, and the sweep of whatever a lab whose owner died
//! left behind.
//!
//! A lab on short timings (a node Unknown after 5 s of silence, a 3 s watchdog) needs its
//! processes to run within a second or two of when they ask: a few such labs share a machine,
//! one per core (or as many as a test runner that knows the machine is otherwise idle says) and
//! at most [`MOST_SHORT_TIMINGS_LABS`], each taking one slot. A lab that keeps
//! the CPU busy on its own (a fleet of thousands of nodes, a benchmark) takes every slot, so no
//! short-timings lab runs beside it. A lab whose timings tolerate a busy machine (Kubernetes'
//! defaults: a node is Unknown after 50 s of silence, a watchdog waits a minute) takes one of a
//! few slots of their own beside them: it stalls the others for nothing more than the CPU it uses,
//! and it is idle most of the time (the ten-minute outage tests wait on a stopped API server or
//! etcd); a benchmark takes all of them too. A last lock,
//! held briefly, covers the sweep and the choice of a lab's network, which two labs starting at
//! once must not make together.

use std::{
    fs::File,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use nix::fcntl::{Flock, FlockArg};

use crate::{Result, cmd, error::io, process};

pub(crate) fn labs_root() -> PathBuf {
    PathBuf::from("/tmp/nodemedic-labs")
}

/// Where finished labs' directories are removed, beside the labs' own (one filesystem, so moving
/// one there is a rename).
fn removal_root() -> PathBuf {
    PathBuf::from("/tmp/nodemedic-labs-removing")
}

/// A remover that has not finished after this long was killed with its test run: the sweep
/// finishes its work.
const REMOVAL_GRACE: Duration = Duration::from_secs(600);

/// Removes a finished lab's directory without waiting for it: moved out of the labs' root at
/// once, then removed by a process of its own. A real-node lab's directory holds every node's
/// unpacked images, gigabytes of small files: on a busy disk removing them took minutes, which
/// the test's process spent after its verdict, its lane waiting. Removed in place if it cannot
/// be moved or the remover cannot start.
pub(crate) fn remove_in_background(dir: &Path) {
    let Some(name) = dir.file_name() else {
        return;
    };
    // Named with when it was moved (a rename keeps the directory's own times), for the sweep.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut moved = removal_root().join(name);
    moved.as_mut_os_string().push(format!("-{}-{now}", std::process::id()));
    if std::fs::create_dir_all(removal_root()).is_err() || std::fs::rename(dir, &moved).is_err() {
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    // Its own process group: a test run's Ctrl-C or a lane's kill does not stop it midway.
    let remover = Command::new("rm")
        .args(["-rf", "--one-file-system", "--"])
        .arg(&moved)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    if remover.is_err() {
        let _ = std::fs::remove_dir_all(&moved);
    }
}

/// Finishes the removals whose remover died (see [`remove_in_background`]).
fn sweep_removals() {
    for entry in std::fs::read_dir(removal_root()).into_iter().flatten().flatten() {
        let moved_at = entry
            .file_name()
            .to_string_lossy()
            .rsplit('-')
            .next()
            .and_then(|secs| secs.parse::<u64>().ok())
            .map(|secs| std::time::UNIX_EPOCH + Duration::from_secs(secs));
        // A name it cannot read is not one of its own: stale at once.
        let stale = moved_at
            .and_then(|at| at.elapsed().ok())
            .is_none_or(|age| age > REMOVAL_GRACE);
        if stale {
            crate::watchdog_device::unmount_under(&entry.path());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// At most this many short-timings labs run at once, however many cores the machine has: each
/// runs a control plane and a few nodes, and many at once contend for memory and disk instead.
pub(crate) const MOST_SHORT_TIMINGS_LABS: usize = 4;

/// The kind of lab a lock admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabKind {
    /// Short timings: takes one of the short-timings slots.
    ShortTimings,
    /// Short timings and busy enough to starve another: takes every short-timings slot.
    ShortTimingsAlone,
    /// Timings that tolerate seconds of stall: takes one of the [`TOLERANT_SLOTS`], and may run
    /// beside short-timings labs.
    Tolerant,
    /// Keeps every other lab on tolerant timings off the machine: takes every tolerant slot.
    TolerantAlone,
}

impl LabKind {
    /// What a lab of this kind waits for, in the log line that says it waits.
    fn waits_for(self) -> &'static str {
        match self {
            Self::ShortTimings => "every slot for a short-timings lab is taken on this machine",
            Self::ShortTimingsAlone => "other labs on short timings are running on this machine",
            Self::Tolerant => "every slot for a lab on Kubernetes' default timings is taken on this machine",
            Self::TolerantAlone => "other labs on Kubernetes' default timings are running on this machine",
        }
    }
}

/// Names how many short-timings labs run at once instead of one per core: a test runner that
/// knows the machine's other work has ended (scripts/lab-tests.py `--grow`) lets more labs in.
const SHORT_TIMINGS_SLOTS_VAR: &str = "NODEMEDIC_LAB_SHORT_TIMINGS_SLOTS";
/// Names a file that holds that count instead, read again while a lab waits for a slot: a runner
/// that adds lanes rewrites it, and a test started before sees the new slots. With the count in
/// its environment, a test started as the third lane was added waited 7 minutes for one of the
/// two slots it knew while the third was free (ci-20261206T231226Z).
const SHORT_TIMINGS_SLOTS_FILE_VAR: &str = "NODEMEDIC_LAB_SHORT_TIMINGS_SLOTS_FILE";

/// How many short-timings labs this machine runs at once: one per core, or as many as the file
/// [`SHORT_TIMINGS_SLOTS_FILE_VAR`] names or else [`SHORT_TIMINGS_SLOTS_VAR`] says; at most
/// [`MOST_SHORT_TIMINGS_LABS`] either way.
pub(crate) fn short_timings_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let from_file = std::env::var(SHORT_TIMINGS_SLOTS_FILE_VAR)
        .ok()
        .and_then(|path| std::fs::read_to_string(path).ok());
    let asked = from_file.or_else(|| std::env::var(SHORT_TIMINGS_SLOTS_VAR).ok());
    slots_for(cores, asked.as_deref())
}

/// A value that is not a count is ignored (one slot per core), so a typo cannot let every lab in.
fn slots_for(cores: usize, asked: Option<&str>) -> usize {
    asked
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(cores)
        .clamp(1, MOST_SHORT_TIMINGS_LABS)
}

fn slot_file(slot: usize) -> String {
    match slot {
        0 => "/run/nodemedic/lab.lock".to_owned(),
        n => format!("/run/nodemedic/lab-{}.lock", n + 1),
    }
}

/// Labs on tolerant timings that run at once: idle most of the time (the outage tests wait on a
/// stopped API server or etcd), two cost the short-timings labs beside them little CPU, and the
/// two ten-minute outages run side by side instead of one after the other.
const TOLERANT_SLOTS: usize = 2;

fn tolerant_slot_file(slot: usize) -> String {
    match slot {
        0 => "/run/nodemedic/lab-tolerant.lock".to_owned(),
        n => format!("/run/nodemedic/lab-tolerant-{}.lock", n + 1),
    }
}

/// Held for the lab's whole life: the locks of each kind the lab counts as.
pub(crate) struct LabLock {
    _locks: Vec<Flock<File>>,
}

impl LabLock {
    pub(crate) async fn acquire(kinds: &[LabKind]) -> Result<Self> {
        let mut locks = Vec::new();
        for &kind in kinds {
            match kind {
                LabKind::ShortTimings => locks.push(any_slot(kind, short_timings_slots, slot_file).await?),
                LabKind::Tolerant => locks.push(any_slot(kind, || TOLERANT_SLOTS, tolerant_slot_file).await?),
                // Every slot in the one order every lab takes them, so two never wait on each
                // other; every slot there can be, not only those this process counts, so a lab
                // started with more slots (SHORT_TIMINGS_SLOTS_VAR) never runs beside this one.
                LabKind::ShortTimingsAlone => {
                    for slot in 0..MOST_SHORT_TIMINGS_LABS {
                        locks.push(lock(slot_file(slot), kind.waits_for()).await?);
                    }
                }
                LabKind::TolerantAlone => {
                    for slot in 0..TOLERANT_SLOTS {
                        locks.push(lock(tolerant_slot_file(slot), kind.waits_for()).await?);
                    }
                }
            }
        }
        Ok(Self { _locks: locks })
    }
}

/// The first free one of `slots()` slots (`file` names each, the count asked again at each look),
/// waiting for one when all are taken.
async fn any_slot(kind: LabKind, slots: fn() -> usize, file: fn(usize) -> String) -> Result<Flock<File>> {
    let mut said = false;
    loop {
        for slot in 0..slots() {
            if let Some(lock) = try_lock(&file(slot))? {
                return Ok(lock);
            }
        }
        if !said {
            tracing::info!(
                "{}; waiting for one to finish (`nodemedic-lab down` stops a lab started by hand)",
                kind.waits_for()
            );
            said = true;
        }
        // A lab holds its slot for tens of seconds at least: polling costs nothing that matters.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn open_lock_file(path: &str) -> Result<File> {
    std::fs::create_dir_all("/run/nodemedic").map_err(io("creating /run/nodemedic"))?;
    File::create(path).map_err(io(format!("opening {path}")))
}

/// The lock on `path`, or none when another process holds it.
fn try_lock(path: &str) -> Result<Option<Flock<File>>> {
    match Flock::lock(open_lock_file(path)?, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(crate::Error::Io {
            what: format!("locking {path}"),
            source: e.into(),
        }),
    }
}

/// Held while a starting lab sweeps and claims its directory and network, not longer.
pub(crate) struct SetupLock {
    _lock: Flock<File>,
}

impl SetupLock {
    pub(crate) async fn acquire() -> Result<Self> {
        lock(
            "/run/nodemedic/lab-setup.lock".to_owned(),
            "another lab is being set up",
        )
        .await
        .map(|lock| Self { _lock: lock })
    }
}

async fn lock(path: String, waiting: &'static str) -> Result<Flock<File>> {
    tokio::task::spawn_blocking(move || {
        let file = open_lock_file(&path)?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((file, _)) => file,
        };
        tracing::info!("{waiting}; waiting for it to finish (`nodemedic-lab down` stops a lab started by hand)");
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| crate::Error::Io {
            what: format!("locking {path}"),
            source: e.into(),
        })
    })
    .await
    .map_err(|e| crate::Error::Invalid(format!("lock task failed: {e}")))?
}

fn alive(pid: i32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// Removes the processes, namespaces, bridges and tmpfs of labs whose owner process is gone.
/// Runs under the [`SetupLock`], under which every lab records its owner before anything else,
/// so no live lab is touched.
pub(crate) fn sweep() {
    sweep_removals();
    let Ok(entries) = std::fs::read_dir(labs_root()) else {
        return;
    };
    let mut kept = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let id = entry.file_name().to_string_lossy().into_owned();
        let owner = std::fs::read_to_string(dir.join("owner.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if owner.is_some_and(alive) {
            continue;
        }
        // A killed lab's device mounts outlive their server; nothing under them can be removed.
        crate::watchdog_device::unmount_under(&dir);
        if !dir.join("torn-down").exists() {
            tracing::warn!(lab = %id, "cleaning up after a lab whose owner died");
            process::kill_recorded(&dir);
            kill_real_nodes(&id);
            remove_network(&id);
            let shm = std::path::PathBuf::from(format!("/dev/shm/nodemedic-{id}"));
            crate::container::Containers::new(&shm, &id).remove_all();
            let _ = std::fs::remove_dir_all(&shm);
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            kept.push(dir);
        }
    }
    // Logs of failed runs are kept for reading; the newest few are enough.
    kept.sort_by_key(|d| std::fs::metadata(d).and_then(|m| m.modified()).ok());
    let excess = kept.len().saturating_sub(5);
    for old in kept.into_iter().take(excess) {
        let _ = std::fs::remove_dir_all(old);
    }
    // Real nodes' processes (their pods too) of labs whose directory is gone altogether.
    for id in crate::real_node::cgroup::labs() {
        if !labs_root().join(&id).exists() {
            kill_real_nodes(&id);
        }
    }
    // Namespaces and bridges of labs whose directory is gone altogether.
    if let Ok(list) = cmd::run("ip", &["netns", "list"]) {
        for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if let Some(id) = lab_id_of(ns)
                && !labs_root().join(&id).exists()
            {
                cmd::run_quietly("ip", &["netns", "del", ns]);
            }
        }
    }
    if let Ok(list) = cmd::run("ip", &["-o", "link", "show", "type", "bridge"]) {
        for name in list.lines().filter_map(|l| l.split(':').nth(1)).map(str::trim) {
            if let Some(id) = lab_id_of(name)
                && !labs_root().join(&id).exists()
            {
                cmd::run_quietly("ip", &["link", "del", name]);
            }
        }
    }
}

/// Every process of the lab's real nodes, found by their cgroup: their pods are in neither the
/// lab's process records nor its namespaces.
fn kill_real_nodes(id: &str) {
    if let Err(error) = crate::real_node::cgroup::kill(&crate::real_node::cgroup::lab_path(id)) {
        tracing::warn!(lab = %id, %error, "stopping a dead lab's real nodes failed");
    }
}

fn remove_network(id: &str) {
    if let Ok(list) = cmd::run("ip", &["netns", "list"]) {
        for ns in list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|ns| ns.starts_with(&format!("nm{id}-")))
        {
            for pid in cmd::run("ip", &["netns", "pids", ns])
                .unwrap_or_default()
                .split_whitespace()
            {
                cmd::run_quietly("kill", &["-9", pid]);
            }
            cmd::run_quietly("ip", &["netns", "del", ns]);
        }
    }
    cmd::run_quietly("ip", &["link", "del", &format!("nm{id}")]);
    cmd::run_quietly("ip", &["link", "del", &format!("nm{id}m")]);
}

/// `nm<4 hex>-...` or `nm<4 hex>` / `nm<4 hex>m` -> the lab id.
fn lab_id_of(name: &str) -> Option<String> {
    let rest = name.strip_prefix("nm")?;
    let id = rest.get(..4)?;
    let tail = &rest[4..];
    (id.chars().all(|c| c.is_ascii_hexdigit()) && (tail.is_empty() || tail == "m" || tail.starts_with('-')))
        .then(|| id.to_owned())
}

/// A live lab's directory for a unit test that makes a lab's cgroups without a lab: while it
/// exists a lab starting meanwhile (CI runs lab tests beside the unit tests) does not sweep them
/// away as a dead lab's. Removed on drop.
#[cfg(test)]
pub(crate) struct LiveLabDir(PathBuf);

#[cfg(test)]
impl LiveLabDir {
    pub(crate) fn new(lab: &str) -> Self {
        let dir = labs_root().join(lab);
        std::fs::create_dir_all(&dir).expect("the lab's directory");
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string()).expect("owner.pid");
        Self(dir)
    }
}

#[cfg(test)]
impl Drop for LiveLabDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn recognises_only_lab_names() {
        assert_eq!(super::lab_id_of("nm3fa2-node-1").as_deref(), Some("3fa2"));
        assert_eq!(super::lab_id_of("nm3fa2m").as_deref(), Some("3fa2"));
        assert_eq!(super::lab_id_of("nm3fa2").as_deref(), Some("3fa2"));
        assert_eq!(super::lab_id_of("nmzzzz"), None);
        assert_eq!(super::lab_id_of("eth0"), None);
        assert_eq!(super::lab_id_of("nm3fa2v1"), None);
    }

    #[test]
    fn a_runner_may_let_more_labs_in_than_cores_but_never_more_than_the_most() {
        assert_eq!(super::slots_for(2, None), 2);
        assert_eq!(super::slots_for(2, Some("3")), 3);
        assert_eq!(super::slots_for(2, Some("9")), super::MOST_SHORT_TIMINGS_LABS);
        assert_eq!(super::slots_for(16, None), super::MOST_SHORT_TIMINGS_LABS);
        assert_eq!(super::slots_for(2, Some("0")), 1);
        assert_eq!(super::slots_for(2, Some("three")), 2);
    }
}
