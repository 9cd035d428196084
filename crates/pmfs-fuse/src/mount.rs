//! `pmfs mount`: mount options, the daemon's life cycle (background start, signals, clean
//! unmount) and the `mount.pmfs` helper's argument conventions.
//!
//! # Life cycle
//! Without `--foreground`, `pmfs mount` starts itself again in the background (a new session,
//! so closing the terminal does not stop it) and returns once the file system is mounted, or
//! with the daemon's error. The daemon:
//! 1. takes the pool's owner lock and mounts the volume (recovering it after a crash);
//! 2. mounts the FUSE file system (`fuse.pmfs`, source = the pool file);
//! 3. serves requests on several threads (one of them polling for a while after each request,
//!    with `-o poll`, see [`crate::poll`]) until the file system is unmounted: by
//!    `pmfs umount` ([`crate::umount`]), `fusermount3 -u` or `umount`, or by `SIGINT`,
//!    `SIGTERM` or `SIGHUP`, which make the daemon unmount it itself (a busy mount point is
//!    reported and kept; a second signal detaches it lazily), and, on a thread of its own,
//!    data clients' requests to have the kernel drop its pages of files they updated
//!    ([`pmfs::kernel_pages`]; not on a read-only mount);
//! 4. closes the volume cleanly and releases the lock.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, INodeNo, MountOption, Notifier, Session, SessionACL};
use nix::sys::signal::{SigSet, Signal};
use pmfs::kernel_pages::{Listener, Stopper};

use crate::error::{Error, Result};
use crate::fs::{PmfsFs, Timeouts};
use crate::poll::Poller;
use crate::pool::{Pool, volume_error};

/// What the `-o` options of a mount ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct MountOptions {
    /// Mount read-only (the volume is not written at all; it must have been closed cleanly).
    pub read_only: bool,
    /// Kernel mount flags and FUSE options passed through.
    pub kernel: Vec<MountOption>,
    /// Who may use the mount.
    pub acl: SessionACL,
    /// Cache lifetimes.
    pub timeouts: Timeouts,
    /// Request-serving threads.
    pub threads: usize,
    /// How long the daemon polls for the next request after one (`poll`; zero: never).
    pub poll: Duration,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            kernel: Vec::new(),
            acl: if nix::unistd::geteuid().is_root() {
                SessionACL::All
            } else {
                SessionACL::Owner
            },
            timeouts: Timeouts::default(),
            threads: 4,
            poll: Duration::ZERO,
        }
    }
}

/// The longest poll window (`-o poll`, in microseconds): a second.
const MAX_POLL_MICROS: u64 = 1_000_000;

fn seconds(key: &str, v: &str) -> Result<Duration> {
    let s: f64 = v
        .parse()
        .map_err(|_| Error::new(format!("mount option {key}={v}: not a number of seconds")))?;
    Duration::try_from_secs_f64(s)
        .map_err(|_| Error::new(format!("mount option {key}={v}: out of range")))
}

/// Options that mount(8) and fstab use and that mean nothing to the daemon.
fn ignored(opt: &str) -> bool {
    matches!(
        opt,
        "" | "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "_netdev"
            | "nofail"
            | "relatime"
            | "strictatime"
            | "lazytime"
            | "default_permissions"
    ) || opt.starts_with("x-")
        || opt.starts_with("comment=")
}

