//! Serving calls on pmfs files in userspace, through a data-only client of the pool
//! ([`pmfs::Volume::attach`]).
//!
//! - **One client per pool per process**, attached on the first pmfs file of that mount (the
//!   mount's source in mountinfo is the pool file). If attaching fails (not a HashFS volume,
//!   no permission on the pool file, …) that mount takes the kernel path for good.
//! - **One [`Served`] per open file description**: opened by inode number (the mount's
//!   `st_ino` is the engine's `Ino`) with the access mode of the descriptor, shared by its
//!   `dup`s (reference-counted), dropped with the last of them. Descriptors point at it from
//!   a table of epoch-protected pointers (`crossbeam-epoch`): a call on one thread never sees
//!   the object freed by a `close` on another.
//! - **The kernel's offset stays the truth**: `read`/`write` of `n` bytes first move it by `n`
//!   with one `lseek(n, SEEK_CUR)`, which the kernel does atomically and which returns where
//!   the range starts, then move the data with `read_at`/`write_at`; a short transfer moves
//!   the offset back by what it did not do. Threads and processes sharing the description so
//!   get ranges of their own, as the kernel's read and write give them (it holds the
//!   description's position lock throughout), and the corrections commute. One system call
//!   per transfer, which never reaches the daemon; `pread`/`pwrite` make none.
//! - **`O_APPEND`** writes (`write`, `writev`, and `pwrite`/`pwritev`, which append on
//!   Linux too) use the engine's atomic append ([`OpenNode::append`]): the bytes land at the
//!   end of file as the log says when the update commits, so appenders in several processes
//!   never overwrite each other; `write` then sets the kernel's offset right after them.
//!   The flag is read from the description when its object is made, and again by the next
//!   write after any `F_SETFL` on a pmfs descriptor of this process: descriptors of one
//!   description can have objects of their own (duplicated before their first call, or
//!   inherited through exec), and must agree on it.
//! - **Mapped files**: a shared mapping of a served description maps the file's blocks
//!   straight from the pool (module `mapped`) and the description stays served: the file is
//!   written in place while it is mapped, so the mapping and `read`/`write` in any process
//!   see the same bytes.
//! - **Left to the kernel**: descriptions mapped any other way (`MAP_PRIVATE`, executable
//!   pages, a mapping reaching past the end of file, …: the kernel's page cache of such a
//!   mapping would not see userspace writes), `preadv2`/`pwritev2`, `SEEK_DATA`/`SEEK_HOLE`,
//!   fallocate modes other than 0, `KEEP_SIZE`, punch hole and zero range, every call whose
//!   arguments the kernel must reject (wrong access mode, negative offsets), and every update
//!   reaching past the file size limit (module `limits`): the kernel gives the exact errno.
//! - **Updates that find no space** (writes, appends, `ftruncate`, `fallocate`) go to the
//!   kernel, unchanged (the engine's failed update changed nothing): the daemon may still
//!   hold blocks of deleted files, which it frees in batches (`pmfs::Fs::release_deferred`)
//!   and at once when its own update finds no space. So the daemon frees them, does the
//!   update, or answers `ENOSPC` itself when the pool is full.
//! - **fork**: the child must not use the parent's objects (their DRAM locks may be held by
//!   parent threads that do not exist in the child), so the child starts a new generation
//!   and attaches a client of its own. A descriptor it inherited still points at the
//!   parent's object; its first call opens the description afresh by the inode number the
//!   object names ([`adopt`]) and puts the new object in every slot that shares the old one,
//!   so the parent's duplicates stay one object in the child too. The parent's objects are
//!   never dropped in the child (that would release the parent's pins).
//! - **The mount going away**: calls on a file of a mount that is gone (module `liveness`)
//!   fail with `EIO`, and its nodes are never dropped (no write to a pool that may have a new
//!   owner); mounts whose daemon cannot be found are not attached.
//! - **exit, `_exit` and every exec function** drop the objects (releasing their pins) first;
//!   **being killed** leaves the log pins of the open files in the pool until the owner's next
//!   mount (see `Volume::attach`).

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int};
use core::mem::ManuallyDrop;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::os::unix::ffi::OsStrExt;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};
use pmfs::{Client, Ino, OpenMode, OpenNode};

use crate::fdtable::{self, TABLE_FDS};
use crate::limits;
use crate::liveness;
use crate::mapped::MapCall;
use crate::mounts::{self, MAX_PMFS};
use crate::signals::Inside;

/// An open file description served in userspace.
///
/// Its open node (which pins the file's log in the pool) is released *synchronously* when
/// the last descriptor is closed, or when the description is mapped: calls in flight are
/// counted in `active`; `closing` stops new ones; whichever of the closer and the last call
/// in flight comes second drops the node (`dropped` makes that happen once). The memory of
/// the object itself is reclaimed by the epoch collector later. Releasing the pin at once
/// matters: the owner frees a file unlinked after its close only if no pin is left.
pub(crate) struct Served {
    node: UnsafeCell<ManuallyDrop<OpenNode>>,
    /// The file's inode number (what a fork child opens again, see [`adopt`]).
    ino: u64,
    read: bool,
    write: bool,
    /// `O_APPEND`, as read from the description when [`FLAGS_SET`] was `append_read`.
    append: AtomicBool,
    append_read: AtomicU64,
    /// Calls using the node now.
    active: AtomicUsize,
    /// No new call may use the node (last close, or mapped through the kernel).
    closing: AtomicBool,
    /// The node was dropped.
    dropped: AtomicBool,
    /// The process generation (bumped in fork children) that made it.
    generation: u64,
    /// The pmfs mount (index of `mounts`) of the file.
    mount: usize,
    /// Descriptors pointing at it.
    refs: AtomicUsize,
}

// SAFETY: the node is only reached between `enter` and `leave`, and dropped once, by the last
// of the closer and the calls in flight (see the type's docs); OpenNode itself is Send + Sync.
unsafe impl Sync for Served {}
// SAFETY: as above.
unsafe impl Send for Served {}

impl Served {
    /// Starts a call on the node; false once the object is closing.
    fn enter(&self) -> bool {
        self.active.fetch_add(1, Ordering::SeqCst);
        if self.closing.load(Ordering::SeqCst) {
            self.leave();
            return false;
        }
        true
    }

