//! Whether the mount a process attached to is still there: once its daemon died or the
//! mount was taken out of the mount table, calls on its files answer `EIO` and the process
//! never writes to the pool again (not even to release its pins: a new owner may have
//! mounted the pool and swept them already).
//!
//! A system call on every data call would cost as much as the data path itself, so:
//! - **every call** loads the owner's mount-state word from the pool
//!   ([`pmfs::Client::owner_state`]) and compares it with its value at attach: a daemon that
//!   unmounted and closed the volume is seen at once;
//! - **at most every [`PROBE_NS`]** (read from the vDSO's coarse clock, no system call) one
//!   thread probes the daemon, found at attach ([`owner_of`]): its `/proc/<pid>/stat` must
//!   still show the same process (same start time, not a zombie), and the mount must still be
//!   in this process's mount table ([`mounts::still_mounted`]: one `statmount`, or a read of
//!   mountinfo). A daemon killed with SIGKILL, or a lazy unmount (`fusermount3 -u -z`, after
//!   which the daemon serves only the descriptors still open and exits with the last), is
//!   seen by the first call made `PROBE_NS` or more after it.
//!
//! The first call that finds the mount gone also makes the process's mappings of its files
//! private (module `mapped`), so stores into them stop reaching the pool too.
//!
//! Everything is read with raw system calls into fixed buffers: probes run inside arbitrary
//! calls of the program, signal handlers included.

use core::ffi::CStr;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use pmfs_core::pm::procs::start_of_stat;

use crate::mounts::{self, MAX_PMFS, number};

/// How long an answer of the daemon probe is trusted.
pub(crate) const PROBE_NS: u64 = 10_000_000;

/// The daemon (lock holder) of each attached mount.
static OWNER_PID: [AtomicI32; MAX_PMFS] = [const { AtomicI32::new(0) }; MAX_PMFS];
/// Its start time (`/proc/<pid>/stat` field 22): a pid reused by another process differs.
static OWNER_START: [AtomicU64; MAX_PMFS] = [const { AtomicU64::new(0) }; MAX_PMFS];
/// The mount-state word at attach.
static STATE_AT_ATTACH: [AtomicU64; MAX_PMFS] = [const { AtomicU64::new(0) }; MAX_PMFS];
/// When the next probe is due (coarse monotonic nanoseconds).
static NEXT_PROBE: [AtomicU64; MAX_PMFS] = [const { AtomicU64::new(0) }; MAX_PMFS];
/// Held by the thread probing.
static PROBING: [AtomicBool; MAX_PMFS] = [const { AtomicBool::new(false) }; MAX_PMFS];
/// The mount is gone, for good.
static GONE: [AtomicBool; MAX_PMFS] = [const { AtomicBool::new(false) }; MAX_PMFS];

/// The daemon serving the pool file `pool` (open as `file`), and its start time: the process
/// the pool records as its owner if that process still runs (`pmfs::Volume::recorded_owner`),
/// else the holder of the pool's exclusive `flock` as `/proc/locks` lists it (an owner of an
/// older build, or one in another PID namespace). `None` if no process owns the pool (nothing
/// to attach next to) or it cannot be told. `/proc/locks` is the slow way: listing it waits
/// for an RCU grace period unless one ended moments before, 10–20 ms on the test VM.
pub(crate) fn owner_of(pool: &CStr, file: &std::fs::File) -> Option<(i32, u64)> {
    if let Some((pid, start)) = pmfs::Volume::recorded_owner(file)
        && let Ok(pid) = i32::try_from(pid)
        && started(pid) == Some(start)
    {
        return Some((pid, start));
    }
    let s = crate::statx_at(libc::AT_FDCWD, pool, 0, libc::STATX_INO)?;
    let mut pid = None;
    mounts::each_line(c"/proc/locks", |line| {
        if let Some(p) = flock_holder(line, s.stx_dev_major, s.stx_dev_minor, s.stx_ino) {
            pid = Some(p);
        }
    });
    let pid = pid?;
    let start = started(pid)?;
    Some((pid, start))
}

/// The pid in a `/proc/locks` line if it is an exclusive `flock` on the file `major:minor:ino`.
///
/// Format (proc(5)): `1: FLOCK  ADVISORY  WRITE 7501 fe:00:9978290 0 EOF`, the device numbers
/// in hexadecimal; waiters have `->` after the number and are skipped.
fn flock_holder(line: &[u8], major: u32, minor: u32, ino: u64) -> Option<i32> {
    let mut f = line.split(|&b| b == b' ').filter(|f| !f.is_empty()).skip(1);
    if (f.next()?, f.next()?, f.next()?) != (b"FLOCK", b"ADVISORY", b"WRITE") {
        return None;
    }
    let pid = f.next()?;
    let mut file = f.next()?.split(|&b| b == b':');
    let ok = number(file.next()?, 16)? == u64::from(major)
        && number(file.next()?, 16)? == u64::from(minor)
        && number(file.next()?, 10)? == ino;
    i32::try_from(number(pid, 10)?).ok().filter(|_| ok)
}

