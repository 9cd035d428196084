//! `mmap(MAP_SHARED)` of pmfs files served straight from the pool, and the table of those
//! mappings that `munmap`, `msync`, `mremap`, `fork`, exec, exit and the mount going away
//! consult.
//!
//! - **Mapping**: the engine puts the file in *mapped mode* ([`pmfs::Client::map`]: every process
//!   writes its blocks in place while a pin lives, so they stay the file's bytes) and names the
//!   pool pieces that hold the range: for a writable description, after filling the holes in it
//!   with zeroed blocks (stores must reach the pool, where served `read`s look); for a read-only
//!   one, which never stores, the holes stay holes ([`pmfs::Client::map_leaving_holes`]), as
//!   through the kernel: a mapping made only to read changes neither the file's allocation nor its
//!   times. The caller's own descriptor is mapped first, through the kernel, exactly as the call
//!   asks (minus `MAP_POPULATE`/`MAP_LOCKED`, which would fault it in through FUSE): the kernel
//!   validates the call (access mode, `prot`, address, `MAP_FIXED_NOREPLACE`, …) and gives its
//!   exact errno, and the range it returns is the caller's. Then every piece of the pool file is
//!   mapped over it with `MAP_SHARED | MAP_FIXED`, at the place of its bytes in the file. The pages
//!   of holes left so stay the kernel's mapping of the descriptor, which reads them as zeros and
//!   sees the block a write gives one later (the writer has the kernel drop the pages it read); the
//!   kernel first fetches the file's size, so that a fault there does not meet a size from before
//!   served writes grew the file (`SIGBUS`). Pages past the end of file stay the kernel's mapping
//!   too (they raise `SIGBUS` like on any file); a mapping that has such pages also leaves its
//!   description to the kernel (as `served::mapped` does), so that writes which grow the file reach
//!   the kernel's page cache of those pages and its idea of the size. The pool file is opened once
//!   per mount and access mode (read-only for read-only descriptions, so `mprotect(PROT_WRITE)`
//!   fails as it would on their file), `O_CLOEXEC`, moved to a high descriptor number, and checked
//!   to still be the pool before each use.
//! - **The table**: one [`Record`] per served call: the pin and the pool pieces of it still
//!   mapped (segments). `munmap` and `MAP_FIXED` mappings over a segment trim, split or drop
//!   it; the pin is released with the last segment. `msync` writes the CPU caches back over
//!   the segments it covers and fences (`pmfs_core::pm::persist`) after the kernel accepted
//!   it. `mremap` is followed when it shrinks a range in place. Growing or moving a range of
//!   segments is done here: the kernel would extend the last piece over the pool bytes after
//!   it (other files' blocks), and moves one mapping at a time where each piece is one. New
//!   pages are mapped from the pool like a new `mmap` of the file, in place or, with
//!   `MREMAP_MAYMOVE`, with the kept segments mapped again elsewhere. Growing needs the file to
//!   reach past the new end (what a program that grows its file and then its mapping has
//!   done) and fails with `ENOMEM` otherwise; `MREMAP_DONTUNMAP` on a segment fails with
//!   `EINVAL`.
//! - **Lifetime**: a `fork` child takes a pin of its own for every record it inherited
//!   ([`pmfs::MapPin::inherit`]: atomic operations on the pool only). Exit, `_exit` and exec
//!   remap every segment `MAP_PRIVATE` (stores made later, by threads still running or after a
//!   failed exec, stay in the process) and release the pins. When the mount is found gone
//!   (module `liveness`), its records are remapped the same way and their pins forgotten: the
//!   pool may have a new owner, which reset them at its mount.
//!
//! The table is a vector behind a spin lock; `fork` takes the lock in its prepare handler, so
//! a child never inherits it held. Internal mappings are made with raw system calls (never
//! through the interposed functions, which take the lock), and nothing that may reach
//! `liveness` runs with the lock held (finding a mount gone takes it).

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use pmfs::{Client, Ino, MapPiece, MapPin};
use pmfs_core::pm::persist;

use crate::liveness;
use crate::mounts::{self, MAX_PMFS};
use crate::signals::Inside;

/// The page size this module serves mappings for: the engine's block size.
const PAGE: usize = 4096;
/// The most pool pieces one call is served with (Linux allows 65530 mappings per process by
/// default); a file more fragmented than that over the range takes the kernel path.
const MAX_PIECES: usize = 16384;
/// The most blocks a call on a writable description may fill in the holes of its range (64
/// MiB): mapping a large sparse file from the pool would first allocate and zero all of it
/// (2 GiB of holes took 38 s, and the space), where the kernel's page cache allocates nothing;
/// such a call takes the kernel path.
const MAX_FILL: u64 = 16384;
/// `mmap` flags a served mapping accepts besides the mapping type.
const SERVED_FLAGS: c_int = libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_POPULATE
    | libc::MAP_LOCKED
    | libc::MAP_NORESERVE
    | libc::MAP_NONBLOCK;
/// Flags that fault pages in: kept off the kernel's mapping of the descriptor, applied to the
/// pool pieces.
const FAULTING_FLAGS: c_int = libc::MAP_POPULATE | libc::MAP_LOCKED;

/// The arguments of an `mmap` call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MapCall {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) prot: c_int,
    pub(crate) flags: c_int,
    pub(crate) fd: c_int,
    pub(crate) off: i64,
}