    /// Ends a call; the last one after `retire` drops the node.
    fn leave(&self) {
        if self.active.fetch_sub(1, Ordering::SeqCst) == 1 && self.closing.load(Ordering::SeqCst) {
            self.drop_node();
        }
    }

    /// No new calls; the node is dropped now if none is in flight, else by the last one. An
    /// object of the parent's image (after fork) only stops being used: its node is the
    /// parent's.
    fn retire(&self) {
        self.closing.store(true, Ordering::SeqCst);
        if self.generation == generation() && self.active.load(Ordering::SeqCst) == 0 {
            self.drop_node();
        }
    }

    /// Drops the node (releasing its pin in the pool), except on a mount that is gone: the
    /// pool may have a new owner, which swept the pins at its mount.
    fn drop_node(&self) {
        if !self.dropped.swap(true, Ordering::AcqRel) && !gone(self.mount) {
            // SAFETY: `dropped` was false: this is the only drop, and no call uses the node
            // (closing is set and active reached 0).
            unsafe { ManuallyDrop::drop(&mut *self.node.get()) };
        }
    }

    /// The node, for a call between `enter` and `leave`.
    fn node(&self) -> &OpenNode {
        // SAFETY: only called between `enter` and `leave`, while the node is not dropped.
        unsafe { &*self.node.get() }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.drop_node();
    }
}

static SLOTS: [Atomic<Served>; TABLE_FDS] = [const { Atomic::null() }; TABLE_FDS];
/// The inode number of a pmfs descriptor whose object is not made yet (0: none): objects are
/// made on the first call that can be served, so descriptors only opened and passed on (a
/// shell's redirections) never pin anything.
static PENDING: [AtomicU64; TABLE_FDS] = [const { AtomicU64::new(0) }; TABLE_FDS];
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The highest slot ever given an object or a pending inode: where loops over the slots stop
/// ([`adopt`], and [`forget_range`] for `closefrom`, exit and exec, which would otherwise
/// touch every page of the tables; in a fork child each is a copy-on-write fault).
static HIGHEST: AtomicUsize = AtomicUsize::new(0);

/// Slot `i` is about to hold an object or a pending inode.
fn used(i: usize) {
    HIGHEST.fetch_max(i, Ordering::SeqCst);
}

/// How many times this process changed the flags of a pmfs file's description (`F_SETFL`):
/// an object that read its `O_APPEND` at another count reads it again.
static FLAGS_SET: AtomicU64 = AtomicU64::new(0);
/// Whether this process ever installed an object (what the exit handler must release).
static ANY: AtomicBool = AtomicBool::new(false);

const UNTRIED: u8 = 0;
const ATTACHING: u8 = 1;
const ATTACHED: u8 = 2;
const FAILED: u8 = 3;

static CLIENT_STATE: [AtomicU8; MAX_PMFS] = [const { AtomicU8::new(UNTRIED) }; MAX_PMFS];
static CLIENTS: [AtomicPtr<Client>; MAX_PMFS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_PMFS];
/// In a `fork` child, the client of each mount that the parent (or an ancestor) had attached:
/// the child attaches again through its mapping ([`Client::reattach`]).
static INHERITED: [AtomicPtr<Client>; MAX_PMFS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_PMFS];

fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The client of pmfs mount `m`, attached now if this is the first try.
fn client(m: usize) -> Option<&'static Client> {
    let state = CLIENT_STATE.get(m)?;
    loop {
        match state.load(Ordering::Acquire) {
            ATTACHED => break,
            // Another thread is attaching: its outcome is this thread's too. Taking the kernel
            // path instead would leave there for good the descriptor this call was to open in
            // userspace (its pending inode is used up).
            ATTACHING => std::thread::yield_now(),
            UNTRIED => {
                if state
                    .compare_exchange(UNTRIED, ATTACHING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    attach(m, state)?;
                    break;
                }
            }
            _ => return None,
        }
    }
    let p = CLIENTS[m].load(Ordering::Acquire);
    // SAFETY: an attached client is leaked on purpose: it lives as long as the process.
    unsafe { p.as_ref() }
}

/// Attaches this process to the pool of pmfs mount `m`, whose `state` this thread moved to
/// `ATTACHING`, and publishes the client; `None` (and the mount on the kernel path for good)
/// if that fails.
fn attach(m: usize, state: &AtomicU8) -> Option<()> {
    let saved = crate::errno();
    // SAFETY: an attached client is leaked on purpose: it lives as long as the process, and
    // a fork child has its copy.
    let attached = match unsafe { INHERITED[m].load(Ordering::Acquire).as_ref() } {
        // The parent's daemon and its mount-state word are the child's too: the parent's
        // record of them (module `liveness`) stays, so a mount that went away in between is
        // still seen.
        Some(parent) => parent.reattach().ok().map(|c| (None, c)),
        // The daemon is found first: the pool is attached while it owns it.
        None => mounts::pool_of(m).and_then(|pool| {
            let file = crate::mapped::pool_file(m)?;
            let owner = liveness::owner_of(pool, &file)?;
            let path = std::ffi::OsStr::from_bytes(pool.to_bytes());
            let c = pmfs::Volume::attach_file(file, path).ok()?;
            Some((Some(owner), c))
        }),
    };
    crate::set_errno(saved);
    let Some((owner, c)) = attached else {
        state.store(FAILED, Ordering::Release);
        return None;
    };
    if let Some(owner) = owner {
        liveness::attached(m, owner, c.owner_state());
    }
    crate::kernel_pages::install(&c, crate::mapped::pool_id(m));
    CLIENTS[m].store(Box::into_raw(Box::new(c)), Ordering::Release);
    state.store(ATTACHED, Ordering::Release);
    Some(())
}

/// Whether pmfs mount `m`, which this process attached to, is gone (see module `liveness`).
fn gone(m: usize) -> bool {
    let p = CLIENTS[m].load(Ordering::Acquire);
    // SAFETY: an attached client is leaked on purpose: it lives as long as the process.
    match unsafe { p.as_ref() } {
        Some(c) => liveness::gone(m, c.owner_state()),
        None => true,
    }
}

fn index(fd: c_int) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&i| i < TABLE_FDS)
}