/// The start time of live process `pid`; `None` if it does not exist or is a zombie.
fn started(pid: i32) -> Option<u64> {
    let mut path = [0u8; 32];
    let mut n = 0;
    for part in [
        &b"/proc/"[..],
        crate::decimal(pid as u64, &mut [0; 20]),
        b"/stat\0",
    ] {
        path[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    let path = CStr::from_bytes_until_nul(&path).ok()?;
    let mut stat = [0u8; 1024];
    let fd = mounts::open_read_only(path)?;
    // SAFETY: `stat` is writable for its length; the descriptor is the one opened above.
    let len = unsafe {
        let len = libc::syscall(libc::SYS_read, fd, stat.as_mut_ptr(), stat.len());
        libc::syscall(libc::SYS_close, fd);
        len
    };
    start_of_stat(&stat[..usize::try_from(len).ok()?])
}

/// Mount `m` was attached next to daemon `owner`, its mount-state word reading `state`.
pub(crate) fn attached(m: usize, owner: (i32, u64), state: u64) {
    OWNER_PID[m].store(owner.0, Ordering::Relaxed);
    OWNER_START[m].store(owner.1, Ordering::Relaxed);
    STATE_AT_ATTACH[m].store(state, Ordering::Relaxed);
    GONE[m].store(false, Ordering::Relaxed);
    NEXT_PROBE[m].store(now() + PROBE_NS, Ordering::Release);
}

/// Whether mount `m` is gone, given its mount-state word now; probes the daemon if that is
/// due.
pub(crate) fn gone(m: usize, state: u64) -> bool {
    if GONE[m].load(Ordering::Acquire) {
        return true;
    }
    if state != STATE_AT_ATTACH[m].load(Ordering::Relaxed) {
        went_away(m);
        return true;
    }
    let t = now();
    if t < NEXT_PROBE[m].load(Ordering::Acquire)
        || PROBING[m]
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return false;
    }
    let pid = OWNER_PID[m].load(Ordering::Relaxed);
    let alive =
        started(pid) == Some(OWNER_START[m].load(Ordering::Relaxed)) && mounts::still_mounted(m);
    if !alive {
        went_away(m);
    }
    NEXT_PROBE[m].store(t + PROBE_NS, Ordering::Release);
    PROBING[m].store(false, Ordering::Release);
    !alive
}

/// Mount `m` is found gone: for good, and its files' mappings stop reaching the pool (module
/// `mapped`).
fn went_away(m: usize) {
    if !GONE[m].swap(true, Ordering::AcqRel) {
        crate::mapped::mount_gone(m);
    }
}

/// In a fork child: a parent thread that was probing does not exist here.
pub(crate) fn after_fork_in_child() {
    for p in &PROBING {
        p.store(false, Ordering::Release);
    }
}

/// The coarse monotonic clock in nanoseconds (answered by the vDSO, no system call).
fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_flocks_on_the_file_give_their_holder() {
        let l = b"1: FLOCK  ADVISORY  WRITE 7501 fe:00:9978290 0 EOF";
        assert_eq!(flock_holder(l, 0xfe, 0, 9978290), Some(7501));
        assert_eq!(flock_holder(l, 0xfe, 0, 9978291), None);
        assert_eq!(flock_holder(l, 0xfe, 1, 9978290), None);
        for other in [
            &b"2: FLOCK  ADVISORY  READ 7501 fe:00:9978290 0 EOF"[..],
            b"3: POSIX  ADVISORY  WRITE 7501 fe:00:9978290 0 EOF",
            b"4: -> FLOCK  ADVISORY  WRITE 7600 fe:00:9978290 0 EOF",
            b"5: FLOCK  ADVISORY  WRITE x fe:00:9978290 0 EOF",
            b"",
        ] {
            assert_eq!(flock_holder(other, 0xfe, 0, 9978290), None);
        }
    }

    /// A pool this process formatted without taking the owner's `flock` (which `/proc/locks`
    /// would list): its owner is found through the record alone, and none once it closed.
    #[test]
    fn the_owner_a_pool_records_is_found_while_it_runs() {
        use std::os::unix::ffi::OsStrExt;
        let path = std::env::temp_dir().join(format!("pmfs-owner-{}.pool", std::process::id()));
        let region = pmfs_core::pm::PmRegion::create(&path, 16 << 20).unwrap();
        let opts = pmfs::Options {
            inodes: Some(64),
            ..pmfs::Options::with_mapping(pmfs::MappingKind::HashFs)
        };
        let vol = pmfs::Volume::format(std::sync::Arc::new(region), &opts).unwrap();
        let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: getpid takes no arguments.
        let me = unsafe { libc::getpid() };
        assert_eq!(owner_of(&name, &file), Some((me, started(me).unwrap())));
        vol.close().unwrap();
        assert_eq!(owner_of(&name, &file), None);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn this_process_is_alive_and_started_once() {
        // SAFETY: getpid takes no arguments.
        let me = unsafe { libc::getpid() };
        let start = started(me).expect("this process is alive");
        assert_eq!(started(me), Some(start));
        assert_eq!(started(i32::MAX), None);
    }
}
