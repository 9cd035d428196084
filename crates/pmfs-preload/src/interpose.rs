//! The exported C functions a program's calls land on under `LD_PRELOAD`.
//!
//! Data calls (the read/write family, `lseek`, sync, truncate, allocate, `fstat`, `mmap`)
//! note whether their descriptor is a pmfs file; on a pmfs file served in userspace (module
//! `served`) they are answered there when they can be, else forwarded. Copies inside the
//! kernel (`copy_file_range`, `sendfile`, `splice`) are forwarded after the kernel has
//! fetched the size of a pmfs input. `munmap`, `msync` and
//! `mremap` forward and keep the table of mappings served from the pool (module `mapped`). Calls that make, copy or
//! remove descriptors forward first and then update the descriptor table from the result.
//! What the program sees is what the kernel path would give it.
//!
//! In the crate's own unit tests these functions are not exported (the test binary must not
//! interpose on itself).
//!
//! # Safety
//! Every function has the contract of the C function of the same name.

use core::ffi::{c_char, c_int, c_long, c_uint, c_void};

use libc::{FILE, iovec, off_t, size_t, ssize_t};

use crate::mapped::{self, MapCall};
use crate::served::{self, Served};
use crate::{
    active, closed, duplicated, flags_set, keeps_table, limits, note_data_call, opened, real,
    signals,
};

/// Data calls whose first argument is the descriptor, served in userspace by `$serve` (on
/// the description's [`Served`] object) when it returns `Some`, else forwarded.
macro_rules! served_calls {
    ($(fn $name:ident($fd:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty
        => |$s:ident| $serve:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: served in userspace for pmfs files when \
            possible, else forwarded.")]
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            if note_data_call($fd)
                && let Some(r) = served::with($fd, |$s: &Served| $serve)
            {
                return r as $ret;
            }
            // SAFETY: the caller's arguments, forwarded under the same contract.
            unsafe { real::$name($fd $(, $arg)*) }
        }
    )*};
}

