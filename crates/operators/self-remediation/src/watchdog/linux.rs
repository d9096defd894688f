//! `/dev/watchdog`: the Linux watchdog API (Documentation/watchdog/watchdog-api.rst). The ioctls
//! are the only `unsafe` code in nodemedic; each call passes a pointer to a live, correctly
//! typed local for exactly the duration of the call.
#![allow(unsafe_code)]

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Watchdog, WatchdogError};

nix::ioctl_read!(wdioc_keepalive, b'W', 5, libc_int);
nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, libc_int);
nix::ioctl_read!(wdioc_gettimeout, b'W', 7, libc_int);

#[allow(non_camel_case_types)]
type libc_int = std::ffi::c_int;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reboot {
    /// `echo b > /proc/sysrq-trigger`: only with `--software-reboot` on a real node.
    Sysrq,
    Refused,
}

pub struct LinuxWatchdog {
    path: PathBuf,
    file: Option<File>,
    timeout: Duration,
    reboot: Reboot,
}

/// The configured path, or else the newest `/dev/watchdog*` (a softdog loaded by the node's
/// administrator). nodemedic never loads kernel modules itself.
fn find(configured: &Path) -> Option<PathBuf> {
    if configured.exists() {
        return Some(configured.to_owned());
    }
    let mut candidates: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir("/dev")
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("watchdog"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, p)| p)
}

impl LinuxWatchdog {
    /// Opens (and so arms) the device; sets `timeout` when non-zero, then reads back what the
    /// driver applied.
    pub fn open(configured: PathBuf, reboot: Reboot, timeout: Duration) -> Result<Self, WatchdogError> {
        let path = find(&configured).ok_or_else(|| WatchdogError::Unusable {
            path: configured.clone(),
            why: "no such device, and no /dev/watchdog* to fall back to".into(),
        })?;
        let io = |source| WatchdogError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_CLOEXEC.bits())
            .open(&path)
            .map_err(io)?;
        let fd = file.as_raw_fd();
        if !timeout.is_zero() {
            let mut seconds = timeout.as_secs().max(1) as libc_int;
            // SAFETY: `seconds` is a live c_int for the duration of the call.
            unsafe { wdioc_settimeout(fd, &mut seconds) }.map_err(|e| io(e.into()))?;
        }
        let mut seconds: libc_int = 0;
        // SAFETY: as above.
        unsafe { wdioc_gettimeout(fd, &mut seconds) }.map_err(|e| io(e.into()))?;
        if seconds <= 0 {
            return Err(WatchdogError::Unusable {
                path,
                why: format!("the driver reports a timeout of {seconds}s"),
            });
        }
        Ok(Self {
            path,
            file: Some(file),
            timeout: Duration::from_secs(seconds as u64),
            reboot,
        })
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

    fn reboot_now(&mut self) -> Result<(), WatchdogError> {
        match self.reboot {
            Reboot::Refused => Err(WatchdogError::RebootRefused(
                "software reboot is not enabled (--software-reboot) or this is a lab; the watchdog will reset the node",
            )),
            Reboot::Sysrq => std::fs::write("/proc/sysrq-trigger", b"b").map_err(|source| WatchdogError::Io {
                path: "/proc/sysrq-trigger".into(),
                source,
            }),
        }
    }

    fn describe(&self) -> String {
        format!("{} ({}s)", self.path.display(), self.timeout.as_secs())
    }
}