/// Parses `-o` option lists (each a comma-separated list).
pub fn parse_options<S: AsRef<str>>(lists: &[S]) -> Result<MountOptions> {
    let mut o = MountOptions::default();
    let (mut suid, mut dev) = (false, false);
    for opt in lists.iter().flat_map(|l| l.as_ref().split(',')) {
        let (key, val) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        match (key, val) {
            ("ro", None) => o.read_only = true,
            ("rw", None) => o.read_only = false,
            ("suid", None) => suid = true,
            ("nosuid", None) => suid = false,
            ("dev", None) => dev = true,
            ("nodev", None) => dev = false,
            ("exec", None) => o.kernel.push(MountOption::Exec),
            ("noexec", None) => o.kernel.push(MountOption::NoExec),
            ("atime", None) => o.kernel.push(MountOption::Atime),
            ("noatime", None) => o.kernel.push(MountOption::NoAtime),
            ("sync", None) => o.kernel.push(MountOption::Sync),
            ("async", None) => o.kernel.push(MountOption::Async),
            ("dirsync", None) => o.kernel.push(MountOption::DirSync),
            ("allow_other", None) => o.acl = SessionACL::All,
            ("allow_root", None) => o.acl = SessionACL::RootAndOwner,
            ("attr_timeout", Some(v)) => o.timeouts.attr = seconds(key, v)?,
            ("entry_timeout", Some(v)) => o.timeouts.entry = seconds(key, v)?,
            ("threads", Some(v)) => {
                o.threads = v
                    .parse()
                    .ok()
                    .filter(|&n| (1..=64).contains(&n))
                    .ok_or_else(|| Error::new(format!("mount option threads={v}: not 1..=64")))?
            }
            ("poll", Some(v)) => {
                o.poll = v
                    .parse()
                    .ok()
                    .filter(|&us| us <= MAX_POLL_MICROS)
                    .map(Duration::from_micros)
                    .ok_or_else(|| {
                        Error::new(format!(
                            "mount option poll={v}: not 0..={MAX_POLL_MICROS} microseconds"
                        ))
                    })?
            }
            _ if ignored(opt) => {}
            _ => return Err(Error::new(format!("unknown mount option {opt:?}"))),
        }
    }
    o.kernel.push(if suid {
        MountOption::Suid
    } else {
        MountOption::NoSuid
    });
    o.kernel.push(if dev {
        MountOption::Dev
    } else {
        MountOption::NoDev
    });
    if o.read_only {
        o.kernel.push(MountOption::RO);
    }
    Ok(o)
}

/// Checks that `dir` can be a mount point and returns its absolute path.
pub fn check_mount_point(dir: &Path) -> Result<PathBuf> {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => dir
            .canonicalize()
            .map_err(|e| Error::new(format!("{shown}: {e}"))),
        Ok(_) => Err(Error::new(format!(
            "{shown}: mount point is not a directory"
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::new(format!("{shown}: mount point does not exist")))
        }
        Err(e) => Err(Error::new(format!("{shown}: {e}"))),
    }
}

/// A pmfs file system in the mount table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub dir: PathBuf,
    /// Its pool file: the mount's source, an absolute path.
    pub pool: PathBuf,
    /// Its device number, which also names its FUSE connection in `/sys/fs/fuse/connections`.
    pub dev: u32,
}

/// The pmfs file systems mounted now (`/proc/self/mountinfo`).
pub fn pmfs_mounts() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| parse_mounts(&info))
        .unwrap_or_default()
}

/// The fields of a `mountinfo` line this crate reads: the device (`major:minor`), the mount
/// point (escaped), the file system type and the source (escaped). Format (proc(5)): `id
/// parent major:minor root mount-point options [optional...] - fstype source super-options`.
pub(crate) struct Line<'a> {
    pub dev: &'a str,
    pub dir: &'a str,
    pub fstype: &'a str,
    pub source: &'a str,
}

/// Splits a `mountinfo` line into its [`Line`] fields; `None` if it is malformed.
pub(crate) fn line(l: &str) -> Option<Line<'_>> {
    let f: Vec<&str> = l.split(' ').collect();
    let mut after = f.iter().skip_while(|&&x| x != "-").skip(1);
    Some(Line {
        dev: f.get(2)?,
        dir: f.get(4)?,
        fstype: after.next()?,
        source: after.next()?,
    })
}

/// The pmfs file systems among the lines of a `mountinfo` text.
fn parse_mounts(info: &str) -> Vec<MountEntry> {
    info.lines()
        .filter_map(|l| {
            let l = line(l)?;
            if l.fstype != "fuse.pmfs" {
                return None;
            }
            // The kernel's own encoding of a device number: 12 bits of major, 20 of minor.
            let (major, minor) = l.dev.split_once(':')?;
            let (major, minor) = (major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?);
            if major >= 1 << 12 || minor >= 1 << 20 {
                return None;
            }
            Some(MountEntry {
                dir: PathBuf::from(unescape(l.dir)),
                pool: PathBuf::from(unescape(l.source)),
                dev: major << 20 | minor,
            })
        })
        .collect()
}

/// Where the pool file `pool` (an absolute path) is mounted now, if it is.
pub fn mount_point_of(pool: &Path) -> Option<PathBuf> {
    pmfs_mounts()
        .into_iter()
        .find(|m| m.pool == pool)
        .map(|m| m.dir)
}