impl MapCall {
    /// Whether the call is one this module may serve from the pool: a shared mapping of
    /// readable or writable (not executable) pages at a page-aligned offset, with no flag the
    /// pool pieces could not honour. Anything else goes to the kernel, which gives its errno.
    pub(crate) fn wants_pool(&self) -> bool {
        let kind = self.flags & libc::MAP_TYPE;
        (kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE)
            && self.flags & !(libc::MAP_TYPE | SERVED_FLAGS) == 0
            && self.prot & !(libc::PROT_READ | libc::PROT_WRITE) == 0
            && self.len != 0
            && self.len <= isize::MAX as usize
            && u64::try_from(self.off).is_ok_and(|o| o.is_multiple_of(PAGE as u64))
            && (self.flags & libc::MAP_FIXED == 0 || self.addr.is_multiple_of(PAGE))
            && page_size() == PAGE
    }

    /// Whether the kernel refuses the call whatever the description's file: no length, an
    /// offset off a page, or an access the description (`readable`, `writable`) lacks (every
    /// file mapping reads; a shared one that writes needs a writable description).
    pub(crate) fn refused(&self, readable: bool, writable: bool) -> bool {
        let kind = self.flags & libc::MAP_TYPE;
        let shared = kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE;
        self.len == 0
            || u64::try_from(self.off).is_ok_and(|o| !o.is_multiple_of(PAGE as u64))
            || !readable
            || (shared && self.prot & libc::PROT_WRITE != 0 && !writable)
    }

    /// The page-rounded length.
    fn span(&self) -> usize {
        pages(self.len)
    }
}

/// `len` rounded up to whole pages, as the kernel rounds lengths (saturating: a length that
/// large is refused by the kernel anyway).
fn pages(len: usize) -> usize {
    len.checked_next_multiple_of(PAGE).unwrap_or(usize::MAX)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0)
}

/// Pool bytes `pool_off..pool_off + len`, the file's bytes `file_off..file_off + len`, mapped
/// at `addr..addr + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    addr: usize,
    len: usize,
    pool_off: u64,
    file_off: u64,
}

impl Seg {
    fn end(self) -> usize {
        self.addr + self.len
    }

    fn overlaps(self, lo: usize, hi: usize) -> bool {
        lo < hi && self.addr < hi && self.end() > lo
    }

    /// The part of the segment inside `lo..hi`.
    fn inside(self, lo: usize, hi: usize) -> Option<Seg> {
        let (a, b) = (self.addr.max(lo), self.end().min(hi));
        (a < b).then(|| Seg {
            addr: a,
            len: b - a,
            pool_off: self.pool_off + (a - self.addr) as u64,
            file_off: self.file_off + (a - self.addr) as u64,
        })
    }

    /// The parts of the segment outside `lo..hi` (`lo < hi`): none, one or two.
    fn outside(self, lo: usize, hi: usize) -> impl Iterator<Item = Seg> {
        let left = self.inside(0, lo);
        let right = self.inside(hi, usize::MAX);
        left.into_iter().chain(right)
    }
}

/// The pin of a mapping, marked [writable](MapPin::writable) if its description may write.
fn pin_of(pin: MapPin, writable: bool) -> MapPin {
    if writable { pin.writable() } else { pin }
}

/// One `mmap` served from the pool: the segments of it still mapped and the pin that keeps the
/// file in mapped mode while they are.
#[derive(Debug)]
struct Record {
    mount: usize,
    /// The client that mapped it: for the mount-state word (a PM load, safe in a `fork` child,
    /// where the client is the parent's), and for mapping more of the file when `mremap` grows
    /// the mapping.
    client: &'static Client,
    ino: Ino,
    /// Whether the description mapped may write.
    writable: bool,
    prot: c_int,
    pin: MapPin,
    segs: Vec<Seg>,
}

/// The records, behind a spin lock.
struct Table {
    locked: AtomicBool,
    records: UnsafeCell<Vec<Record>>,
}

// SAFETY: `records` is only reached by the holder of `locked`.
unsafe impl Sync for Table {}

static TABLE: Table = Table {
    locked: AtomicBool::new(false),
    records: UnsafeCell::new(Vec::new()),
};
/// How many records there are, readable without the lock: with none, `munmap`, `msync`,
/// `mremap` and `MAP_FIXED` mappings only forward.
static RECORDS: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// Whether this thread holds the lock: a call it makes meanwhile (an allocator's `munmap`
    /// under a `Vec` push, say) only forwards instead of waiting for itself.
    static HOLDING: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

fn acquire() {
    let mut spins = 0u32;
    while TABLE
        .locked
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            // SAFETY: sched_yield takes no arguments.
            unsafe { libc::syscall(libc::SYS_sched_yield) };
        }
    }
    HOLDING.set(true);
}

/// Unlocks; called by the holder of the lock.
fn release() {
    // SAFETY: the caller holds the lock.
    let n = unsafe { (*TABLE.records.get()).len() };
    RECORDS.store(n, Ordering::Release);
    HOLDING.set(false);
    TABLE.locked.store(false, Ordering::Release);
}

/// The table, locked until the guard is dropped (signal handlers wait meanwhile).
struct Locked {
    _inside: Inside,
}

impl Locked {
    /// The lock, unless this thread holds it already.
    fn take() -> Option<Locked> {
        if HOLDING.get() {
            return None;
        }
        let inside = Inside::enter();
        acquire();
        Some(Locked { _inside: inside })
    }

