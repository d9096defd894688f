//! A process's memory and CPU from procfs text. Parsing is pure; [`sample`] reads the files.

use std::{
    path::Path,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use serde::Serialize;

/// Clock ticks per second of `/proc/<pid>/stat` times: 100 on every Linux this runs on.
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Resident set now (KiB).
    pub rss_kib: u64,
    /// Peak resident set since the process started (KiB).
    pub peak_rss_kib: u64,
    /// Of the resident set: anonymous memory (heap, stacks), the part the process allocated.
    pub anon_kib: u64,
    /// User and system CPU since the process started (seconds).
    pub cpu_seconds: f64,
}

/// Parses `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn parse(status: &str, stat: &str) -> Option<Usage> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(Usage {
        rss_kib: field("VmRSS:")?,
        peak_rss_kib: field("VmHWM:")?,
        anon_kib: field("RssAnon:").unwrap_or(0),
        cpu_seconds: (ticks(11)? + ticks(12)?) as f64 / TICKS_PER_SECOND,
    })
}

/// Reads a running process's usage.
pub fn sample(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(&status, &stat)
}

/// CPU between two samples as millicores over `seconds` of wall time.
pub fn millicores(before: &Usage, after: &Usage, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    (after.cpu_seconds - before.cpu_seconds).max(0.0) / seconds * 1000.0
}

/// The most memory any process running `executable` below this one had while watched, sampled
/// every 100 ms from a thread of its own. Below this one: the lab starts its processes as this
/// process's children, and labs beside it (CI runs a few at once) run the same executables. The kernel keeps a peak only of the whole resident set (VmHWM), and
/// for a debug build most of that is its executable's pages: the allocated part (RssAnon) is what
/// a change of the code's data can move, and only sampling finds its peak. Processes that start
/// while watched (an agent after its node's reboot) are found as they appear.
pub struct PeakWatch {
    stop: Arc<AtomicBool>,
    peak: Arc<Mutex<Peak>>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

/// What [`PeakWatch`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Peak {
    /// The largest allocated memory (RssAnon) any one process had (KiB).
    pub anon_kib: u64,
    /// The largest resident set any one process had (VmHWM, KiB).
    pub rss_kib: u64,
    /// How many processes below this one ran the executable while watched.
    pub processes: usize,
}

const PEAK_SAMPLING: std::time::Duration = std::time::Duration::from_millis(100);

impl PeakWatch {
    pub fn start(executable: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(Mutex::new(Peak::default()));
        // /proc/<pid>/exe names the executable by its canonical path.
        let executable = std::fs::canonicalize(executable).unwrap_or_else(|_| executable.to_path_buf());
        let (stopped, found) = (stop.clone(), peak.clone());
        let watcher = std::process::id();
        let sampler = std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !stopped.load(Ordering::Relaxed) {
                for pid in running(&executable)
                    .into_iter()
                    .filter(|&pid| descends_from(pid, watcher))
                {
                    if let Some(usage) = sample(pid) {
                        seen.insert(pid);
                        let mut peak = found.lock().unwrap_or_else(PoisonError::into_inner);
                        peak.anon_kib = peak.anon_kib.max(usage.anon_kib);
                        peak.rss_kib = peak.rss_kib.max(usage.peak_rss_kib);
                        peak.processes = seen.len();
                    }
                }
                std::thread::sleep(PEAK_SAMPLING);
            }
        });
        Self {
            stop,
            peak,
            sampler: Some(sampler),
        }
    }

    /// The peaks so far.
    pub fn so_far(&self) -> Peak {
        *self.peak.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops watching; the peaks.
    pub fn stop(mut self) -> Peak {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
        self.so_far()
    }
}

impl Drop for PeakWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The processes running `executable` now.
fn running(executable: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| runs(&exe, executable)))
        .collect()
}

/// Whether process `pid` is `ancestor` or runs below it.
fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut current = pid;
    // Deeper than any lab's process tree; also ends a walk that races a pid's reuse.
    for _ in 0..16 {
        if current == ancestor {
            return true;
        }
        match std::fs::read_to_string(format!("/proc/{current}/stat"))
            .ok()
            .and_then(|stat| parent_in(&stat))
        {
            Some(parent) if parent > 1 => current = parent,
            _ => return false,
        }
    }
    false
}

/// The parent's pid in a `/proc/<pid>/stat` line: the field after the state.
fn parent_in(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process whose `/proc/<pid>/exe` is `exe` runs `executable`, also when the file was
/// replaced since it started (a rebuild: the kernel then adds " (deleted)").
fn runs(exe: &Path, executable: &Path) -> bool {
    let exe = exe.as_os_str().to_string_lossy();
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
    Path::new(exe) == executable
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str =
        "Name:\tnodemedic\nVmHWM:\t   30000 kB\nVmRSS:\t   21720 kB\nRssAnon:\t    1628 kB\nRssFile:\t   20092 kB\n";
    const STAT: &str = "4242 (node medic (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 4 0 100 1000 500";

    #[test]
    fn reads_memory_and_cpu_even_with_odd_command_names() {
        let u = parse(STATUS, STAT).expect("parses");
        assert_eq!(u.rss_kib, 21720);
        assert_eq!(u.peak_rss_kib, 30000);
        assert_eq!(u.anon_kib, 1628);
        assert_eq!(u.cpu_seconds, 3.0);
    }

    #[test]
    fn a_process_descends_from_itself_and_its_ancestors_only() {
        assert_eq!(parent_in(STAT), Some(1));
        let me = std::process::id();
        assert!(descends_from(me, me));
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep starts");
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(me, child.id()));
        let _ = kill(child);
    }

    fn kill(mut child: std::process::Child) -> std::io::Result<()> {
        child.kill()?;
        child.wait().map(drop)
    }

    #[test]
    fn millicores_over_a_window() {
        let a = Usage {
            cpu_seconds: 1.0,
            ..Usage::default()
        };
        let b = Usage {
            cpu_seconds: 1.3,
            ..Usage::default()
        };
        assert!((millicores(&a, &b, 60.0) - 5.0).abs() < 1e-9);
        assert_eq!(millicores(&a, &b, 0.0), 0.0);
    }

    #[test]
    fn a_watch_finds_the_processes_of_an_executable_and_their_peaks() {
        let me = std::env::current_exe().expect("own executable");
        let watch = PeakWatch::start(&me);
        std::thread::sleep(PEAK_SAMPLING * 3);
        let peak = watch.stop();
        assert!(peak.processes >= 1, "{peak:?}");
        assert!(peak.anon_kib > 0 && peak.rss_kib >= peak.anon_kib, "{peak:?}");
    }

    #[test]
    fn a_replaced_executable_is_still_recognised() {
        let built = Path::new("/work/target/debug/nodemedic-controller");
        assert!(runs(built, built));
        assert!(runs(
            Path::new("/work/target/debug/nodemedic-controller (deleted)"),
            built
        ));
        assert!(!runs(Path::new("/work/target/debug/nodemedic-agent"), built));
    }

    #[test]
    fn this_process_can_be_sampled() {
        let me = sample(std::process::id()).expect("own procfs");
        assert!(me.rss_kib > 0 && me.peak_rss_kib >= me.rss_kib);
    }
}
