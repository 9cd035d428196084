//! The functions the library stands in front of, as the next object in the lookup order
//! (normally libc) defines them.
//!
//! Each one is looked up with `dlsym(RTLD_NEXT, name)` on its first call (the `exec` family
//! before the first `fork`, [`resolve_exec_family`]) and cached in an atomic word (no lock,
//! nothing to deadlock across `fork`). While a lookup is under way — on another thread, or on
//! this one if the dynamic linker ever called back into the library — and when no later
//! object defines the name, the call is made as a raw system call instead (`libc::syscall`,
//! which sets `errno` the same way). So calls that arrive before the library initialised,
//! from other libraries' constructors, are forwarded without recursion and without
//! allocating. The few stdio-level functions that have no system call behind
//! them ([`fclose`], [`freopen`], [`freopen64`], [`isatty`], [`closefrom`], [`sigaction`],
//! [`signal`]) are looked up without that guard: the dynamic linker calls none of them.
//!
//! # Safety
//! Every function here has exactly the contract of the C function of the same name: the
//! caller passes what that function requires (valid pointers of the right sizes, etc.).

use core::ffi::{CStr, c_char, c_int, c_long, c_uint, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use libc::{FILE, iovec, off_t, size_t, ssize_t};

/// The slot has not been looked up yet.
const UNRESOLVED: usize = 0;
/// A lookup is under way.
const RESOLVING: usize = 1;
/// No later object defines the name.
const MISSING: usize = 2;

/// The address of `sym` in the next object, or `None` while a lookup is under way or when no
/// later object defines it.
fn resolve(slot: &AtomicUsize, sym: &CStr) -> Option<usize> {
    match slot.load(Ordering::Acquire) {
        UNRESOLVED => {}
        RESOLVING | MISSING => return None,
        p => return Some(p),
    }
    if slot
        .compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        let p = slot.load(Ordering::Acquire);
        return (p > MISSING).then_some(p);
    }
    let p = lookup(sym);
    slot.store(p.unwrap_or(MISSING), Ordering::Release);
    p
}

/// Looks `sym` up after this object, keeping `errno` as it was.
fn lookup(sym: &CStr) -> Option<usize> {
    let saved = crate::errno();
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no further precondition.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, sym.as_ptr()) } as usize;
    crate::set_errno(saved);
    (p > MISSING).then_some(p)
}

/// The slot a function's address is kept in: the named one, or a slot of its own.
macro_rules! slot {
    () => {{
        static SLOT: AtomicUsize = AtomicUsize::new(UNRESOLVED);
        &SLOT
    }};
    ($slot:ident) => {
        &$slot
    };
}

/// Functions backed by one system call each; `$fallback` is that call.
macro_rules! syscall_backed {
    ($($(static $slot:ident:)? fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty
        = $fallback:expr;)*) => {$(
        $(
            #[doc = concat!("Where `", stringify!($name), "` was found ([`resolve`]).")]
            static $slot: AtomicUsize = AtomicUsize::new(UNRESOLVED);
        )?
        #[doc = concat!("The next object's `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// The C function's contract.
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            let slot = slot!($($slot)?);
            let sym = const {
                match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("symbol name with a NUL"),
                }
            };
            match resolve(slot, sym) {
                Some(p) => {
                    // SAFETY: `p` is the address of the C function `$name`, whose prototype
                    // is this signature.
                    let f = unsafe {
                        core::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                    };
                    // SAFETY: the caller keeps the C function's contract.
                    unsafe { f($($arg),*) }
                }
                // SAFETY: the same operation as one system call, with the same contract.
                None => (unsafe { $fallback }) as $ret,
            }
        }
    )*};
}

