//! An emulated watchdog device per node: a one-file FUSE filesystem at
//! `<lab>/nodes/<node>-dev/watchdog` that speaks the Linux watchdog API (open arms it,
//! WDIOC_SETTIMEOUT / GETTIMEOUT / GETSUPPORT / KEEPALIVE, a write is a keep-alive, the magic
//! close disarms), so the product's unmodified `LinuxWatchdog` runs against it. It is served by a
//! thread of the lab on the host, its timer the node's lab watchdog ([`crate::watchdog`]): a
//! partition does not stop it, and its expiry power-cycles the node.
//!
//! FUSE passes only "restricted" ioctls on a regular file: the kernel copies in and out what the
//! command's _IOC direction and size say, which the WDIOC_* commands (an `int` or a
//! `struct watchdog_info`) describe exactly.

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, UNIX_EPOCH},
};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, IoctlFlags, LockOwner, OpenFlags,
    ReplyAttr, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

use crate::{Error, Lab, Result, error::io, watchdog::Watchdogs};

/// What the driver reports as its identity (WDIOC_GETSUPPORT): not softdog's, so the agent
/// treats it as a hardware watchdog.
pub const WATCHDOG_DEVICE_IDENTITY: &str = "nodemedic lab watchdog";
/// The identity of the filesystem's second file, `softdog`: the kernel's software watchdog's, so
/// the agent takes it for softdog. Both files drive the node's one lab watchdog.
pub const SOFTDOG_IDENTITY: &str = "Software Watchdog";

/// A node's stand-in for modprobe, and where the agent looks for the softdog it brings
/// ([`Lab::modprobe_stand_in`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModprobeStandIn {
    pub program: PathBuf,
    pub class_dir: PathBuf,
    pub device_dir: PathBuf,
}

/// What a node's emulated watchdog device was asked to do since the lab started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchdogDeviceStats {
    /// The timeout last programmed with WDIOC_SETTIMEOUT.
    pub programmed_timeout: Option<Duration>,
    /// Keep-alives that fed the armed watchdog: WDIOC_KEEPALIVE and writes.
    pub keepalives: u64,
    pub opens: u64,
    /// Releases after a write holding `V` that disarmed the watchdog.
    pub magic_closes: u64,
}

const WDIOC_GETSUPPORT: u32 = nix::request_code_read!(b'W', 0, INFO_SIZE) as u32;
const WDIOC_GETSTATUS: u32 = nix::request_code_read!(b'W', 1, INT) as u32;
const WDIOC_GETBOOTSTATUS: u32 = nix::request_code_read!(b'W', 2, INT) as u32;
const WDIOC_KEEPALIVE: u32 = nix::request_code_read!(b'W', 5, INT) as u32;
const WDIOC_SETTIMEOUT: u32 = nix::request_code_readwrite!(b'W', 6, INT) as u32;
const WDIOC_GETTIMEOUT: u32 = nix::request_code_read!(b'W', 7, INT) as u32;
const INT: usize = size_of::<i32>();
/// `struct watchdog_info`: options, firmware_version, identity[32].
const INFO_SIZE: usize = 40;
const WDIOF_SETTIMEOUT: u32 = 0x0080;
const WDIOF_MAGICCLOSE: u32 = 0x0100;
const WDIOF_KEEPALIVEPING: u32 = 0x8000;
/// softdog's upper bound.
const MAX_TIMEOUT_SECONDS: i32 = 65_535;

const DEVICE: INodeNo = INodeNo(2);
const NAME: &str = "watchdog";
const SOFTDOG: INodeNo = INodeNo(3);
const SOFTDOG_NAME: &str = "softdog";
const TTL: Duration = Duration::from_secs(1);

struct Handle {
    /// The watchdog generation this open armed: after a power cycle (or a newer open) the handle
    /// no longer speaks for the device.
    generation: u64,
    /// The last write held a `V`: the release disarms.
    magic: bool,
}

struct Device {
    node: String,
    watchdogs: Watchdogs,
    default_timeout: Duration,
    handles: Mutex<HashMap<u64, Handle>>,
    next_handle: AtomicU64,
}

fn attr(ino: INodeNo) -> FileAttr {
    let dir = ino == INodeNo::ROOT;
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o600 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 512,
    }
}