/// Data calls always forwarded (noted if on a pmfs file).
macro_rules! forwarded_calls {
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

served_calls! {
    fn read(fd, buf: *mut c_void, n: size_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.read(fd, buf.cast(), n, None) };
    fn write(fd, buf: *const c_void, n: size_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.write(fd, buf.cast(), n, None) };
    fn pread(fd, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.read(fd, buf.cast(), n, Some(off)) };
    fn pread64(fd, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.read(fd, buf.cast(), n, Some(off)) };
    fn pwrite(fd, buf: *const c_void, n: size_t, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.write(fd, buf.cast(), n, Some(off)) };
    fn pwrite64(fd, buf: *const c_void, n: size_t, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.write(fd, buf.cast(), n, Some(off)) };
    fn readv(fd, iov: *const iovec, cnt: c_int) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.readv(fd, iov, cnt, None) };
    fn writev(fd, iov: *const iovec, cnt: c_int) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.writev(fd, iov, cnt, None) };
    fn preadv(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.readv(fd, iov, cnt, Some(off)) };
    fn preadv64(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.readv(fd, iov, cnt, Some(off)) };
    fn pwritev(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.writev(fd, iov, cnt, Some(off)) };
    fn pwritev64(fd, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| unsafe { s.writev(fd, iov, cnt, Some(off)) };
    fn __read_chk(fd, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| if n > buflen { None } else { unsafe { s.read(fd, buf.cast(), n, None) } };
    fn __pread_chk(fd, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| if n > buflen { None } else { unsafe { s.read(fd, buf.cast(), n, Some(off)) } };
    fn __pread64_chk(fd, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t =>
        // SAFETY: the caller's buffers, valid as the C contract requires.
        |s| if n > buflen { None } else { unsafe { s.read(fd, buf.cast(), n, Some(off)) } };
    fn lseek(fd, off: off_t, whence: c_int) -> off_t =>
        |s| if whence == libc::SEEK_END { s.seek_end(fd, off) } else { None };
    fn lseek64(fd, off: off_t, whence: c_int) -> off_t =>
        |s| if whence == libc::SEEK_END { s.seek_end(fd, off) } else { None };
    fn fsync(fd) -> c_int => |s| s.sync();
    fn fdatasync(fd) -> c_int => |s| s.sync();
    fn ftruncate(fd, len: off_t) -> c_int => |s| s.truncate(fd, len);
    fn ftruncate64(fd, len: off_t) -> c_int => |s| s.truncate(fd, len);
    fn fallocate(fd, mode: c_int, off: off_t, len: off_t) -> c_int =>
        |s| s.allocate(fd, mode, off, len);
    fn fallocate64(fd, mode: c_int, off: off_t, len: off_t) -> c_int =>
        |s| s.allocate(fd, mode, off, len);
    fn fchown(fd, owner: libc::uid_t, group: libc::gid_t) -> c_int =>
        |s| s.chown(fd, owner, group);
}

forwarded_calls! {
    fn preadv2(fd, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    fn preadv64v2(fd, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
}

/// Positioned vector writes with flags, forwarded; on a pmfs file after the kernel fetched
/// its size ([`crate::refresh_kernel_size`]). An append (`RWF_APPEND`, or an `O_APPEND`
/// description) goes where the kernel thinks the file ends, and served writes move the end
/// behind its back: without the refresh the bytes would overwrite the file at the size the
/// kernel last saw.
macro_rules! flagged_writes {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: forwarded, after the kernel learned the \
            size of a pmfs file.")]
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
            flags: c_int,
        ) -> ssize_t {
            if note_data_call(fd) {
                crate::refresh_kernel_size(fd);
            }
            // SAFETY: the caller's arguments, forwarded under the same contract.
            unsafe { real::$name(fd, iov, cnt, off, flags) }
        }
    )*};
}

flagged_writes!(pwritev2, pwritev64v2);

/// Before a forwarded call that copies from `fd_in` to `fd_out` inside the kernel
/// (`copy_file_range`, `sendfile`, `splice`): notes the call, and if `fd_in` is a pmfs file,
/// has the kernel fetch its attributes. Those calls stop at the size the kernel last saw,
/// without asking the daemon as a `read` past it does, and served writes and truncations
/// change the size behind the kernel's back ([`crate::refresh_kernel_size`]). They copy the
/// pages the kernel caches, which stores through mappings served from the pool bypass: a
/// served file that some process maps has its mtime raised first, which makes the kernel
/// drop them when it fetches the attributes ([`Served::reveal_mapped`]).
fn before_kernel_copy(fd_in: c_int, fd_out: c_int) {
    if note_data_call(fd_in) {
        served::peek(fd_in, Served::reveal_mapped);
        crate::refresh_kernel_size(fd_in);
    } else {
        note_data_call(fd_out);
    }
}

/// Copies inside the kernel from descriptor `$in` to `$out`: forwarded after
/// [`before_kernel_copy`].
macro_rules! kernel_copies {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) from $in:ident to $out:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: forwarded, after the kernel learned the \
            input's size.")]
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> ssize_t {
            before_kernel_copy($in, $out);
            // SAFETY: the caller's arguments, forwarded under the same contract.
            unsafe { real::$name($($arg),*) }
        }
    )*};
}

kernel_copies! {
    fn copy_file_range(fd_in: c_int, off_in: *mut i64, fd_out: c_int, off_out: *mut i64,
        len: size_t, flags: c_uint) from fd_in to fd_out;
    fn splice(fd_in: c_int, off_in: *mut i64, fd_out: c_int, off_out: *mut i64, len: size_t,
        flags: c_uint) from fd_in to fd_out;
    fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, count: size_t)
        from in_fd to out_fd;
    fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut i64, count: size_t)
        from in_fd to out_fd;
}