/// Undoes the octal escapes of mountinfo paths (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Starts the daemon in the background (this executable, `mount ... --foreground
/// --notify-ready`) and waits until it has mounted the file system or failed.
pub fn spawn_daemon(pool: &Path, mountpoint: &Path, options: &[String]) -> Result<()> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::new(format!("cannot find the pmfs executable: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(pool)
        .arg(mountpoint)
        .arg("--foreground")
        .arg("--notify-ready");
    for o in options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .current_dir("/")
        .spawn()
        .map_err(|e| Error::new(format!("cannot start the pmfs daemon: {e}")))?;
    let (Some(out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::new("cannot talk to the pmfs daemon"));
    };
    // Until it is ready the daemon's messages are ours; then it detaches from both pipes.
    let relay = std::thread::spawn(move || {
        let _ = std::io::copy(&mut err, &mut std::io::stderr());
    });
    // Before `ready` it may tell what mounting repaired, a line at a time.
    let mut out = BufReader::new(out);
    let mut line = String::new();
    while matches!(out.read_line(&mut line), Ok(n) if n > 0) {
        if line.trim() == "ready" {
            return Ok(());
        }
        let _ = std::io::stderr().write_all(line.as_bytes());
        line.clear();
    }
    // The daemon ended without mounting; it reported why on stderr.
    let _ = relay.join();
    let status = child
        .wait()
        .ok()
        .and_then(|s| s.code())
        .filter(|&c| c != 0)
        .unwrap_or(1);
    Err(Error::silent(status))
}

/// Unmounts `dir` with `fusermount3 -u` (`-z`: lazily), retrying for a moment while the
/// mount is busy: a program that closed its last file on it just before may still be ending.
pub fn unmount(dir: &Path, lazy: bool) -> std::result::Result<(), String> {
    let mut tries = 0;
    loop {
        let mut cmd = Command::new("fusermount3");
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let out = cmd
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run fusermount3: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if tries >= 40 || !msg.contains("busy") {
            return Err(msg);
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the daemon in this process until the file system is unmounted.
pub fn serve(
    pool: &Path,
    mountpoint: &Path,
    opts: &MountOptions,
    notify_ready: bool,
) -> Result<()> {
    let mountpoint = check_mount_point(mountpoint)?;
    if notify_ready {
        // Leave the caller's session: the daemon outlives the terminal that started it.
        let _ = nix::unistd::setsid();
    }
    let pool = if opts.read_only {
        Pool::open_read_only_exclusive(pool)?
    } else {
        Pool::open(pool)?
    };
    let media = pool.media()?;
    let vol = if opts.read_only {
        pmfs::Volume::mount_read_only(media)
    } else {
        pmfs::Volume::mount(media)
    }
    .map_err(|e| volume_error(pool.path(), e))?;
    let report = vol.mount_report();
    if !report.clean || report.did_anything() {
        let what = format!(
            "pmfs: {}: {}{report}\n",
            pool.path().display(),
            match (report.clean, opts.read_only) {
                (true, _) => "",
                (false, false) => "was not closed cleanly, recovered: ",
                (false, true) =>
                    "was not closed cleanly, recovered in memory (the pool stays as it is until a read-write mount): ",
            }
        );
        // Through stdout, which the starter reads up to `ready`: a line on stderr could still
        // be in its relay when it exits.
        let _ = if notify_ready {
            std::io::stdout().write_all(what.as_bytes())
        } else {
            std::io::stderr().write_all(what.as_bytes())
        };
    }

    // Signals are taken by a dedicated thread: block them here, before fuser starts its
    // threads, so that every thread inherits the mask.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals
        .thread_block()
        .map_err(|e| Error::new(format!("cannot block signals: {e}")))?;

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(pool.path().display().to_string()),
        // As a kernel option: fuser's direct mount(2) drops MountOption::Subtype.
        MountOption::CUSTOM("subtype=pmfs".into()),
        MountOption::DefaultPermissions,
    ];
    config.mount_options.extend(opts.kernel.iter().cloned());
    config.acl = opts.acl;
    config.n_threads = Some(opts.threads);
    config.clone_fd = true;
    let mut fs = PmfsFs::new(vol.clone(), opts.timeouts);
    let poller = if opts.poll.is_zero() {
        None
    } else {
        let (poller, thread) = Poller::start(opts.poll)
            .map_err(|e| Error::new(format!("cannot start the poll thread: {e}")))?;
        fs = fs.with_poller(poller.clone());
        Some((poller, thread))
    };
    let session = Session::new(fs, &mountpoint, &config)
        .map_err(|e| Error::new(format!("{}: cannot mount: {e}", mountpoint.display())))?;
    let kernel_pages = if opts.read_only {
        None
    } else {
        serve_kernel_pages(&pool, vol.clone(), session.notifier())
            .map_err(|e| {
                let _ = writeln!(
                    std::io::stderr(),
                    "pmfs: {e}; processes that map files through the kernel may see stale pages after writes by the preload library"
                );
            })
            .ok()
    };
    let shown = mountpoint.clone();
    std::thread::Builder::new()
        .name("pmfs-signals".into())
        .spawn(move || {
            let mut lazy = false;
            while signals.wait().is_ok() {
                match unmount(&shown, lazy) {
                    Ok(()) if lazy => break,
                    Ok(()) => {}
                    Err(e) => {
                        let _ = writeln!(
                            std::io::stderr(),
                            "pmfs: cannot unmount {}: {e}; still serving (signal again to detach it lazily)",
                            shown.display()
                        );
                        lazy = true;
                    }
                }
            }
        })
        .map_err(|e| Error::new(format!("cannot start the signal thread: {e}")))?;
    if notify_ready {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready").and_then(|()| out.flush());
        // Detach from the starter's pipes: it exits now, and whoever reads its output must
        // not wait for the daemon.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stdout(&null);
            let _ = nix::unistd::dup2_stderr(&null);
        }
    }
    let collector = if opts.read_only {
        None
    } else {
        Some(collect_dead_pins(vol.clone())?)
    };
    let served = session_end(session.run());
    if let Some((poller, thread)) = poller {
        poller.stop();
        let _ = thread.join();
    }
    if let Some((stop, thread)) = collector {
        // Its handle of the volume goes with it, as the kernel-pages thread's below.
        drop(stop);
        let _ = thread.join();
    }
    if let Some((stop, thread)) = kernel_pages {
        // Its handle of the volume goes with it, before the close below, which is clean only
        // for the last handle.
        if stop.stop().is_ok() {
            let _ = thread.join();
        }
    }
    let closed = vol.close().map_err(|e| volume_error(pool.path(), e));
    drop(pool);
    served.map_err(|e| Error::new(format!("{}: {e}", mountpoint.display())))?;
    closed
}

/// What the request loop's end means. fuser ends it without an error when a read of
/// `/dev/fuse` fails with `ENODEV`, the answer once the connection is gone (unmounted, or
/// aborted through `/sys/fs/fuse/connections`: the daemon does not ask for
/// `FUSE_ABORT_ERROR`). A thread that had just taken a request off the queue when the
/// connection went is answered `ECONNABORTED` instead (the kernel ends that request itself).
/// That happens when a request is still queued at the unmount, as the release the kernel
/// sends when the last file of a lazily detached mount is closed: the end is the same.
fn session_end(served: std::io::Result<()>) -> std::io::Result<()> {
    match served {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
        other => other,
    }
}

/// How often the daemon looks again at pins data clients left ([`collect_dead_pins`]).
const DEAD_PINS_EVERY: Duration = Duration::from_secs(1);

/// Starts the thread that clears, every [`DEAD_PINS_EVERY`], the pins that killed data
/// clients left on files while other clients were attached, once those left too
/// ([`pmfs::Volume::collect_dead_pins`]). Dropping the sender stops it. An error (of the
/// media) is reported once, and stops it too: the next mount clears the pins anyway.
fn collect_dead_pins(vol: pmfs::Volume) -> Result<(Sender<()>, JoinHandle<()>)> {
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("pmfs-dead-pins".into())
        .spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(DEAD_PINS_EVERY) {
                if let Err(e) = vol.collect_dead_pins() {
                    let _ = writeln!(
                        std::io::stderr(),
                        "pmfs: cannot clear the pins of killed clients: {e}; the next mount clears them"
                    );
                    break;
                }
            }
        })
        .map_err(|e| Error::new(format!("cannot start the dead-pins thread: {e}")))?;
    Ok((stop, thread))
}