fn info(ino: INodeNo) -> [u8; INFO_SIZE] {
    let mut raw = [0u8; INFO_SIZE];
    let options = WDIOF_SETTIMEOUT | WDIOF_MAGICCLOSE | WDIOF_KEEPALIVEPING;
    raw[..4].copy_from_slice(&options.to_ne_bytes());
    let identity = if ino == SOFTDOG {
        SOFTDOG_IDENTITY
    } else {
        WATCHDOG_DEVICE_IDENTITY
    };
    raw[8..8 + identity.len()].copy_from_slice(identity.as_bytes());
    raw
}

fn seconds(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX)
}

/// The bytes an ioctl copies out to the caller, or its error.
type Answer = std::result::Result<Vec<u8>, Errno>;

impl Device {
    fn generation_of(&self, fh: FileHandle) -> Option<u64> {
        self.handles.lock().ok()?.get(&fh.0).map(|h| h.generation)
    }

    /// Feeds through a handle; `ENODEV` when it is stale, as a real driver answers once its
    /// device is gone.
    fn keepalive(&self, generation: u64) -> std::result::Result<(), Errno> {
        let default = self.default_timeout;
        let fed = self.watchdogs.with_node(&self.node, |s| {
            let fed = s.feed(generation, s.device_timeout.unwrap_or(default));
            if fed {
                s.device_stats.keepalives += 1;
            }
            (fed, s.late_keepalive.take())
        });
        if let Some((_, Some(gap))) = fed {
            // As the device saw it: a gap the agent did not see was the lab's own stall.
            tracing::warn!(node = %self.node, gap_ms = gap.as_millis() as u64, "a keep-alive reached the lab's watchdog late");
        }
        if matches!(fed, Some((true, _))) {
            Ok(())
        } else {
            Err(Errno::ENODEV)
        }
    }

    fn answer(&self, ino: INodeNo, generation: u64, cmd: u32, input: &[u8]) -> Answer {
        let default = self.default_timeout;
        match cmd {
            WDIOC_GETSUPPORT => Ok(info(ino).to_vec()),
            WDIOC_GETSTATUS | WDIOC_GETBOOTSTATUS => Ok(0i32.to_ne_bytes().to_vec()),
            WDIOC_KEEPALIVE => self.keepalive(generation).map(|()| Vec::new()),
            WDIOC_GETTIMEOUT => self
                .watchdogs
                .with_node(&self.node, |s| seconds(s.device_timeout.unwrap_or(default)))
                .map(|t| t.to_ne_bytes().to_vec())
                .ok_or(Errno::ENODEV),
            WDIOC_SETTIMEOUT => {
                let raw: [u8; INT] = input.get(..INT).and_then(|b| b.try_into().ok()).ok_or(Errno::EINVAL)?;
                let wanted = i32::from_ne_bytes(raw);
                if !(1..=MAX_TIMEOUT_SECONDS).contains(&wanted) {
                    return Err(Errno::EINVAL);
                }
                let timeout = Duration::from_secs(wanted.unsigned_abs().into());
                // Setting the timeout also pings, as the kernel's watchdog core does.
                let applied = self.watchdogs.with_node(&self.node, |s| {
                    let applied = s.feed(generation, timeout);
                    if applied {
                        s.device_timeout = Some(timeout);
                        s.device_stats.programmed_timeout = Some(timeout);
                    }
                    applied
                });
                if applied == Some(true) {
                    Ok(wanted.to_ne_bytes().to_vec())
                } else {
                    Err(Errno::ENODEV)
                }
            }
            _ => Err(Errno::ENOTTY),
        }
    }
}