/// Writes attributes `$st` ([`served::Stat`]) into `$buf`, a `stat` or `stat64` (zeroed
/// first: the types have private padding fields).
macro_rules! write_stat {
    ($buf:expr, $st:expr) => {{
        let (b, st) = (&mut *$buf, $st);
        *b = core::mem::zeroed();
        b.st_dev = st.dev;
        b.st_ino = st.ino;
        b.st_mode = st.mode;
        b.st_nlink = st.nlink;
        b.st_uid = st.uid;
        b.st_gid = st.gid;
        b.st_rdev = st.rdev;
        b.st_size = st.size as i64;
        b.st_blksize = st.blksize;
        b.st_blocks = st.blocks as i64;
        let [a, m, c] = st
            .times
            .map(|t| (t.div_euclid(1_000_000_000), t.rem_euclid(1_000_000_000)));
        (b.st_atime, b.st_atime_nsec) = a;
        (b.st_mtime, b.st_mtime_nsec) = m;
        (b.st_ctime, b.st_ctime_nsec) = c;
    }};
}

/// Fills `$buf` for served descriptor `$fd`; evaluates to whether it did.
macro_rules! fill_stat {
    ($fd:expr, $buf:expr) => {
        match served::peek($fd, Served::stat) {
            Some(st) => {
                write_stat!($buf, st);
                true
            }
            None => false,
        }
    };
}

/// The path forms of `stat`: a pmfs regular file's attributes come from its inode in the
/// pool once the kernel has resolved the name from its caches, and a file on a mount that
/// answers exactly from them gets that walk's answer ([`served::stat_path`]); anything else
/// is `$forward`.
macro_rules! stat_path {
    ($dirfd:expr, $path:expr, $flags:expr, $buf:expr, $forward:expr) => {{
        match (active() && !$buf.is_null())
            .then(|| served::stat_path($dirfd, $path, $flags))
            .flatten()
        {
            Some(Ok(st)) => {
                // SAFETY: the contract makes `$buf` a writable stat buffer.
                unsafe { write_stat!($buf, st) };
                0
            }
            Some(Err(e)) => {
                crate::set_errno(e);
                -1
            }
            // SAFETY: forwarded under the same contract.
            None => unsafe { $forward },
        }
    }};
}

/// `stat`: a pmfs regular file answers from its inode in the pool, a file on a mount that
/// answers exactly from one path walk (`served::stat_path`).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    stat_path!(libc::AT_FDCWD, path, 0, buf, real::stat(path, buf))
}

/// `stat64`: as [`stat`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    stat_path!(libc::AT_FDCWD, path, 0, buf, real::stat64(path, buf))
}

/// `lstat`: as [`stat`], not following a final symbolic link.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    let nofollow = libc::AT_SYMLINK_NOFOLLOW;
    stat_path!(libc::AT_FDCWD, path, nofollow, buf, real::lstat(path, buf))
}

/// `lstat64`: as [`lstat`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    let nofollow = libc::AT_SYMLINK_NOFOLLOW;
    stat_path!(
        libc::AT_FDCWD,
        path,
        nofollow,
        buf,
        real::lstat64(path, buf)
    )
}

/// `fstatat`: as [`stat`] (with `AT_EMPTY_PATH` and an empty path, forwarded).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    stat_path!(
        dirfd,
        path,
        flags,
        buf,
        real::fstatat(dirfd, path, buf, flags)
    )
}

/// `fstatat64`: as [`fstatat`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    stat_path!(
        dirfd,
        path,
        flags,
        buf,
        real::fstatat64(dirfd, path, buf, flags)
    )
}

/// `fstat`: a served pmfs file's attributes come from its inode in the pool
/// (`Served::stat`), with no request to the daemon; everything else is forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the contract makes `buf` a writable stat buffer.
    if note_data_call(fd) && !buf.is_null() && unsafe { fill_stat!(fd, buf) } {
        return 0;
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::fstat(fd, buf) }
}