/// `fd` was found to be a regular file with inode `ino` on a pmfs mount, and recorded as
/// `entry`: it is opened in userspace on its first call that can be served. Nothing stays
/// pending if the descriptor was closed since it was recorded.
pub(crate) fn pending(fd: c_int, ino: u64, entry: fdtable::Entry) {
    let Some(i) = index(fd) else { return };
    ANY.store(true, Ordering::Relaxed);
    let _inside = Inside::enter();
    let guard = epoch::pin();
    forget_with(i, &guard);
    used(i);
    PENDING[i].store(ino, Ordering::SeqCst);
    if !fdtable::unchanged(fd, entry) {
        let _ = PENDING[i].compare_exchange(ino, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Opens `fd` (inode `ino` on pmfs mount `m`, recorded as `entry`) in userspace, or leaves it
/// to the kernel when that is not possible. An object made for a descriptor closed meanwhile
/// is dropped again, so it never serves a file that took the number since.
fn install(i: usize, fd: c_int, m: usize, ino: u64, entry: fdtable::Entry) {
    let obj = open(fd, m, ino);
    let guard = epoch::pin();
    let new = match obj {
        Some(s) => {
            ANY.store(true, Ordering::Relaxed);
            Owned::new(s).into_shared(&guard)
        }
        None => Shared::null(),
    };
    used(i);
    let old = SLOTS[i].swap(new, Ordering::SeqCst, &guard);
    release(old, &guard);
    if !new.is_null() {
        kept(i, fd, entry, new, &guard);
    }
}

/// `new` was just put in slot `i` for `fd`, recorded as `entry`: if the descriptor was closed
/// since (its number may name another file by now), it is taken out again. Whether it stays.
fn kept(
    i: usize,
    fd: c_int,
    entry: fdtable::Entry,
    new: Shared<'_, Served>,
    guard: &Guard,
) -> bool {
    if fdtable::unchanged(fd, entry) {
        return true;
    }
    if SLOTS[i]
        .compare_exchange(
            new,
            Shared::null(),
            Ordering::SeqCst,
            Ordering::SeqCst,
            guard,
        )
        .is_ok()
    {
        release(new, guard);
    }
    false
}

fn open(fd: c_int, m: usize, ino: u64) -> Option<Served> {
    let append_read = FLAGS_SET.load(Ordering::Acquire);
    // SAFETY: F_GETFL takes no pointer.
    let flags = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
    if flags < 0 {
        return None;
    }
    let flags = flags as c_int;
    if flags & libc::O_PATH != 0 {
        return None;
    }
    let (read, write) = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => (true, false),
        libc::O_WRONLY => (false, true),
        libc::O_RDWR => (true, true),
        _ => return None,
    };
    let client = client(m)?;
    if gone(m) {
        return None;
    }
    let saved = crate::errno();
    let write = write && !write_clears_set_id(client, ino);
    let node = client.open_ino(
        Ino::from_raw(ino),
        OpenMode {
            read,
            write,
            truncate: false,
        },
    );
    crate::set_errno(saved);
    Some(Served {
        node: UnsafeCell::new(ManuallyDrop::new(node.ok()?)),
        ino,
        read,
        write,
        append: AtomicBool::new(flags & libc::O_APPEND != 0),
        append_read: AtomicU64::new(append_read),
        active: AtomicUsize::new(0),
        closing: AtomicBool::new(false),
        dropped: AtomicBool::new(false),
        generation: generation(),
        mount: m,
        refs: AtomicUsize::new(1),
    })
}

/// Whether inode `ino` is a file whose set-ID bits ([`pmfs::Attr::privilege_bits`]) a write
/// by this process would clear: its updates then go through the kernel, whose daemon clears
/// them (only the daemon changes modes). The kernel clears them when the writer lacks
/// CAP_FSETID; uid 0 stands for the capability, as in the daemon. Checked when the
/// descriptor is opened in userspace: bits set later by a chmod stay until the next update
/// through the kernel.
fn write_clears_set_id(client: &Client, ino: u64) -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    client
        .getattr(Ino::from_raw(ino))
        .map_or(true, |a| a.privilege_bits() != 0)
}

/// `fd` no longer refers to what it did (closed or replaced).
pub(crate) fn forget(fd: c_int) {
    let Some(i) = index(fd) else { return };
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    let _inside = Inside::enter();
    let guard = epoch::pin();
    forget_with(i, &guard);
}

/// As [`forget`] for every descriptor in `first..=last`.
pub(crate) fn forget_range(first: usize, last: usize) {
    if !ANY.load(Ordering::Relaxed) || first >= TABLE_FDS {
        return;
    }
    let _inside = Inside::enter();
    let guard = epoch::pin();
    // The slots above `HIGHEST` hold nothing.
    for i in first..=last.min(HIGHEST.load(Ordering::SeqCst)) {
        forget_with(i, &guard);
    }
}

fn forget_with(i: usize, guard: &Guard) {
    PENDING[i].store(0, Ordering::Release);
    if SLOTS[i].load(Ordering::Relaxed, guard).is_null() {
        return;
    }
    let old = SLOTS[i].swap(Shared::null(), Ordering::AcqRel, guard);
    release(old, guard);
}

/// `new` became a duplicate of `old`: they share the object.
pub(crate) fn share(old: c_int, new: c_int) {
    let (Some(o), Some(n)) = (index(old), index(new)) else {
        if let Some(n) = index(new) {
            forget(n as c_int);
        }
        return;
    };
    let _inside = Inside::enter();
    let guard = epoch::pin();
    let p = SLOTS[o].load(Ordering::Acquire, &guard);
    let pending = PENDING[o].load(Ordering::Acquire);
    // SAFETY: loaded under `guard`: not freed before the guard is dropped.
    let shared = match unsafe { p.as_ref() } {
        // The parent's object (after fork), which counts no references here: both slots are
        // given this process's object at the first call on either ([`adopt`]).
        Some(s) if s.generation != generation() => p,
        Some(s)
            if s.refs
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                    (r > 0).then_some(r + 1)
                })
                .is_ok() =>
        {
            p
        }
        _ => Shared::null(),
    };
    used(n);
    let prev = SLOTS[n].swap(shared, Ordering::AcqRel, &guard);
    release(prev, &guard);
    PENDING[n].store(
        if shared.is_null() { pending } else { 0 },
        Ordering::Release,
    );
}

