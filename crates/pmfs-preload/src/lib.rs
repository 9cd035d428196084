//! # pmfs-preload
//!
//! `libpmfs_preload.so`: an `LD_PRELOAD` library for programs that use files on a pmfs FUSE
//! mount (`pmfs mount`). It owns the FFI edge only — which calls it stands in front of, how
//! it recognises pmfs files and follows descriptors — and must not know how file data is laid
//! out: that is the engine's (`pmfs`).
//!
//! ```text
//! LD_PRELOAD=target/release/libpmfs_preload.so PMFS_PRELOAD_STATS=1 sqlite3 /mnt/pmfs/db
//! ```
//!
//! ## What works today
//! - **Userspace service of pmfs files** (module `served`): on the first pmfs file of a mount, the
//!   process attaches to the pool as a data-only client (`pmfs::Volume::attach_file`; HashFS pools
//!   only — otherwise, without permission on the pool file, or while the volume awaits recovery (a
//!   read-only mount of a crashed pool recovers it in memory only), that mount keeps the kernel
//!   path for good). Its descriptor of the pool file, like the ones `mmap` uses, sits high in the
//!   descriptor range (below 1024), so programs that count on getting the lowest free number still
//!   get it; a program that closes it or puts another file at its number changes nothing for the
//!   client, which knows the pool by the identity it read while attaching. `read`, `write`,
//!   `pread(64)`, `pwrite(64)`, `readv`, `writev`, `preadv(64)`, `pwritev(64)`,
//!   `__read_chk`/`__pread(64)_chk`, `lseek(SEEK_END)`, `fsync`, `fdatasync`, `ftruncate(64)` and
//!   `fallocate(64)` (modes 0, `KEEP_SIZE`, `PUNCH_HOLE|KEEP_SIZE`, `ZERO_RANGE` and
//!   `ZERO_RANGE|KEEP_SIZE`) run against the pool through the engine's copy-on-write log path
//!   (atomic and durable on return, coherent with the daemon and other processes). `fstat(64)`
//!   answers from the file's inode in the pool, with no request to the daemon (whose mount caches
//!   no file attributes); `stat`, `lstat`, `fstatat` (and their `64` forms) and `statx` of a pmfs
//!   regular file let the kernel resolve the name from its caches (`statx` with
//!   `AT_STATX_DONT_SYNC`: permission checks, no attribute refresh) and answer from the inode too.
//!   That walk also answers these calls for any file whose mount keeps every attribute in the
//!   kernel (disk and memory file systems, proc, sysfs: `statmount` tells, once per mount), so a
//!   program under the library walks each path once, as without it; on other mounts (FUSE, network
//!   file systems, overlayfs) the call is forwarded and the path walked twice. `fchown` that
//!   changes nothing but the ctime (the file's own owner and group, asked by root or the owner, of
//!   a file with no set-ID bit and no extended attribute, on a writable mount: `statmount`, or a
//!   description open for writing) raises the ctime in the pool; `sqlite3` running as root asks for
//!   one after every open of its journal, two FUSE requests (GETXATTR, SETATTR) through the kernel.
//!   Every other change of owner goes to the kernel. `isatty` (and `ioctl(TCGETS)`, what it asks)
//!   answers that a served file is no terminal: through the kernel, an `ioctl` on a FUSE file is a
//!   round trip to the daemon, and Python's `open` asks once per file. The kernel's file offset
//!   stays the truth (`read`/`write` take their range from it with one atomic `lseek(n, SEEK_CUR)`
//!   and give back what a short transfer left unused), so `dup`s, threads, `fork` children and
//!   kernel-path users of the same description agree on it, and concurrent transfers on one
//!   description get ranges of their own, as through the kernel.
//! - **`O_APPEND`**: writes on appending descriptions (`write`, `writev`, and `pwrite`/
//!   `pwritev`, which append on Linux as well) use the engine's atomic append: the bytes land
//!   at the end of file as the log says when the update commits, so appenders in any number
//!   of processes never overwrite each other, and `write` leaves the offset after them.
//! - **The mount going away** (module `liveness`): once the daemon a process attached next to
//!   died, or its mount was detached (`fusermount3 -u -z`), calls served in userspace fail
//!   with `EIO` (a shared `mmap` of a served description too), its served mappings are made
//!   private, and the process never writes to the pool again (its pins are left for the
//!   owner's next mount to sweep). A clean unmount is seen at once (the pool's mount-state
//!   word, one load per call); a killed daemon or a detached mount within 10 ms (a probe of
//!   the daemon's `/proc/<pid>/stat` and of the mount table, at most every 10 ms). Attaching
//!   needs the daemon: the process the pool records as its owner, if it still runs, else the
//!   holder of the pool's `flock` in `/proc/locks`.
//! - **Mapped files** (module `mapped`): `mmap`/`mmap64` with `MAP_SHARED` (or
//!   `MAP_SHARED_VALIDATE`) of a served description maps the file's blocks straight from the pool:
//!   the engine puts the file in *mapped mode* (while any process maps it, every process writes it
//!   in place) and names the pool pieces that hold the range; the caller's range is first mapped
//!   through the kernel from its own descriptor (the kernel checks the call and gives the exact
//!   errno), then each piece of the pool file is mapped over it (`MAP_FIXED`). Stores through the
//!   mapping are what `read` returns in any process, and `write`s of any process (served in
//!   userspace or through the daemon) appear in it at once. Holes in the range are allocated
//!   (zeroed, the file's times kept) first for a writable description; a read-only one leaves them
//!   to the kernel's mapping, which reads them as zeros, so that mapping a file to read changes
//!   neither its allocation nor its times (and moving or growing such a mapping gives them blocks
//!   then). The description stays served in userspace. `munmap` and `MAP_FIXED` mappings over it
//!   follow it (the file's pin is released with the last page), `msync` also flushes the CPU caches
//!   over it, `mremap` shrinking it is followed, moving or growing it (within the file) is served
//!   from the pool, a `fork` child takes pins of its own, and exit and exec make the pages private
//!   before releasing the pins. Once the mount is found gone the mapping is made private
//!   (`MAP_PRIVATE` of the same bytes), so later stores stay in the process. These calls count as
//!   served. Stores change no time and bypass the pages the kernel may cache of the file (copies
//!   inside the kernel read those, as do processes without the library): `msync` and the release of
//!   the last page of a mapping of a writable description raise the file's mtime and ctime
//!   (`pmfs::MapPin::stored`; a kernel file system raises them at a store's page fault) and have
//!   the kernel drop its pages (below), and so does a `sendfile`/`splice`/`copy_file_range` from a
//!   served file that some process maps, before the kernel copies (`pmfs::Client::reveal_mapped`).
//!   Until then, another process's `stat` shows the mtime from before the stores.
//! - **The kernel's pages** (module `kernel_pages`): after an update of a file whose pages the
//!   kernel may hold (the daemon read it for the kernel since they were last dropped), the
//!   update raises the mtime, which makes each later `read` through the kernel drop them, and
//!   asks the daemon, over a socket named after the pool file and a random word the daemon
//!   stores in it at mount (`pmfs::kernel_pages`), to make the kernel drop them at once, and
//!   waits for it: a mapping through the kernel (a process without the library, or a mapping
//!   the library leaves to the kernel) shows the update once it returned. That costs a round
//!   trip to the daemon (about 50 µs here), once per kernel read of the file between updates.
//! - **Left to the kernel on pmfs files**: descriptions mapped any other way (`MAP_PRIVATE`,
//!   `PROT_EXEC`, `MAP_SYNC` and other flags, a range of more than 16384 pool pieces or, on a
//!   writable description, whose holes would need more than 16384 fresh blocks, as in a large
//!   sparse file) are released from userspace at the `mmap`: the kernel's page cache backs the
//!   mapping; the kernel is made to refresh the size first. So is a description whose shared
//!   mapping reaches past the end of file (its pages within the file still come from the pool). So
//!   are `preadv2`/`pwritev2` (`pwritev2` once the kernel has fetched the file's size, as appends
//!   through it go where the kernel thinks the file ends), other `lseek` and `fallocate` modes, and
//!   calls the kernel must reject (wrong access mode, negative offsets, ranges ending past the
//!   largest offset, zero lengths), for the exact errno. So are writes, truncations and allocations
//!   that reach past the process's file size limit (`RLIMIT_FSIZE`), and appends while it has one
//!   (module `limits`): the kernel cuts them short or sends `SIGXFSZ` and answers `EFBIG`. So are
//!   updates that find no space in the pool (the daemon may hold blocks of deleted files it has yet
//!   to free: it frees them, or answers `ENOSPC` itself). So are the updates (reads stay served) of
//!   a file that has set-ID bits which a write by this process clears (a process not running as
//!   root; set-user-ID, or set-group-ID with group-execute) when its node is opened: only the
//!   daemon changes modes, and it clears them on those updates as the kernel would. Bits set by a
//!   `chmod` after that stay until the next update through the kernel.
//! - **Interposition** of every call above plus `open`/`open64`/`openat`/`openat64`/`creat`/
//!   `creat64`, `close`, `close_range`, `closefrom`, `dup`/`dup2`/`dup3`, `fcntl`/`fcntl64`
//!   (`F_DUPFD`, `F_DUPFD_CLOEXEC`, `F_SETFL`'s `O_APPEND` followed; the rest forwarded),
//!   `fclose`, `freopen(64)`, `mmap(64)`, `munmap`, `msync`, `mremap`, `sigaction`/`signal`
//!   (see below), `_exit`/`_Exit` and `execve`/`execv`/`execvp`/`execvpe`/`fexecve`/`execl`/
//!   `execlp`/`execle` (which release the process's open nodes and mappings first; the variadic
//!   `execl*` through a small x86-64 trampoline that gathers the argument list into an array
//!   for `execv*`), `preadv2`/`pwritev2` and their `64v2` forms (which programs built with
//!   64-bit file offsets call), `ioctl` (`FIONREAD` on a pmfs file once the kernel has fetched
//!   its size; `TCGETS`, above), `isatty`, and `setrlimit`/`setrlimit64`/`prlimit`/
//!   `prlimit64` (followed for the file size limit). Everything not served goes to the next
//!   definition (`dlsym(RTLD_NEXT)`, resolved lazily; raw system calls while that is not
//!   possible, see module `real`), so calls made before the library initialised (another
//!   object's constructor) work.
//! - **Signal handlers** (module `signals`): the handlers a program installs with `sigaction`
//!   or `signal` for signals other than faults run when the library call their thread is in
//!   is done, as the kernel runs handlers between system calls: a handler may call the
//!   library (append to the log file its thread was appending to) without waiting for locks
//!   its own thread holds. `sigaction` reports the program's handlers as it installed them.
//! - **Recognising pmfs files.** After every open (and lazily for descriptors it did not see
//!   opened: inherited ones, stdin redirected from a file, …) a descriptor is classified with
//!   one `statx` (`AT_STATX_DONT_SYNC`: no FUSE round trip): a regular file whose device is
//!   that of a `fuse.pmfs` mount is a pmfs file (module `mounts`: `statmount` tells by the
//!   mount's unique id, or else `/proc/self/mountinfo`).
//!   Its userspace node is opened on its first servable call only.
//! - **A descriptor table** (module `fdtable`, plus epoch-protected object pointers in
//!   `served`): lock-free, `dup` shares, every close path resets, before the real call and
//!   after it (a number another thread's call has closed, and the kernel has given to another
//!   file, is not served as the old file even before that call returns; see `fdtable` for the
//!   one narrow exception); safe across `fork` (the child attaches afresh, through the
//!   parent's mapping of the pool and with the parent's record of the daemon
//!   (`pmfs::Client::reattach`), and opens the descriptions it inherited again on their
//!   first call, duplicates still sharing one object; a `pthread_atfork` handler resets its
//!   counters) and `exec` (rebuilt in the new image). A `vfork` child (shared memory) never
//!   writes the table.
//! - `PMFS_PRELOAD=off` (or `0`) turns all of it off: every call is forwarded, nothing is
//!   recorded or counted.
//! - `PMFS_PRELOAD_STATS=1` prints one line to standard error at exit, and at `_exit` if the
//!   process had pmfs files, its own or inherited (the library's only output): `pmfs-preload:
//!   pid P: F pmfs fds, C calls on them, S served in userspace` (F counts the descriptors
//!   this process classified, which a `fork` child's inherited ones are not);
//!   `PMFS_PRELOAD_STATS=/absolute/path` appends that line to the file instead (one `write`
//!   per process, `O_APPEND`), for programs that close standard error before they exit
//!   (coreutils do) and for collecting the lines of every process of a pipeline.
//!
//! ## What does not work yet
//! - Mapped files: a mapping that reaches past the end of file takes the kernel path for its
//!   description, and its pages past the end stay the kernel's (they see only what the kernel's
//!   page cache knows). Growing a served mapping with `mremap` past the end of file fails with
//!   `ENOMEM` (within it, it works), `MREMAP_DONTUNMAP` on one with `EINVAL`. Protection
//!   changed by `mprotect` is not followed: a mapping made private (mount gone, exit, exec)
//!   gets the protection it was mapped with. Writes to a mapped file are in place, hence not
//!   atomic against a concurrent reader or a crash (the engine's mapped mode), and stores
//!   through a mapping change no `mtime`. A process that only stores through a mapping and
//!   makes no call on the mount's files never finds the mount gone: its stores keep reaching
//!   the pool. `munmap` is not async-signal safe for a handler installed some other way than
//!   `sigaction`/`signal` (a handler calling it while its thread is in the library's `mmap`,
//!   `munmap`, `msync` or `mremap` leaves the table as it was). The mapping table is a
//!   spin-locked vector: these calls serialise while any served mapping exists. A file
//!   unlinked while served mappings of it remain after its last `close` is freed only at the
//!   owner's next mount (the daemon frees it at that close only if no process pins it).
//! - Processes without the library read and map a file through the kernel's page cache.
//!   They see each update served in userspace once it returned, and stores through a served
//!   mapping once `msync`ed or unmapped (see "The kernel's pages"); a served mapping's stores
//!   before that are in the pool only. What they store through their own mappings reaches
//!   the pool when the kernel writes it back (`msync`, `munmap`, or the kernel's writeback).
//!   So processes with and without the library must not share files they *store* into
//!   through mappings: `sqlite3` in WAL mode stores into its `-shm` index that way, and a
//!   database written in WAL mode by both kinds of process at once is corrupted. A daemon the
//!   library cannot reach (another network namespace, for the abstract socket) leaves kernel
//!   mappings stale until the process reads or `stat`s the file.
//! - Calls made in the first 10 ms after the daemon was killed or the mount detached still
//!   reach the pool (valid log commits, recovered by the owner's next mount); a call already
//!   running when it happens finishes. Descriptors classified after that get the kernel's
//!   errors. A probe that cannot open `/proc` files (the process is out of descriptors)
//!   leaves the answer as it was until the next probe.
//! - `read`/`write` on one description from several threads or processes at once: a transfer
//!   that comes up short (end of file, an error) gives its unused range back in a second
//!   step. A transfer that took its range in between starts after the whole range asked
//!   for: a read at end of file still reads nothing, as it would after the first, but after
//!   a write that failed part-way the next writer's bytes lie past a hole and the offset
//!   ends short of them (through the kernel they would follow the bytes written).
//! - `O_APPEND` set or cleared by `F_SETFL` in *another* process sharing the description (a
//!   `fork` child or parent) is not seen: this process keeps the mode it last knew.
//! - A served `fchown` is judged by the caller's effective user id (the kernel uses the
//!   file-system user id, which differs only after `setfsuid`), asks no security module, and
//!   raises no inotify/fanotify `IN_ATTRIB` event.
//! - Served reads and writes raise no file-change notifications: the kernel raises them (inotify
//!   and fanotify `IN_ACCESS`/`IN_MODIFY`, dnotify `DN_ACCESS`/`DN_MODIFY`) in the calls that
//!   reach it, and there is no call to raise one for another. Watchers of files that processes
//!   under the library write wait for events that do not come (`stress-ng --dnotify` fails so).
//! - A buffer the kernel would answer `EFAULT` for crashes the caller instead (`SIGSEGV`),
//!   unless it lies in the first 64 KiB of the address space (a null or small bogus pointer),
//!   where nothing is mapped: those calls are forwarded.
//! - A process that ends by `exit_group` without libc or by a signal, or that execs through
//!   `execl*` on architectures other than x86-64 (not interposed there), leaves its files'
//!   log and mapping pins in the pool. The daemon takes them for dead when the kernel next
//!   asks for a file's attributes (every open does) or forgets the file, if no data client is
//!   attached then, and otherwise within a second of the last client leaving
//!   (`Volume::collect_dead_pins`); until then, files unlinked meanwhile stay allocated and
//!   mapped ones stay in mapped mode. A failed exec leaves its pmfs descriptors on the kernel
//!   path and its served mappings private copies.
//! - Signal handlers installed with `sigset`, `sysv_signal`, `bsd_signal` or a raw
//!   `rt_sigaction` are not deferred: one that calls the library while its thread is in the
//!   library may wait for its own thread forever. A deferred handler gets a context made where
//!   it runs, not the interrupted one, runs on the thread's stack even with `SA_ONSTACK`, and
//!   runs once for a realtime signal sent several times meanwhile. Served writes allocate
//!   memory: a handler that interrupts the program inside `malloc` and then writes to a pmfs
//!   file may wait for the allocator's lock its thread holds (through the kernel such a write
//!   would not allocate).
//! - A `vfork` child that writes to a descriptor it redirected before `exec` would use the
//!   parent's entry for that number.
//! - Descriptors at or above 65536 are not recorded (kernel path); more than 16 pmfs mounts in
//!   one process are not told apart (kernel path for the rest).
//! - Functions not interposed: `fopen`'s and other stdio opens and reads (glibc calls its
//!   internal functions: stdio streams on pmfs files take the kernel path), `fstatat` with
//!   `AT_EMPTY_PATH` (kernel path), `chown`, `lchown` and `fchownat` (kernel path: only
//!   `fchown` of a descriptor is served), `posix_fallocate`, and raw `syscall(SYS_close, …)`. A
//!   recorded descriptor closed by a raw system call and reused would keep a stale entry.
//!   `copy_file_range`, `sendfile` and `splice` are forwarded, after a `statx` with
//!   `AT_STATX_FORCE_SYNC` of a pmfs input (the kernel copies only up to the size it last saw,
//!   and the forced refresh reaches the daemon on a mount that caches attributes too).
//! - A process that does not use the library and keeps a file open while a library client
//!   grows it sees the new size at its next `stat` or `read` (on a mount with a nonzero
//!   `attr_timeout`, once that expired); its `copy_file_range`,
//!   `sendfile` and `splice` from the file stop at the size its kernel saw last before them.
//! - Children made without glibc's `fork` (`_Fork`, raw `clone`) run no `pthread_atfork`
//!   handler: they never write the table, and must not use served descriptors.
//! - A mount is looked up (statmount, or mountinfo) only for files on anonymous devices not
//!   seen before; after 64 such non-pmfs devices, pmfs mounts made later are not recognised
//!   (kernel path).