/// Starts the thread that has the kernel drop its pages of a file when a data client (the
/// preload library) updated it behind the kernel's back ([`pmfs::kernel_pages`]): the engine
/// first notes that the kernel holds none, then the kernel is told
/// (`FUSE_NOTIFY_INVAL_INODE` over the whole file), then the client is answered. A file or
/// node gone meanwhile needs nothing.
/// Returns what stops it, and the thread.
fn serve_kernel_pages(
    pool: &Pool,
    vol: pmfs::Volume,
    notifier: Notifier,
) -> Result<(Stopper, JoinHandle<std::io::Result<()>>)> {
    let (dev, ino) = pool.identity()?;
    let cannot = |e| {
        Error::new(format!(
            "{}: cannot listen for data clients: {e}",
            pool.path().display()
        ))
    };
    let listener = Listener::bind(dev, ino, vol.rendezvous()).map_err(cannot)?;
    let stop = listener.stopper().map_err(cannot)?;
    let thread = std::thread::Builder::new()
        .name("pmfs-kernel-pages".into())
        .spawn(move || {
            listener.serve(|file| {
                match vol.forget_kernel_pages(file) {
                    Ok(()) => {}
                    Err(pmfs::Error::NotFound) => return Ok(()),
                    Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno())),
                }
                match notifier.inval_inode(INodeNo(file.raw()), 0, 0) {
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
                    _ => Ok(()),
                }
            })
        })
        .map_err(|e| Error::new(format!("cannot start the kernel-pages thread: {e}")))?;
    Ok((stop, thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_torn_down_under_a_request_ends_the_session_like_an_unmount() {
        let from = |errno| Err(std::io::Error::from_raw_os_error(errno));
        assert!(session_end(Ok(())).is_ok());
        assert!(session_end(from(libc::ECONNABORTED)).is_ok());
        let other = session_end(from(libc::EIO)).unwrap_err();
        assert_eq!(other.raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn options_parse_and_reject_unknown_ones() {
        let o = parse_options(&[
            "ro,noexec,attr_timeout=0.5",
            "threads=2,nofail,x-systemd.automount",
        ])
        .unwrap();
        assert!(o.read_only);
        assert_eq!(o.threads, 2);
        assert_eq!(o.timeouts.attr, Duration::from_millis(500));
        assert!(o.kernel.contains(&MountOption::NoExec));
        assert!(o.kernel.contains(&MountOption::RO));
        assert!(o.kernel.contains(&MountOption::NoSuid));
        assert!(o.kernel.contains(&MountOption::NoDev));
        let o = parse_options(&["suid,dev"]).unwrap();
        assert!(o.kernel.contains(&MountOption::Suid));
        assert!(o.kernel.contains(&MountOption::Dev));
        assert!(parse_options(&["bogus"]).is_err());
        assert!(parse_options(&["threads=0"]).is_err());
        assert!(parse_options(&["entry_timeout=x"]).is_err());
        assert_eq!(o.poll, Duration::ZERO);
        let o = parse_options(&["poll=200"]).unwrap();
        assert_eq!(o.poll, Duration::from_micros(200));
        assert!(parse_options(&["poll=1000001"]).is_err());
        assert!(parse_options(&["poll=-1"]).is_err());
        assert!(parse_options(&["poll"]).is_err());
    }

    #[test]
    fn the_mount_table_yields_pmfs_mounts_with_their_connections() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
42 27 0:39 / /tmp/a\\040b rw,nosuid shared:9 - fuse.pmfs /dev/shm/p\\040q.pool rw,user_id=0
43 27 0:40 / /mnt/other rw - fuse.sshfs host: rw
44 27 259:3 / /mnt/p rw - fuse.pmfs /pools/p rw
45 27 0:41 / /mnt/bad rw - fuse.pmfs
";
        assert_eq!(
            parse_mounts(info),
            [
                MountEntry {
                    dir: "/tmp/a b".into(),
                    pool: "/dev/shm/p q.pool".into(),
                    dev: 39,
                },
                MountEntry {
                    dir: "/mnt/p".into(),
                    pool: "/pools/p".into(),
                    dev: 259 << 20 | 3,
                },
            ]
        );
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }
}
