//! `/dev/watchdog`: the Linux watchdog API (Documentation/watchdog/watchdog-api.rst), and the
//! scheduling of the thread that feeds it. The ioctls and the two scheduling calls are the only
//! `unsafe` code in nodemedic; each call passes plain integers or a pointer to a live, correctly
//! typed local for exactly the duration of the call.
#![allow(unsafe_code)]

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Reboot, Watchdog, WatchdogError};

/// `struct watchdog_info` of linux/watchdog.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WatchdogInfo {
    pub options: u32,
    pub firmware_version: u32,
    pub identity: [u8; 32],
}

nix::ioctl_read!(wdioc_getsupport, b'W', 0, WatchdogInfo);
nix::ioctl_read!(wdioc_keepalive, b'W', 5, libc_int);
nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, libc_int);
nix::ioctl_read!(wdioc_gettimeout, b'W', 7, libc_int);

#[allow(non_camel_case_types)]
type libc_int = std::ffi::c_int;

/// The identity the kernel's software watchdog reports.
pub(crate) const SOFTDOG_IDENTITY: &str = "Software Watchdog";

pub struct LinuxWatchdog {
    path: PathBuf,
    file: Option<File>,
    timeout: Duration,
    identity: String,
    reboot: Reboot,
}

impl LinuxWatchdog {
    /// Opens (and so arms) the device; programs `timeout` when non-zero and different from the
    /// driver's (WDIOC_SETTIMEOUT also sends a keep-alive), then reads back what the driver
    /// applied and the driver's identity.
    pub fn open(path: &Path, timeout: Duration, reboot: Reboot) -> Result<Self, WatchdogError> {
        let io = |source| WatchdogError::Io {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_CLOEXEC.bits())
            .open(path)
            .map_err(io)?;
        let fd = file.as_raw_fd();
        let mut seconds = get_timeout(fd).map_err(|e| io(e.into()))?;
        let wanted = libc_int::try_from(timeout.as_secs().max(1)).unwrap_or(libc_int::MAX);
        if !timeout.is_zero() && wanted != seconds {
            seconds = set_timeout(fd, wanted).map_err(|e| io(e.into()))?;
        }
        if seconds <= 0 {
            return Err(WatchdogError::Unusable {
                path: path.to_owned(),
                why: format!("the driver reports a timeout of {seconds}s"),
            });
        }
        let mut info = WatchdogInfo::default();
        // SAFETY: `info` is a live, #[repr(C)] watchdog_info for the duration of the call. A
        // driver without the ioctl leaves the identity empty.
        let identity = match unsafe { wdioc_getsupport(fd, &mut info) } {
            Ok(_) => identity_text(&info.identity),
            Err(_) => String::new(),
        };
        Ok(Self {
            path: path.to_owned(),
            file: Some(file),
            timeout: Duration::from_secs(seconds.unsigned_abs().into()),
            identity,
            reboot,
        })
    }

    /// The driver's identity (`Software Watchdog` for softdog).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn is_softdog(&self) -> bool {
        self.identity == SOFTDOG_IDENTITY
    }

    fn fd(&self) -> Result<i32, WatchdogError> {
        self.file
            .as_ref()
            .map(|f| f.as_raw_fd())
            .ok_or_else(|| WatchdogError::Unusable {
                path: self.path.clone(),
                why: "already disarmed".into(),
            })
    }
}

fn get_timeout(fd: i32) -> nix::Result<libc_int> {
    let mut seconds: libc_int = 0;
    // SAFETY: `seconds` is a live c_int for the duration of the call.
    unsafe { wdioc_gettimeout(fd, &mut seconds) }?;
    Ok(seconds)
}

/// Programs the timeout; returns what the driver applied.
fn set_timeout(fd: i32, seconds: libc_int) -> nix::Result<libc_int> {
    let mut seconds = seconds;
    // SAFETY: `seconds` is a live c_int for the duration of the call.
    unsafe { wdioc_settimeout(fd, &mut seconds) }?;
    Ok(seconds)
}

/// How the kernel schedules the thread that feeds the watchdog ([`raise_this_thread`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FeederScheduling {
    /// SCHED_FIFO at the lowest real-time priority: it runs before any ordinary thread.
    Realtime,
    /// Real time refused; the highest nice level instead.
    Nice,
    /// Neither allowed: it waits for the CPU like any other thread.
    Ordinary,
}

/// Asks the kernel to run the calling thread before ordinary work. A feeder that waits for the
/// CPU behind a loaded node's other threads misses the watchdog's deadline and resets a healthy
/// node; the `watchdog` daemon's `realtime` option and SBD run theirs so for the same reason.
/// Real time is refused without CAP_SYS_NICE, and in a cgroup that has no real-time runtime
/// (CONFIG_RT_GROUP_SCHED, as a pod's cgroup under cgroup v1): then the highest nice level,
/// which weighs 88 times an ordinary thread against the agent's own threads.
pub(crate) fn raise_this_thread() -> FeederScheduling {
    let lowest_realtime = nix::libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; `lowest_realtime` is a live local for the call.
    if unsafe { nix::libc::sched_setscheduler(0, nix::libc::SCHED_FIFO, &lowest_realtime) } == 0 {
        return FeederScheduling::Realtime;
    }
    // SAFETY: integers only; on Linux the nice level is per thread, and 0 is the calling one.
    if unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, -20) } == 0 {
        return FeederScheduling::Nice;
    }
    FeederScheduling::Ordinary
}