    fn records(&mut self) -> &mut Vec<Record> {
        // SAFETY: this guard holds the lock, and `&mut self` makes the borrow unique.
        unsafe { &mut *TABLE.records.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        release();
    }
}

/// `fork` prepare handler: the lock is held across the fork, so the child's copy of the table
/// is whole and its lock not held by a thread that does not exist there.
pub(crate) fn before_fork() {
    acquire();
}

/// `fork` parent handler.
pub(crate) fn after_fork_in_parent() {
    release();
}

/// `fork` child handler (the lock is held, see [`before_fork`]): the child has its own copy of
/// every mapping and takes a pin of its own for each; the copied pins are the parent's and are
/// never dropped here. A record whose pin cannot be taken is made private at once.
pub(crate) fn after_fork_in_child() {
    let mut t = Locked {
        _inside: Inside::enter(),
    };
    abandon(t.records(), |r| match r.pin.inherit() {
        Ok(own) => {
            core::mem::forget(core::mem::replace(&mut r.pin, own));
            false
        }
        Err(_) => true,
    });
}

/// Serves `call` on file `ino` of pmfs mount `m` from the pool, `writable` telling whether the
/// description may write. `None`: nothing was done, the kernel path takes the call. Else the
/// address, or -1 with `errno` set.
pub(crate) fn map(
    client: &'static Client,
    m: usize,
    ino: Ino,
    writable: bool,
    call: &MapCall,
) -> Option<isize> {
    let saved = crate::errno();
    let (off, span) = (call.off as u64, call.span() as u64);
    // A read-only description never stores: its holes stay holes, mapped by the kernel.
    let file = if writable {
        client.map_filling_at_most(ino, off, span, MAX_FILL)
    } else {
        client.map_leaving_holes(ino, off, span)
    };
    crate::set_errno(saved);
    let file = file.ok()?;
    if file.pieces().len() > MAX_PIECES {
        return None;
    }
    let covered: u64 = file.pieces().iter().map(|p| p.len).sum();
    if covered < file.end().saturating_sub(off) {
        // Holes left to the kernel's mapping: a page fault there past the size the kernel last
        // saw (before served writes grew the file) would raise SIGBUS.
        crate::refresh_kernel_size(call.fd);
    }
    let pool = pool_fd(m, writable);
    let mut t = Locked::take()?;
    // SAFETY: the caller's own request, checked by the kernel; MAP_FIXED replaces only what the
    // caller asked to replace.
    let reserved = unsafe {
        sys_mmap(
            call.addr,
            call.len,
            call.prot,
            call.flags & !FAULTING_FLAGS,
            call.fd,
            call.off as u64,
        )
    };
    let base = match reserved {
        Ok(base) => base,
        Err(e) => {
            drop(t);
            crate::set_errno(e);
            return Some(-1);
        }
    };
    let replaced = if call.flags & libc::MAP_FIXED != 0 {
        unrecord(t.records(), base, base + call.span())
    } else {
        Vec::new()
    };
    let piece_flags = libc::MAP_SHARED
        | libc::MAP_FIXED
        | (call.flags & SERVED_FLAGS & !libc::MAP_FIXED_NOREPLACE);
    let segs = pool.and_then(|fd| {
        let segs = segs_of(file.pieces(), base, call.off as u64);
        // SAFETY: the segments lie inside the range the kernel just gave the caller.
        unsafe { place(&segs, call.prot, piece_flags, fd) }
            .ok()
            .map(|()| segs)
    });
    let failed = segs.is_none();
    let whole = !failed && file.end() - off >= span;
    if failed {
        // SAFETY: the caller's range, given by the kernel above, mapped again from the
        // caller's descriptor as the call asked (over the pieces mapped so far).
        let again = unsafe {
            sys_mmap(
                base,
                call.len,
                call.prot,
                (call.flags & !libc::MAP_FIXED_NOREPLACE) | libc::MAP_FIXED,
                call.fd,
                call.off as u64,
            )
        };
        if let Err(e) = again {
            // SAFETY: the caller's range, which holds nothing of anyone else's.
            unsafe { libc::syscall(libc::SYS_munmap, base, call.len) };
            drop(t);
            let_go(replaced);
            crate::set_errno(e);
            return Some(-1);
        }
    }
    match segs {
        Some(segs) if !segs.is_empty() => t.records().push(Record {
            mount: m,
            client,
            ino,
            writable,
            prot: call.prot,
            pin: pin_of(file.into_pin(), writable),
            segs,
        }),
        _ => drop(file),
    }
    drop(t);
    let_go(replaced);
    if !whole {
        // Past the end of file, or a piece could not be mapped: the description is the
        // kernel's from now on (see the module docs).
        crate::served::mapped(call.fd);
    }
    crate::set_errno(saved);
    Some(base as isize)
}

/// `munmap`: forwarded (with the table locked, so that no `msync` flushes pages being
/// unmapped), then the segments in the range forgotten.
///
/// # Safety
/// The C function's contract.
pub(crate) unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let t = if RECORDS.load(Ordering::Acquire) == 0 {
        None
    } else {
        Locked::take()
    };
    // SAFETY: forwarded under the same contract.
    let r = unsafe { crate::real::munmap(addr, len) };
    if let Some(t) = t
        && r == 0
    {
        let lo = addr as usize;
        settle(t, |records| {
            unrecord(records, lo, lo.saturating_add(pages(len)))
        });
    }
    r
}