/// `fstat64`: as [`fstat`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int {
    // SAFETY: the contract makes `buf` a writable stat buffer.
    if note_data_call(fd) && !buf.is_null() && unsafe { fill_stat!(fd, buf) } {
        return 0;
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::fstat64(fd, buf) }
}

/// `statx`: a pmfs regular file (named by a path, or open at `dirfd` with `AT_EMPTY_PATH`)
/// gets the kernel's cached answer with its attributes from its inode in the pool
/// (`served::cached_statx`), with no request to the daemon; a file on a mount that answers
/// exactly gets that walk's answer (`served::exact_as_asked`); anything else is forwarded.
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
    if !path.is_null() && !buf.is_null() && active() {
        // SAFETY: the contract makes `path` a valid C string.
        let on_fd = flags & libc::AT_EMPTY_PATH != 0 && unsafe { *path } == 0;
        if !on_fd || note_data_call(dirfd) {
            // SAFETY: the contract makes `buf` a writable statx buffer.
            let out = unsafe { &mut *buf };
            // The mount's unique id tells pmfs mounts, and mounts that answer exactly, apart.
            let walk = mask | libc::STATX_MNT_ID_UNIQUE;
            match served::cached_statx(dirfd, path, flags, walk, out) {
                Ok(Some(st)) if served::as_asked(out, mask) => {
                    st.patch(out);
                    return 0;
                }
                Ok(None) if served::exact_as_asked(out, mask) => return 0,
                Err(e) if e != libc::ENOSYS => {
                    crate::set_errno(e);
                    return -1;
                }
                _ => {}
            }
        }
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::statx(dirfd, path, flags, mask, buf) }
}

/// `mmap` of a pmfs file: a shared mapping of a description served in userspace maps the
/// file's blocks straight from the pool (module `mapped`); any other is forwarded, and the
/// description left to the kernel from then on, whose page cache backs the mapping, unless
/// the kernel is sure to refuse the call (`MapCall::refused`: the description stays served,
/// as it would after any other failed call). A `MAP_FIXED` mapping replaces what the table of
/// served mappings knew of the range.
///
/// # Safety
/// The C function's contract, for the call's arguments.
unsafe fn map_file(
    call: MapCall,
    forward: unsafe fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void,
) -> *mut c_void {
    if call.flags & libc::MAP_ANONYMOUS == 0 && note_data_call(call.fd) {
        if call.wants_pool()
            && let Some(p) = served::with(call.fd, |s| s.map(&call))
        {
            return core::ptr::without_provenance_mut(p as usize);
        }
        if !served::peek(call.fd, |s| Some(s.refuses(&call))).unwrap_or(false) {
            served::mapped(call.fd);
        }
    }
    // SAFETY: forwarded under the same contract.
    let p = unsafe {
        forward(
            core::ptr::without_provenance_mut(call.addr),
            call.len,
            call.prot,
            call.flags,
            call.fd,
            call.off,
        )
    };
    if call.flags & libc::MAP_FIXED != 0 && p != libc::MAP_FAILED {
        mapped::replaced(p as usize, call.len);
    }
    p
}

/// `mmap` and `mmap64`, through `map_file`.
macro_rules! map_calls {
    ($(fn $name:ident => $forward:path;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: see `map_file`.")]
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(
            addr: *mut c_void,
            len: size_t,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: off_t,
        ) -> *mut c_void {
            let call = MapCall {
                addr: addr as usize,
                len,
                prot,
                flags,
                fd,
                off,
            };
            // SAFETY: the caller's arguments, under the same contract.
            unsafe { map_file(call, $forward) }
        }
    )*};
}

map_calls! {
    fn mmap => real::mmap;
    fn mmap64 => real::mmap64;
}

/// `munmap`: forwarded; the pool segments in the range are forgotten, and a served mapping's
/// pin released with its last one (module `mapped`).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: the caller's arguments, under the same contract.
    unsafe { mapped::munmap(addr, len) }
}

/// `msync`: forwarded; pool segments in the range are flushed from the CPU caches too.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, under the same contract.
    unsafe { mapped::msync(addr, len, flags) }
}

