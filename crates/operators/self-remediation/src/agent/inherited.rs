//! A licence belongs to the node's boot, not to the agent process that earned it. When an agent
//! process dies with its watchdog open, the kernel sends one last keep-alive, and a new process
//! opening the device sends another: a crash loop faster than the watchdog's timeout would keep
//! a node alive for ever. So each process records its licence's end in its state directory, and
//! a process started later in the same boot takes it over: while it lasts it may feed; once it
//! has lapsed the node fences at once.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::time::{ClockId, clock_gettime};
use serde::{Deserialize, Serialize};

/// What an earlier agent process of this boot left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Inherited {
    /// No earlier process in this boot (or nothing readable).
    Nothing,
    /// A licence that lasts until then.
    Until(Instant),
    /// A licence that has lapsed, or a process that was fencing.
    Lapsed,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Record {
    /// Identifies the boot (the kernel's boot_id, or the lab's boot time).
    boot: String,
    /// The licence's end on CLOCK_BOOTTIME, in nanoseconds; none once lapsed or fencing.
    until_ns: Option<u64>,
}

fn path(dir: &Path) -> PathBuf {
    dir.join("licence.json")
}

/// CLOCK_BOOTTIME: shared by every process of the boot, unlike a process's `Instant`s.
fn boot_clock() -> Option<Duration> {
    clock_gettime(ClockId::CLOCK_BOOTTIME).ok().map(Duration::from)
}

/// The boot this process runs in: the lab's boot-time file when given (its nodes share the host's
/// kernel), else the kernel's boot_id.
pub(super) fn boot_key(boot_time_file: Option<&Path>) -> Option<String> {
    let path = boot_time_file.unwrap_or(Path::new("/proc/sys/kernel/random/boot_id"));
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// What the earlier processes of boot `boot` left in `dir`.
pub(super) fn load(dir: &Path, boot: &str) -> Inherited {
    let Some(record) = std::fs::read(path(dir))
        .ok()
        .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
    else {
        return Inherited::Nothing;
    };
    if record.boot != boot {
        return Inherited::Nothing;
    }
    let (Some(until), Some(now)) = (record.until_ns, boot_clock()) else {
        return Inherited::Lapsed;
    };
    match Duration::from_nanos(until).checked_sub(now) {
        Some(left) if !left.is_zero() => Inherited::Until(Instant::now() + left),
        _ => Inherited::Lapsed,
    }
}

/// Records this process's licence (`None`: lapsed or fencing), atomically.
pub(super) fn save(dir: &Path, boot: &str, until: Option<Instant>) -> std::io::Result<()> {
    let until_ns = until.and_then(|until| {
        let left = until.checked_duration_since(Instant::now())?;
        u64::try_from((boot_clock()? + left).as_nanos()).ok()
    });
    let record = Record {
        boot: boot.to_owned(),
        until_ns,
    };
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("licence.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&record).map_err(std::io::Error::other)?)?;
    std::fs::rename(tmp, path(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_process_of_the_same_boot_takes_the_licence_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path(), "boot-1"), Inherited::Nothing);
        let until = Instant::now() + Duration::from_secs(60);
        save(dir.path(), "boot-1", Some(until)).expect("saved");
        match load(dir.path(), "boot-1") {
            Inherited::Until(at) => {
                let off = if at > until { at - until } else { until - at };
                assert!(off < Duration::from_millis(50), "{off:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load(dir.path(), "boot-2"), Inherited::Nothing, "another boot");
    }

    #[test]
    fn a_lapsed_or_fencing_licence_is_inherited_as_lapsed() {
        let dir = tempfile::tempdir().expect("tempdir");
        save(dir.path(), "b", None).expect("saved");
        assert_eq!(load(dir.path(), "b"), Inherited::Lapsed);
        save(dir.path(), "b", Some(Instant::now())).expect("saved");
        assert_eq!(load(dir.path(), "b"), Inherited::Lapsed);
    }
}
