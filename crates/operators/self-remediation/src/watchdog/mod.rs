//! How a node fences itself: the watchdog that resets it when its agent stops feeding, or the
//! agent's own timer where there is no device, and the reboot an agent asks for when it must
//! fence at once.
//!
//! The agent never exits for lack of a device. It takes, in order (seed 004's order): the
//! configured device; else a softdog device, loading the module (`modprobe softdog`) when there
//! is none; else, with software reboot enabled, its own timer; else nothing, and says so (with
//! why each step failed) in its registration so the manager reports at once that the node cannot
//! be self-remediated.
//!
//! The configured device must be an absolute path without `..` components: anything else (such
//! as the `lab:<socket>` of earlier test labs) is refused without being opened, since the safe
//! time trusts the watchdog an agent registers; the refusal is one of the reasons the agent
//! passes the configured device over, and the order goes on from the softdog.
//!
//! Two implementations: the Linux device (`/dev/watchdog`, the only code with `unsafe`, in
//! [`linux`]) and the software timer ([`software`]). The test lab gives every node an emulated
//! watchdog device that this same Linux driver opens. The software reboot writes `b` to
//! `/proc/sysrq-trigger` and only with `--software-reboot`; the lab runs every node process with
//! a file of its own mounted over that path, so a lab reboot reaches the lab, never the host.

pub(crate) mod linux;
mod software;

use std::{
    path::{Component, Path, PathBuf},
    time::Duration,
};

pub use linux::LinuxWatchdog;
pub(crate) use software::SoftwareTimer;

use crate::protocol::manager::{Means, SOFTWARE_REBOOT_DELAY};

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("watchdog {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("watchdog {path}: {why}")]
    Unusable { path: PathBuf, why: String },
    #[error("software reboot refused: {0}")]
    RebootRefused(&'static str),
}

pub trait Watchdog: Send {
    /// How long after the last feed the device resets the node.
    fn timeout(&self) -> Duration;
    fn feed(&mut self) -> Result<(), WatchdogError>;
    /// The magic close: stop the timer. Only for a deliberate, safe shutdown of the agent.
    fn disarm(&mut self) -> Result<(), WatchdogError>;
    /// Reset the node now (fencing at once).
    fn reboot_now(&mut self) -> Result<(), WatchdogError>;
    /// Called on every round of the feeder: a timer kept in the agent acts here.
    fn poll(&mut self) -> Result<(), WatchdogError> {
        Ok(())
    }
    fn describe(&self) -> String;
}

/// The kernel's immediate reboot.
pub const SYSRQ_TRIGGER: &str = "/proc/sysrq-trigger";

/// How an agent reboots its node at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reboot {
    /// Write `b` to this sysrq trigger (`isSoftwareRebootEnabled`).
    Sysrq(PathBuf),
    /// Software reboot is not enabled: the watchdog resets the node when it runs out.
    Refused,
}

impl Reboot {
    pub fn new(software_reboot: bool) -> Self {
        if software_reboot {
            Reboot::Sysrq(PathBuf::from(SYSRQ_TRIGGER))
        } else {
            Reboot::Refused
        }
    }

    pub fn now(&self) -> Result<(), WatchdogError> {
        match self {
            Reboot::Refused => Err(WatchdogError::RebootRefused(
                "software reboot is not enabled (isSoftwareRebootEnabled); the watchdog resets the node",
            )),
            Reboot::Sysrq(trigger) => std::fs::write(trigger, b"b").map_err(|source| WatchdogError::Io {
                path: trigger.clone(),
                source,
            }),
        }
    }
}

/// Where the agent looks for its fencing means.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The configured device (`watchdogFilePath`): an absolute path (see [`refusal`]).
    pub device: String,
    /// The timeout to program (zero: the driver's own).
    pub timeout: Duration,
    pub software_reboot: bool,
    /// Where watchdog devices are described (`/sys/class/watchdog`), to find a softdog.
    pub sysfs: PathBuf,
    /// Where their device files are (`/dev`).
    pub dev: PathBuf,
    pub reboot: Reboot,
    /// The program that loads a kernel module (`modprobe`), run as `<program> softdog` when the
    /// node has neither the configured device nor a softdog; `None`: never load it.
    pub modprobe: Option<PathBuf>,
}