/// `msync`: forwarded (the kernel checks the arguments and syncs what it maps itself); then,
/// unless it refused them, the CPU caches are flushed over the segments in the range, and the
/// mtime of a file mapped there from a writable description is raised ([`MapPin::stored`]:
/// stores may have changed it; dropping the pin does it too). Counted as a served call when it
/// covers a segment.
///
/// # Safety
/// The C function's contract.
pub(crate) unsafe fn msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    // SAFETY: forwarded under the same contract.
    let r = unsafe { crate::real::msync(addr, len, flags) };
    if RECORDS.load(Ordering::Acquire) == 0 || (r != 0 && crate::errno() != libc::ENOMEM) {
        return r;
    }
    let Some(mut t) = Locked::take() else {
        return r;
    };
    let lo = addr as usize;
    let hi = lo.saturating_add(pages(len));
    let mut flushed = false;
    let mut requests = Vec::new();
    for r in t.records() {
        let mut covered = false;
        for s in &r.segs {
            if let Some(part) = s.inside(lo, hi) {
                // SAFETY: the part is a mapping of the pool, which stays mapped while the
                // table is locked (`munmap` forwards under the lock).
                unsafe { persist::flush(part.addr as *const u8, part.len) };
                covered = true;
                flushed = true;
            }
        }
        if covered && let Ok(Some(request)) = r.pin.stored_later() {
            requests.push(request);
        }
    }
    drop(t);
    // Each waits for the daemon: not under the table's lock.
    for request in requests {
        request.send();
    }
    if flushed {
        persist::fence();
        crate::PMFS_CALLS.fetch_add(1, Ordering::Relaxed);
        crate::SERVED.fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// `mremap`: forwarded, and the segments it cuts followed. Growing or moving a range of
/// segments is served here instead, see [`relocate`]; `MREMAP_DONTUNMAP` on a segment is
/// refused (`EINVAL`: it would keep the pool mapped twice).
///
/// # Safety
/// The C function's contract.
pub(crate) unsafe fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let t = if RECORDS.load(Ordering::Acquire) == 0 {
        None
    } else {
        Locked::take()
    };
    let Some(mut t) = t else {
        // SAFETY: forwarded under the same contract.
        return unsafe { crate::real::mremap(old, old_len, new_len, flags, new_addr) };
    };
    let (from, old_span, new_span) = (old as usize, pages(old_len), pages(new_len));
    let held = t
        .records()
        .iter()
        .flat_map(|r| &r.segs)
        .any(|s| s.overlaps(from, from.saturating_add(old_span.max(PAGE))));
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if held && (new_span > old_span || fixed || flags & libc::MREMAP_DONTUNMAP != 0) {
        let saved = crate::errno();
        let mut emptied = Vec::new();
        let grown = if flags & libc::MREMAP_DONTUNMAP != 0 {
            Err(libc::EINVAL)
        } else {
            let to = new_addr as usize;
            relocate(&mut t, from, old_span, new_span, flags, to, &mut emptied)
        };
        drop(t);
        let_go(emptied);
        return match grown {
            Ok(to) => {
                crate::set_errno(saved);
                crate::PMFS_CALLS.fetch_add(1, Ordering::Relaxed);
                crate::SERVED.fetch_add(1, Ordering::Relaxed);
                core::ptr::without_provenance_mut(to)
            }
            Err(e) => {
                crate::set_errno(e);
                libc::MAP_FAILED
            }
        };
    }
    // SAFETY: forwarded under the same contract.
    let r = unsafe { crate::real::mremap(old, old_len, new_len, flags, new_addr) };
    if r != libc::MAP_FAILED {
        settle(t, |records| {
            moved(records, from, old_span, r as usize, new_span)
        });
    }
    r
}