/// Drops one descriptor's reference; the last one frees the object once no call uses it.
fn release(p: Shared<'_, Served>, guard: &Guard) {
    // SAFETY: loaded under `guard`.
    let Some(s) = (unsafe { p.as_ref() }) else {
        return;
    };
    // An object of the parent's image (after fork) is never dropped here: see the module docs.
    if s.generation == generation() && s.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
        s.retire();
        // SAFETY: no slot points at it any more and no new reference can be taken (refs is
        // 0); calls still using it hold guards, which the destruction waits for.
        unsafe { guard.defer_destroy(p) };
    }
}

/// Runs `f` on the object of `fd` if it is served in userspace; `None` means "kernel path".
/// A call on a file whose mount is gone fails with `EIO` instead. Counts the calls answered.
pub(crate) fn with<R: From<i8>>(fd: c_int, f: impl FnOnce(&Served) -> Option<R>) -> Option<R> {
    let r = use_object(fd, |s| {
        if gone(s.mount) {
            crate::set_errno(libc::EIO);
            return Some(R::from(-1));
        }
        f(s)
    })?;
    crate::SERVED.fetch_add(1, Ordering::Relaxed);
    Some(r)
}

fn use_object<R>(fd: c_int, f: impl FnOnce(&Served) -> Option<R>) -> Option<R> {
    let i = index(fd)?;
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    let _inside = Inside::enter();
    let guard = epoch::pin();
    let mut p = SLOTS[i].load(Ordering::Acquire, &guard);
    if p.is_null() {
        let entry = fdtable::entry(fd);
        let ino = PENDING[i].swap(0, Ordering::SeqCst);
        let fdtable::Kind::Pmfs(m) = entry.kind() else {
            return None;
        };
        if ino == 0 {
            return None;
        }
        install(i, fd, m, ino, entry);
        p = SLOTS[i].load(Ordering::Acquire, &guard);
    }
    // SAFETY: loaded under `guard`, which lives until `f` returned.
    let mut s = unsafe { p.as_ref() }?;
    if s.generation != generation() {
        // SAFETY: as above.
        s = unsafe { adopt(i, fd, p, &guard).as_ref() }?;
    }
    if !s.enter() {
        return None;
    }
    let r = f(s);
    s.leave();
    r
}

/// In a fork child, descriptor `fd` (slot `i`) points at `old`, the parent's object for its
/// description: opens the description afresh with this process's client and gives the new
/// object to every slot that shares `old` (the parent's duplicates of `fd`, and the child's
/// made since), so they stay one object, as they are one description. The parent's object
/// is only marked closing, never dropped (see [`release`]): it is what a description this
/// process cannot open (the file gone, the pool not attachable) leaves its slots pointing at,
/// and every later call on them takes the kernel path at once. Returns this process's object
/// for `fd`, or null for the kernel path.
fn adopt<'g>(i: usize, fd: c_int, old: Shared<'g, Served>, guard: &'g Guard) -> Shared<'g, Served> {
    // SAFETY: loaded under `guard` by the caller; the parent's objects are never freed here.
    let Some(o) = (unsafe { old.as_ref() }) else {
        return Shared::null();
    };
    if o.closing.load(Ordering::SeqCst) {
        return Shared::null();
    }
    let entry = fdtable::entry(fd);
    let fdtable::Kind::Pmfs(m) = entry.kind() else {
        return Shared::null();
    };
    let Some(obj) = open(fd, m, o.ino) else {
        o.closing.store(true, Ordering::SeqCst);
        return Shared::null();
    };
    let new = Owned::new(obj).into_shared(guard);
    if let Err(e) = SLOTS[i].compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst, guard) {
        // Another thread adopted it first, or the descriptor was closed or replaced.
        // SAFETY: `new` was never published.
        drop(unsafe { e.new.into_owned() });
        let now = SLOTS[i].load(Ordering::Acquire, guard);
        // SAFETY: loaded under `guard`.
        return match unsafe { now.as_ref() } {
            Some(s) if s.generation == generation() => now,
            _ => Shared::null(),
        };
    }
    if !kept(i, fd, entry, new, guard) {
        return Shared::null();
    }
    // SAFETY: published under `guard`: not freed before the guard is dropped.
    let n = unsafe { new.deref() };
    let last = HIGHEST.load(Ordering::SeqCst);
    for (k, slot) in SLOTS[..=last].iter().enumerate() {
        if k == i || slot.load(Ordering::Acquire, guard) != old {
            continue;
        }
        // The reference is counted before the slot shows it, so that a close of `k` racing
        // with this never frees the object under the others; once every slot holding it was
        // closed meanwhile, the rest keep `old` and adopt on their own.
        if n.refs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r > 0).then_some(r + 1)
            })
            .is_err()
        {
            break;
        }
        if slot
            .compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst, guard)
            .is_err()
        {
            release(new, guard);
        }
    }
    new
}

/// As [`with`], without counting a served call (the call itself went to the kernel), and
/// `None` when the mount is gone.
pub(crate) fn peek<R>(fd: c_int, f: impl FnOnce(&Served) -> Option<R>) -> Option<R> {
    use_object(fd, |s| if gone(s.mount) { None } else { f(s) })
}

/// `fd` is being mapped through the kernel: its description goes to the kernel from now on
/// (its node is released), and the kernel learns the file's size first (it faults in the
/// mapping against the size it last asked the daemon for, which misses extensions written in
/// userspace since: touching pages past it would raise SIGBUS), even on a mount that caches
/// attributes ([`crate::refresh_kernel_size`]).
pub(crate) fn mapped(fd: c_int) {
    let Some(i) = index(fd) else { return };
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    let guard = epoch::pin();
    PENDING[i].store(0, Ordering::Release);
    // SAFETY: loaded under `guard`.
    if let Some(s) = unsafe { SLOTS[i].load(Ordering::Acquire, &guard).as_ref() } {
        s.retire();
        crate::refresh_kernel_size(fd);
    }
}

/// `F_SETFL` changed the flags of a pmfs file's description: every object reads its
/// `O_APPEND` again at its next write.
pub(crate) fn flags_changed() {
    FLAGS_SET.fetch_add(1, Ordering::AcqRel);
}