impl Filesystem for Device {
    /// Runs on the thread that serves the device, before any request.
    fn init(&mut self, _req: &Request, _config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        serve_first();
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == NAME {
            reply.entry(&TTL, &attr(DEVICE), fuser::Generation(0));
        } else if parent == INodeNo::ROOT && name == SOFTDOG_NAME {
            reply.entry(&TTL, &attr(SOFTDOG), fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT || ino == DEVICE || ino == SOFTDOG {
            reply.attr(&TTL, &attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    /// Only `O_TRUNC` (a shell's `>`) gets here: like a character device, nothing changes.
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.getattr(req, ino, None, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != DEVICE && ino != SOFTDOG {
            reply.error(Errno::EISDIR);
            return;
        }
        let default = self.default_timeout;
        let armed = self.watchdogs.with_node(&self.node, |s| {
            s.device_stats.opens += 1;
            s.arm(s.device_timeout.unwrap_or(default))
        });
        let (Some(generation), Ok(mut handles)) = (armed, self.handles.lock()) else {
            reply.error(Errno::EIO);
            return;
        };
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        handles.insert(
            fh,
            Handle {
                generation,
                magic: false,
            },
        );
        tracing::debug!(node = %self.node, pid = req.pid(), "watchdog device opened: armed");
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NONSEEKABLE,
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(generation) = self.generation_of(fh) else {
            reply.error(Errno::EBADF);
            return;
        };
        if let Err(errno) = self.keepalive(generation) {
            reply.error(errno);
            return;
        }
        // As the kernel's watchdog core: only the last write decides whether the close is magic.
        if let Ok(mut handles) = self.handles.lock()
            && let Some(handle) = handles.get_mut(&fh.0)
        {
            handle.magic = data.contains(&b'V');
        }
        reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX));
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self.handles.lock().ok().and_then(|mut h| h.remove(&fh.0));
        if let Some(Handle {
            generation,
            magic: true,
        }) = handle
        {
            self.watchdogs.with_node(&self.node, |s| {
                if s.disarm(generation) {
                    s.device_stats.magic_closes += 1;
                }
            });
        } else if handle.is_some() {
            tracing::debug!(node = %self.node, "watchdog device closed without the magic close: still armed");
        }
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let Some(generation) = self.generation_of(fh) else {
            reply.error(Errno::EBADF);
            return;
        };
        match self.answer(ino, generation, cmd, in_data) {
            Ok(out) => {
                let len = out.len().min(usize::try_from(out_size).unwrap_or(usize::MAX));
                reply.ioctl(0, &out[..len]);
            }
            Err(errno) => reply.error(errno),
        }
    }
}

/// The directory the node's device filesystem is mounted on.
pub(crate) fn mount_point(dir: &Path, node: &str) -> PathBuf {
    dir.join("nodes").join(format!("{node}-dev"))
}

/// The node's device file, under its mount point.
pub(crate) fn device_path(dir: &Path, node: &str) -> PathBuf {
    mount_point(dir, node).join(NAME)
}

/// Puts the calling thread (the device's server) at the highest nice level. A real watchdog
/// is a timer in hardware: a keep-alive reaches it at once. The lab's passes through this thread,
/// and on a machine whose CPU a CI run has saturated an ordinary thread can wait seconds for it:
/// the keep-alive would count late, and reset a node that fed in time.
fn serve_first() {
    let thread = nix::unistd::gettid().to_string();
    let reniced = std::process::Command::new("renice")
        .args(["-n", "-20", "-p", &thread])
        .stdout(std::process::Stdio::null())
        .status();
    if !reniced.is_ok_and(|s| s.success()) {
        tracing::warn!(%thread, "cannot raise the watchdog device's thread: keep-alives may count late on a busy machine");
    }
}

/// Where the FUSE control filesystem shows each connection's queue (mounted here when it is not:
/// most distributions mount it at boot).
const FUSE_CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// The `waiting` file of the FUSE connection mounted on `point`: how many requests wait for the
/// lab's device thread or are being served by it ([`crate::watchdog`] judges expiries with it).
fn connection_queue(point: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(FUSE_CONNECTIONS)));
    if !mounted {
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl", FUSE_CONNECTIONS])
            .stderr(std::process::Stdio::null())
            .status();
    }
    // The connection is named by the kernel's device number of the mount: major << 20 | minor.
    let dev = std::fs::metadata(point).ok()?.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let waiting = Path::new(FUSE_CONNECTIONS)
        .join(((major << 20) | minor).to_string())
        .join("waiting");
    waiting.exists().then_some(waiting)
}

/// Mounts the node's device and serves it on a thread of its own until the returned task is
/// dropped (aborted with the lab's tasks); teardown unmounts it first in any case.
pub(crate) fn mount(
    watchdogs: &Watchdogs,
    node: &str,
    dir: &Path,
    default_timeout: Duration,
) -> Result<tokio::task::JoinHandle<()>> {
    let point = mount_point(dir, node);
    std::fs::create_dir_all(&point).map_err(io(format!("creating {}", point.display())))?;
    watchdogs.register(node);
    let device = Device {
        node: node.to_owned(),
        watchdogs: watchdogs.clone(),
        default_timeout,
        handles: Mutex::new(HashMap::new()),
        next_handle: AtomicU64::new(1),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("nodemedic-lab-{node}")),
        fuser::MountOption::Subtype("nodemedic-watchdog".into()),
        fuser::MountOption::NoExec,
    ];
    let session = fuser::spawn_mount(device, &point, &config).map_err(|e| Error::Command {
        command: format!("mounting the watchdog device on {}", point.display()),
        detail: format!("{e} (FUSE needs /dev/fuse and root)"),
    })?;
    let queue = connection_queue(&point);
    if queue.is_none() {
        tracing::warn!(%node, "cannot find the watchdog device's FUSE connection: on a busy machine a keep-alive still queued for the lab may count late");
    }
    watchdogs.with_node(node, |s| s.device_queue = queue);
    Ok(tokio::spawn(async move {
        let _session = session;
        std::future::pending::<()>().await;
    }))
}

