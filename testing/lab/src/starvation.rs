//! A lab process starved of CPU or memory, as a busy or overcommitted machine starves it: a v1
//! cgroup of the lab's own, `/nodemedic/<lab>/starved-<name>`, with a CPU quota or a memory
//! limit. It is made in the freezer hierarchy too, so the lab's teardown (and the sweep of a
//! dead lab's leftovers) finds and stops what runs in it, as it does a real node's cgroup.
//!
//! The processes starved are the lab's own (an agent, etcd, the API server), never the host's.

use std::path::PathBuf;

use crate::{Error, Lab, Result, error::io, process::ProcessSpec};

const HIERARCHIES: &str = "/sys/fs/cgroup";
/// `cpu.cfs_period_us`: the quota is a share of this.
const PERIOD_US: u64 = 100_000;

fn cgroup(lab: &str, name: &str, hierarchy: &str) -> PathBuf {
    let path = crate::real_node::cgroup::lab_path(lab);
    PathBuf::from(HIERARCHIES)
        .join(hierarchy)
        .join(path.trim_start_matches('/'))
        .join(format!("starved-{}", name.replace('/', "-")))
}

fn write(path: PathBuf, value: &str) -> Result<()> {
    std::fs::write(&path, value).map_err(io(format!("writing {value} to {}", path.display())))
}

/// Makes the cgroup in `hierarchy` and the freezer's, and moves `pid` into both.
fn enter(lab: &str, name: &str, hierarchy: &str, pid: u32) -> Result<PathBuf> {
    let mut made = PathBuf::new();
    for h in [hierarchy, "freezer"] {
        let dir = cgroup(lab, name, h);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating cgroup {}", dir.display())))?;
        if h == "cpu" {
            crate::cpu_share::allow_realtime(&dir)?;
        }
        write(dir.join("cgroup.procs"), &pid.to_string())?;
        if h == hierarchy {
            made = dir;
        }
    }
    Ok(made)
}

/// Moves every task of the cgroup back where the lab's processes run (the lab's CPU share in the
/// cpu hierarchy, the root in the others) and removes it.
fn leave(lab: &str, name: &str, hierarchies: &[&str]) -> Result<()> {
    for h in hierarchies.iter().chain(["freezer"].iter()) {
        let dir = cgroup(lab, name, h);
        if !dir.exists() {
            continue;
        }
        let back = crate::cpu_share::home(lab, h);
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            // A task that exited meanwhile is gone already.
            let _ = std::fs::write(back.join("cgroup.procs"), pid);
        }
        std::fs::remove_dir(&dir).map_err(io(format!("removing cgroup {}", dir.display())))?;
    }
    Ok(())
}

impl Lab {
    fn running_pid(&self, process: &str) -> Result<u32> {
        self.process_pid(process)
            .ok_or_else(|| Error::Invalid(format!("lab process {process} is not running")))
    }

    fn starvation_fault(&self, process: &str, fault: &str) {
        self.inner.timeline.record(crate::Event::Fault {
            node: process.split_once('/').map(|(node, _)| node.to_owned()),
            fault: format!("{fault} {process}"),
        });
    }

