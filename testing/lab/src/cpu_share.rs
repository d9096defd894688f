//! Each lab's share of the machine's CPU: every process the lab supervises (control plane, kwok,
//! agents, controllers, a real node's boot until it joins its node's cgroup) runs in the v1 cpu
//! cgroup `/nodemedic/<lab>/host`, so the CPU it takes is counted as the lab's.
//!
//! Without it a lab's processes competed with every other thread of the machine one for one,
//! while a real-node lab's nodes weigh eight threads (`boot.sh`): when one booted beside a
//! short-timings lab, 91 and 132 tasks became runnable (ci-20261207T074308Z,
//! ci-20261207T064733Z), that lab's API server answered nothing for six seconds, and its agents,
//! unable to read or to reach each other, let their licences run out. Under `/nodemedic` every lab
//! weighs the same, as clusters of machines of their own would.

use std::path::{Path, PathBuf};

use crate::{Result, error::io};

const CPU: &str = "/sys/fs/cgroup/cpu";
/// What `boot.sh` gives each level above a real node, and so every lab's: eight busy threads.
const LAB_CPU_SHARES: &str = "8192";

/// The cgroup a lab's host processes run in, below the lab's own.
pub(crate) fn host_path(lab: &str) -> String {
    format!("{}/host", crate::real_node::cgroup::lab_path(lab))
}

fn dir(path: &str) -> PathBuf {
    Path::new(CPU).join(path.trim_start_matches('/'))
}

/// Makes the lab's cgroup, weighted as every lab's, its processes allowed real-time threads (the
/// agents feed their watchdogs from one). Nothing to do on a machine without a v1 cpu hierarchy.
pub(crate) fn create(lab: &str) -> Result<()> {
    if !Path::new(CPU).join("cgroup.procs").exists() {
        return Ok(());
    }
    let host = dir(&host_path(lab));
    std::fs::create_dir_all(&host).map_err(io(format!("creating cgroup {}", host.display())))?;
    for level in [host.parent(), host.parent().and_then(Path::parent)]
        .into_iter()
        .flatten()
    {
        let shares = level.join("cpu.shares");
        std::fs::write(&shares, LAB_CPU_SHARES).map_err(io(format!("writing {}", shares.display())))?;
    }
    allow_realtime(&host)
}

/// Where the lab's host processes run in the v1 `hierarchy` (mounted under `/sys/fs/cgroup`):
/// the lab's share where it was made (the cpu hierarchy), the hierarchy's root otherwise.
pub(crate) fn home(lab: &str, hierarchy: &str) -> PathBuf {
    let root = Path::new(CPU).with_file_name(hierarchy);
    let share = root.join(host_path(lab).trim_start_matches('/'));
    if share.exists() { share } else { root }
}

/// Moves a process the lab just started into the lab's cgroup (none made: nothing to move into).
pub(crate) fn place(lab: &str, pid: u32) -> Result<()> {
    let procs = dir(&host_path(lab)).join("cgroup.procs");
    if !procs.exists() {
        return Ok(());
    }
    std::fs::write(&procs, pid.to_string()).map_err(io(format!("moving process {pid} into {}", procs.display())))
}

/// Real-time runtime (microseconds per second) for the levels of a lab's cpu cgroups: all labs',
/// each lab's, and each of its own (its host processes', each starved process's). Under
/// CONFIG_RT_GROUP_SCHED a cgroup without any refuses a real-time thread (the agent's watchdog
/// feeder) with EINVAL; each level must hold its children's sum, so eight labs, each with its
/// host processes and five starved ones, fit.
const REALTIME_US: [(usize, u64); 3] = [(3, 480_000), (2, 60_000), (1, 10_000)];

/// Lets the cpu cgroup `dir` (`.../nodemedic/<lab>/<part>`) and the two levels above it take
/// real-time threads, as a kernel without real-time group scheduling lets any cgroup: a CPU
/// quota then throttles a starved process's ordinary threads and not its watchdog feeder.
pub(crate) fn allow_realtime(dir: &std::path::Path) -> Result<()> {
    for (up, runtime) in REALTIME_US {
        let Some(level) = dir.ancestors().nth(up - 1) else {
            continue;
        };
        let file = level.join("cpu.rt_runtime_us");
        if !file.exists() {
            // A kernel without real-time group scheduling: nothing to allow.
            return Ok(());
        }
        let current: u64 = std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if current < runtime {
            std::fs::write(&file, runtime.to_string())
                .map_err(io(format!("writing {runtime} to {}", file.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup a process is in, in the cpu hierarchy.
    fn cpu_cgroup_of(pid: u32) -> Option<String> {
        let table = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        table.lines().find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers.split(',').any(|c| c == "cpu").then(|| path.to_owned())
        })
    }

    /// Needs root, as every lab does.
    #[test]
    fn a_started_process_runs_in_its_lab_s_share_and_may_run_in_real_time() {
        let lab = format!("unit-{}-share", std::process::id());
        let _live = crate::lock::LiveLabDir::new(&lab);
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("sleep");
        create(&lab).expect("the lab's cgroup");
        let placed = place(&lab, child.id());
        let cgroup = cpu_cgroup_of(child.id());
        // As an agent's watchdog feeder asks for real time.
        let realtime = std::process::Command::new("chrt")
            .args(["--fifo", "--pid", "1", &child.id().to_string()])
            .status();
        let shares = std::fs::read_to_string(dir(&crate::real_node::cgroup::lab_path(&lab)).join("cpu.shares"));
        let _ = child.kill();
        let _ = child.wait();
        let removed = crate::real_node::cgroup::remove(&crate::real_node::cgroup::lab_path(&lab));
        placed.expect("placed");
        assert_eq!(cgroup, Some(host_path(&lab)));
        assert!(
            realtime.expect("chrt runs").success(),
            "a process of the lab may run real-time threads"
        );
        assert_eq!(shares.expect("the lab's weight").trim(), LAB_CPU_SHARES);
        removed.expect("the lab's cgroup goes with its last process");
    }
}