/// In a fork child: a new generation, clients to attach afresh (through the parent's
/// mappings where it had attached).
pub(crate) fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    for ((state, client), inherited) in CLIENT_STATE.iter().zip(&CLIENTS).zip(&INHERITED) {
        let parent = client.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !parent.is_null() {
            inherited.store(parent, Ordering::Release);
        }
        state.store(UNTRIED, Ordering::Release);
    }
}

/// At exit, `_exit` and exec: drops every object (releasing the pins of the files' logs) once
/// no call uses it.
pub(crate) fn release_all() {
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    forget_range(0, TABLE_FDS - 1);
    for _ in 0..4 {
        epoch::pin().flush();
    }
}

fn errno_of(e: &pmfs::Error) -> isize {
    crate::set_errno(e.errno());
    -1
}

fn seek(fd: c_int, off: i64, whence: c_int) -> Option<u64> {
    // SAFETY: lseek takes plain integers.
    let r = unsafe { libc::syscall(libc::SYS_lseek, fd, off, whence) };
    u64::try_from(r).ok()
}

/// Moves the offset of `fd` past the next `n` bytes: the start of the range now this caller's.
/// `None` (the offset unmoved) if the kernel refuses, for example past the largest offset.
fn claim(fd: c_int, n: usize) -> Option<u64> {
    seek(fd, n as i64, libc::SEEK_CUR)?.checked_sub(n as u64)
}

/// Gives back the last `unused` bytes of a range taken by [`claim`]. Relative, so corrections
/// by threads sharing the offset commute. The data has moved already: a failure cannot send
/// the call to the kernel a second time, and moving the offset back cannot fail.
fn unclaim(fd: c_int, unused: usize) {
    if unused > 0 {
        let _ = seek(fd, -(unused as i64), libc::SEEK_CUR);
    }
}

/// The offset of a positioned transfer of `n` bytes at `off`; `None` where the kernel answers
/// `EINVAL`: a negative offset, or a range that ends past the largest file offset.
fn position(off: i64, n: usize) -> Option<u64> {
    off.checked_add(i64::try_from(n).ok()?)?;
    u64::try_from(off).ok()
}

/// Linux's largest single transfer.
const MAX_RW: usize = 0x7fff_f000;

/// Whether a buffer at `p` lies in the first 64 KiB of the address space, which nothing maps
/// unless an administrator lowered `vm.mmap_min_addr`: a null or small bogus pointer, which
/// the kernel answers with `EFAULT` and a copy here would answer with `SIGSEGV`. Such calls
/// are forwarded (correct either way). Other unmapped buffers are not detected: checking
/// each would cost a system call.
fn low(p: *const libc::c_void) -> bool {
    (p as usize) < 1 << 16
}

impl Served {
    /// `pread` at `off`, or at the descriptor's offset (moved past the bytes read) if `None`.
    ///
    /// # Safety
    /// `buf` is writable for `n` bytes (the C contract of read).
    pub(crate) unsafe fn read(
        &self,
        fd: c_int,
        buf: *mut u8,
        n: usize,
        off: Option<i64>,
    ) -> Option<isize> {
        if !self.read || n == 0 || low(buf.cast()) {
            return None;
        }
        let n = n.min(MAX_RW);
        let at = match off {
            Some(o) => position(o, n)?,
            None => claim(fd, n)?,
        };
        // SAFETY: the caller's buffer, writable for `n` bytes.
        let dst = unsafe { core::slice::from_raw_parts_mut(buf, n) };
        let r = self.node().read_at(dst, at);
        if off.is_none() {
            unclaim(fd, n - *r.as_ref().unwrap_or(&0));
        }
        Some(match r {
            Ok(k) => k as isize,
            Err(e) => errno_of(&e),
        })
    }

    /// `pwrite` at `off`, or `write` at the descriptor's offset if `None`.
    ///
    /// # Safety
    /// `buf` is readable for `n` bytes (the C contract of write).
    pub(crate) unsafe fn write(
        &self,
        fd: c_int,
        buf: *const u8,
        n: usize,
        off: Option<i64>,
    ) -> Option<isize> {
        if !self.write || n == 0 || low(buf.cast()) {
            return None;
        }
        let n = n.min(MAX_RW);
        // SAFETY: the caller's buffer, readable for `n` bytes.
        let src = unsafe { core::slice::from_raw_parts(buf, n) };
        self.write_slice(fd, src, off)
    }

    /// Whether the description of `fd` (this object's) has `O_APPEND`: as read last, or read
    /// again if a flag of a pmfs description was set since. If another thread closed `fd`
    /// meanwhile (the call overlaps the close), the last answer stands.
    fn appending(&self, fd: c_int) -> bool {
        let now = FLAGS_SET.load(Ordering::Acquire);
        if self.append_read.load(Ordering::Acquire) != now {
            // SAFETY: F_GETFL takes no pointer.
            let flags = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
            if flags >= 0 {
                self.append
                    .store(flags as c_int & libc::O_APPEND != 0, Ordering::Release);
            }
            self.append_read.store(now, Ordering::Release);
        }
        self.append.load(Ordering::Acquire)
    }

    /// Writes `src` at `off`, or at the descriptor's offset (moved past the bytes) if `None`.
    /// On an `O_APPEND` description the bytes go to the end of file as the log says at commit
    /// (for `pwrite` too, as Linux does), and `write` leaves the offset right after them.
    fn write_slice(&self, fd: c_int, src: &[u8], off: Option<i64>) -> Option<isize> {
        if self.appending(fd) {
            if off.is_some_and(|o| position(o, src.len()).is_none()) {
                return None;
            }
            if !limits::unlimited() {
                return limits::past(fd);
            }
            return Some(match self.node().append(src) {
                Ok(at) => {
                    if off.is_none() {
                        // The bytes are in the file: a failed seek must not send the write to
                        // the kernel a second time.
                        let _ = seek(fd, (at + src.len() as u64) as i64, libc::SEEK_SET);
                    }
                    src.len() as isize
                }
                Err(pmfs::Error::NoSpace) => return None,
                Err(e) => errno_of(&e),
            });
        }
        let at = match off {
            Some(o) => position(o, src.len())?,
            None => claim(fd, src.len())?,
        };
        if !limits::allows(at + src.len() as u64) {
            if off.is_none() {
                unclaim(fd, src.len());
            }
            return limits::past(fd);
        }
        let r = self.node().write_at(src, at);
        if off.is_none() {
            unclaim(fd, src.len() - *r.as_ref().unwrap_or(&0));
        }
        Some(match r {
            Ok(k) => k as isize,
            Err(pmfs::Error::NoSpace) => return None,
            Err(e) => errno_of(&e),
        })
    }