/// `mremap` (variadic in C: the new address is read as the fifth argument, where the C
/// calling convention of Linux puts it): forwarded, and pool segments followed when they
/// shrink; moving or growing them is served from the pool (module `mapped`).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's arguments, under the same contract.
    unsafe { mapped::mremap(old, old_len, new_len, flags, new_addr) }
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

/// Makes `call`, which closes or replaces descriptors `first..=last`, with their entries
/// forgotten before it and again after it, `errno` kept: the kernel may give a number to
/// another file before `call` returns, and another thread may have classified the old one
/// meanwhile (see module `fdtable`).
fn closing<R>(first: usize, last: usize, call: impl FnOnce() -> R) -> R {
    // Asked once: a process keeps the table or not for the whole call.
    let keeps = keeps_table();
    if keeps {
        closed(first, last);
    }
    let r = call();
    if keeps {
        let saved = crate::errno();
        closed(first, last);
        crate::set_errno(saved);
    }
    r
}

/// [`closing`] for one descriptor, which may be invalid (then only `call` is made).
fn closing_one<R>(fd: c_int, call: impl FnOnce() -> R) -> R {
    match usize::try_from(fd) {
        Ok(i) => closing(i, i, call),
        Err(_) => call(),
    }
}

/// `close`: forwarded, with the entry forgotten before (Linux releases the descriptor even
/// when close reports an error) and after. A served description's last descriptor thus
/// releases its node, and the node's pin, before the kernel tells the daemon: the daemon frees
/// a file unlinked meanwhile at that release only if no process pins it.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    closing_one(fd, || unsafe { real::close(fd) })
}

/// `close_range`: forwarded, with the entries forgotten before and after (not with
/// `CLOSE_RANGE_CLOEXEC`, which closes nothing now).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let call = || unsafe { real::close_range(first, last, flags) };
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        return call();
    }
    closing(first as usize, last as usize, call)
}

/// `closefrom`: forwarded, with the entries from `low` on forgotten before and after.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn closefrom(low: c_int) {
    // SAFETY: forwarded under the same contract.
    closing(usize::try_from(low).unwrap_or(0), usize::MAX, || unsafe {
        real::closefrom(low)
    });
}

/// `fclose`: forwarded, with the stream's descriptor forgotten before and after.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    // SAFETY: forwarded under the same contract.
    closing_one(stream_fd(stream), || unsafe { real::fclose(stream) })
}

/// `freopen`: forwarded, with the stream's old descriptor (closed, or reused) forgotten before
/// and after.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    // SAFETY: forwarded under the same contract.
    closing_one(stream_fd(stream), || unsafe {
        real::freopen(path, mode, stream)
    })
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
    // SAFETY: forwarded under the same contract.
    closing_one(stream_fd(stream), || unsafe {
        real::freopen64(path, mode, stream)
    })
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

/// `dup2`: as [`dup`]; `new` is replaced (closed first if open), its entry forgotten before.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    replacing(old, new, || unsafe { real::dup2(old, new) })
}

/// `dup3`: as [`dup2`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    replacing(old, new, || unsafe { real::dup3(old, new, flags) })
}

/// Makes `call`, which makes `new` a duplicate of `old`, with `new`'s entry forgotten before
/// (as [`closing`]) and set to `old`'s after.
fn replacing(old: c_int, new: c_int, call: impl FnOnce() -> c_int) -> c_int {
    if let Ok(i) = usize::try_from(new)
        && old != new
        && keeps_table()
    {
        closed(i, i);
    }
    let r = call();
    duplicated(old, r);
    r
}

/// `fcntl` (variadic in C; the argument is taken as a `long`, wide enough for every
/// command's argument and passed on unchanged): `F_DUPFD`/`F_DUPFD_CLOEXEC` followed like
/// [`dup`], `F_SETFL`'s `O_APPEND` followed, every other command only forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r);
    } else if cmd == libc::F_SETFL && r == 0 {
        flags_set(fd);
    }
    r
}