/// Variadic functions backed by one system call each: the fixed arguments, then the
/// variadic ones, which the caller passes through as they came.
macro_rules! syscall_backed_variadic {
    ($(fn $name:ident($($arg:ident: $ty:ty),*; $($va:ident: $vty:ty),*) -> $ret:ty
        = $fallback:expr;)*) => {$(
        #[doc = concat!("The next object's variadic `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// The C function's contract.
        pub(crate) unsafe fn $name($($arg: $ty,)* $($va: $vty),*) -> $ret {
            let slot = slot!();
            let sym = const {
                match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("symbol name with a NUL"),
                }
            };
            match resolve(slot, sym) {
                Some(p) => {
                    // SAFETY: `p` is the address of the variadic C function `$name`, whose
                    // fixed arguments are these.
                    let f = unsafe {
                        core::mem::transmute::<usize, unsafe extern "C" fn($($ty,)* ...) -> $ret>(p)
                    };
                    // SAFETY: the caller keeps the C function's contract; the variadic
                    // arguments are passed on as the caller gave them.
                    unsafe { f($($arg,)* $($va),*) }
                }
                // SAFETY: the same operation as one system call, with the same contract.
                None => (unsafe { $fallback }) as $ret,
            }
        }
    )*};
}

/// stdio-level functions without a system call behind them: `$missing` is what they return
/// when no later object defines them (never the case with glibc).
macro_rules! libc_only {
    ($($(static $slot:ident:)? fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty
        = $missing:expr;)*) => {$(
        $(
            #[doc = concat!("Where `", stringify!($name), "` was found ([`resolve`]).")]
            static $slot: AtomicUsize = AtomicUsize::new(UNRESOLVED);
        )?
        #[doc = concat!("The next object's `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// The C function's contract.
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            let slot = slot!($($slot)?);
            let sym = const {
                match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("symbol name with a NUL"),
                }
            };
            let mut p = slot_value(slot);
            if p.is_none() {
                p = lookup(sym);
                slot.store(p.unwrap_or(MISSING), Ordering::Release);
            }
            match p {
                Some(p) => {
                    // SAFETY: `p` is the address of the C function `$name`, whose prototype
                    // is this signature.
                    let f = unsafe {
                        core::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                    };
                    // SAFETY: the caller keeps the C function's contract.
                    unsafe { f($($arg),*) }
                }
                None => {
                    crate::set_errno(libc::ENOSYS);
                    $missing
                }
            }
        }
    )*};
}

/// Looks up the `exec` family in a process about to `fork`, so that a child's `exec` (which
/// releases the child's files here first) finds them resolved. A child that looks one up
/// itself runs `dlsym`, and has to fault its code in again: a `fork` child starts with none of
/// the parent's file pages mapped. That was about 30 µs of each `fork` and `exec` (of 600 µs)
/// on this project's machine.
pub(crate) fn resolve_exec_family() {
    for (slot, sym) in [
        (&EXECVE, c"execve"),
        (&FEXECVE, c"fexecve"),
        (&EXECV, c"execv"),
        (&EXECVP, c"execvp"),
        (&EXECVPE, c"execvpe"),
    ] {
        resolve(slot, sym);
    }
}

/// A looked-up address, `None` if not looked up yet or missing.
fn slot_value(slot: &AtomicUsize) -> Option<usize> {
    let p = slot.load(Ordering::Acquire);
    (p > MISSING).then_some(p)
}

use libc::{
    AT_FDCWD, O_CREAT, O_TRUNC, O_WRONLY, SYS_close, SYS_close_range, SYS_copy_file_range, SYS_dup,
    SYS_dup3, SYS_fallocate, SYS_fchown, SYS_fcntl, SYS_fdatasync, SYS_fstat, SYS_fsync,
    SYS_ftruncate, SYS_lseek, SYS_mmap, SYS_mremap, SYS_msync, SYS_munmap, SYS_newfstatat,
    SYS_openat, SYS_pread64, SYS_preadv, SYS_preadv2, SYS_pwrite64, SYS_pwritev, SYS_pwritev2,
    SYS_read, SYS_readv, SYS_sendfile, SYS_splice, SYS_statx, SYS_write, SYS_writev, syscall,
};