impl Settings {
    pub fn new(device: &str, timeout: Duration, software_reboot: bool) -> Self {
        Self {
            device: device.to_owned(),
            timeout,
            software_reboot,
            sysfs: PathBuf::from("/sys/class/watchdog"),
            dev: PathBuf::from("/dev"),
            reboot: Reboot::new(software_reboot),
            modprobe: Some(PathBuf::from("modprobe")),
        }
    }
}

/// A softdog device: an existing one, else one the module brings when loaded. Why none could be
/// had goes to `passed_over`.
fn softdog(settings: &Settings, passed_over: &mut Vec<String>) -> Option<PathBuf> {
    if let Some(found) = find_softdog(settings) {
        return Some(found);
    }
    match load_softdog(settings) {
        Ok(()) => {
            let found = find_softdog(settings);
            if found.is_none() {
                passed_over.push(format!("{SOFTDOG_MODULE} was loaded but no softdog device appeared"));
            }
            found
        }
        Err(why) => {
            passed_over.push(format!("no softdog device, and it could not be loaded: {why}"));
            None
        }
    }
}

/// Loads the softdog module with `settings.modprobe`, as medik8s's agent does where a node has no
/// watchdog device (seed 004): the kernel's software watchdog still resets a node whose agent
/// hangs, where the agent's own timer would hang with it.
fn load_softdog(settings: &Settings) -> Result<(), String> {
    let Some(modprobe) = &settings.modprobe else {
        return Err("loading softdog is not enabled".into());
    };
    let shown = format!("{} {SOFTDOG_MODULE}", modprobe.display());
    let mut child = std::process::Command::new(modprobe)
        .arg(SOFTDOG_MODULE)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{shown}: {e}"))?;
    // A modprobe that hangs must not keep the agent from starting (and voting for its peers).
    let deadline = std::time::Instant::now() + MODPROBE_TIMEOUT;
    let status = loop {
        match child.try_wait().map_err(|e| format!("{shown}: {e}"))? {
            Some(status) => break status,
            None if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not finish within {MODPROBE_TIMEOUT:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    Err(format!("{shown} failed ({status}): {}", stderr.trim()))
}

/// How long loading softdog may take.
const MODPROBE_TIMEOUT: Duration = Duration::from_secs(10);

const SOFTDOG_MODULE: &str = "softdog";

/// The means an agent found, with the timer that implements it (none for [`Means::None`]).
pub struct Fencing {
    pub means: Means,
    pub watchdog: Option<Box<dyn Watchdog>>,
    /// Why a device in the order was passed over, for the log.
    pub passed_over: Vec<String>,
}

impl Fencing {
    /// The timeout the registration publishes: the device's, zero for the software timer and
    /// none.
    pub(crate) fn published_timeout(&self) -> Duration {
        match self.means {
            Means::HardwareWatchdog | Means::Softdog => self.watchdog.as_ref().map_or(Duration::ZERO, |w| w.timeout()),
            Means::SoftwareReboot | Means::None => Duration::ZERO,
        }
    }

    pub fn describe(&self) -> String {
        match &self.watchdog {
            Some(w) => format!("{}: {}", self.means.as_str(), w.describe()),
            None => self.means.as_str().to_owned(),
        }
    }
}

/// An existing softdog device: the `/sys/class/watchdog` entry whose identity says so.
fn find_softdog(settings: &Settings) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(&settings.sysfs)
        .ok()?
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("identity")).is_ok_and(|id| id.trim() == linux::SOFTDOG_IDENTITY)
        })
        .map(|e| settings.dev.join(e.file_name()))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Why a configured `watchdogFilePath` is refused without being opened: it is not an absolute
/// path, or it has a `..` component. None for a path the agent may open. The manager reports the
/// same text in the SelfNodeRemediationConfig's `Valid` condition.
pub fn refusal(path: &str) -> Option<String> {
    const FIX: &str = "set an absolute device path such as /dev/watchdog";
    let parsed = Path::new(path);
    let shown = if path.is_empty() { "\"\"" } else { path };
    if !parsed.is_absolute() {
        Some(format!("watchdogFilePath {shown} is not an absolute path: {FIX}"))
    } else if parsed.components().any(|c| c == Component::ParentDir) {
        Some(format!("watchdogFilePath {shown} has a '..' component: {FIX}"))
    } else {
        None
    }
}