    /// `preadv`/`readv`: fills the buffers in order, stopping at a short read.
    ///
    /// # Safety
    /// `iov` points at `cnt` valid iovecs (the C contract of readv).
    pub(crate) unsafe fn readv(
        &self,
        fd: c_int,
        iov: *const libc::iovec,
        cnt: c_int,
        off: Option<i64>,
    ) -> Option<isize> {
        let iovs = iovecs(iov, cnt)?;
        if !self.read {
            return None;
        }
        let mut total = 0usize;
        for v in iovs {
            if v.iov_len > 0 && low(v.iov_base) {
                return None;
            }
            total = total.checked_add(v.iov_len).filter(|&t| t <= MAX_RW)?;
        }
        let start = match off {
            Some(o) => position(o, total)?,
            None => claim(fd, total)?,
        };
        let mut done = 0usize;
        let mut failed = None;
        for v in iovs.iter().filter(|v| v.iov_len > 0) {
            // SAFETY: the caller's iovec buffer.
            let dst =
                unsafe { core::slice::from_raw_parts_mut(v.iov_base.cast::<u8>(), v.iov_len) };
            match self.node().read_at(dst, start + done as u64) {
                Ok(k) => {
                    done += k;
                    if k < v.iov_len {
                        break;
                    }
                }
                Err(e) => {
                    failed = (done == 0).then_some(e);
                    break;
                }
            }
        }
        if off.is_none() {
            unclaim(fd, total - done);
        }
        Some(match failed {
            Some(e) => errno_of(&e),
            None => done as isize,
        })
    }

    /// `pwritev`/`writev`: the buffers gathered and written as one atomic write.
    ///
    /// # Safety
    /// `iov` points at `cnt` valid iovecs (the C contract of writev).
    pub(crate) unsafe fn writev(
        &self,
        fd: c_int,
        iov: *const libc::iovec,
        cnt: c_int,
        off: Option<i64>,
    ) -> Option<isize> {
        let iovs = iovecs(iov, cnt)?;
        if !self.write {
            return None;
        }
        let total = iovs
            .iter()
            .map(|v| v.iov_len)
            .try_fold(0usize, |a, l| a.checked_add(l))?;
        if total == 0 || total > MAX_RW {
            return None;
        }
        let mut all = Vec::with_capacity(total);
        for v in iovs {
            if v.iov_len > 0 {
                if low(v.iov_base) {
                    return None;
                }
                // SAFETY: the caller's iovec buffer.
                all.extend_from_slice(unsafe {
                    core::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
                });
            }
        }
        self.write_slice(fd, &all, off)
    }

    /// `lseek(fd, off, SEEK_END)` against the size the log says now: the kernel sets the
    /// offset it comes to. One that lands before the start of the file fails with `EINVAL`
    /// here, and one the kernel refuses (past the largest offset) with its errno: the kernel,
    /// asked to seek from the end instead, would judge the offset against the size it last
    /// saw, which a mount that caches attributes (`-o attr_timeout=`) keeps for seconds after
    /// served writes.
    pub(crate) fn seek_end(&self, fd: c_int, off: i64) -> Option<i64> {
        let size = i64::try_from(self.node().size().ok()?).ok()?;
        let Some(to) = size.checked_add(off).filter(|&t| t >= 0) else {
            crate::set_errno(libc::EINVAL);
            return Some(-1);
        };
        Some(seek(fd, to, libc::SEEK_SET).map_or(-1, |o| o as i64))
    }

    /// `fsync`/`fdatasync`: every update is durable on return already; a fence orders them.
    pub(crate) fn sync(&self) -> Option<c_int> {
        self.node().sync();
        Some(0)
    }

    /// `ftruncate`.
    pub(crate) fn truncate(&self, fd: c_int, len: i64) -> Option<c_int> {
        if !self.write {
            return None;
        }
        let len = u64::try_from(len).ok()?;
        if !limits::allows(len) {
            return limits::past(fd);
        }
        Some(match self.node().set_len(len) {
            Ok(()) => 0,
            Err(pmfs::Error::NoSpace) => return None,
            Err(e) => errno_of(&e) as c_int,
        })
    }

    /// `fchown` that changes nothing but the file's ctime (`pmfs::Client::chown_unchanged`:
    /// the same owner and group, asked by root or the owner, of a file with no set-ID bit and
    /// no extended attribute), on a writable mount: the ctime is raised in the pool, with no
    /// request to the daemon. (A description open for writing needs no look at the mount:
    /// the kernel refuses to make a mount with writers read-only.) `sqlite3` running as root
    /// asks for one after every open of its journal. Every other change goes to the kernel.
    pub(crate) fn chown(&self, fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> Option<c_int> {
        if !self.write && !crate::mounts::writable(fd) {
            return None;
        }
        let keep = |id: u32| (id != u32::MAX).then_some(id);
        // SAFETY: geteuid takes no arguments and cannot fail.
        let caller = unsafe { libc::geteuid() };
        let client = client(self.mount)?;
        let saved = crate::errno();
        let served = client.chown_unchanged(self.node().ino(), keep(uid), keep(gid), caller);
        crate::set_errno(saved);
        served.ok().filter(|&done| done).map(|_| 0)
    }

    /// `fallocate` modes 0, `KEEP_SIZE`, `PUNCH_HOLE | KEEP_SIZE` and `ZERO_RANGE` (with
    /// `KEEP_SIZE` or without).
    pub(crate) fn allocate(&self, fd: c_int, mode: c_int, off: i64, len: i64) -> Option<c_int> {
        if !self.write || off < 0 || len <= 0 {
            return None;
        }
        let (off, len) = (off as u64, len as u64);
        if !limits::allows(off.saturating_add(len)) {
            return limits::past(fd);
        }
        let r = match mode {
            0 => self.node().allocate(off, len, false),
            libc::FALLOC_FL_KEEP_SIZE => self.node().allocate(off, len, true),
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                self.node().punch_hole(off, len)
            }
            libc::FALLOC_FL_ZERO_RANGE => self.node().zero_range(off, len, false),
            m if m == libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE => {
                self.node().zero_range(off, len, true)
            }
            _ => return None,
        };
        Some(match r {
            Ok(()) => 0,
            Err(pmfs::Error::NoSpace) => return None,
            Err(e) => errno_of(&e) as c_int,
        })
    }