syscall_backed! {
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t = syscall(SYS_read, fd, buf, n);
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t =
        syscall(SYS_write, fd, buf, n);
    fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t =
        syscall(SYS_pread64, fd, buf, n, off);
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t =
        syscall(SYS_pread64, fd, buf, n, off);
    fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t =
        syscall(SYS_pwrite64, fd, buf, n, off);
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t =
        syscall(SYS_pwrite64, fd, buf, n, off);
    fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t =
        syscall(SYS_readv, fd, iov, cnt);
    fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t =
        syscall(SYS_writev, fd, iov, cnt);
    fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =
        syscall(SYS_preadv, fd, iov, cnt, off, 0);
    fn preadv64(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =
        syscall(SYS_preadv, fd, iov, cnt, off, 0);
    fn pwritev(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =
        syscall(SYS_pwritev, fd, iov, cnt, off, 0);
    fn pwritev64(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =
        syscall(SYS_pwritev, fd, iov, cnt, off, 0);
    fn preadv2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int)
        -> ssize_t = syscall(SYS_preadv2, fd, iov, cnt, off, 0, flags);
    fn pwritev2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int)
        -> ssize_t = syscall(SYS_pwritev2, fd, iov, cnt, off, 0, flags);
    fn preadv64v2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int)
        -> ssize_t = syscall(SYS_preadv2, fd, iov, cnt, off, 0, flags);
    fn pwritev64v2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int)
        -> ssize_t = syscall(SYS_pwritev2, fd, iov, cnt, off, 0, flags);
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t =
        syscall(SYS_read, fd, buf, n.min(buflen));
    fn __pread_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t)
        -> ssize_t = syscall(SYS_pread64, fd, buf, n.min(buflen), off);
    fn __pread64_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t)
        -> ssize_t = syscall(SYS_pread64, fd, buf, n.min(buflen), off);
    fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t =
        syscall(SYS_lseek, fd, off, whence);
    fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t =
        syscall(SYS_lseek, fd, off, whence);
    fn fsync(fd: c_int) -> c_int = syscall(SYS_fsync, fd);
    fn fdatasync(fd: c_int) -> c_int = syscall(SYS_fdatasync, fd);
    fn fchown(fd: c_int, owner: libc::uid_t, group: libc::gid_t) -> c_int =
        syscall(SYS_fchown, fd, owner, group);
    fn ftruncate(fd: c_int, len: off_t) -> c_int = syscall(SYS_ftruncate, fd, len);
    fn ftruncate64(fd: c_int, len: off_t) -> c_int = syscall(SYS_ftruncate, fd, len);
    fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int =
        syscall(SYS_fallocate, fd, mode, off, len);
    fn fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int =
        syscall(SYS_fallocate, fd, mode, off, len);
    fn copy_file_range(fd_in: c_int, off_in: *mut i64, fd_out: c_int, off_out: *mut i64,
        len: size_t, flags: c_uint) -> ssize_t =
        syscall(SYS_copy_file_range, fd_in, off_in, fd_out, off_out, len, flags);
    fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, count: size_t) -> ssize_t =
        syscall(SYS_sendfile, out_fd, in_fd, off, count);
    fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut i64, count: size_t) -> ssize_t =
        syscall(SYS_sendfile, out_fd, in_fd, off, count);
    fn splice(fd_in: c_int, off_in: *mut i64, fd_out: c_int, off_out: *mut i64, len: size_t,
        flags: c_uint) -> ssize_t =
        syscall(SYS_splice, fd_in, off_in, fd_out, off_out, len, flags);
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int = syscall(SYS_fstat, fd, buf);
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int = syscall(SYS_fstat, fd, buf);
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int =
        { let _ = ver; syscall(SYS_fstat, fd, buf) };
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int =
        { let _ = ver; syscall(SYS_fstat, fd, buf) };
    fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int =
        syscall(SYS_newfstatat, libc::AT_FDCWD, path, buf, 0);
    fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int =
        syscall(SYS_newfstatat, libc::AT_FDCWD, path, buf, 0);
    fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int =
        syscall(SYS_newfstatat, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW);
    fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int =
        syscall(SYS_newfstatat, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW);
    fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int =
        syscall(SYS_newfstatat, dirfd, path, buf, flags);
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int)
        -> c_int = syscall(SYS_newfstatat, dirfd, path, buf, flags);
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint,
        buf: *mut libc::statx) -> c_int = syscall(SYS_statx, dirfd, path, flags, mask, buf);
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t)
        -> *mut c_void = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int,
        off: off_t) -> *mut c_void = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    fn munmap(addr: *mut c_void, len: size_t) -> c_int = syscall(SYS_munmap, addr, len);
    fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int =
        syscall(SYS_msync, addr, len, flags);
    fn close(fd: c_int) -> c_int = syscall(SYS_close, fd);
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int =
        syscall(SYS_close_range, first, last, flags);
    fn dup(fd: c_int) -> c_int = syscall(SYS_dup, fd);
    fn dup2(old: c_int, new: c_int) -> c_int = dup2_syscall(old, new);
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int =
        syscall(SYS_dup3, old, new, flags);
    static EXECVE: fn execve(path: *const c_char, argv: *const *const c_char,
        envp: *const *const c_char) -> c_int = syscall(libc::SYS_execve, path, argv, envp);
    static FEXECVE: fn fexecve(fd: c_int, argv: *const *const c_char,
        envp: *const *const c_char) -> c_int =
        syscall(libc::SYS_execveat, fd, c"".as_ptr(), argv, envp, libc::AT_EMPTY_PATH);
    fn creat(path: *const c_char, mode: libc::mode_t) -> c_int =
        syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
    fn creat64(path: *const c_char, mode: libc::mode_t) -> c_int =
        syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
    fn setrlimit(resource: c_int, rlim: *const libc::rlimit) -> c_int =
        syscall(libc::SYS_prlimit64, 0, resource, rlim, core::ptr::null::<libc::rlimit>());
    fn setrlimit64(resource: c_int, rlim: *const libc::rlimit) -> c_int =
        syscall(libc::SYS_prlimit64, 0, resource, rlim, core::ptr::null::<libc::rlimit>());
    fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit,
        old: *mut libc::rlimit) -> c_int = syscall(libc::SYS_prlimit64, pid, resource, new, old);
    fn prlimit64(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit,
        old: *mut libc::rlimit) -> c_int = syscall(libc::SYS_prlimit64, pid, resource, new, old);
}