/// `ioctl` (variadic in C; the argument is taken as a pointer, wide enough for every request's
/// argument and passed on unchanged): forwarded; `FIONREAD` on a pmfs file after the kernel
/// fetched its size (`refresh_kernel_size`), since it answers the size less the offset, and
/// served writes and truncations change the size behind its back. `TCGETS` on a pmfs file
/// served in userspace fails with `ENOTTY` there, as `isatty` answers.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: *mut c_void) -> c_int {
    if request == libc::TCGETS
        && note_data_call(fd)
        && let Some(r) = no_terminal(fd)
    {
        return r;
    }
    if request == libc::FIONREAD && note_data_call(fd) {
        crate::refresh_kernel_size(fd);
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::ioctl(fd, request, arg) }
}

/// `isatty`: false, with `ENOTTY`, for a pmfs file served in userspace (see `no_terminal`);
/// else forwarded.
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn isatty(fd: c_int) -> c_int {
    if note_data_call(fd) && no_terminal(fd).is_some() {
        return 0;
    }
    // SAFETY: forwarded under the same contract.
    unsafe { real::isatty(fd) }
}

/// The answer to a terminal request (`TCGETS`, what `isatty` asks) on regular file `fd`, if it
/// is served in userspace: -1 with `ENOTTY`, or `EIO` once its mount is gone. Through the
/// kernel, every `ioctl` the kernel does not answer itself is a round trip to the daemon,
/// which answers this one the same way; Python's `open` asks once per file.
fn no_terminal(fd: c_int) -> Option<c_int> {
    served::with(fd, |_| {
        crate::set_errno(libc::ENOTTY);
        Some(-1)
    })
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
    } else if cmd == libc::F_SETFL && r == 0 {
        flags_set(fd);
    }
    r
}

/// `sigaction`: handlers of signals other than faults are wrapped, so that one arriving while
/// its thread is inside the library runs when the library call is done (module `signals`).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if signals::wrapped(sig) && active() {
        // SAFETY: the same contract.
        unsafe { signals::sigaction(sig, act, old) }
    } else {
        // SAFETY: forwarded under the same contract.
        unsafe { real::sigaction(sig, act, old) }
    }
}

/// `signal`: glibc's, with the handler wrapped as [`sigaction`] wraps it (BSD semantics: the
/// signal blocked while its handler runs, interrupted calls restarted).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if !(signals::wrapped(sig) && active()) {
        // SAFETY: forwarded under the same contract.
        return unsafe { real::signal(sig, handler) };
    }
    // SAFETY: all-zero bytes are a valid action; the set functions get valid sets and a
    // signal number in range.
    unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        act.sa_sigaction = handler;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaddset(&mut act.sa_mask, sig);
        let mut old: libc::sigaction = core::mem::zeroed();
        if signals::sigaction(sig, &act, &mut old) == 0 {
            old.sa_sigaction
        } else {
            libc::SIG_ERR
        }
    }
}

/// Limit calls on this process (`setrlimit`, `setrlimit64`; `prlimit`, `prlimit64` with pid
/// 0 or its own): forwarded, then the file size limit that served writes keep is read again
/// (module `limits`).
macro_rules! limit_calls {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) on $pid:expr, $resource:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: forwarded; a new file size limit is \
            followed.")]
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            // SAFETY: the caller's arguments, forwarded under the same contract.
            let r = unsafe { real::$name($($arg),*) };
            limits::after_set($pid, $resource, r);
            r
        }
    )*};
}

limit_calls! {
    fn setrlimit(resource: c_int, rlim: *const libc::rlimit) on 0, resource;
    fn setrlimit64(resource: c_int, rlim: *const libc::rlimit) on 0, resource;
    fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit,
        old: *mut libc::rlimit) on pid, resource;
    fn prlimit64(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit,
        old: *mut libc::rlimit) on pid, resource;
}