    /// Before the kernel copies from the file: stores through mappings of it, in any process,
    /// bypassed the pages the kernel may cache ([`pmfs::Client::reveal_mapped`]).
    pub(crate) fn reveal_mapped(&self) -> Option<()> {
        client(self.mount)?.reveal_mapped(self.node().ino()).ok()
    }

    /// What `fstat` reports for the file, from its inode in the pool (through this process's
    /// attachment), as the daemon would answer the kernel: the kernel, which caches no
    /// attributes of a pmfs mount, would ask the daemon for them on every call.
    pub(crate) fn stat(&self) -> Option<Stat> {
        let a = client(self.mount)?.getattr(self.node().ino()).ok()?;
        Some(Stat::of(self.mount, &a))
    }

    /// Whether the kernel refuses `call` on this description ([`MapCall::refused`]).
    pub(crate) fn refuses(&self, call: &MapCall) -> bool {
        call.refused(self.read, self.write)
    }

    /// `mmap` of the file with `MAP_SHARED`, from the pool (module `mapped`); `None` for the
    /// kernel path, which also answers the calls it must refuse.
    pub(crate) fn map(&self, call: &MapCall) -> Option<isize> {
        if self.refuses(call) {
            return None;
        }
        let client = client(self.mount)?;
        crate::mapped::map(client, self.mount, self.node().ino(), self.write, call)
    }
}

/// The attributes of the file that `path` names (from `dirfd`; `flags` may hold
/// `AT_SYMLINK_NOFOLLOW` and `AT_NO_AUTOMOUNT`) for `stat` and its relatives: for a pmfs
/// regular file this process can attach to, from its inode in the pool (see
/// [`cached_statx`]); for any file on a mount that answers exactly from the kernel's cache
/// ([`MountFacts::exact`](crate::mounts::MountFacts::exact)), as that walk found them.
/// `Some(Err(errno))` when the walk fails (its answer is the call's); `None` for anything
/// else (left to the kernel).
pub(crate) fn stat_path(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
) -> Option<Result<Stat, c_int>> {
    if path.is_null() || flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT) != 0 {
        return None;
    }
    // SAFETY: the caller's contract makes `path` a NUL-terminated string.
    if unsafe { *path } == 0 {
        return None;
    }
    // SAFETY: a zeroed statx buffer is a valid one.
    let mut stx = unsafe { core::mem::zeroed::<libc::statx>() };
    // The mount's unique id tells a device not seen before without a second call. The basic
    // fields are asked for as `stat` asks for them: file systems with fine-grained timestamps
    // report the change and modification times only when asked. The `stat` calls never
    // trigger an automount.
    let flags = flags | libc::AT_NO_AUTOMOUNT;
    let mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID_UNIQUE;
    match cached_statx(dirfd, path, flags, mask, &mut stx) {
        Ok(Some(st)) => Some(Ok(st)),
        // Anything else: the walk's answer is the call's where the mount answers exactly, and
        // the call is forwarded (a second walk) where it does not.
        Ok(None) => (stx.stx_mask & libc::STATX_BASIC_STATS == libc::STATX_BASIC_STATS
            && crate::mounts::unique_mount_id(&stx)
                .and_then(crate::mounts::mount_facts)
                .is_some_and(|m| m.exact))
        .then(|| Stat::walked(&stx))
        .flatten()
        .map(Ok),
        Err(libc::ENOSYS) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Makes `out`, the answer of a walk that asked for `STATX_MNT_ID_UNIQUE` besides `mask`, what
/// a `statx` asking for `mask` gets: the mount's reused id unless `mask` asked for the unique
/// one (the kernel reports one or the other). `false` if that id is not known.
pub(crate) fn as_asked(out: &mut libc::statx, mask: u32) -> bool {
    with_reused_id(out, mask, |out| {
        crate::mounts::unique_mount_id(out).and_then(crate::mounts::mount_facts)
    })
}

/// Whether `out`, the answer of a walk that asked for `STATX_MNT_ID_UNIQUE` besides `mask`
/// with `AT_STATX_DONT_SYNC`, is on a mount that answers exactly; if it is, makes it what a
/// `statx` asking for `mask` gets ([`as_asked`]).
pub(crate) fn exact_as_asked(out: &mut libc::statx, mask: u32) -> bool {
    let facts = crate::mounts::unique_mount_id(out).and_then(crate::mounts::mount_facts);
    facts.is_some_and(|m| m.exact) && with_reused_id(out, mask, |_| facts)
}

/// [`as_asked`], with `facts` giving the facts of `out`'s mount when they are needed.
fn with_reused_id(
    out: &mut libc::statx,
    mask: u32,
    facts: impl FnOnce(&libc::statx) -> Option<crate::mounts::MountFacts>,
) -> bool {
    // Asked for, or not reported (a kernel without unique ids answered with the reused one).
    if mask & libc::STATX_MNT_ID_UNIQUE != 0 || out.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return true;
    }
    let Some(facts) = facts(out) else {
        return false;
    };
    out.stx_mnt_id = u64::from(facts.old_id);
    out.stx_mask = (out.stx_mask & !libc::STATX_MNT_ID_UNIQUE) | libc::STATX_MNT_ID;
    true
}