pub(crate) mod fdtable;
pub mod interpose;
pub(crate) mod kernel_pages;
pub(crate) mod limits;
pub(crate) mod liveness;
pub(crate) mod mapped;
pub(crate) mod mounts;
pub(crate) mod real;
pub(crate) mod served;
pub(crate) mod signals;

use core::ffi::{CStr, c_int};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, Ordering};

use fdtable::Kind;

const UNINIT: u8 = 0;
const INITIALISING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;

/// Whether the library is on (`ON`), off by request (`OFF`), or not initialised yet.
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Where to print the counters at exit: nowhere (empty), standard error (`1`) or the file at
/// this absolute path (copied here at initialisation, NUL-terminated).
static STATS_TO: StatsTo = StatsTo(core::cell::UnsafeCell::new([0; STATS_PATH_MAX]));
/// Whether `STATS_TO` holds a destination.
static STATS: AtomicBool = AtomicBool::new(false);
const STATS_PATH_MAX: usize = 512;

/// The destination of the counters, written once at initialisation before `STATS` is set
/// (release) and read only after `STATS` was seen set (acquire).
struct StatsTo(core::cell::UnsafeCell<[u8; STATS_PATH_MAX]>);

// SAFETY: written by the one initialising thread before publication through `STATS`, then only
// read.
unsafe impl Sync for StatsTo {}
/// The process allowed to change the descriptor table (see the crate docs on `vfork`).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Descriptors recognised as pmfs files.
static PMFS_FDS: AtomicU64 = AtomicU64::new(0);
/// Interposed data calls made on pmfs files.
static PMFS_CALLS: AtomicU64 = AtomicU64::new(0);
/// Calls served in userspace.
static SERVED: AtomicU64 = AtomicU64::new(0);