/// Keeps every page the agent touches in memory (mlockall, pages locked as they are faulted
/// in, as the `watchdog` daemon and SBD lock themselves). A feeder that must read its own code
/// back from disk is late however it is scheduled: in a memory cgroup at its limit the kernel
/// evicts a process's file pages first, its executable's included, and a feed then waits for
/// the disk. Only pages already used are locked, so the agent's footprint stays as it was.
pub(crate) fn lock_in_memory() -> nix::Result<()> {
    use nix::sys::mman::{MlockAllFlags, mlockall};
    let on_fault = MlockAllFlags::from_bits_retain(nix::libc::MCL_ONFAULT);
    mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE | on_fault)
}

pub(crate) fn identity_text(raw: &[u8]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).trim().to_owned()
}

impl Watchdog for LinuxWatchdog {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn feed(&mut self) -> Result<(), WatchdogError> {
        let fd = self.fd()?;
        let mut unused: libc_int = 0;
        // SAFETY: `unused` is a live c_int for the duration of the call.
        unsafe { wdioc_keepalive(fd, &mut unused) }.map_err(|e| WatchdogError::Io {
            path: self.path.clone(),
            source: e.into(),
        })?;
        Ok(())
    }

    fn disarm(&mut self) -> Result<(), WatchdogError> {
        if let Some(mut file) = self.file.take() {
            file.write_all(b"V").map_err(|source| WatchdogError::Io {
                path: self.path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Sysrq where software reboot is enabled; otherwise the device's shortest timeout, so it
    /// resets the node within a second instead of a whole timeout.
    fn reboot_now(&mut self) -> Result<(), WatchdogError> {
        match self.reboot.now() {
            Err(WatchdogError::RebootRefused(_)) => {
                let fd = self.fd()?;
                set_timeout(fd, 1).map_err(|e| WatchdogError::Io {
                    path: self.path.clone(),
                    source: e.into(),
                })?;
                self.timeout = Duration::from_secs(1);
                Ok(())
            }
            other => other,
        }
    }

    fn describe(&self) -> String {
        let identity = if self.identity.is_empty() {
            "no identity"
        } else {
            &self.identity
        };
        format!("{} ({identity}, {}s)", self.path.display(), self.timeout.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy and nice level, as /proc reports them (fields 41
    /// and 19 of its stat, counted after the command's closing parenthesis).
    fn policy_and_nice() -> (i64, i64) {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        let fields: Vec<i64> = stat[stat.rfind(')').expect("comm") + 2..]
            .split(' ')
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        (fields[38], fields[16])
    }

    #[test]
    fn the_agents_pages_stay_in_memory_once_used() {
        let locked_kib = || {
            let status = std::fs::read_to_string("/proc/self/status").expect("status");
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmLck:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .expect("VmLck")
        };
        let locked = lock_in_memory();
        let after = locked_kib();
        // Undone at once: the other tests of this process run as they would.
        nix::sys::mman::munlockall().expect("munlockall");
        if nix::unistd::Uid::effective().is_root() {
            locked.expect("root may lock its memory");
            assert!(after > 0, "VmLck {after} kB");
        }
    }

    #[test]
    fn the_feeder_thread_runs_before_ordinary_threads_when_the_kernel_allows_it() {
        // CI may run the suite under a nice value of its own: compare with where we started.
        let before = policy_and_nice();
        let (scheduling, after) = std::thread::spawn(|| (raise_this_thread(), policy_and_nice()))
            .join()
            .expect("thread");
        match scheduling {
            FeederScheduling::Realtime => assert_eq!(after.0, i64::from(nix::libc::SCHED_FIFO), "{after:?}"),
            FeederScheduling::Nice => assert_eq!(after, (i64::from(nix::libc::SCHED_OTHER), -20)),
            FeederScheduling::Ordinary => assert_eq!(after, before),
        }
        // Root in the machine's root cgroup (as CI runs) gets real time.
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let root_cpu_cgroup = cgroups.lines().any(|l| {
            let mut fields = l.splitn(3, ':').skip(1);
            let controllers = fields.next().unwrap_or_default();
            controllers.split(',').any(|c| c == "cpu") && fields.next() == Some("/")
        });
        if nix::unistd::Uid::effective().is_root() && root_cpu_cgroup {
            assert_eq!(scheduling, FeederScheduling::Realtime);
        }
        assert_eq!(policy_and_nice(), before, "only the calling thread");
    }

    #[test]
    fn identities_end_at_the_first_nul() {
        let mut raw = [0u8; 32];
        raw[..SOFTDOG_IDENTITY.len()].copy_from_slice(SOFTDOG_IDENTITY.as_bytes());
        assert_eq!(identity_text(&raw), SOFTDOG_IDENTITY);
        assert_eq!(identity_text(&[0u8; 32]), "");
    }

    #[test]
    fn a_missing_device_is_an_error_that_names_it() {
        let error = LinuxWatchdog::open(Path::new("/nonexistent/watchdog"), Duration::ZERO, Reboot::Refused)
            .err()
            .expect("no device");
        assert!(error.to_string().contains("/nonexistent/watchdog"), "{error}");
    }
}