syscall_backed_variadic! {
    fn open(path: *const c_char, flags: c_int; mode: c_uint) -> c_int =
        syscall(SYS_openat, AT_FDCWD, path, flags, mode);
    fn open64(path: *const c_char, flags: c_int; mode: c_uint) -> c_int =
        syscall(SYS_openat, AT_FDCWD, path, flags, mode);
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int; mode: c_uint) -> c_int =
        syscall(SYS_openat, dirfd, path, flags, mode);
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int; mode: c_uint) -> c_int =
        syscall(SYS_openat, dirfd, path, flags, mode);
    fn fcntl(fd: c_int, cmd: c_int; arg: c_long) -> c_int = syscall(SYS_fcntl, fd, cmd, arg);
    fn fcntl64(fd: c_int, cmd: c_int; arg: c_long) -> c_int = syscall(SYS_fcntl, fd, cmd, arg);
    fn ioctl(fd: c_int, request: libc::c_ulong; arg: *mut c_void) -> c_int =
        syscall(libc::SYS_ioctl, fd, request, arg);
    fn mremap(old: *mut c_void, old_len: size_t, new_len: size_t, flags: c_int;
        new_addr: *mut c_void) -> *mut c_void =
        syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
}

libc_only! {
    static EXECV: fn execv(path: *const c_char, argv: *const *const c_char) -> c_int = -1;
    static EXECVP: fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int = -1;
    static EXECVPE: fn execvpe(file: *const c_char, argv: *const *const c_char,
        envp: *const *const c_char) -> c_int = -1;
    fn fclose(stream: *mut FILE) -> c_int = libc::EOF;
    fn isatty(fd: c_int) -> c_int = 0;
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE =
        core::ptr::null_mut();
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE =
        core::ptr::null_mut();
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int = -1;
    fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = libc::SIG_ERR;
}