/// Whether the library is on; initialises it on the first call. A call made while another
/// thread initialises it is treated as "off" (forwarded, not recorded).
fn active() -> bool {
    match STATE.load(Ordering::Acquire) {
        ON => true,
        UNINIT => init(),
        _ => false,
    }
}

fn init() -> bool {
    if STATE
        .compare_exchange(UNINIT, INITIALISING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == ON;
    }
    let on = !matches!(env(c"PMFS_PRELOAD"), Some(b"off" | b"0"));
    if on {
        if let Some(to) = env(c"PMFS_PRELOAD_STATS")
            && (to == b"1" || to.first() == Some(&b'/'))
            && to.len() < STATS_PATH_MAX
        {
            // SAFETY: only this thread (the one that won the initialisation) writes it, and
            // nobody reads it before `STATS` is set below.
            unsafe { (&mut *STATS_TO.0.get())[..to.len()].copy_from_slice(to) };
            STATS.store(true, Ordering::Release);
        }
        OWNER_PID.store(getpid(), Ordering::Relaxed);
        limits::refresh();
        // SAFETY: registers plain functions without arguments to run around fork.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(in_fork_child),
            )
        };
    }
    STATE.store(if on { ON } else { OFF }, Ordering::Release);
    on
}

/// The value of an environment variable, without allocating.
fn env(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated string that
    // lives as long as the environment entry (the library only reads it at initialisation).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: non-null results of getenv are NUL-terminated strings.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

extern "C" fn before_fork() {
    real::resolve_exec_family();
    mapped::before_fork();
}

extern "C" fn after_fork_in_parent() {
    mapped::after_fork_in_parent();
}

extern "C" fn in_fork_child() {
    mapped::after_fork_in_child();
    OWNER_PID.store(getpid(), Ordering::Relaxed);
    PMFS_FDS.store(0, Ordering::Relaxed);
    PMFS_CALLS.store(0, Ordering::Relaxed);
    SERVED.store(0, Ordering::Relaxed);
    mounts::after_fork_in_child();
    liveness::after_fork_in_child();
    served::after_fork_in_child();
}

/// Whether this process may change the descriptor table: not a `vfork` child sharing the
/// parent's memory.
fn owns_table() -> bool {
    getpid() == OWNER_PID.load(Ordering::Relaxed)
}

pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// What `fd` is, classifying it if the table does not know.
fn kind(fd: c_int) -> Kind {
    match fdtable::get(fd) {
        Kind::Unknown if fdtable::recorded(fd) => learn(fd),
        k => k,
    }
}

/// Classifies `fd` and records the answer, unless the descriptor was closed or classified
/// on another thread meanwhile (errno kept as it was).
fn learn(fd: c_int) -> Kind {
    let seen = fdtable::for_classifying(fd);
    let (k, ino) = classify_keeping_errno(fd);
    if owns_table()
        && let Some(now) = fdtable::publish(fd, seen, k)
    {
        if let Kind::Pmfs(_) = k {
            PMFS_FDS.fetch_add(1, Ordering::Relaxed);
            served::pending(fd, ino, now);
        } else {
            served::forget(fd);
        }
    }
    k
}

fn classify_keeping_errno(fd: c_int) -> (Kind, u64) {
    let saved = errno();
    let k = classify(fd);
    set_errno(saved);
    k
}

/// Has the kernel fetch the attributes of the pmfs file open at `fd` from the daemon, before
/// a call forwarded to it that depends on the file's size: served writes and truncations
/// change the size behind the kernel's back. A `statx` with `AT_STATX_FORCE_SYNC` asks the
/// daemon even when the mount caches attributes (`-o attr_timeout=`) and leaves the answer in
/// the kernel's inode (a kernel without `statx`: `fstat`, which asks once the cached
/// attributes expired, at once on a default mount). `errno` is kept.
pub(crate) fn refresh_kernel_size(fd: c_int) {
    let saved = errno();
    if statx_fd(fd, libc::AT_STATX_FORCE_SYNC, libc::STATX_SIZE).is_none()
        && errno() == libc::ENOSYS
    {
        let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `st` is a writable `stat` buffer; the result is not used.
        unsafe { real::fstat(fd, st.as_mut_ptr()) };
    }
    set_errno(saved);
}

/// `statx` of the file open at `fd` (with `flags` besides `AT_EMPTY_PATH`, asking for
/// `mask`), as a raw system call; `None` with `errno` set if it fails.
pub(crate) fn statx_fd(fd: c_int, flags: c_int, mask: u32) -> Option<libc::statx> {
    statx_at(fd, c"", libc::AT_EMPTY_PATH | flags, mask)
}

/// `statx` of `path` (relative to `dirfd`) by the raw system call, never through the
/// library's own `statx`; `None` if it fails.
pub(crate) fn statx_at(dirfd: c_int, path: &CStr, flags: c_int, mask: u32) -> Option<libc::statx> {
    let mut stx = core::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a NUL-terminated path and a statx buffer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            dirfd,
            path.as_ptr(),
            flags,
            mask,
            stx.as_mut_ptr(),
        )
    };
    // SAFETY: statx filled the buffer when it succeeded.
    (r == 0).then(|| unsafe { stx.assume_init() })
}