/// `_exit`: the process's userspace nodes are released first (their pins in the pool) and its
/// counters reported (`PMFS_PRELOAD_STATS`), then it ends.
///
/// # Safety
/// None beyond `_exit`'s: it takes a plain integer.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::ending();
    real::exit_now(status)
}

/// `_Exit`: as [`_exit`].
///
/// # Safety
/// None beyond `_Exit`'s: it takes a plain integer.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case, reason = "the C name")]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    crate::ending();
    real::exit_now(status)
}

/// `execve`: the process's userspace nodes are released first (the new image opens its own).
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    crate::leaving();
    // SAFETY: forwarded under the same contract.
    unsafe { real::execve(path, argv, envp) }
}

/// `execv`: as [`execve`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    crate::leaving();
    // SAFETY: forwarded under the same contract.
    unsafe { real::execv(path, argv) }
}

/// `execvp`: as [`execve`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    crate::leaving();
    // SAFETY: forwarded under the same contract.
    unsafe { real::execvp(file, argv) }
}

/// `execvpe`: as [`execve`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    crate::leaving();
    // SAFETY: forwarded under the same contract.
    unsafe { real::execvpe(file, argv, envp) }
}

/// `fexecve`: as [`execve`].
///
/// # Safety
/// The C function's contract.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    crate::leaving();
    // SAFETY: forwarded under the same contract.
    unsafe { real::fexecve(fd, argv, envp) }
}

/// The `execl` family takes its arguments as a variadic list, which stable Rust cannot
/// receive. Each of them is a trampoline that stores the argument registers just below the
/// arguments the caller passed on the stack — making one array of every argument after the
/// first, in order, as the x86-64 System V convention passes variadic pointers like named
/// ones — and calls `$gathered(first, array)` with it. It then puts the stack back as it was
/// and returns what that call returned.
macro_rules! exec_list_calls {
    ($($(#[$doc:meta])* fn $name:ident => $gathered:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The C function's contract: a NULL-terminated list of C strings (followed by the
        /// environment for `execle`).
        #[cfg(target_arch = "x86_64")]
        #[cfg_attr(not(test), unsafe(no_mangle))]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(path: *const c_char, arg0: *const c_char) -> c_int {
            core::arch::naked_asm!(
                // The return address out of the way: the stacked arguments start at rsp.
                "pop rax",
                // Arguments 2 to 6 (registers) in front of them.
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",
                // Back on top, which also aligns the stack to 16 bytes for the call.
                "push rax",
                "call {gathered}",
                "pop rcx",
                "add rsp, 40",
                "push rcx",
                "ret",
                gathered = sym $gathered,
            )
        }
    )*};
}

exec_list_calls! {
    /// `execl`: its argument list gathered, then [`execv`].
    fn execl => execl_gathered;
    /// `execlp`: its argument list gathered, then [`execvp`].
    fn execlp => execlp_gathered;
    /// `execle`: its argument list and environment gathered, then [`execve`].
    fn execle => execle_gathered;
}

/// `execl` with its arguments as an array.
///
/// # Safety
/// `argv` is a NULL-terminated array of C strings.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn execl_gathered(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { execv(path, argv) }
}

/// `execlp` with its arguments as an array.
///
/// # Safety
/// As [`execl_gathered`].
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn execlp_gathered(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { execvp(file, argv) }
}

/// `execle` with its arguments as an array; the environment is the entry after their NULL.
///
/// # Safety
/// As [`execl_gathered`], with the environment after the NULL.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn execle_gathered(path: *const c_char, argv: *const *const c_char) -> c_int {
    let mut end = 0;
    // SAFETY: the array is NULL-terminated.
    while !unsafe { *argv.add(end) }.is_null() {
        end += 1;
    }
    // SAFETY: execle's contract puts the environment right after the NULL.
    let envp = unsafe { *argv.add(end + 1) }.cast::<*const c_char>();
    // SAFETY: the caller's arguments.
    unsafe { execve(path, argv, envp) }
}