/// Serves an `mremap` of `from..from + old_span` (whole pages), which holds segments, that the
/// kernel cannot do on them: one that grows the range (the kernel would extend the last piece over
/// the pool bytes after it: other files' blocks) or moves it (the kernel moves one mapping at a
/// time, and the pieces are one each). The range must be segments of one file, mapped with one
/// access mode and protection, contiguous in the file (the holes a read-only mapping leaves to the
/// kernel get blocks and become segments first, [`fill_gaps`]). New pages are mapped from the pool
/// like a new `mmap` of the file (holes allocated, a record and pin of their own), so the file must
/// reach past the grown range (a program grows a mapping after growing its file). The range grows
/// in place if the pages after it are free; otherwise, with `MREMAP_MAYMOVE`, it moves (to
/// `new_addr` with `MREMAP_FIXED`, replacing what was there): the pieces it keeps are mapped there
/// again from the pool (a shared mapping: the same bytes) and the old range unmapped. Returns the
/// address or the errno, and puts the records nothing is left of in `emptied` (even on failure: an
/// `MREMAP_FIXED` target is given up first). The errors are the kernel's (`EINVAL` for flags it
/// refuses, `EFAULT` for a range that is not one mapping, `ENOMEM` for want of room), and `ENOMEM`
/// for a file that ends before the grown range, where the kernel would map pages that raise
/// `SIGBUS`.
fn relocate(
    t: &mut Locked,
    from: usize,
    old_span: usize,
    new_span: usize,
    flags: c_int,
    new_addr: usize,
    emptied: &mut Vec<Record>,
) -> Result<usize, c_int> {
    let moving = flags & libc::MREMAP_MAYMOVE != 0;
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if flags & !(libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) != 0
        || (fixed && !moving)
        || !from.is_multiple_of(PAGE)
        || new_span == 0
        || (fixed
            && (!new_addr.is_multiple_of(PAGE)
                || (new_addr < from + old_span && from < new_addr.saturating_add(new_span))))
    {
        return Err(libc::EINVAL);
    }
    let hi = from + old_span;
    let keep = old_span.min(new_span);
    let ext_len = new_span.saturating_sub(old_span);
    let mut owner = None;
    let mut parts = Vec::new();
    for r in t.records().iter() {
        let inside = r.segs.iter().filter_map(|s| s.inside(from, hi));
        let before = parts.len();
        parts.extend(inside);
        if parts.len() == before {
            continue;
        }
        let this = (r.mount, r.ino, r.writable, r.prot);
        match owner {
            None => owner = Some((r.client, this)),
            Some((_, first)) if first == this => {}
            Some(_) => return Err(libc::EFAULT),
        }
    }
    let (client, (mount, ino, writable, prot)) = owner.ok_or(libc::EFAULT)?;
    parts.sort_unstable_by_key(|s| s.addr);
    if !writable {
        fill_gaps(t, &mut parts, from, hi, (mount, client, ino, prot))?;
    }
    let contiguous = parts
        .windows(2)
        .all(|w| w[0].end() == w[1].addr && w[0].file_off + w[0].len as u64 == w[1].file_off);
    let last = *parts.last().ok_or(libc::EFAULT)?;
    if parts[0].addr != from || last.end() != hi || !contiguous {
        return Err(libc::EFAULT);
    }
    let ext_off = last.file_off + last.len as u64;
    let ext = if ext_len > 0 {
        let ext = client
            .map(ino, ext_off, ext_len as u64)
            .map_err(|_| libc::ENOMEM)?;
        let mapped: u64 = ext.pieces().iter().map(|p| p.len).sum();
        if ext.pieces().first().is_none_or(|p| p.file_off != ext_off) || mapped != ext_len as u64 {
            return Err(libc::ENOMEM);
        }
        Some(ext)
    } else {
        None
    };
    let fd = pool_fd(mount, writable).ok_or(libc::ENOMEM)?;
    let reserve = |addr: usize, len: usize, how: c_int| {
        // SAFETY: an anonymous mapping; with MAP_FIXED only over the target of an
        // `mremap(MREMAP_FIXED)`, which the caller gave up.
        unsafe {
            sys_mmap(
                addr,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | how,
                -1,
                0,
            )
        }
    };
    let to = if fixed {
        reserve(new_addr, new_span, libc::MAP_FIXED).map_err(|_| libc::ENOMEM)?;
        emptied.extend(unrecord(t.records(), new_addr, new_addr + new_span));
        new_addr
    } else {
        match reserve(hi, ext_len, libc::MAP_FIXED_NOREPLACE) {
            Ok(a) if a == hi => from,
            Ok(a) => {
                // SAFETY: the reservation just made, at an address the kernel chose.
                unsafe { libc::syscall(libc::SYS_munmap, a, ext_len) };
                if !moving {
                    return Err(libc::ENOMEM);
                }
                reserve(0, new_span, 0).map_err(|_| libc::ENOMEM)?
            }
            Err(_) if moving => reserve(0, new_span, 0).map_err(|_| libc::ENOMEM)?,
            Err(_) => return Err(libc::ENOMEM),
        }
    };
    let kept = if to == from { &[][..] } else { &parts[..] };
    let moved_segs: Vec<Seg> = kept
        .iter()
        .filter_map(|s| s.inside(from, from + keep))
        .map(|s| Seg {
            addr: s.addr - from + to,
            ..s
        })
        .collect();
    let ext_segs = ext
        .as_ref()
        .map(|e| segs_of(e.pieces(), to + old_span, ext_off))
        .unwrap_or_default();
    let flags = libc::MAP_SHARED | libc::MAP_FIXED;
    // SAFETY: the segments lie inside the range reserved above.
    let placed = unsafe { place(&moved_segs, prot, flags, fd) }
        .and_then(|()| unsafe { place(&ext_segs, prot, flags, fd) });
    if placed.is_err() {
        let (lo, len) = if to == from {
            (hi, ext_len)
        } else {
            (to, new_span)
        };
        // SAFETY: the range reserved above, which holds nothing of the caller's yet (an
        // `MREMAP_FIXED` target was given up).
        unsafe { libc::syscall(libc::SYS_munmap, lo, len) };
        return Err(libc::ENOMEM);
    }
    if to != from {
        // SAFETY: the old range, whose pieces are mapped at `to` now.
        unsafe { libc::syscall(libc::SYS_munmap, from, old_span) };
        emptied.extend(moved(t.records(), from, old_span, to, keep));
    }
    if let Some(ext) = ext {
        t.records().push(Record {
            mount,
            client,
            ino,
            writable,
            prot,
            pin: pin_of(ext.into_pin(), writable),
            segs: ext_segs,
        });
    }
    Ok(to)
}