/// A pmfs regular file, another open file, or `Unknown` if `fd` is not open; and its inode
/// number.
fn classify(fd: c_int) -> (Kind, u64) {
    let (mode, dev, ino, mnt_id) = if let Some(s) = statx_fd(
        fd,
        libc::AT_STATX_DONT_SYNC,
        libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID_UNIQUE,
    ) {
        (
            u32::from(s.stx_mode),
            libc::makedev(s.stx_dev_major, s.stx_dev_minor),
            s.stx_ino,
            mounts::unique_mount_id(&s),
        )
    } else if errno() == libc::ENOSYS {
        let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: a stat buffer.
        if unsafe { libc::syscall(libc::SYS_fstat, fd, st.as_mut_ptr()) } != 0 {
            return (Kind::Unknown, 0);
        }
        // SAFETY: fstat filled the buffer.
        let s = unsafe { st.assume_init() };
        (s.st_mode, s.st_dev, s.st_ino, None)
    } else {
        return (Kind::Unknown, 0);
    };
    if mode & libc::S_IFMT != libc::S_IFREG {
        return (Kind::Other, ino);
    }
    (
        mounts::pmfs_mount_of(dev, || mnt_id).map_or(Kind::Other, Kind::Pmfs),
        ino,
    )
}

/// Counts a data call on `fd` if it is a pmfs file; returns whether it is one.
fn note_data_call(fd: c_int) -> bool {
    let pmfs = active() && matches!(kind(fd), Kind::Pmfs(_));
    if pmfs {
        PMFS_CALLS.fetch_add(1, Ordering::Relaxed);
    }
    pmfs
}