fn device(path: &Path, settings: &Settings) -> Result<(Means, Box<dyn Watchdog>), WatchdogError> {
    let wd = LinuxWatchdog::open(path, settings.timeout, settings.reboot.clone())?;
    let means = if wd.is_softdog() {
        Means::Softdog
    } else {
        Means::HardwareWatchdog
    };
    Ok((means, Box::new(wd)))
}

/// Finds and arms the node's fencing means, in seed 004's order. A configured device that
/// [`refusal`] refuses is passed over unopened (the reason in [`Fencing::passed_over`]); the order
/// goes on from the softdog.
pub fn open(settings: &Settings) -> Fencing {
    let mut passed_over = Vec::new();
    let configured = Path::new(&settings.device);
    // A configured device that exists and failed is not tried again as a softdog; one that did
    // not exist may be the very device loading softdog brings.
    let failed_at = (refusal(&settings.device).is_none() && configured.exists()).then_some(configured);
    let opened = if let Some(why) = refusal(&settings.device) {
        Err(why)
    } else if configured.exists() {
        device(configured, settings).map_err(|e| e.to_string())
    } else {
        Err(format!("{}: no such device", configured.display()))
    };
    let found = match opened {
        Ok(found) => Some(found),
        Err(why) => {
            passed_over.push(why);
            softdog(settings, &mut passed_over)
                .filter(|p| Some(p.as_path()) != failed_at)
                .and_then(|softdog| {
                    device(&softdog, settings)
                        .map_err(|e| passed_over.push(e.to_string()))
                        .ok()
                })
        }
    };
    if let Some((means, watchdog)) = found {
        return Fencing {
            means,
            watchdog: Some(watchdog),
            passed_over,
        };
    }
    if settings.software_reboot {
        return Fencing {
            means: Means::SoftwareReboot,
            watchdog: Some(Box::new(SoftwareTimer::new(
                SOFTWARE_REBOOT_DELAY,
                settings.reboot.clone(),
            ))),
            passed_over,
        };
    }
    Fencing {
        means: Means::None,
        watchdog: None,
        passed_over,
    }
}