/// Before a read-only mapping is grown or moved: the pages of `from..hi` that its segments
/// `parts` (sorted) leave to the kernel's mapping, the holes of the file, get blocks and are
/// mapped from the pool like the rest, in a record of their own, so that the range is
/// segments alone, which are all that can be moved. Pages past the end of file stay as they
/// are. The file offsets follow from the first segment's: one `mmap` call maps one run of the
/// file.
fn fill_gaps(
    t: &mut Locked,
    parts: &mut Vec<Seg>,
    from: usize,
    hi: usize,
    (mount, client, ino, prot): (usize, &'static Client, Ino, c_int),
) -> Result<(), c_int> {
    let first = *parts.first().ok_or(libc::EFAULT)?;
    let file_at = |addr: usize| (first.file_off + addr as u64).checked_sub(first.addr as u64);
    let mut gaps = Vec::new();
    let mut at = from;
    for s in parts.iter().chain([&Seg {
        addr: hi,
        len: 0,
        pool_off: 0,
        file_off: 0,
    }]) {
        if s.addr > at {
            gaps.push((at, s.addr - at));
        }
        at = at.max(s.end());
    }
    if gaps.is_empty() {
        return Ok(());
    }
    let fd = pool_fd(mount, false).ok_or(libc::ENOMEM)?;
    for (addr, len) in gaps {
        let off = file_at(addr).ok_or(libc::EFAULT)?;
        let Ok(file) = client.map(ino, off, len as u64) else {
            return Err(libc::ENOMEM);
        };
        let mut segs = segs_of(file.pieces(), addr, off);
        // One at a time, so that the record holds exactly those placed.
        let placed = segs.iter().position(|s| {
            // SAFETY: pages of the caller's mapping that the kernel maps from the file: the
            // same bytes, from the pool.
            unsafe { place(&[*s], prot, libc::MAP_SHARED | libc::MAP_FIXED, fd) }.is_err()
        });
        let failed = placed.is_some();
        segs.truncate(placed.unwrap_or(segs.len()));
        parts.extend(segs.iter().copied());
        if !segs.is_empty() {
            t.records().push(Record {
                mount,
                client,
                ino,
                writable: false,
                prot,
                pin: file.into_pin(),
                segs,
            });
        }
        if failed {
            return Err(libc::ENOMEM);
        }
    }
    parts.sort_unstable_by_key(|s| s.addr);
    Ok(())
}

/// A mapping with `MAP_FIXED` replaced `addr..addr + len`: the segments there are gone.
pub(crate) fn replaced(addr: usize, len: usize) {
    if RECORDS.load(Ordering::Acquire) == 0 {
        return;
    }
    if let Some(t) = Locked::take() {
        settle(t, |records| {
            unrecord(records, addr, addr.saturating_add(pages(len)))
        });
    }
}

/// Changes the records with `change`, which returns those nothing is left of; unlocks, then
/// lets them go (keeping `errno`).
fn settle(mut t: Locked, change: impl FnOnce(&mut Vec<Record>) -> Vec<Record>) {
    let emptied = change(t.records());
    drop(t);
    let saved = crate::errno();
    let_go(emptied);
    crate::set_errno(saved);
}

/// Pmfs mount `m` is gone (module `liveness`): its mappings are made private, so no later
/// store reaches the pool, and their pins forgotten (the pool may have a new owner, which
/// reset them).
pub(crate) fn mount_gone(m: usize) {
    if RECORDS.load(Ordering::Acquire) == 0 {
        return;
    }
    if let Some(mut t) = Locked::take() {
        abandon(t.records(), |r| r.mount == m);
    }
}

/// At exit, `_exit` and exec: every mapping is made private (stores made later, by threads
/// still running or after a failed exec, stay in the process), then its pin released.
pub(crate) fn release_all() {
    if RECORDS.load(Ordering::Acquire) == 0 {
        return;
    }
    let Some(mut t) = Locked::take() else {
        return;
    };
    let all = core::mem::take(t.records());
    let mut pool = None;
    for r in &all {
        make_private(r, &mut pool);
    }
    drop(t);
    let_go(all);
}

/// Removes the records `pick` chooses, makes them private and forgets their pins.
fn abandon(records: &mut Vec<Record>, mut pick: impl FnMut(&mut Record) -> bool) {
    let mut pool = None;
    let mut i = 0;
    while i < records.len() {
        if pick(&mut records[i]) {
            let r = records.swap_remove(i);
            make_private(&r, &mut pool);
            core::mem::forget(r.pin);
        } else {
            i += 1;
        }
    }
}

/// Remaps the segments of `r` `MAP_PRIVATE` from the pool (their bytes as they are now; later
/// stores stay in the process), or, failing that, takes write access away. `pool` keeps a
/// descriptor of a mount's pool between calls.
fn make_private(r: &Record, pool: &mut Option<(usize, c_int)>) {
    let fd = match *pool {
        Some((m, fd)) if m == r.mount => Some(fd),
        _ => {
            let fd = pool_fd(r.mount, false);
            *pool = fd.map(|fd| (r.mount, fd));
            fd
        }
    };
    for s in &r.segs {
        let private = match fd {
            // SAFETY: the segment is a mapping of the pool this table made; a private copy of
            // the same bytes keeps every address valid.
            Some(fd) => unsafe {
                sys_mmap(
                    s.addr,
                    s.len,
                    r.prot,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    fd,
                    s.pool_off,
                )
            }
            .is_ok(),
            None => false,
        };
        if !private {
            // SAFETY: as above; only the protection of the segment changes.
            unsafe {
                libc::syscall(
                    libc::SYS_mprotect,
                    s.addr,
                    s.len,
                    r.prot & !libc::PROT_WRITE,
                )
            };
        }
    }
}

/// Takes `lo..hi` out of every record; returns the records nothing is left of.
fn unrecord(records: &mut Vec<Record>, lo: usize, hi: usize) -> Vec<Record> {
    for r in records.iter_mut() {
        if r.segs.iter().any(|s| s.overlaps(lo, hi)) {
            r.segs = cut(&r.segs, lo, hi);
        }
    }
    take_empty(records)
}

/// `mremap` moved `from..from + old_span` to `to..to + new_span` (not larger, where a segment
/// was): see [`shift`]. Returns the records nothing is left of.
fn moved(
    records: &mut Vec<Record>,
    from: usize,
    old_span: usize,
    to: usize,
    new_span: usize,
) -> Vec<Record> {
    let (old_hi, new_hi) = (from.saturating_add(old_span), to.saturating_add(new_span));
    for r in records.iter_mut() {
        if r.segs
            .iter()
            .any(|s| s.overlaps(from, old_hi) || s.overlaps(to, new_hi))
        {
            r.segs = shift(&r.segs, from, old_span, to, new_span);
        }
    }
    take_empty(records)
}

/// `segs` without `lo..hi`.
fn cut(segs: &[Seg], lo: usize, hi: usize) -> Vec<Seg> {
    segs.iter().flat_map(|s| s.outside(lo, hi)).collect()
}

/// `segs` after `from..from + old_span` moved to `to..to + new_span`: the segments in the part
/// kept move along, the rest of the old range is gone, and so is whatever the target range
/// held before.
fn shift(segs: &[Seg], from: usize, old_span: usize, to: usize, new_span: usize) -> Vec<Seg> {
    let (old_hi, new_hi) = (from.saturating_add(old_span), to.saturating_add(new_span));
    let kept = segs
        .iter()
        .filter_map(|s| s.inside(from, from.saturating_add(new_span)))
        .map(|s| Seg {
            addr: s.addr - from + to,
            ..s
        });
    cut(&cut(segs, from, old_hi), to, new_hi)
        .into_iter()
        .chain(kept)
        .collect()
}

fn take_empty(records: &mut Vec<Record>) -> Vec<Record> {
    let mut empty = Vec::new();
    let mut i = 0;
    while i < records.len() {
        if records[i].segs.is_empty() {
            empty.push(records.swap_remove(i));
        } else {
            i += 1;
        }
    }
    empty
}

/// Releases the pins of records nothing is mapped of any more; on a mount that is gone they
/// are forgotten instead (see [`mount_gone`]). Called without the lock: finding a mount gone
/// takes it.
fn let_go(records: Vec<Record>) {
    for r in records {
        if liveness::gone(r.mount, r.client.owner_state()) {
            core::mem::forget(r.pin);
        } else {
            drop(r);
        }
    }
}

/// Descriptors of each mount's pool file, read-only (`[m][0]`) and read-write (`[m][1]`); -1
/// when not open.
static POOL_FDS: [[AtomicI32; 2]; MAX_PMFS] =
    [const { [const { AtomicI32::new(-1) }; 2] }; MAX_PMFS];
/// The device and inode number of each mount's pool file, as first opened (0: not yet).
static POOL_ID: [[AtomicU64; 2]; MAX_PMFS] = [const { [const { AtomicU64::new(0) }; 2] }; MAX_PMFS];

/// A descriptor of the pool file of mount `m` (read-write if `write`), opened on first use
/// and opened again if the program closed the one kept (its number may be another file now).
/// `errno` is kept.
fn pool_fd(m: usize, write: bool) -> Option<c_int> {
    let slot = &POOL_FDS.get(m)?[usize::from(write)];
    let saved = crate::errno();
    let kept = slot.load(Ordering::Acquire);
    let fd = if kept >= 0 && identity(kept).is_some_and(|id| id == pool_id(m)) {
        Some(kept)
    } else {
        open_pool(m, write).map(|fd| {
            match slot.compare_exchange(kept, fd, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => fd,
                Err(other) => {
                    // SAFETY: closes the descriptor opened just above, which nobody else saw.
                    unsafe { libc::syscall(libc::SYS_close, fd) };
                    other
                }
            }
        })
    };
    crate::set_errno(saved);
    fd
}

pub(crate) fn pool_id(m: usize) -> (u64, u64) {
    (
        POOL_ID[m][0].load(Ordering::Acquire),
        POOL_ID[m][1].load(Ordering::Acquire),
    )
}

/// The pool file of mount `m`, opened read-write at a high number (see [`open_pool`]), for
/// the process's client of it to own.
pub(crate) fn pool_file(m: usize) -> Option<std::fs::File> {
    let fd = open_pool(m, true)?;
    // SAFETY: `fd` was opened just above and is owned by nobody else.
    Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Opens the pool file of mount `m`, `O_CLOEXEC`, at a descriptor number high in the range
/// programs use, and notes its identity the first time.
fn open_pool(m: usize, write: bool) -> Option<c_int> {
    let path: &CStr = mounts::pool_of(m)?;
    let mode = if write { libc::O_RDWR } else { libc::O_RDONLY };
    // SAFETY: a NUL-terminated path; openat has no other precondition.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            mode | libc::O_CLOEXEC,
        )
    } as c_int;
    if fd < 0 {
        return None;
    }
    let fd = moved_high(fd);
    let id = identity(fd)?;
    if POOL_ID[m][0]
        .compare_exchange(0, id.0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        POOL_ID[m][1].store(id.1, Ordering::Release);
    }
    Some(fd)
}

