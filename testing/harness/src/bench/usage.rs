//! A process's memory and CPU from procfs text. Parsing is pure; [`sample`] reads the files.

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
    fn this_process_can_be_sampled() {
        let me = sample(std::process::id()).expect("own procfs");
        assert!(me.rss_kib > 0 && me.peak_rss_kib >= me.rss_kib);
    }
}
