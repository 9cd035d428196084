//! The exported C functions a program's calls land on under `LD_PRELOAD`.
//!
//! Data calls (the read/write family, `lseek`, sync, truncate, allocate, `fstat`, `mmap`)
//! note whether their descriptor is a pmfs file and forward. Calls that make, copy or
//! remove descriptors forward first and then update the descriptor table from the result.
//! Nothing here changes what the program sees: arguments, results and `errno` are the next
//! definition's.
//!
//! In the crate's own unit tests these functions are not exported (the test binary must not
//! interpose on itself).
//!
//! # Safety
//! Every function has the contract of the C function of the same name.

use core::ffi::{c_char, c_int, c_long, c_uint, c_void};

use libc::{FILE, iovec, off_t, size_t, ssize_t};

use crate::{closed, duplicated, note_data_call, opened, real};

/// Data calls whose first argument is the descriptor.
macro_rules! data_calls {
    ($(fn $name:ident($fd:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: noted if on a pmfs file, then forwarded.")]
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            note_data_call($fd);
            // SAFETY: the caller's arguments, forwarded under the same contract.
            unsafe { real::$name($fd $(, $arg)*) }
        }
    )*};
}

data_calls! {
    fn read(fd, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd, buf: *const c_void, n: size_t) -> ssize_t;
    fn pread(fd, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    fn pread64(fd, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    fn pwrite(fd, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    fn pwrite64(fd, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    fn readv(fd, iov: *const iovec, cnt: c_int) -> ssize_t;
    fn writev(fd, iov: *const iovec, cnt: c_int) -> ssize_t;
    fn preadv(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    fn preadv64(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    fn pwritev(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    fn pwritev64(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t;
    fn preadv2(fd, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    fn pwritev2(fd, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    fn __read_chk(fd, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    fn __pread_chk(fd, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t;
    fn __pread64_chk(fd, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t;
    fn lseek(fd, off: off_t, whence: c_int) -> off_t;
    fn lseek64(fd, off: off_t, whence: c_int) -> off_t;
    fn fsync(fd) -> c_int;
    fn fdatasync(fd) -> c_int;
    fn ftruncate(fd, len: off_t) -> c_int;
    fn ftruncate64(fd, len: off_t) -> c_int;
    fn fallocate(fd, mode: c_int, off: off_t, len: off_t) -> c_int;
    fn fallocate64(fd, mode: c_int, off: off_t, len: off_t) -> c_int;
    fn fstat(fd, buf: *mut libc::stat) -> c_int;
    fn fstat64(fd, buf: *mut libc::stat64) -> c_int;
}

/// `__fxstat` (glibc before 2.33 compiled `fstat` to it): noted, then forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    note_data_call(fd);
    // SAFETY: forwarded under the same contract.
    unsafe { real::__fxstat(ver, fd, buf) }
}

/// `__fxstat64`: noted, then forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
    note_data_call(fd);
    // SAFETY: forwarded under the same contract.
    unsafe { real::__fxstat64(ver, fd, buf) }
}

/// `statx`: noted when it stats an open descriptor (`AT_EMPTY_PATH` and an empty path),
/// then forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: the contract makes `path` a valid C string when it is not null.
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        note_data_call(dirfd);
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::statx(dirfd, path, flags, mask, buf) }
}

/// `mmap`: noted if it maps a pmfs file, then forwarded (mapped through the kernel).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0 {
        note_data_call(fd);
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::mmap(addr, len, prot, flags, fd, off) }
}

/// `mmap64`: as [`mmap`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0 {
        note_data_call(fd);
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::mmap64(addr, len, prot, flags, fd, off) }
}

/// `open` (variadic in C: the mode is read as the third argument, where the C calling
/// convention of Linux puts it): forwarded, then the new descriptor classified.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: forwarded under the same contract.
    let fd = unsafe { real::open(path, flags, mode) };
    opened(fd);
    fd
}

/// `open64`: as [`open`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: forwarded under the same contract.
    let fd = unsafe { real::open64(path, flags, mode) };
    opened(fd);
    fd
}

/// `openat` (variadic in C, as [`open`]).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: forwarded under the same contract.
    let fd = unsafe { real::openat(dirfd, path, flags, mode) };
    opened(fd);
    fd
}

/// `openat64`: as [`openat`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: forwarded under the same contract.
    let fd = unsafe { real::openat64(dirfd, path, flags, mode) };
    opened(fd);
    fd
}

/// `creat`: forwarded, then the new descriptor classified.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn creat(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: forwarded under the same contract.
    let fd = unsafe { real::creat(path, mode) };
    opened(fd);
    fd
}

/// `creat64`: as [`creat`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: forwarded under the same contract.
    let fd = unsafe { real::creat64(path, mode) };
    opened(fd);
    fd
}

/// `close`: forwarded, then the entry forgotten (Linux releases the descriptor even when
/// close reports an error).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::close(fd) };
    if let Ok(i) = usize::try_from(fd) {
        let saved = crate::errno();
        closed(i, i);
        crate::set_errno(saved);
    }
    r
}

/// `close_range`: forwarded, then the closed entries forgotten (not with
/// `CLOSE_RANGE_CLOEXEC`, which closes nothing now).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::close_range(first, last, flags) };
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        closed(first as usize, last as usize);
    }
    r
}

/// `closefrom`: forwarded, then the entries from `low` on forgotten.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn closefrom(low: c_int) {
    // SAFETY: forwarded under the same contract.
    unsafe { real::closefrom(low) };
    closed(usize::try_from(low).unwrap_or(0), usize::MAX);
}

/// `fclose`: forwarded, then the stream's descriptor forgotten.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    let fd = stream_fd(stream);
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::fclose(stream) };
    forget_stream_fd(fd);
    r
}

/// `freopen`: forwarded, then the stream's old descriptor forgotten (closed, or reused).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    let fd = stream_fd(stream);
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::freopen(path, mode, stream) };
    forget_stream_fd(fd);
    r
}

/// `freopen64`: as [`freopen`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    let fd = stream_fd(stream);
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::freopen64(path, mode, stream) };
    forget_stream_fd(fd);
    r
}

/// The descriptor under an open stream (-1 for a null stream).
fn stream_fd(stream: *mut FILE) -> c_int {
    if stream.is_null() {
        return -1;
    }
    let saved = crate::errno();
    // SAFETY: the caller passes an open stream to fclose/freopen, which fileno accepts.
    let fd = unsafe { libc::fileno(stream) };
    crate::set_errno(saved);
    fd
}

fn forget_stream_fd(fd: c_int) {
    if let Ok(i) = usize::try_from(fd) {
        let saved = crate::errno();
        closed(i, i);
        crate::set_errno(saved);
    }
}

/// `dup`: forwarded; the new descriptor refers to what the old one does.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::dup(fd) };
    duplicated(fd, r);
    r
}

/// `dup2`: as [`dup`]; `new` is replaced (closed first if open).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::dup2(old, new) };
    duplicated(old, r);
    r
}

/// `dup3`: as [`dup2`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::dup3(old, new, flags) };
    duplicated(old, r);
    r
}

/// `fcntl` (variadic in C; the argument is taken as a `long`, wide enough for every
/// command's argument and passed on unchanged): `F_DUPFD`/`F_DUPFD_CLOEXEC` followed like
/// [`dup`], every other command only forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r);
    }
    r
}

/// `fcntl64` (what `fcntl` compiles to with `_FILE_OFFSET_BITS=64` on glibc 2.28+): as
/// [`fcntl`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::fcntl64(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r);
    }
    r
}