/// How often to feed: a third of the timeout (as medik8s), at most once a second.
pub fn feed_interval(timeout: Duration) -> Duration {
    (timeout / 3)
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(100))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, device: &str, software_reboot: bool) -> Settings {
        Settings {
            device: device.to_owned(),
            timeout: Duration::ZERO,
            software_reboot,
            sysfs: dir.join("sys"),
            dev: dir.join("dev"),
            reboot: if software_reboot {
                Reboot::Sysrq(dir.join("sysrq-trigger"))
            } else {
                Reboot::Refused
            },
            modprobe: None,
        }
    }

    /// A stand-in for modprobe in `dir`: `script` is its shell body.
    fn modprobe(dir: &Path, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("modprobe");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    #[test]
    fn softdog_is_loaded_when_the_node_has_no_watchdog() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = settings(dir.path(), "/nonexistent/watchdog", false);
        let (sys, dev) = (s.sysfs.display().to_string(), s.dev.display().to_string());
        s.modprobe = Some(modprobe(
            dir.path(),
            &format!(
                "[ \"$1\" = softdog ] || exit 1\nmkdir -p {sys}/watchdog0 {dev}\necho 'Software Watchdog' > {sys}/watchdog0/identity\n: > {dev}/watchdog0"
            ),
        ));
        assert_eq!(find_softdog(&s), None);
        let fencing = open(&s);
        assert_eq!(
            find_softdog(&s),
            Some(dir.path().join("dev").join("watchdog0")),
            "loaded"
        );
        // A plain file is no watchdog driver: the loaded device is found and then refused.
        assert!(
            fencing.passed_over.iter().any(|why| why.contains("watchdog0")),
            "{:?}",
            fencing.passed_over
        );
    }

    #[test]
    fn a_softdog_that_cannot_be_loaded_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = settings(dir.path(), "/nonexistent/watchdog", false);
        s.modprobe = Some(modprobe(
            dir.path(),
            "echo 'modprobe: FATAL: Module softdog not found' >&2; exit 1",
        ));
        let fencing = open(&s);
        assert_eq!(fencing.means, Means::None);
        let why = fencing.passed_over.join("; ");
        assert!(why.contains("no such device"), "{why}");
        assert!(why.contains("Module softdog not found"), "{why}");
    }

    #[test]
    fn without_any_device_software_reboot_is_the_means_and_its_timer_reboots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = settings(dir.path(), "/nonexistent/watchdog", true);
        let mut fencing = open(&s);
        assert_eq!(fencing.means, Means::SoftwareReboot);
        assert_eq!(fencing.published_timeout(), Duration::ZERO);
        assert!(
            fencing.passed_over[0].contains("no such device"),
            "{:?}",
            fencing.passed_over
        );
        let wd = fencing.watchdog.as_mut().expect("a timer");
        wd.feed().expect("feed");
        wd.poll().expect("poll");
        assert!(!dir.path().join("sysrq-trigger").exists(), "fed: no reboot");
        wd.reboot_now().expect("reboot");
        assert_eq!(std::fs::read(dir.path().join("sysrq-trigger")).expect("written"), b"b");
    }

    #[test]
    fn without_any_device_or_software_reboot_there_is_no_means() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fencing = open(&settings(dir.path(), "/nonexistent/watchdog", false));
        assert_eq!(fencing.means, Means::None);
        assert!(fencing.watchdog.is_none());
    }

    #[test]
    fn a_softdog_is_found_by_its_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, identity) in [("watchdog0", "iTCO_wdt"), ("watchdog1", "Software Watchdog")] {
            std::fs::create_dir_all(dir.path().join("sys").join(name)).expect("dir");
            std::fs::write(
                dir.path().join("sys").join(name).join("identity"),
                format!("{identity}\n"),
            )
            .expect("id");
            std::fs::create_dir_all(dir.path().join("dev")).expect("dir");
            std::fs::write(dir.path().join("dev").join(name), "").expect("dev");
        }
        let s = settings(dir.path(), "/nonexistent/watchdog", false);
        assert_eq!(find_softdog(&s), Some(dir.path().join("dev").join("watchdog1")));
    }

    #[test]
    fn only_an_absolute_path_without_parent_components_may_be_opened() {
        for fine in [
            "/dev/watchdog",
            "/dev/watchdog1",
            "/dev/./watchdog",
            "/run/lab/node-1-dev/watchdog",
        ] {
            assert_eq!(refusal(fine), None, "{fine}");
        }
        for (path, why) in [
            ("lab:/x", "watchdogFilePath lab:/x is not an absolute path"),
            ("dev/watchdog", "watchdogFilePath dev/watchdog is not an absolute path"),
            ("watchdog", "is not an absolute path"),
            ("", "watchdogFilePath \"\" is not an absolute path"),
            ("/dev/../etc/watchdog", "has a '..' component"),
            ("/dev/watchdog/..", "has a '..' component"),
        ] {
            let refused = refusal(path).unwrap_or_else(|| panic!("{path:?} accepted"));
            assert!(refused.contains(why), "{path:?}: {refused}");
            assert!(
                refused.ends_with("set an absolute device path such as /dev/watchdog"),
                "{path:?}: {refused}"
            );
        }
    }

    #[test]
    fn a_refused_path_is_never_opened_and_the_order_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        // What a lab socket watchdog was: nothing may connect to it.
        let socket = dir.path().join("node-1.watchdog");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        // An existing file behind a `..`: refused before it is opened.
        std::fs::create_dir_all(dir.path().join("dev")).expect("dir");
        std::fs::write(dir.path().join("dev").join("watchdog"), "").expect("file");
        let dotted = format!("{}/dev/../dev/watchdog", dir.path().display());
        for device in [format!("lab:{}", socket.display()), dotted, "dev/watchdog".to_owned()] {
            let expected = refusal(&device).expect("refused");
            let fencing = open(&settings(dir.path(), &device, true));
            assert_eq!(fencing.means, Means::SoftwareReboot, "{device}");
            assert_eq!(fencing.passed_over.first(), Some(&expected), "{device}");
            assert!(
                fencing.describe().starts_with("software-reboot"),
                "{}",
                fencing.describe()
            );
            let fencing = open(&settings(dir.path(), &device, false));
            assert_eq!(fencing.means, Means::None, "{device}");
            assert!(fencing.watchdog.is_none());
        }
        assert_eq!(
            listener.accept().map(drop).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "nothing connected to the socket"
        );
    }

    #[test]
    fn the_refused_reboot_says_how_to_enable_it() {
        let error = Reboot::Refused.now().expect_err("refused");
        assert!(error.to_string().contains("isSoftwareRebootEnabled"), "{error}");
    }
}