/// A `statx` of `path` from `dirfd` (`flags` and `mask` as the call's) into `out` that lets
/// the kernel answer from what it has cached (`AT_STATX_DONT_SYNC` in place of the caller's
/// sync type): the path walk keeps its permission checks and uses the name cache, which the
/// daemon keeps exact, but no attribute is asked of the daemon. Then, for a pmfs regular file
/// this process can attach to, its attributes from its inode in the pool, which preload
/// clients change behind the kernel's back: `Ok(Some(..))`, and `out` holds the file's
/// unchanging fields. `Ok(None)` for anything else, whose cached attributes may be stale (the
/// caller forwards the call); `Err(errno)` when the walk fails, its answer being the call's.
pub(crate) fn cached_statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: u32,
    out: &mut libc::statx,
) -> Result<Option<Stat>, c_int> {
    let flags = (flags & !libc::AT_STATX_SYNC_TYPE) | libc::AT_STATX_DONT_SYNC;
    let walk = |mask: u32, out: &mut libc::statx| {
        // SAFETY: the caller passes a NUL-terminated path, and `out` is a statx buffer.
        unsafe { libc::syscall(libc::SYS_statx, dirfd, path, flags, mask, out as *mut _) }
    };
    if walk(mask | libc::STATX_TYPE | libc::STATX_INO, out) != 0 {
        return Err(crate::errno());
    }
    if u32::from(out.stx_mode) & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    let dev = libc::makedev(out.stx_dev_major, out.stx_dev_minor);
    // For a device not seen before: the mount's unique id, asked apart if the caller did not
    // (asking in its call would change what it gets). A name renamed in between may lead to
    // another mount: `mounts::identify` trusts an answer only for the device seen here.
    let mnt_id = || {
        crate::mounts::unique_mount_id(out).or_else(|| {
            let saved = crate::errno();
            // SAFETY: a zeroed statx buffer is a valid one.
            let mut own = unsafe { core::mem::zeroed::<libc::statx>() };
            let found = walk(libc::STATX_MNT_ID_UNIQUE, &mut own) == 0;
            crate::set_errno(saved);
            found
                .then(|| crate::mounts::unique_mount_id(&own))
                .flatten()
        })
    };
    let Some(m) = crate::mounts::pmfs_mount_of(dev, mnt_id) else {
        return Ok(None);
    };
    let saved = crate::errno();
    let attr = client(m)
        .filter(|_| !gone(m))
        .map(|c| c.getattr(Ino::from_raw(out.stx_ino)));
    crate::set_errno(saved);
    Ok(match attr {
        Some(Ok(a)) => Some(Stat::of(m, &a)),
        _ => None,
    })
}

/// The attributes `stat` and `fstat` report for a file the library answers for: a served file
/// ([`Served::stat`]), or any file whose mount answers exactly from the kernel's cache
/// ([`stat_path`]).
pub(crate) struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blksize: i64,
    pub blocks: u64,
    /// Access, modification and change times, ns since the epoch.
    pub times: [i64; 3],
}

impl Stat {
    /// Writes these attributes into the basic fields of `x` and marks them filled.
    pub(crate) fn patch(&self, x: &mut libc::statx) {
        x.stx_mode = self.mode as u16;
        x.stx_nlink = u32::try_from(self.nlink).unwrap_or(u32::MAX);
        x.stx_uid = self.uid;
        x.stx_gid = self.gid;
        x.stx_size = self.size;
        x.stx_blocks = self.blocks;
        for (ts, t) in [&mut x.stx_atime, &mut x.stx_mtime, &mut x.stx_ctime]
            .into_iter()
            .zip(self.times)
        {
            ts.tv_sec = t.div_euclid(1_000_000_000);
            ts.tv_nsec = t.rem_euclid(1_000_000_000) as u32;
        }
        x.stx_mask |= libc::STATX_BASIC_STATS;
    }

    /// Regular file `a` on pmfs mount `m`.
    fn of(m: usize, a: &pmfs::Attr) -> Stat {
        Stat {
            dev: crate::mounts::dev_of(m),
            ino: a.ino.raw(),
            mode: libc::S_IFREG | a.perm,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: 0,
            size: a.size,
            blksize: pmfs_core::layout::BLOCK_SIZE as i64,
            blocks: a.blocks,
            times: [a.atime, a.mtime, a.ctime],
        }
    }

    /// What a path walk's `statx` answer `x` says, with every basic field filled; `None` for
    /// a time too far from 1970 for nanoseconds in 64 bits (the call is then forwarded).
    fn walked(x: &libc::statx) -> Option<Stat> {
        let ns = |t: libc::statx_timestamp| {
            t.tv_sec
                .checked_mul(1_000_000_000)?
                .checked_add(i64::from(t.tv_nsec))
        };
        Some(Stat {
            dev: libc::makedev(x.stx_dev_major, x.stx_dev_minor),
            ino: x.stx_ino,
            mode: u32::from(x.stx_mode),
            nlink: u64::from(x.stx_nlink),
            uid: x.stx_uid,
            gid: x.stx_gid,
            rdev: libc::makedev(x.stx_rdev_major, x.stx_rdev_minor),
            size: x.stx_size,
            blksize: i64::from(x.stx_blksize),
            blocks: x.stx_blocks,
            times: [ns(x.stx_atime)?, ns(x.stx_mtime)?, ns(x.stx_ctime)?],
        })
    }
}

/// The caller's iovec array, if its count is one the kernel accepts.
fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Option<&'a [libc::iovec]> {
    let cnt = usize::try_from(cnt).ok().filter(|&c| c > 0 && c <= 1024)?;
    if iov.is_null() {
        return None;
    }
    // SAFETY: the C contract of the vectored calls: `iov` points at `cnt` iovecs.
    Some(unsafe { core::slice::from_raw_parts(iov, cnt) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_on_mounts_that_answer_exactly_take_one_walk() {
        // A device node on devtmpfs (or tmpfs), and proc's root: both exact file systems.
        for path in [c"/dev/null", c"/proc"] {
            let st = stat_path(libc::AT_FDCWD, path.as_ptr(), 0)
                .expect("answered by the library")
                .expect("the walk succeeds");
            // SAFETY: a zeroed stat buffer is a valid one.
            let mut k: libc::stat = unsafe { core::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a stat buffer (in tests, the C library's).
            assert_eq!(unsafe { libc::stat(path.as_ptr(), &mut k) }, 0);
            assert_eq!(
                (st.dev, st.ino, st.mode, st.rdev, st.blksize),
                (k.st_dev, k.st_ino, k.st_mode, k.st_rdev, k.st_blksize)
            );
        }
        assert!(matches!(
            stat_path(libc::AT_FDCWD, c"/proc/no/such/file".as_ptr(), 0),
            Some(Err(libc::ENOENT))
        ));
    }
}
