//! The process's file size limit (`RLIMIT_FSIZE`), which the kernel applies to every write,
//! growing truncation and allocation of a regular file: a write that starts at or past the
//! limit fails with `EFBIG` and raises `SIGXFSZ`, one that reaches past it is cut short there,
//! and a truncation or an allocation that would grow the file past it fails like the first.
//! A served call whose range ends past the limit is forwarded, so the kernel does exactly
//! that; calls within it are served as before. The kernel places an append, and tells a
//! growing truncation or allocation from a shrinking one, by the size it last saw, which
//! served calls change behind its back: the call is forwarded after the kernel fetched the
//! size ([`past`]).
//!
//! The soft limit is read when the library initialises (an `exec` starts a new image, which
//! reads the limit it inherited) and again after each `setrlimit` or `prlimit` this process
//! makes through the library on itself, so that looking at it costs no system call on the
//! data path. A limit another process changes for this one (`prlimit(2)` with this pid) is
//! not seen until the next of those calls.

use core::sync::atomic::{AtomicU64, Ordering};

/// The soft limit in bytes; `RLIM_INFINITY` (all ones) when there is none.
static FSIZE: AtomicU64 = AtomicU64::new(libc::RLIM_INFINITY);

/// Reads the soft limit again (a raw system call: no interposed function runs, and `errno`
/// is kept). If the call fails the last value stays.
pub(crate) fn refresh() {
    let saved = crate::errno();
    let mut lim = core::mem::MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: prlimit64 on this process (pid 0), no new limit, `lim` a writable rlimit.
    let r = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_FSIZE,
            core::ptr::null::<libc::rlimit>(),
            lim.as_mut_ptr(),
        )
    };
    if r == 0 {
        // SAFETY: the call succeeded and filled `lim`.
        FSIZE.store(unsafe { lim.assume_init() }.rlim_cur, Ordering::Relaxed);
    }
    crate::set_errno(saved);
}

/// Whether a file may reach `end` bytes under the limit (`end` is where a write's range, a
/// truncation or an allocation ends).
pub(crate) fn allows(end: u64) -> bool {
    end <= FSIZE.load(Ordering::Relaxed)
}

/// Whether there is no limit: an append, whose place is known only at its commit, is served
/// only then.
pub(crate) fn unlimited() -> bool {
    FSIZE.load(Ordering::Relaxed) == libc::RLIM_INFINITY
}

/// Forwards a call on the pmfs file open at `fd` that reaches past the limit (`None`: the
/// caller forwards), once the kernel has the file's size.
pub(crate) fn past<T>(fd: libc::c_int) -> Option<T> {
    crate::refresh_kernel_size(fd);
    None
}

/// After a `setrlimit` or `prlimit` call on `resource` of process `pid` (0: the caller)
/// returned `r`: reads the file size limit again if that call may have changed it.
pub(crate) fn after_set(pid: libc::pid_t, resource: libc::c_int, r: libc::c_int) {
    if r == 0
        && resource == libc::RLIMIT_FSIZE as libc::c_int
        && (pid == 0 || pid == crate::getpid())
    {
        refresh();
    }
}