/// `fd` moved to the lowest free number at least 2 × `MAX_PMFS` below the descriptor limit
/// (at most 1024, so the kernel's descriptor table stays small), out of the way of programs
/// that use small fixed numbers; `fd` itself if that fails.
fn moved_high(fd: c_int) -> c_int {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads this process's limit into `lim`.
    let got = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            core::ptr::null::<libc::rlimit>(),
            &mut lim,
        )
    };
    let floor = lim.rlim_cur.min(1024).saturating_sub(2 * MAX_PMFS as u64);
    if got != 0 || floor <= fd as u64 {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC takes a plain integer.
    let high = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, floor) } as c_int;
    if high < 0 {
        return fd;
    }
    // SAFETY: closes the descriptor this module opened, now duplicated.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    high
}

/// The device and inode number of the file open at `fd`.
fn identity(fd: c_int) -> Option<(u64, u64)> {
    let s = crate::statx_fd(fd, 0, libc::STATX_INO)?;
    Some((libc::makedev(s.stx_dev_major, s.stx_dev_minor), s.stx_ino))
}

/// The segments of `pieces` of a file placed so that file offset `file_off` lies at `addr`.
fn segs_of(pieces: &[MapPiece], addr: usize, file_off: u64) -> Vec<Seg> {
    pieces
        .iter()
        .map(|p| Seg {
            addr: addr + (p.file_off - file_off) as usize,
            len: p.len as usize,
            pool_off: p.pool_off,
            file_off: p.file_off,
        })
        .collect()
}