    /// Throttles lab process `process` (`<node>/agent`, `etcd`, `kube-apiserver`) to `percent`
    /// of one CPU, as a machine whose CPU is overcommitted does, until [`Lab::unthrottle_cpu`]
    /// (or the process restarts).
    pub fn throttle_cpu(&self, process: &str, percent: u64) -> Result<()> {
        let pid = self.running_pid(process)?;
        let dir = enter(self.id(), process, "cpu", pid)?;
        write(dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
        write(
            dir.join("cpu.cfs_quota_us"),
            &(PERIOD_US * percent.max(1) / 100).to_string(),
        )?;
        self.starvation_fault(process, &format!("throttle-cpu {percent}%"));
        Ok(())
    }

    /// How many CPU periods the throttled process was held back in ([`Lab::throttle_cpu`]),
    /// and how often its memory cgroup hit its limit ([`Lab::squeeze_memory`]): proof the
    /// starvation bit.
    pub fn starvation_counts(&self, process: &str) -> (u64, u64) {
        let read = |hierarchy: &str, file: &str, key: Option<&str>| -> u64 {
            let text = std::fs::read_to_string(cgroup(self.id(), process, hierarchy).join(file)).unwrap_or_default();
            match key {
                Some(key) => text
                    .lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
                    .unwrap_or(0),
                None => text.trim().parse().unwrap_or(0),
            }
        };
        (
            read("cpu", "cpu.stat", Some("nr_throttled")),
            read("memory", "memory.failcnt", None),
        )
    }

    /// Ends [`Lab::throttle_cpu`].
    pub fn unthrottle_cpu(&self, process: &str) -> Result<()> {
        leave(self.id(), process, &["cpu"])?;
        self.starvation_fault(process, "unthrottle-cpu");
        Ok(())
    }

    /// Puts lab process `process` under memory pressure: it shares a memory cgroup, limited to
    /// what it uses now plus `headroom_mib`, with a hog that keeps allocating and touching more
    /// than that, so the cgroup stays at its limit and every allocation of the process waits on
    /// reclaim. The hog is the OOM killer's first choice (score 1000), as a best-effort pod is
    /// beside a system-node-critical one. Until [`Lab::release_memory`].
    pub fn squeeze_memory(&self, process: &str, headroom_mib: u64) -> Result<()> {
        let pid = self.running_pid(process)?;
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(io("reading the process's status"))?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        // What the process allocates from now on is charged here, and waits on reclaim when
        // the hog holds the cgroup at its limit. Its pages from before stay charged where they
        // were: this kernel has no `memory.move_charge_at_immigrate`.
        let dir = enter(self.id(), process, "memory", pid)?;
        let limit = rss_kib * 1024 + headroom_mib * 1024 * 1024;
        write(dir.join("memory.limit_in_bytes"), &limit.to_string())?;
        let hog = format!("{process}-memory-hog");
        // The hog's CPU is capped (a tenth of one) so that its allocations, killed and started
        // again, do not starve the machine's other labs.
        let hog_cpu = cgroup(self.id(), &hog, "cpu");
        std::fs::create_dir_all(&hog_cpu).map_err(io(format!("creating cgroup {}", hog_cpu.display())))?;
        write(hog_cpu.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
        write(hog_cpu.join("cpu.cfs_quota_us"), &(PERIOD_US / 10).to_string())?;
        // The hog asks for more than the headroom: the cgroup stays at its limit, reclaiming,
        // and the OOM killer takes the hog's allocation (never the shell that starts another).
        let script = format!(
            "echo $$ > {procs}\necho $$ > {frozen}\necho $$ > {cpu}\n\
             while true; do python3 -c 'import time\nopen(\"/proc/self/oom_score_adj\", \"w\").write(\"1000\")\nb = bytearray({bytes})\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(0.5)'; done",
            procs = dir.join("cgroup.procs").display(),
            frozen = cgroup(self.id(), process, "freezer").join("cgroup.procs").display(),
            cpu = hog_cpu.join("cgroup.procs").display(),
            bytes = (headroom_mib + 32) * 1024 * 1024,
        );
        self.add_host_process(&hog, ProcessSpec::new("/bin/sh", ["-c".to_owned(), script]))?;
        self.starvation_fault(process, &format!("squeeze-memory +{headroom_mib}MiB"));
        Ok(())
    }

    /// Ends [`Lab::squeeze_memory`]: the hog stops, the process leaves the cgroup.
    pub async fn release_memory(&self, process: &str) -> Result<()> {
        let hog = format!("{process}-memory-hog");
        self.kill_process(&hog)?;
        // The hog's shell and its last allocation are killed by group: the cgroup holds only the
        // process once they are gone.
        let procs = cgroup(self.id(), process, "memory").join("cgroup.procs");
        crate::wait::until("the memory hog gone", std::time::Duration::from_secs(10), || {
            let left = std::fs::read_to_string(&procs).unwrap_or_default();
            async move { Ok((left.split_whitespace().count() <= 1).then_some(())) }
        })
        .await?;
        leave(self.id(), process, &["memory"])?;
        leave(self.id(), &hog, &["cpu"])?;
        self.starvation_fault(process, "release-memory");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root, as every lab does.
    #[test]
    fn a_process_with_a_real_time_thread_can_be_starved() {
        let mut realtime = std::process::Command::new("chrt")
            .args(["--fifo", "1", "sleep", "60"])
            .spawn()
            .expect("chrt");
        let lab = format!("unit-{}-starved", std::process::id());
        let live = crate::lock::LiveLabDir::new(&lab);
        let entered = enter(&lab, "feeder", "cpu", realtime.id());
        let left = leave(&lab, "feeder", &["cpu"]);
        drop(live);
        let _ = realtime.kill();
        let _ = realtime.wait();
        let _ = std::fs::remove_dir(cgroup(&lab, "feeder", "cpu").parent().expect("the lab's cgroup"));
        let _ = std::fs::remove_dir(cgroup(&lab, "feeder", "freezer").parent().expect("the lab's cgroup"));
        entered.expect("a real-time process enters a starved cgroup");
        left.expect("and leaves it");
    }
}