/// A descriptor was just opened: classify it afresh ([`learn`] records the answer only in a
/// process that [owns the table](owns_table)).
fn opened(fd: c_int) {
    if fdtable::recorded(fd) && active() {
        learn(fd);
    }
}

/// The process is about to end or exec: release its userspace nodes and mappings (and the
/// pins they hold in the pool). Not in a `vfork` child, whose memory is the parent's.
fn leaving() {
    if STATE.load(Ordering::Acquire) == ON && owns_table() {
        mapped::release_all();
        served::release_all();
    }
}

/// The process ends without running its exit handlers (`_exit`, `_Exit`): as [`leaving`], and
/// the counters reported as at exit if it had pmfs files, its own or inherited (shells leave
/// this way after every command, and a `vfork` child, whose counters are its parent's,
/// always does).
fn ending() {
    leaving();
    if STATE.load(Ordering::Acquire) == ON
        && STATS.load(Ordering::Acquire)
        && owns_table()
        && (PMFS_FDS.load(Ordering::Relaxed) > 0 || PMFS_CALLS.load(Ordering::Relaxed) > 0)
    {
        report();
    }
}

/// `new` was made a duplicate of `old`.
fn duplicated(old: c_int, new: c_int) {
    if new >= 0 && old != new && active() && owns_table() {
        fdtable::copy(old, new);
        served::share(old, new);
    }
}