/// `dup2` as system calls (there is no `dup2` system call on every architecture): `dup3`,
/// or a validity check when both descriptors are the same.
///
/// # Safety
/// None beyond the system calls', which take plain integers.
unsafe fn dup2_syscall(old: c_int, new: c_int) -> c_long {
    if old == new {
        // SAFETY: F_GETFD takes no pointer.
        let r = unsafe { syscall(SYS_fcntl, old, libc::F_GETFD) };
        if r < 0 { r } else { c_long::from(new) }
    } else {
        // SAFETY: dup3 takes plain integers.
        unsafe { syscall(SYS_dup3, old, new, 0) }
    }
}

/// Ends the process like `_exit` (glibc's `_exit` and `_Exit` are the same system call).
pub(crate) fn exit_now(status: c_int) -> ! {
    loop {
        // SAFETY: exit_group takes a plain integer and does not return.
        unsafe { syscall(libc::SYS_exit_group, status) };
    }
}

/// The next object's `closefrom` (glibc 2.34+); without one, `close_range` to the end.
///
/// # Safety
/// None: it takes a plain integer.
pub(crate) unsafe fn closefrom(low: c_int) {
    static SLOT: AtomicUsize = AtomicUsize::new(UNRESOLVED);
    let mut p = slot_value(&SLOT);
    if p.is_none() {
        p = lookup(c"closefrom");
        SLOT.store(p.unwrap_or(MISSING), Ordering::Release);
    }
    match p {
        Some(p) => {
            // SAFETY: `p` is the address of glibc's `void closefrom(int)`.
            let f = unsafe { core::mem::transmute::<usize, unsafe extern "C" fn(c_int)>(p) };
            // SAFETY: it takes a plain integer.
            unsafe { f(low) }
        }
        None => {
            // SAFETY: close_range takes plain integers.
            unsafe { syscall(SYS_close_range, low, c_uint::MAX, 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_defined_name_resolves_once_and_is_cached() {
        let slot = AtomicUsize::new(UNRESOLVED);
        let p = resolve(&slot, c"getpid").expect("libc defines getpid");
        assert_eq!(slot.load(Ordering::Relaxed), p);
        assert_eq!(resolve(&slot, c"getpid"), Some(p));
    }

    #[test]
    fn a_missing_name_or_a_lookup_under_way_falls_back() {
        let slot = AtomicUsize::new(UNRESOLVED);
        crate::set_errno(libc::EXDEV);
        assert_eq!(resolve(&slot, c"pmfs_preload_no_such_symbol"), None);
        assert_eq!(slot.load(Ordering::Relaxed), MISSING);
        assert_eq!(crate::errno(), libc::EXDEV, "the lookup kept errno");
        let busy = AtomicUsize::new(RESOLVING);
        assert_eq!(resolve(&busy, c"getpid"), None);
    }

    #[test]
    fn the_dup2_fallback_checks_the_descriptor_when_both_are_equal() {
        // SAFETY: plain integers; only descriptors this test made are closed.
        unsafe {
            let r = dup2_syscall(1_000_000, 1_000_000);
            assert_eq!((r, crate::errno()), (-1, libc::EBADF));
            let fd = libc::syscall(libc::SYS_dup, 2) as c_int;
            assert!(fd >= 0);
            assert_eq!(dup2_syscall(fd, fd), c_long::from(fd));
            assert_eq!(dup2_syscall(fd, 900), 900);
            assert_eq!(libc::syscall(SYS_close, 900), 0);
            assert_eq!(libc::syscall(SYS_close, fd), 0);
        }
    }
}