/// Detaches every mount under `dir` (deepest first): a lab's device filesystems at teardown, or
/// those a killed lab left, whose server is gone and whose directory cannot be removed until
/// they are.
pub(crate) fn unmount_under(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(&dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        if let Err(error) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(%error, point = %point.display(), "unmounting a lab device failed");
        }
    }
}

/// Mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

impl Lab {
    /// The node's emulated watchdog device, for `LinuxWatchdog::open` (or an agent's
    /// `--watchdog=<path>`). Served on the host; visible inside the node's namespace too.
    pub fn watchdog_device_path(&self, node: &str) -> PathBuf {
        device_path(self.dir(), node)
    }

    /// A stand-in for `modprobe` for the node's agent (`--modprobe`, with `--watchdog-class-dir`
    /// and `--device-dir` from it): tests must not load kernel modules. With `loadable`, its
    /// `softdog` makes the node's softdog appear (a watchdog class entry naming the kernel's
    /// software watchdog, and its device: the lab device's `softdog` file, on the node's one lab
    /// watchdog), as loading the module does; without, it fails as modprobe does on a kernel
    /// without the module.
    pub fn modprobe_stand_in(&self, node: &str, loadable: bool) -> Result<ModprobeStandIn> {
        self.inner.index(node)?;
        let nodes = self.dir().join("nodes");
        let stand_in = ModprobeStandIn {
            program: nodes.join(format!("{node}-modprobe")),
            class_dir: nodes.join(format!("{node}-watchdog-class")),
            device_dir: nodes.join(format!("{node}-devices")),
        };
        for dir in [&stand_in.class_dir, &stand_in.device_dir] {
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let body = if loadable {
            format!(
                "[ \"$1\" = softdog ] || {{ echo \"modprobe: FATAL: Module $1 not found\" >&2; exit 1; }}\n\
                 mkdir -p '{class}/watchdog0'\n\
                 echo '{SOFTDOG_IDENTITY}' > '{class}/watchdog0/identity'\n\
                 ln -sfn '{device}' '{devices}/watchdog0'\n",
                class = stand_in.class_dir.display(),
                devices = stand_in.device_dir.display(),
                device = mount_point(self.dir(), node).join(SOFTDOG_NAME).display(),
            )
        } else {
            "echo \"modprobe: FATAL: Module $1 not found in directory /lib/modules/nodemedic-lab\" >&2\nexit 1\n"
                .to_owned()
        };
        let script =
            format!("#!/bin/sh\n# The lab's stand-in for modprobe on {node}: no kernel module is loaded.\n{body}");
        std::fs::write(&stand_in.program, script).map_err(io(format!("writing {}", stand_in.program.display())))?;
        std::fs::set_permissions(&stand_in.program, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io(format!("making {} executable", stand_in.program.display())))?;
        Ok(stand_in)
    }

    /// What the node's emulated watchdog device was asked to do since the lab started.
    pub fn watchdog_device_stats(&self, node: &str) -> Result<WatchdogDeviceStats> {
        self.inner.index(node)?;
        Ok(self
            .inner
            .watchdogs
            .with_node(node, |s| s.device_stats.clone())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_are_the_kernels() {
        assert_eq!(WDIOC_GETSUPPORT, 0x8028_5700);
        assert_eq!(WDIOC_KEEPALIVE, 0x8004_5705);
        assert_eq!(WDIOC_SETTIMEOUT, 0xc004_5706);
        assert_eq!(WDIOC_GETTIMEOUT, 0x8004_5707);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/tmp/a\040b\134c"), r"/tmp/a b\c");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn the_identity_fits_and_is_not_softdogs() {
        let identity = |ino| {
            let raw = info(ino);
            let end = raw[8..].iter().position(|b| *b == 0).map_or(32, |p| p);
            String::from_utf8_lossy(&raw[8..8 + end]).into_owned()
        };
        assert_eq!(identity(DEVICE), WATCHDOG_DEVICE_IDENTITY);
        assert_eq!(identity(SOFTDOG), SOFTDOG_IDENTITY);
    }
}