/// `F_SETFL` changed the flags of `fd`'s description.
fn flags_set(fd: c_int) {
    if active() && matches!(kind(fd), Kind::Pmfs(_)) {
        served::flags_changed();
    }
}

/// Whether this process keeps the descriptor table: the library is on, and the process
/// [owns the table](owns_table) (a system call).
fn keeps_table() -> bool {
    active() && owns_table()
}

/// Descriptors `first..=last` were closed, in a process that [keeps the table](keeps_table).
fn closed(first: usize, last: usize) {
    fdtable::forget_range(first, last);
    served::forget_range(first, last);
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = {
    extern "C" fn init_at_load() {
        active();
    }
    init_at_load
};

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = {
    extern "C" fn report_at_exit() {
        leaving();
        if STATE.load(Ordering::Acquire) == ON && STATS.load(Ordering::Acquire) {
            report();
        }
    }
    report_at_exit
};

/// Writes the counters to their destination with one raw `write`.
fn report() {
    let mut line = Line::default();
    line.push(b"pmfs-preload: pid ");
    line.num(getpid() as u64);
    line.push(b": ");
    line.num(PMFS_FDS.load(Ordering::Relaxed));
    line.push(b" pmfs fds, ");
    line.num(PMFS_CALLS.load(Ordering::Relaxed));
    line.push(b" calls on them, ");
    line.num(SERVED.load(Ordering::Relaxed));
    line.push(b" served in userspace\n");
    // SAFETY: `STATS` was seen set, so the destination is written and no longer changes.
    let to = unsafe { &*STATS_TO.0.get() };
    if to.starts_with(b"1\0") {
        // SAFETY: writes initialised bytes of the buffer.
        unsafe { libc::syscall(libc::SYS_write, 2, line.buf.as_ptr(), line.len) };
        return;
    }
    // SAFETY: `to` is a NUL-terminated path (the buffer is longer than any accepted path).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd >= 0 {
        // SAFETY: writes initialised bytes of the buffer, then closes the file opened above.
        unsafe {
            libc::syscall(libc::SYS_write, fd, line.buf.as_ptr(), line.len);
            libc::syscall(libc::SYS_close, fd);
        }
    }
}

/// A fixed buffer for the report line (no allocation at exit).
struct Line {
    buf: [u8; 160],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 160],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    fn num(&mut self, v: u64) {
        self.push(decimal(v, &mut [0; 20]));
    }
}

/// `v` in decimal, written at the end of `buf`.
pub(crate) fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_numbers_are_decimal() {
        let mut l = Line::default();
        l.num(0);
        l.push(b" ");
        l.num(u64::MAX);
        assert_eq!(&l.buf[..l.len], b"0 18446744073709551615");
    }

    #[test]
    fn files_outside_pmfs_mounts_are_other_and_closed_fds_unknown() {
        let f = std::fs::File::open("/proc/self/mountinfo").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        assert_eq!(classify(fd).0, Kind::Other);
        let exe = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
        let exe_fd = std::os::fd::AsRawFd::as_raw_fd(&exe);
        let ino = std::os::unix::fs::MetadataExt::ino(&exe.metadata().unwrap());
        assert_eq!(classify(exe_fd), (Kind::Other, ino));
        drop(f);
        assert_eq!(classify(fd).0, Kind::Unknown);
    }
}