/// Maps each of `segs` from the pool file `fd` at its address; stops at the first failure.
///
/// # Safety
/// As [`sys_mmap`] with `MAP_FIXED` (in `flags`): the caller owns what the segments cover.
unsafe fn place(segs: &[Seg], prot: c_int, flags: c_int, fd: c_int) -> Result<(), c_int> {
    for s in segs {
        // SAFETY: the caller's contract.
        unsafe { sys_mmap(s.addr, s.len, prot, flags, fd, s.pool_off) }?;
    }
    Ok(())
}

/// `mmap` as a system call (never the interposed function, which takes the table's lock):
/// the address, or the errno.
///
/// # Safety
/// As `mmap(2)`; with `MAP_FIXED`, the caller owns what is mapped at `addr..addr + len`.
unsafe fn sys_mmap(
    addr: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: u64,
) -> Result<usize, c_int> {
    // SAFETY: the caller's contract.
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if r == -1 {
        Err(crate::errno())
    } else {
        Ok(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = PAGE;

    fn seg(addr: usize, len: usize, pool_off: u64) -> Seg {
        Seg {
            addr,
            len,
            pool_off,
            file_off: pool_off + 5 * 4096,
        }
    }

    #[test]
    fn cuts_trim_split_and_drop_segments() {
        let segs = [seg(10 * P, 4 * P, 100 * 4096), seg(20 * P, P, 7 * 4096)];
        assert_eq!(cut(&segs, 0, 5 * P), segs.to_vec(), "nothing in the range");
        assert_eq!(
            cut(&segs, 11 * P, 13 * P),
            vec![
                seg(10 * P, P, 100 * 4096),
                seg(13 * P, P, 103 * 4096),
                seg(20 * P, P, 7 * 4096)
            ],
            "split in two, the pool offsets following"
        );
        assert_eq!(
            cut(&segs, 8 * P, 11 * P),
            vec![seg(11 * P, 3 * P, 101 * 4096), seg(20 * P, P, 7 * 4096)]
        );
        assert_eq!(
            cut(&segs, 12 * P, 30 * P),
            vec![seg(10 * P, 2 * P, 100 * 4096)]
        );
        assert_eq!(cut(&segs, 10 * P, 21 * P), vec![]);
    }

    #[test]
    fn shifts_follow_moves_and_shrinks() {
        let segs = [seg(10 * P, 2 * P, 50 * 4096), seg(12 * P, P, 9 * 4096)];
        assert_eq!(
            shift(&segs, 10 * P, 3 * P, 40 * P, 3 * P),
            vec![seg(40 * P, 2 * P, 50 * 4096), seg(42 * P, P, 9 * 4096)],
            "moved whole"
        );
        assert_eq!(
            shift(&segs, 10 * P, 3 * P, 10 * P, P),
            vec![seg(10 * P, P, 50 * 4096)],
            "shrunk in place"
        );
        assert_eq!(
            shift(&segs, 11 * P, 2 * P, 30 * P, P),
            vec![seg(10 * P, P, 50 * 4096), seg(30 * P, P, 51 * 4096)],
            "the middle moved and shrunk"
        );
        let other = [seg(30 * P, 2 * P, 70 * 4096)];
        assert_eq!(
            shift(&other, 10 * P, 3 * P, 29 * P, 2 * P),
            vec![seg(31 * P, P, 71 * 4096)],
            "a target range over a segment replaces what it covers"
        );
    }

    #[test]
    fn only_plain_shared_mappings_at_page_offsets_want_the_pool() {
        let call = MapCall {
            addr: 0,
            len: 100,
            prot: libc::PROT_READ | libc::PROT_WRITE,
            flags: libc::MAP_SHARED,
            fd: 3,
            off: 8192,
        };
        assert!(call.wants_pool());
        assert_eq!(call.span(), P);
        for flags in [
            libc::MAP_SHARED_VALIDATE | libc::MAP_POPULATE,
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
        ] {
            assert!(MapCall { flags, ..call }.wants_pool(), "{flags:#x}");
        }
        for bad in [
            MapCall {
                flags: libc::MAP_PRIVATE,
                ..call
            },
            MapCall {
                flags: libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                ..call
            },
            MapCall {
                prot: libc::PROT_READ | libc::PROT_EXEC,
                ..call
            },
            MapCall { len: 0, ..call },
            MapCall {
                len: usize::MAX,
                ..call
            },
            MapCall { off: 100, ..call },
            MapCall { off: -4096, ..call },
            MapCall {
                addr: 100,
                flags: libc::MAP_SHARED | libc::MAP_FIXED,
                ..call
            },
        ] {
            assert!(!bad.wants_pool(), "{bad:?}");
        }
    }
}
