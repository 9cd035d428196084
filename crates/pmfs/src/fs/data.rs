//! Open files and the copy-on-write data path (MadFS §4.1–4.6) on each file's log.
//!
//! # Truth
//!
//! A regular file's blocks and size are the volume's mapping structure plus the inode's `SIZE`
//! word (the *digested* state) plus the entries of the file's log ([`pmfs_core::log`], head
//! word `LOG` in the inode) that are not digested yet: the digest cursor word `DIGEST` holds the
//! LSN of the first entry not applied to the mapping. `MAPPED_END` bounds the mapped logical
//! blocks (fallocate with KEEP_SIZE maps blocks past end of file), so a truncation knows what
//! to unmap. A file gets its log on its first data update.
//!
//! Each process keeps, per open inode, one log handle and an [`Overlay`]: the DRAM fold of the
//! undigested entries, caught up from the log before every operation.
//!
//! # Updates
//!
//! Every data update is one log entry, committed by one CAS ([`Log::prepare`] and
//! [`try_commit`](pmfs_core::log::Prepared::try_commit)):
//!
//! - a write stages fresh blocks for every block it touches (the volume allocator with a
//!   `Growing` hint whose goal follows the previous logical block, or HashFS staging), copies
//!   the unaligned head and tail old bytes (zeros for holes and at/after the old size) and the
//!   new bytes with non-temporal stores, fences, and commits `Write { runs, extend_to }` at the
//!   tail it started from. Growing past an unaligned end of file also copies the old last block
//!   with its bytes past the old size zeroed (a truncation leaves stale bytes there). The
//!   overlay's lock covers the catch-up and the lookups of the old blocks only, not the copies.
//!   If other entries were committed meanwhile (another process, or another thread of this
//!   one), the writer folds them, re-copies only
//!   the partial blocks whose old contents they changed, and retries; a truncation among them,
//!   a moved end of file for an append, or entries it could not fold (compacted away after
//!   being applied, or folded meanwhile by another thread of the process) make it start over;
//! - a shrinking `set_len` is a `Truncate`; a growing one a `Write` without new data blocks
//!   but with `extend_to` (and the zeroed copy of the old last block);
//! - `allocate` maps fresh zeroed blocks over the holes of the range (past end of file too
//!   with KEEP_SIZE); `punch_hole` copies the partial edge blocks with the range zeroed, then
//!   commits a `Punch` of the whole blocks. When it needs both updates, a journal cleanup
//!   armed before the first (naming an edge block and its copy) makes mount finish the second
//!   if a crash comes between them, so the punch is atomic too; `zero_range` is a `Write` of
//!   zeros over the range (fresh blocks, the partial edges copied with their kept bytes).
//!
//! Writes are *digested* in batches: a process applies its writes once it has committed
//! [`DIGEST_AFTER_ENTRIES`] of them (or [`DIGEST_AFTER_BLOCKS`] blocks), at the last close of
//! the file, before it frees it, and when staging finds no space; every other update (a
//! truncation, a punch, an allocation) digests at once. Until then readers see the writes
//! through their overlay, `metadata` folds the log for the size ([`Fs::live_size`]), and the
//! blocks the writes replaced stay allocated. [`Log::digest_batched`] applies every
//! undigested entry to the mapping in log order, one holder at a time across processes (the
//! cursor word, holder = process id, a dead holder is taken over), in batches of consecutive
//! writes that move the cursor once. Applying is idempotent: a write's run that the mapping
//! already maps exactly is skipped, else the mapping maps it over the range and frees the
//! replaced blocks (`replace_many`: a run over mapped blocks is rewritten in place, one
//! atomic word per block or entry, with one fence per batch; a cuckoo run that cuts
//! another's needs an intent record; any other run is a `replace`); a truncation stores the
//! size, unmaps `[ceil(size / 4096), MAPPED_END)` and lowers `MAPPED_END`; a punch unmaps. On
//! the extent tree, radix tree and cuckoo hash a batch holds writes to disjoint blocks only,
//! so applying it again after a crash cannot map a block back to an older version; its runs
//! are applied in block order, those continuing each other as one run (a batch of appends is
//! one mapping update). On HashFS ([`HashFs::apply_writes`]) the displaced versions are
//! tombstoned, one fence, the new ones promoted, one fence, then the cursor moves past the
//! whole batch; a block written twice in a batch is promoted once, and its losing staged slot
//! given back after the cursor moved.
//! Once the log has grown by a block of applied entries, [`Log::compact_applied`] drops them.
//!
//! The modification time is stamped from the kernel's coarse clock, before the data fence
//! (which makes it durable with the data), and only when it moves.
//!
//! Reads are optimistic: they take the log's tail, catch the overlay up, read the blocks the
//! overlay names or else the mapping's, and retry if the tail moved meanwhile. Writers of a
//! file race on the log tail, threads of one process exactly as processes do (a writer whose
//! commit finds newer entries checks them in the log, whatever other threads folded into the
//! overlay meanwhile). On HashFS, reads and writes take no lock of the inode. On the other
//! structures a file's readers and writers share its lock and every digest holds it alone:
//! their lookups must not run into a digest restructuring a tree, so a write that fills a
//! batch digests it after its commit, with the lock taken again alone. Size changes,
//! allocation and punching hold the lock alone on every structure.
//!
//! # The tail
//!
//! The bytes past the end of file in the partial last block belong to no version of the file
//! (a truncation leaves old bytes there, which growing the file must zero). So an update that
//! starts at or past the end of file inside that block writes its bytes there *in place*
//! (with zeros over any gap from the old end), flushes them with the staged blocks' copies,
//! and commits an entry that only raises the size for that block: an append of a few bytes
//! copies no block and stages none. This needs the writer to own those bytes and the block
//! to stay the file's until the commit, so every update that changes the size or writes the
//! partial last block holds the file's *tail* from its plan to its commit: this process's
//! tail mutex, then the inode's `TAIL` word, which names the holding process (taken by CAS,
//! waited for while that process lives and maps the pool, taken over once it does not, reset
//! at mount). The word matters on HashFS, whose files other processes write too.
//! Under the tail no other entry can move the end of file or supersede the last block, so
//! the entries that commit meanwhile (writes of other blocks) never conflict with the bytes
//! written in place.
//! Mapped mode writes the tail its own way (after the commit) and takes no in-place path. A
//! crash, or an error, before the commit leaves the bytes past the end of file, where they
//! are not part of the file.
//!
//! A write is durable and atomic when it returns: after a crash each update is wholly present
//! or absent, and mount recovery digests every log (see [`super`]).
//!
//! # Mapped files
//!
//! A process that maps a file's blocks straight from the pool ([`Fs::map_file`], for `mmap`
//! in the preload library) needs them to stay the file's: copy-on-write would move every
//! written block away from the mapping. So a file has a *mapped mode*, the inode's `MAPS`
//! count (the device-number word, which regular files do not use). While it is nonzero, every
//! update of the file in any process leaves the blocks the file maps where they are:
//!
//! - a write (and a growing `set_len`, an allocation) stages fresh blocks only for holes. It
//!   commits an entry whose other runs map blocks to themselves (which digests skip), then
//!   writes its bytes *in place*, with zeros over the bytes at or after the old size that it
//!   does not write, and fences. If any entry committed since its snapshot touches one of its
//!   blocks, it plans again: its runs name the blocks the file has at its commit;
//! - a shrinking `set_len` commits a `Resize` (the size only, the blocks stay, as fallocate
//!   with KEEP_SIZE leaves them), then zeroes from the new end to the end of the old last
//!   block in place; a hole punch zeroes in place and unmaps nothing.
//!
//! The protocol, across processes with nothing but the pool:
//!
//! - a *mapper* raises `MAPS`, then commits an empty write (a barrier), then allocates the
//!   holes of its range and reads the file's runs;
//! - an update that moves or unmaps blocks (a copy-on-write commit, a `Truncate`, a
//!   `Punch`) reads `MAPS` after it has seen the tail it commits at, and plans again in
//!   mapped mode if it is nonzero. A commit after the barrier saw the barrier, and so the
//!   count; one before it is in the mapper's view;
//! - an in-place writer joins the mode only from a nonzero count and holds its share until
//!   its bytes are in place. No block it names can be moved meanwhile (no copy-on-write
//!   commit can happen while the count is up), and it writes only after its commit, whose
//!   check proved the blocks were still the file's.
//!
//! The pin ([`MapPin`]) also holds a pin on the log, so the owner does not free an unlinked
//! file while it is mapped. Mount resets every `MAPS` count: no mapping survives the owner.
//! A mapper killed before it gave its share back leaves the file in mapped mode until then,
//! unless the owner finds, at its last close of the file or a later look, that no process but
//! dead ones can hold a share ([`Fs::clear_dead_pins`], [`Fs::collect_dead_pins`]).
//!
//! In mapped mode updates are neither atomic nor isolated: a reader may see a write half
//! done, and a crash may leave one torn (as with `mmap` on any file system), and a size
//! change may be seen before the bytes it covers are written.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{
    CURSOR_LSN_BITS, Commit, Digest, ENTRIES_PER_BLOCK, Entry, HeadWord, Log, MapPinned, Position,
};
use pmfs_core::pm::{Media, procs};
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent, Run, merge_runs};
use pmfs_mapping::hashfs::{HashFs, HashFsFile};

use super::path::{Follow, Target};
use super::{Fs, wall_ns};
use crate::api::ino::Ino;
use crate::error::{Error, Result};
use crate::fs::MAX_FILE_SIZE;
use crate::hash::FastMap;
use crate::inode::{GID_WORD, Handle, Kind, field, flag, flags_in};
use crate::mapping::{MapFile, handle};
use crate::overlay::{Overlay, Src, touches, touches_range};
use crate::parts::{Pm, Stager};

/// A file's log as this engine opens it.
pub(crate) type FileLog = Log<Pm, dyn BlockAllocator>;

/// The per-process state of an open inode's log: the handle and the overlay of undigested
/// entries. Shared by every open node of the inode; closed with the last one.
pub(crate) struct Shared {
    pub log: FileLog,
    ov: Mutex<Overlay>,
    /// This process's side of the file's tail ([`Fs::lock_tail`]).
    tail: Mutex<()>,
    /// Where the next compaction is measured from: the log's first LSN when this process
    /// opened it, then the applied LSN at each compaction. A block's worth of applied entries
    /// past it triggers one, so a file opened, written a little and closed many times (a
    /// journal) keeps a short log too.
    gc_at: AtomicU64,
    /// Writes this process committed since its last digest, and their blocks (see
    /// [`DIGEST_AFTER_ENTRIES`]).
    pending_entries: AtomicU64,
    pending_blocks: AtomicU64,
    /// The latest modification time this process stored or found in the inode: the times
    /// word only grows, so a write stamped no later needs neither to read nor store it.
    stamped: AtomicU64,
    /// What the mapping holds under ranges that undigested entries changed
    /// ([`Fs::overlaid_blocks`]).
    underneath: Mutex<Underneath>,
}

/// Blocks the mapping maps in ranges `(lblk, len)`, counted at one digest cursor word: the
/// mapping of a file changes only in a digest, which moves the word, so the counts stay true
/// while it stays. Between two digests a file's pieces in the overlay are mostly the same ones
/// (each write adds or splits a few), so each `fstat` looks up only the new ones.
#[derive(Debug, Default)]
struct Underneath {
    cursor: u64,
    blocks: FastMap<(u64, u64), u64>,
}

/// Ranges an [`Underneath`] keeps at most; past it they are all dropped.
const UNDERNEATH_MAX: usize = 4096;

impl Shared {
    /// Whether the writes this process committed since its last digest fill a batch
    /// ([`DIGEST_AFTER_ENTRIES`], [`DIGEST_AFTER_BLOCKS`]).
    fn batch_full(&self) -> bool {
        self.pending_entries.load(Ordering::Relaxed) >= DIGEST_AFTER_ENTRIES
            || self.pending_blocks.load(Ordering::Relaxed) >= DIGEST_AFTER_BLOCKS
    }

    /// The state of `log` with an empty overlay starting at LSN `digested`, compacting once a
    /// block of applied entries lies past LSN `gc_from`.
    pub fn new(log: FileLog, digested: u64, gc_from: u64) -> Shared {
        Shared {
            log,
            ov: Mutex::new(Overlay::new(digested)),
            tail: Mutex::new(()),
            gc_at: AtomicU64::new(gc_from),
            pending_entries: AtomicU64::new(0),
            pending_blocks: AtomicU64::new(0),
            stamped: AtomicU64::new(0),
            underneath: Mutex::default(),
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("log", &self.log).finish()
    }
}

/// An open inode (shared by the handles of one `File`). Its mapping handle is opened on the
/// first data access, and its log handle on the first access to a file that has a log.
#[derive(Debug)]
pub(crate) struct Node {
    pub h: Handle,
    map: std::sync::OnceLock<MapFile>,
    log: Mutex<Option<Arc<Shared>>>,
}

impl Node {
    /// A node whose mapping handle is opened on first use.
    pub fn new(h: Handle) -> Node {
        Node {
            h,
            map: std::sync::OnceLock::new(),
            log: Mutex::new(None),
        }
    }

    /// A node with an already open mapping handle.
    pub fn with_map(h: Handle, map: MapFile) -> Node {
        Node {
            h,
            map: std::sync::OnceLock::from(map),
            log: Mutex::new(None),
        }
    }
}

/// How to open a path.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenReq {
    pub write: bool,
    pub truncate: bool,
    pub create: bool,
    pub create_new: bool,
    pub perm: u32,
}

const BS: u64 = BLOCK_SIZE;

/// Free blocks that staging leaves to the mapping structure's nodes (extent, radix, cuckoo).
const DIGEST_RESERVE: u64 = 8;

/// An update that does not free space leaves at least this many slots in its log's last
/// block, or else holds a spare block for the log's next one ([`Log::keep_a_spare`]), so that
/// an update that frees space (a truncation's or a punch's extended entry takes at most 7
/// slots) can still commit when the volume is full. Else, on HashFS, where log blocks come
/// from the table the data fills, a file grown until nothing is left could not be truncated.
const LOG_RESERVE: u64 = 8;

/// What a count of a mapping's blocks ([`Fs::mapped_blocks`]) was counted at. It stays true
/// while the file is the same incarnation, its counted range the same and its digest cursor
/// word the same: every change of a file's mapping is a digest, which moves the cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counted {
    generation: u32,
    cursor: u64,
    end: u64,
}

/// Block counts a process keeps at most ([`Fs::mapped_blocks`]); past it they are all dropped.
const BLOCKS_SEEN_MAX: usize = 4096;

/// Times a block count with undigested entries starts again when a digest ran during it
/// ([`Fs::overlaid_blocks`]); the last count stands.
const COUNT_TRIES: u32 = 4;

/// A process digests its writes in batches: once it has committed this many since its last
/// digest, or [`DIGEST_AFTER_BLOCKS`] blocks of them. Until then the overlay serves them, and
/// the blocks they replaced stay allocated.
const DIGEST_AFTER_ENTRIES: u64 = 128;

/// See [`DIGEST_AFTER_ENTRIES`].
const DIGEST_AFTER_BLOCKS: u64 = 2048;

/// The pieces of `[lblk, lblk + len)` as the overlay `ov` has them (all the mapping's
/// without one), into `out`, cleared first.
fn overlay_pieces(ov: Option<&Overlay>, lblk: u64, len: u64, out: &mut Vec<crate::overlay::Piece>) {
    out.clear();
    match ov {
        Some(ov) => ov.lookup(lblk, len, out),
        None => out.push(crate::overlay::Piece {
            lblk,
            len,
            src: Src::Base,
        }),
    }
}

/// What the overlay `ov` has for logical block `lblk`.
fn overlay_src(ov: &Overlay, lblk: u64) -> Src {
    let mut p = PIECES.take();
    overlay_pieces(Some(ov), lblk, 1, &mut p);
    let src = p.first().map_or(Src::Base, |p| p.src);
    PIECES.set(p);
    src
}

thread_local! {
    /// The runs of this thread's last read (or [`Fs::block_at`]), kept so that a read
    /// allocates nothing once the buffer has grown (a read's only allocations were its two
    /// lists). A caller that finds it taken (nested use) starts an empty one.
    static RUNS: Cell<Vec<Run>> = const { Cell::new(Vec::new()) };
    /// The overlay pieces of this thread's last [`Fs::runs_in`], kept likewise.
    static PIECES: Cell<Vec<crate::overlay::Piece>> = const { Cell::new(Vec::new()) };
}

/// How many runs ahead of the one it copies a read hints into the cache (see
/// [`Fs::prefetch_run`]).
const PREFETCH_RUNS: usize = 4;

/// Bytes at the start of a run that a read hints (one block; see [`Fs::prefetch_run`]).
const PREFETCH_BYTES: u64 = 4096;

/// One range of a copy-on-write update: logical blocks `[lblk, lblk + len)` get fresh blocks;
/// the bytes `[from, to)` (file offsets inside the range) become `data` (zeros for `None`);
/// the other bytes of the range keep their old contents (zeros at and after the old size).
#[derive(Clone, Copy, Debug)]
struct Seg<'b> {
    lblk: u64,
    len: u64,
    from: u64,
    to: u64,
    data: Option<&'b [u8]>,
}

impl Seg<'_> {
    /// Whether the segment's blocks include logical block `lblk`.
    fn covers(&self, lblk: u64) -> bool {
        (self.lblk..self.lblk + self.len).contains(&lblk)
    }

    /// Whether the new bytes cover only part of block `lblk`, one of the segment's blocks.
    fn partly_writes(&self, lblk: u64) -> bool {
        self.from > lblk * BS || self.to < (lblk + 1) * BS
    }
}

/// A block of a plan whose old contents must be copied: the bytes outside `[new_from,
/// new_to)` of logical block `lblk`, into physical block `pblk`.
#[derive(Clone, Copy, Debug)]
struct Partial {
    lblk: u64,
    pblk: u64,
    new_from: u64,
    new_to: u64,
}

/// The blocks of `sg` that it writes in part: its first and its last, when the new bytes
/// do not cover them whole.
fn partial_blocks<'s>(sg: &'s Seg<'_>) -> impl Iterator<Item = u64> + 's {
    let last = sg.lblk + sg.len.max(1) - 1;
    [sg.lblk, last]
        .into_iter()
        .take(sg.len.min(2) as usize)
        .filter(|&b| sg.partly_writes(b))
}

/// Plans a copy-on-write update from the overlay, the mapping handle and the current size:
/// the segments and the size to extend to, or `None` for nothing to do.
type Plan<'p, 'b> =
    dyn FnMut(&Fs, Option<&Overlay>, &MapFile, u64) -> Result<Option<(Vec<Seg<'b>>, u64)>> + 'p;

/// Why a commit attempt gave up and the update must be planned again.
enum Attempt {
    /// Committed at LSN `lsn` by an attempt that checked the log from LSN `from`: only
    /// reservations and padding lie between the two.
    Committed {
        from: u64,
        lsn: u64,
    },
    Replan,
}

/// An update this thread committed, for [`Fs::after_commit`] to fold without reading the log.
struct Own<'a> {
    /// The LSN the committing attempt checked from (see [`Attempt::Committed`]).
    from: u64,
    lsn: u64,
    entry: &'a Entry,
}

/// How a copy-on-write update runs (see [`Fs::cow_update`]).
#[derive(Clone, Copy, Debug)]
struct Update {
    /// Re-plan when the size moved under a commit attempt (an append).
    append: bool,
    /// Leave the digest to a later batch (see [`DIGEST_AFTER_ENTRIES`]).
    lazy: bool,
    /// In mapped mode, stage fresh blocks for the holes of the segments (a punch leaves them).
    holes: bool,
    /// The caller holds the inode's lock shared, not alone (a write on a structure other than
    /// HashFS, see [`Fs::write_inner`]): the digest, which needs it alone, is left to the
    /// caller, and staging that finds no space fails with [`Error::NoSpace`] at once.
    shared: bool,
}

impl Update {
    const WRITE: Update = Update {
        append: false,
        lazy: true,
        holes: true,
        shared: false,
    };
    const NOW: Update = Update {
        append: false,
        lazy: false,
        holes: true,
        shared: false,
    };
}

/// When [`Fs::after_commit`] digests the file's log.
#[derive(Clone, Copy, Debug)]
enum DigestWhen {
    /// At once.
    Now,
    /// With a later batch, unless this write of so many blocks fills one
    /// ([`Shared::batch_full`]).
    Batched(u64),
    /// Never: the write of so many blocks is counted in the batch, which the caller digests
    /// once it holds the inode's lock alone ([`Fs::digest_if_due`]).
    ByCaller(u64),
}

/// What [`Fs::fill`] puts over its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// Zeroed blocks over the holes (`fallocate`), failing with [`Error::NoSpace`] before
    /// any change if they need more than this many.
    Holes { at_most: u64 },
    /// Zeros over all of it (`FALLOC_FL_ZERO_RANGE`).
    Zeros,
}

/// The file's tail held ([`Fs::lock_tail`]): this process's lock of it and the inode's `TAIL`
/// word naming this process. Dropping it frees both.
struct TailGuard<'a> {
    media: &'a dyn Media,
    at: PmOff,
    _local: MutexGuard<'a, ()>,
}

impl Drop for TailGuard<'_> {
    fn drop(&mut self) {
        let _ = self.media.store_u64(self.at, 0);
    }
}

/// The bytes of an update that go in place into the partial last block (see
/// [`tail_in_place`]): zeros over `[size, from)`, then `data` at `from`, or zeros up to `to`.
#[derive(Clone, Copy, Debug)]
struct InPlace<'b> {
    lblk: u64,
    size: u64,
    from: u64,
    to: u64,
    data: Option<&'b [u8]>,
}

/// Takes out of `segs` the part that writes at or past the old end `size` of the file inside
/// its partial last block, to be written in place (see the module documentation): what a
/// write starting there puts into that block, or the zeros a file growing past it needs. The
/// rest of the segment, from the next block on, stays. `None` when no segment does that
/// (the end is block-aligned, or a segment writes below it in that block).
fn tail_in_place<'b>(segs: &mut Vec<Seg<'b>>, size: u64) -> Option<InPlace<'b>> {
    if size.is_multiple_of(BS) {
        return None;
    }
    let t = size / BS;
    let end = t * BS + BS;
    let i = segs.iter().position(|sg| sg.covers(t))?;
    let sg = segs[i];
    if sg.from < size {
        return None;
    }
    // A growth past the old end without new bytes in the block (`eof_seg`) zeroes the rest
    // of the block; a segment of zeros or bytes covers its range.
    let to = if sg.from == sg.to {
        end
    } else {
        sg.to.min(end)
    };
    let piece = InPlace {
        lblk: t,
        size,
        from: sg.from,
        to,
        data: sg.data.map(|d| &d[..(to - sg.from) as usize]),
    };
    if sg.to > end {
        segs[i] = Seg {
            lblk: t + 1,
            len: sg.lblk + sg.len - (t + 1),
            from: end,
            to: sg.to,
            data: sg.data.map(|d| &d[(end - sg.from) as usize..]),
        };
    } else {
        segs.remove(i);
    }
    Some(piece)
}

/// Whether an update of `segs` that extends the file to `extend_to` (0: it does not) needs
/// the file's tail: it changes the size or writes the partial last block.
fn needs_tail(segs: &[Seg<'_>], extend_to: u64, size: u64) -> bool {
    if extend_to > size {
        return true;
    }
    let t = size / BS;
    !size.is_multiple_of(BS) && segs.iter().any(|sg| sg.covers(t))
}

/// Adds one to (`up`) or takes one from the counter word at `at`, by CAS; `from_nonzero`
/// refuses to raise a zero counter (returns false then). A counter never goes below zero.
fn count_step(m: &Pm, at: PmOff, up: bool, from_nonzero: bool) -> Result<bool> {
    let mut cur = m.load_u64(at)?;
    loop {
        let new = match (up, cur) {
            (true, 0) if from_nonzero => return Ok(false),
            (true, c) => c + 1,
            (false, c) => c.saturating_sub(1),
        };
        match m.cas_u64(at, cur, new)? {
            Ok(_) => return Ok(true),
            Err(seen) => cur = seen,
        }
    }
}

/// The [`MapHold`]s this process holds, on any file of any pool: counted before the hold's
/// step of the `MAPS` count and given back after it, so that a process that read a count
/// including a hold of its own, then looks here, sees it (see
/// [`clear_dead_pins`](Fs::clear_dead_pins)).
static MAP_HOLDS_HERE: AtomicU64 = AtomicU64::new(0);

/// Whether a thread of this process holds a share of some file's mapped mode.
pub(super) fn map_holds_here() -> bool {
    MAP_HOLDS_HERE.load(Ordering::SeqCst) != 0
}

/// A writer's share of a file's mapped mode (see the module documentation), taken before its
/// snapshot and given back once its bytes are in place.
struct MapHold<'f> {
    fs: &'f Fs,
    ino: u32,
}

impl Drop for MapHold<'_> {
    fn drop(&mut self) {
        // A count left behind only keeps the file in mapped mode until the next mount, or
        // until the owner finds every process that could hold it gone.
        let _ = count_step(
            self.fs.media(),
            self.fs.inodes.field(self.ino, field::MAPS),
            false,
            false,
        );
        MAP_HOLDS_HERE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Keeps a file in mapped mode, and its log pinned (so the owner does not free it when it is
/// unlinked), while a process maps its blocks: see `Fs::map_file`. Dropping it gives both
/// back. It touches nothing but those two words of the pool, so a `fork` child that inherited
/// a mapping can take its own ([`MapPin::inherit`]) and drop it without the parent's state.
pub struct MapPin {
    media: Pm,
    maps: PmOff,
    log: PmOff,
    /// How the log counted this pin.
    pinned: MapPinned,
    times: KernelTimes,
    writable: bool,
    /// The request for the kernel's pages of the file, if the client set a hook.
    kernel_pages: Option<KernelPagesRequest>,
}

/// What a data-only client calls, with the file, after an update of a file whose pages the
/// kernel may cache ([`crate::kernel_pages`]).
pub(crate) type DropKernelPages = Arc<dyn Fn(Ino) + Send + Sync>;

impl std::fmt::Debug for MapPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapPin")
            .field("maps", &self.maps)
            .field("log", &self.log)
            .field("writable", &self.writable)
            .finish()
    }
}

impl MapPin {
    /// One more pin on the same file, for a process that inherited the mapping (a `fork`
    /// child).
    ///
    /// # Errors
    /// Media errors, or [`Error::Unsupported`] if the file's log has the most pins it can hold.
    pub fn inherit(&self) -> Result<MapPin> {
        let pinned = pmfs_core::log::pin_mapping(&*self.media, self.log)?;
        count_step(&self.media, self.maps, true, false)?;
        Ok(MapPin {
            media: self.media.clone(),
            maps: self.maps,
            log: self.log,
            pinned,
            times: self.times,
            writable: self.writable,
            kernel_pages: self.kernel_pages.clone(),
        })
    }

    /// This pin, for a mapping that may store into the file (a mapping of a description open
    /// for writing): see [`stored`](Self::stored).
    #[must_use]
    pub fn writable(mut self) -> MapPin {
        self.writable = true;
        self
    }

    /// After stores through a [writable](Self::writable) mapping may have changed the file
    /// (`msync`; dropping the pin does it too): raises its mtime and ctime, as a store into a
    /// mapping raises them on a kernel file system (at its page fault), so that programs that
    /// look for changes by mtime (`make`, `rsync`) see it, and the kernel drops the pages it
    /// may cache of the file, which the stores bypassed (at its next attribute fetch, or
    /// at once through the client's [`on_kernel_pages`](crate::Client::on_kernel_pages)).
    /// Nothing for a pin of a read-only mapping.
    ///
    /// # Errors
    /// Media errors.
    pub fn stored(&self) -> Result<()> {
        if let Some(request) = self.stored_later()? {
            request.send();
        }
        Ok(())
    }

    /// [`stored`](Self::stored), leaving the request that the kernel drop its pages to the
    /// caller, who sends it once it holds no lock (it waits for the owner's answer).
    ///
    /// # Errors
    /// Media errors.
    pub fn stored_later(&self) -> Result<Option<KernelPagesRequest>> {
        if !self.writable {
            return Ok(None);
        }
        self.times.raise(&*self.media, wall_ns())?;
        Ok(match &self.kernel_pages {
            Some(request) if self.times.kernel_cached(&*self.media)? => Some(request.clone()),
            _ => None,
        })
    }
}

/// A request that the kernel drop its pages of a file stores went to
/// ([`MapPin::stored_later`]).
#[derive(Clone)]
pub struct KernelPagesRequest {
    file: Ino,
    drop_pages: DropKernelPages,
}

impl KernelPagesRequest {
    /// Calls the client's [`on_kernel_pages`](crate::Client::on_kernel_pages) hook with the
    /// file.
    pub fn send(self) {
        (self.drop_pages)(self.file);
    }
}

impl std::fmt::Debug for KernelPagesRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelPagesRequest")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl Drop for MapPin {
    fn drop(&mut self) {
        let _ = self.stored();
        // Leftovers only keep the file in mapped mode (and an unlinked one allocated) until
        // the owner's next mount.
        let _ = count_step(&self.media, self.maps, false, false);
        let _ = pmfs_core::log::unpin_mapping(&*self.media, self.log, self.pinned);
    }
}

/// The words of an inode that tell a kernel reader its data changed: the flags, whose
/// [`flag::KERNEL_CACHED`] says the kernel may hold pages of the file (the owner sets it
/// before it reads the file for the kernel), and the mtime and ctime. The kernel keeps its
/// pages while the mtime and size it fetches stay as they were (`FUSE_AUTO_INVAL_DATA`), so
/// an update that bypassed it raises the mtime strictly above the stored one.
#[derive(Clone, Copy, Debug)]
struct KernelTimes {
    flags: PmOff,
    mtime: PmOff,
    ctime: PmOff,
}

impl KernelTimes {
    fn of(fs: &Fs, ino: u32) -> KernelTimes {
        KernelTimes {
            flags: fs.inodes.field(ino, GID_WORD),
            mtime: fs.inodes.field(ino, field::MTIME),
            ctime: fs.inodes.field(ino, field::CTIME),
        }
    }

    /// If the kernel may cache pages of the file, raises mtime and ctime to `now`, or above
    /// the stored mtime if that is not earlier: either the owner's read for the kernel saw
    /// the update, or this sees its flag.
    fn reveal(&self, m: &dyn Media, now: impl FnOnce() -> i64) -> Result<bool> {
        if !self.kernel_cached(m)? {
            return Ok(false);
        }
        self.raise(m, now())?;
        Ok(true)
    }

    /// Whether the kernel may hold pages of the file.
    fn kernel_cached(&self, m: &dyn Media) -> Result<bool> {
        Ok(flags_in(m.load_u64(self.flags)?) & flag::KERNEL_CACHED != 0)
    }

    /// Raises mtime and ctime to `now`, or above the stored mtime if that is not earlier.
    fn raise(&self, m: &dyn Media, now: i64) -> Result<()> {
        let stored = m.load_u64(self.mtime)?;
        raise_words(m, &[self.mtime, self.ctime], (now as u64).max(stored + 1))
    }
}

/// Raises the time words at `words` to `now` by CAS, never backwards (writers of a file race
/// here); durable after the next fence.
fn raise_words(m: &dyn Media, words: &[PmOff], now: u64) -> Result<()> {
    for &at in words {
        let mut cur = m.load_u64(at)?;
        while cur < now {
            match m.cas_u64(at, cur, now)? {
                Ok(_) => {
                    m.flush(at, 8)?;
                    break;
                }
                Err(seen) => cur = seen,
            }
        }
    }
    Ok(())
}

/// How long a holder found alive counts as alive without looking again: a dead holder
/// misjudged alive is only taken over that much later.
const ALIVE_FOR: Duration = Duration::from_millis(100);

impl Fs {
    /// Opens (and maybe creates) the file at `path`. The returned node is counted as open
    /// until [`release_node`](Fs::release_node).
    pub fn open(&self, path: &str, req: OpenReq) -> Result<Node> {
        if (req.write || req.create || req.create_new || req.truncate) && self.read_only {
            return Err(Error::ReadOnly);
        }
        let follow = if req.create_new {
            Follow::NoLast
        } else {
            Follow::Last
        };
        let mut attempts = 0;
        let mut created = false;
        let h = loop {
            attempts += 1;
            if attempts > 16 {
                return Err(Error::Busy);
            }
            let (parent, name, want_dir) = match self.resolve(path, follow)? {
                Target::Dir(_) => return Err(Error::IsADirectory),
                Target::Entry {
                    parent,
                    name,
                    want_dir,
                    ..
                } => (parent, name, want_dir),
            };
            if req.create || req.create_new {
                if want_dir {
                    return Err(Error::IsADirectory);
                }
                let o = self.open_or_create(&parent, &name, req.perm, req.create_new)?;
                match o.kind {
                    Kind::File => {
                        created = o.created;
                        break o.h;
                    }
                    Kind::Dir => return Err(Error::IsADirectory),
                    // Only reachable when the link changed under us: resolve again.
                    Kind::Symlink => continue,
                    // FIFOs, sockets and device nodes have no data in the volume: the
                    // kernel serves them, the embedding API cannot.
                    _ => return Err(Error::Unsupported("open of a special file")),
                }
            }
            let d = parent.inner.read().unwrap_or_else(|e| e.into_inner());
            if d.dead {
                return Err(Error::NotFound);
            }
            let s = d.get(&name).ok_or(Error::NotFound)?;
            match s.kind {
                Kind::Dir => return Err(Error::IsADirectory),
                Kind::Symlink => continue,
                Kind::File => {}
                _ => return Err(Error::Unsupported("open of a special file")),
            }
            self.open_inc(s.h.ino);
            break s.h;
        };
        let node = Node::new(h);
        // A file this call created is empty already.
        if req.truncate
            && req.write
            && !created
            && let Err(e) = self.set_len(&node, 0)
        {
            self.release_node(&node)?;
            return Err(e);
        }
        Ok(node)
    }

    /// Drops one open handle; frees the inode when it was the last handle of an unlinked
    /// file. The last handle of an inode digests its log and closes the log handle.
    pub fn release_node(&self, n: &Node) -> Result<()> {
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let (left, orphan) = self.release_open(n.h.ino);
        let mine = n.log.lock().unwrap_or_else(|e| e.into_inner()).take();
        if left > 0 {
            return Ok(());
        }
        if !self.client && !self.read_only {
            // No open file is left in the kernel either (an open file stays open while
            // mapped): the kernel drops the pages at the next open.
            self.inodes
                .clear_flags(self.m(), n.h.ino, flag::KERNEL_CACHED)?;
        }
        let shared = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&n.h.ino);
        drop(mine);
        if let Some(s) = shared {
            // Every other node of the inode gave its reference back at its release.
            self.digest_and_close(n, s)?;
        }
        // A client's last close of a file it did not unlink is done: only the owner looks
        // for pins of dead processes (see drop_dead_pins).
        if self.read_only || (self.client && !orphan) {
            return Ok(());
        }
        let rec = self.inodes.read(self.m(), n.h.ino)?;
        if rec.state != n.h.live_state() {
            return Ok(());
        }
        if orphan {
            if rec.nlink == 0 {
                self.free_inode(n.h, n.map.get(), false)?;
            }
            return Ok(());
        }
        if rec.kind() == Some(Kind::File) {
            self.drop_dead_pins(n)?;
        }
        Ok(())
    }

    /// After the owner's last close of `n`'s regular file: if its log is still pinned, or the
    /// file still in mapped mode, and only by processes that died
    /// ([`clear_dead_pins`](Fs::clear_dead_pins)), clears the pins (setting the orphans flag)
    /// and the mapped-mode count. A program killed under the preload library leaves its pins
    /// behind, and whoever has the file open next is never alone with the log, so none of the
    /// blocks its compactions retire came back before the next mount; now the next process
    /// alone with the log frees them, and sweeps those the dead one left (see
    /// `pmfs_core::log`, "Across processes"). One killed while it mapped the file left it in
    /// mapped mode, where writes are not atomic, until the next mount; now the next write
    /// copies on write again. A file this cannot clear (another client is attached) is noted
    /// for [`collect_dead_pins`](Fs::collect_dead_pins).
    fn drop_dead_pins(&self, n: &Node) -> Result<()> {
        let ino = n.h.ino;
        let root = self.inodes.field(ino, field::LOG);
        let hw = HeadWord(self.m().load_u64(root)?);
        if hw.head().is_none() || !self.held_by_others(ino, hw)? {
            return Ok(());
        }
        if self.clear_dead_pins(ino, self.node_map(n)?)?.is_none() {
            self.pend_dead_pins(n.h);
        }
        Ok(())
    }

    /// The mapping handle of `n`, opened on first use.
    pub fn node_map<'n>(&self, n: &'n Node) -> Result<&'n MapFile> {
        if let Some(m) = n.map.get() {
            return Ok(m);
        }
        let opened = self.map.open_file(self.file_id(n.h.ino))?;
        Ok(n.map.get_or_init(|| opened))
    }

    /// Where the log blocks of inode `ino` come from.
    pub fn log_alloc(&self, ino: u32) -> Arc<dyn BlockAllocator> {
        match &self.stage {
            Stager::Alloc(a) => a.clone(),
            Stager::Hash(t) => Arc::new(t.log_blocks(u64::from(ino))),
        }
    }

    /// A handle of the existing log of inode `ino` (it pins the log until closed).
    pub fn open_log(&self, ino: u32) -> Result<FileLog> {
        let root = self.inodes.field(ino, field::LOG);
        Ok(Log::open(self.media().clone(), root, self.log_alloc(ino))?)
    }

    /// The log state of `n`'s inode, opened on first use; `None` if the file has no log and
    /// `create` is false. A log is created by CAS on the head word: a loser opens the winner's.
    fn shared(&self, n: &Node, create: bool) -> Result<Option<Arc<Shared>>> {
        // A read-only volume was closed cleanly: every log is digested, and opening one
        // would write its pin count.
        if self.read_only {
            return Ok(None);
        }
        let mut mine = n.log.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*mine {
            return Ok(Some(s.clone()));
        }
        let ino = n.h.ino;
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = logs.get(&ino) {
            *mine = Some(s.clone());
            return Ok(Some(s.clone()));
        }
        let log = if self.inodes.load(self.m(), ino, field::LOG)? == 0 {
            if !create {
                return Ok(None);
            }
            let root = self.inodes.field(ino, field::LOG);
            match Log::create(self.media().clone(), root, self.log_alloc(ino)) {
                Ok(l) => l,
                Err(pmfs_core::Error::InvalidArgument(_)) => self.open_log(ino)?,
                Err(e) => return Err(e.into()),
            }
        } else {
            self.open_log(ino)?
        };
        let d = log.digested(self.inodes.field(ino, field::DIGEST))?;
        let first = log.start()?.lsn();
        let s = Arc::new(Shared::new(log, d, first));
        logs.insert(ino, s.clone());
        *mine = Some(s.clone());
        Ok(Some(s))
    }

    /// Opens (creating if needed) and so pins the log of `n`'s inode.
    pub fn pin_log(&self, n: &Node) -> Result<()> {
        self.shared(n, true).map(drop)
    }

    /// Folds the entries committed since the overlay's last catch-up; drops what is digested.
    /// `tail`: an LSN the caller saw as the tail (`u64::MAX` if unknown); an overlay already
    /// there reads nothing. A replay that starts later than the overlay's next LSN (a
    /// compaction dropped applied entries the overlay had not folded) leaves a correct view:
    /// the mapping shows what was dropped.
    fn catch_up(&self, ino: u32, s: &Shared, ov: &mut Overlay, tail: u64) -> Result<()> {
        if ov.next_lsn() < tail {
            let mut replay = s.log.iter_from_lsn(ov.next_lsn())?;
            for item in replay.by_ref() {
                let (pos, e) = item?;
                ov.apply(pos.lsn(), &e);
            }
            ov.advance_to(replay.position().lsn());
        }
        ov.prune(s.log.digested(self.inodes.field(ino, field::DIGEST))?);
        Ok(())
    }

    /// The digested size word.
    fn digested_size(&self, ino: u32) -> Result<u64> {
        self.inodes.load(self.m(), ino, field::SIZE)
    }

    /// The data blocks regular file `h` of `size` bytes maps (its `st_blocks`, in blocks).
    /// A file that never had a hole ([`flag::HOLES`]) maps every block below its size, and
    /// past it those allocated with `KEEP_SIZE`, up to its mapped end: no lookup. The blocks
    /// of any other file are counted in its mapping, and the ranges that undigested entries
    /// changed as the overlay has them, as reads see them ([`overlaid_blocks`]).
    ///
    /// [`overlaid_blocks`]: Fs::overlaid_blocks
    pub fn blocks_of(&self, h: Handle, size: u64) -> Result<u64> {
        let ino = h.ino;
        let end = self.block_span(ino, size)?.min(MAX_FILE_SIZE / BS);
        if self.inodes.flags(self.m(), ino)? & flag::HOLES == 0 {
            return Ok(end);
        }
        let _il = self.tree_read_lock(ino);
        let f = self.map.open_file(self.file_id(ino))?;
        match self.with_live_log(ino, |s| self.overlaid_blocks(h, s, &f, end))? {
            Some(n) => Ok(n),
            None => self.mapped_blocks(h, &f, end),
        }
    }

    /// The blocks of `[0, end)` that `h`'s mapping maps. The count costs a lookup of the
    /// range (on the hashed structures at most one pass over the table: 2 ms for a 100 MiB
    /// HashFS file with one block at 50 MB), so it is kept until the file's digest cursor
    /// moves ([`Counted`]). The caller holds the [tree lock](Fs::tree_read_lock).
    fn mapped_blocks(&self, h: Handle, f: &MapFile, end: u64) -> Result<u64> {
        let (m, ino) = (self.m(), h.ino);
        let counted = Counted {
            generation: h.generation,
            cursor: self.inodes.load(m, ino, field::DIGEST)?,
            end,
        };
        if let Some(&(_, n)) = self
            .blocks_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .filter(|(at, _)| *at == counted)
        {
            return Ok(n);
        }
        let blocks = self.blocks_in(f, 0, end)?;
        // Kept only if no digest ran meanwhile, nor was running (a holder in the cursor).
        if counted.cursor >> CURSOR_LSN_BITS == 0
            && self.inodes.load(m, ino, field::DIGEST)? == counted.cursor
        {
            let mut c = self.blocks_seen.lock().unwrap_or_else(|e| e.into_inner());
            if c.len() >= BLOCKS_SEEN_MAX {
                c.clear();
            }
            c.insert(ino, (counted, blocks));
        }
        Ok(blocks)
    }

    /// The blocks of `[lblk, lblk + len)` that the mapping maps.
    fn blocks_in(&self, f: &MapFile, lblk: u64, len: u64) -> Result<u64> {
        let mut runs = RUNS.take();
        runs.clear();
        let r = self.map.lookup(f, lblk, len, &mut runs);
        let blocks = runs.iter().map(|r| r.len).sum();
        RUNS.set(runs);
        r.map(|()| blocks)
    }

    /// [`mapped_blocks`](Fs::mapped_blocks) with the undigested entries of `s`: the ranges
    /// they changed are counted as the overlay has them instead of as the mapping does. A
    /// write counts from its commit, not from its digest, which may come much later (while
    /// the file stays open): a file whose new blocks did not count would look like holes to
    /// `tar --sparse` and `cp`. A digest that runs meanwhile changes the mapping under the
    /// count, which then starts again, a few times at most.
    fn overlaid_blocks(&self, h: Handle, s: &Shared, f: &MapFile, end: u64) -> Result<u64> {
        let (m, ino) = (self.m(), h.ino);
        let mut pieces = Vec::new();
        let mut tries = 0;
        loop {
            tries += 1;
            let t0 = s.log.tail()?.lsn();
            let cursor = self.inodes.load(m, ino, field::DIGEST)?;
            let mapped = self.mapped_blocks(h, f, end)?;
            // The mapping maps nothing past the digested size and mapped end: pieces there
            // (a file growing, the common case) need no lookup.
            let digested_end = self.block_span(ino, self.digested_size(ino)?)?;
            {
                let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                self.catch_up(ino, s, &mut ov, t0)?;
                pieces.clear();
                ov.lookup(0, end, &mut pieces);
            }
            let mut blocks = mapped;
            for p in &pieces {
                let now = match p.src {
                    Src::Base => continue,
                    Src::Mapped(_) => p.len,
                    Src::Hole => 0,
                };
                let was = match digested_end.saturating_sub(p.lblk).min(p.len) {
                    0 => 0,
                    len => self.blocks_under(ino, s, f, cursor, p.lblk, len)?,
                };
                blocks = (blocks + now).saturating_sub(was);
            }
            let settled = cursor >> CURSOR_LSN_BITS == 0
                && self.inodes.load(m, ino, field::DIGEST)? == cursor
                && s.log.tail()?.lsn() == t0;
            if settled || tries == COUNT_TRIES {
                return Ok(blocks);
            }
            std::thread::yield_now();
        }
    }

    /// [`blocks_in`](Fs::blocks_in) for a range of an undigested piece of `s`'s file, where
    /// `cursor` is the digest cursor word the count started at: kept in `s` while that word
    /// stays (and no digest is running), so the next count looks up only pieces it has not
    /// seen.
    fn blocks_under(
        &self,
        ino: u32,
        s: &Shared,
        f: &MapFile,
        cursor: u64,
        lblk: u64,
        len: u64,
    ) -> Result<u64> {
        let keep = cursor >> CURSOR_LSN_BITS == 0;
        if keep {
            let u = s.underneath.lock().unwrap_or_else(|e| e.into_inner());
            if u.cursor == cursor
                && let Some(&n) = u.blocks.get(&(lblk, len))
            {
                return Ok(n);
            }
        }
        let n = self.blocks_in(f, lblk, len)?;
        // Kept only if no digest ran meanwhile (as in `mapped_blocks`).
        if keep && self.inodes.load(self.m(), ino, field::DIGEST)? == cursor {
            let mut u = s.underneath.lock().unwrap_or_else(|e| e.into_inner());
            if u.cursor != cursor || u.blocks.len() >= UNDERNEATH_MAX {
                u.cursor = cursor;
                u.blocks.clear();
            }
            u.blocks.insert((lblk, len), n);
        }
        Ok(n)
    }

    /// The logical blocks regular file `ino` of `size` bytes may map: those below its size
    /// or below its mapped end, whichever reaches further.
    pub(crate) fn block_span(&self, ino: u32, size: u64) -> Result<u64> {
        let mapped_end = self.inodes.load(self.m(), ino, field::MAPPED_END)?;
        Ok(size.div_ceil(BS).max(mapped_end))
    }

    /// Marks `ino` as a file that may have holes ([`flag::HOLES`]), before an update that may
    /// make one commits (durable at its fence).
    fn mark_holes(&self, ino: u32) -> Result<()> {
        self.inodes.set_flags(self.m(), ino, flag::HOLES)
    }

    /// The file's size.
    pub fn size_of(&self, n: &Node) -> Result<u64> {
        match self.shared(n, false)? {
            Some(s) => self.folded_size(n.h.ino, &s),
            None => self.digested_size(n.h.ino),
        }
    }

    /// The size with every committed entry of `s`'s log folded in.
    fn folded_size(&self, ino: u32, s: &Shared) -> Result<u64> {
        loop {
            let t0 = s.log.tail()?.lsn();
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.catch_up(ino, s, &mut ov, t0)?;
            let size = ov.size(self.digested_size(ino)?);
            if s.log.tail()?.lsn() == t0 {
                return Ok(size);
            }
        }
    }

    /// The size of regular file `ino` whose size word reads `digested`, with the writes its
    /// log has not digested yet. Writes are digested in batches, so while some process has
    /// the file open the size word may lag; a log that nobody has open (no pins) is digested
    /// (every process digests at its last close, mount digests what a crash left, and the
    /// owner what killed processes left before it takes their pins for dead,
    /// [`clear_dead_pins`](Fs::clear_dead_pins)).
    pub fn live_size(&self, ino: u32, digested: u64) -> Result<u64> {
        Ok(self
            .with_live_log(ino, |s| self.folded_size(ino, s))?
            .unwrap_or(digested))
    }

    /// Calls `f` with the log of regular file `ino` if some process has it open (it may
    /// have undigested entries), else returns `None`: a log that nobody has open is
    /// digested, as is every log of a read-only volume. A log this process does not have
    /// open is read through a handle of its own, closed after `f`.
    fn with_live_log<T>(
        &self,
        ino: u32,
        f: impl FnOnce(&Shared) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.read_only {
            return Ok(None);
        }
        let head = HeadWord(self.inodes.load(self.m(), ino, field::LOG)?);
        if head.head().is_none() || head.pins() == 0 {
            return Ok(None);
        }
        if let Some(s) = self.registered_log(ino) {
            return f(&s).map(Some);
        }
        let log = self.open_log(ino)?;
        let s = match log.digested(self.inodes.field(ino, field::DIGEST)) {
            Ok(d) => Shared::new(log, d, d),
            Err(e) => {
                log.close()?;
                return Err(e.into());
            }
        };
        let r = f(&s);
        s.log.close()?;
        r.map(Some)
    }

    /// The log of inode `ino` if this process has it open.
    fn registered_log(&self, ino: u32) -> Option<Arc<Shared>> {
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .cloned()
    }

    /// Where logical block `lblk` lives now: `None` for a hole.
    fn block_at(&self, ov: Option<&Overlay>, f: &MapFile, lblk: u64) -> Result<Option<u64>> {
        let src = ov.map_or(Src::Base, |ov| overlay_src(ov, lblk));
        self.resolve_block(f, lblk, src)
    }

    /// Where logical block `lblk`, which the overlay has as `src` ([`overlay_src`]), lives:
    /// the overlay's block, or the mapping's (see [`resolve_pieces`](Fs::resolve_pieces)).
    fn resolve_block(&self, f: &MapFile, lblk: u64, src: Src) -> Result<Option<u64>> {
        match src {
            Src::Mapped(b) => return Ok(Some(b)),
            Src::Hole => return Ok(None),
            Src::Base => {}
        }
        let mut runs = RUNS.take();
        runs.clear();
        let found = self.map.lookup(f, lblk, 1, &mut runs);
        let at = runs.first().map(|r| r.pblk.0 + (lblk - r.lblk));
        RUNS.set(runs);
        found.map(|()| at)
    }

    /// The mapped runs of `[lblk, lblk + len)` through the overlay and the mapping, in
    /// logical order.
    fn runs_in(
        &self,
        ov: Option<&Overlay>,
        f: &MapFile,
        lblk: u64,
        len: u64,
        out: &mut Vec<Run>,
    ) -> Result<()> {
        let mut pieces = PIECES.take();
        overlay_pieces(ov, lblk, len, &mut pieces);
        let r = self.resolve_pieces(f, &pieces, out);
        PIECES.set(pieces);
        r
    }

    /// The runs of `pieces` ([`overlay_pieces`]), in logical order: the overlay's blocks as
    /// they are, the mapping's looked up. The lookups need no overlay: a digest that
    /// changed the mapping since the pieces were taken applied only entries the overlay had
    /// (whose blocks no piece of the mapping's covers) or later ones, which a caller that
    /// checks the log's tail afterwards sees.
    fn resolve_pieces(
        &self,
        f: &MapFile,
        pieces: &[crate::overlay::Piece],
        out: &mut Vec<Run>,
    ) -> Result<()> {
        for &p in pieces {
            match p.src {
                Src::Mapped(b) => out.push(Run {
                    lblk: p.lblk,
                    pblk: BlockNo(b),
                    len: p.len,
                }),
                Src::Hole => {}
                Src::Base => {
                    let from = out.len();
                    self.map.lookup(f, p.lblk, p.len, out)?;
                    out[from..].sort_unstable_by_key(|r| r.lblk);
                }
            }
        }
        Ok(())
    }

    /// The mapped runs of `n`'s logical blocks `[lblk, lblk + len)`, in order.
    pub fn data_runs(&self, n: &Node, lblk: u64, len: u64) -> Result<Vec<Run>> {
        let f = self.node_map(n)?;
        let mut out = Vec::new();
        let Some(s) = self.shared(n, false)? else {
            self.runs_in(None, f, lblk, len, &mut out)?;
            return Ok(out);
        };
        loop {
            out.clear();
            let t0 = s.log.tail()?.lsn();
            {
                let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                self.catch_up(n.h.ino, &s, &mut ov, t0)?;
                self.runs_in(Some(&ov), f, lblk, len, &mut out)?;
            }
            if s.log.tail()?.lsn() == t0 {
                return Ok(out);
            }
        }
    }

    /// Reads at `off`; returns the bytes read (0 at or past end of file).
    pub fn read_at(&self, n: &Node, buf: &mut [u8], off: u64) -> Result<usize> {
        let _il = self.tree_read_lock(n.h.ino);
        let f = self.node_map(n)?;
        // The first block's lookup misses on the hash tables: start it before the log work.
        self.map.prefetch(f, off / BS);
        let s = self.shared(n, false)?;
        let (mut runs, mut pieces) = (RUNS.take(), PIECES.take());
        let r = self.read_runs(n, f, s.as_deref(), buf, off, &mut runs, &mut pieces);
        RUNS.set(runs);
        PIECES.set(pieces);
        r
    }

    /// [`read_at`](Fs::read_at) with `runs` for the runs it reads and `pieces` for the
    /// overlay's pieces of them. The overlay's lock covers the catch-up, the size and the
    /// pieces, not the mapping's lookups: two readers of a file, or a reader and a writer,
    /// look up its tree side by side.
    #[allow(clippy::too_many_arguments)]
    fn read_runs(
        &self,
        n: &Node,
        f: &MapFile,
        s: Option<&Shared>,
        buf: &mut [u8],
        off: u64,
        runs: &mut Vec<Run>,
        pieces: &mut Vec<crate::overlay::Piece>,
    ) -> Result<usize> {
        loop {
            let t0 = match &s {
                Some(s) => Some(s.log.tail()?.lsn()),
                None => None,
            };
            runs.clear();
            let size = {
                let mut guard = match &s {
                    Some(s) => {
                        let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                        self.catch_up(n.h.ino, s, &mut ov, t0.unwrap_or(u64::MAX))?;
                        Some(ov)
                    }
                    None => None,
                };
                let ov = guard.as_deref_mut().map(|o| &*o);
                let size = match ov {
                    Some(o) => o.size(self.digested_size(n.h.ino)?),
                    None => self.digested_size(n.h.ino)?,
                };
                if off < size && !buf.is_empty() {
                    let end = off + (buf.len() as u64).min(size - off);
                    let first = off / BS;
                    let last = (end - 1) / BS;
                    overlay_pieces(ov, first, last - first + 1, pieces);
                }
                size
            };
            if off >= size || buf.is_empty() {
                return Ok(0);
            }
            self.resolve_pieces(f, pieces, runs)?;
            let len = (buf.len() as u64).min(size - off);
            let end = off + len;
            let out = &mut buf[..len as usize];
            // Holes read as zeros: only the bytes no run covers are zeroed.
            let mut filled = off;
            for ahead in runs.iter().take(PREFETCH_RUNS) {
                self.prefetch_run(ahead, off, end);
            }
            for (i, r) in runs.iter().enumerate() {
                if let Some(ahead) = runs.get(i + PREFETCH_RUNS) {
                    self.prefetch_run(ahead, off, end);
                }
                let rs = r.lblk * BS;
                let re = (r.lblk + r.len) * BS;
                let a = rs.max(off);
                let e = re.min(end);
                if a < e {
                    if a > filled {
                        out[(filled - off) as usize..(a - off) as usize].fill(0);
                    }
                    let phys = r.pblk.offset() + (a - rs);
                    self.m()
                        .read(phys, &mut out[(a - off) as usize..(e - off) as usize])?;
                    filled = filled.max(e);
                }
            }
            out[(filled - off) as usize..].fill(0);
            match (&s, t0) {
                (Some(s), Some(t0)) if s.log.tail()?.lsn() != t0 => continue,
                _ => return Ok(len as usize),
            }
        }
    }

    /// Hints the first [`PREFETCH_BYTES`] of `r` that a read of `[off, end)` copies: the runs
    /// of a HashFS file lie anywhere in the pool, and the hardware prefetcher does not follow
    /// a copy from one block into another. A read hints its first [`PREFETCH_RUNS`] runs,
    /// then, before copying run `i`, run `i + PREFETCH_RUNS`: each run once, four runs
    /// ahead. Hinting every run again before each copy (each so three times) filled the
    /// core's queue of misses with hints that were already in flight, and so did hinting
    /// whole blocks that way; hinted once, a whole block is best. 1 MiB HashFS reads in
    /// `data_fig6`, three alternated rounds on huge pages: 106-116 µs hinting the first 512
    /// bytes of the next three runs before every copy, 92-98 µs hinting 512 bytes once,
    /// 75-85 µs hinting the whole block once (four runs ahead each time).
    fn prefetch_run(&self, r: &Run, off: u64, end: u64) {
        let a = (r.lblk * BS).max(off);
        let e = ((r.lblk + r.len) * BS).min(end).min(a + PREFETCH_BYTES);
        if a < e {
            self.m()
                .prefetch_range(r.pblk.offset() + (a - r.lblk * BS), e - a);
        }
    }

    /// On a volume whose mapping structure is not HashFS, a reader or writer of inode `ino`
    /// holds its lock shared: a lookup in a tree (or a cuckoo bucket) must not run into a
    /// digest restructuring it, and every digest runs under the lock held alone. HashFS
    /// lookups and digests change one slot word at a time, so its readers and writers take
    /// no lock, threads as processes do.
    fn tree_read_lock(&self, ino: u32) -> Option<RwLockReadGuard<'_, ()>> {
        matches!(self.stage, Stager::Alloc(_))
            .then(|| self.ilock(ino).read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The digest's side of [`tree_read_lock`](Fs::tree_read_lock).
    fn tree_write_lock(&self, ino: u32) -> Option<RwLockWriteGuard<'_, ()>> {
        matches!(self.stage, Stager::Alloc(_))
            .then(|| self.ilock(ino).write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Writes an [`InPlace`] piece into block `pblk`, its partial last block: streaming
    /// stores, or cached ones flushed for short pieces, durable at the caller's fence (before
    /// it commits).
    fn write_in_tail(&self, p: &InPlace<'_>, pblk: u64) -> Result<()> {
        let m = self.m();
        let at = |x: u64| BlockNo(pblk).offset() + (x - p.lblk * BS);
        let zero_to = if p.data.is_some() { p.from } else { p.to };
        if zero_to > p.size {
            m.fill_nt(at(p.size), zero_to - p.size, 0)?;
        }
        if let Some(d) = p.data {
            m.write_nt(at(p.from), d)?;
        }
        Ok(())
    }

    /// After an update that gave blocks back: holds a spare log block again if the log's last
    /// block is short of room ([`LOG_RESERVE`]) and a block is free (the update may have
    /// used the spare).
    fn restore_log_reserve(&self, s: &Shared) -> Result<()> {
        if s.log.tail()?.room() < LOG_RESERVE {
            match s.log.keep_a_spare() {
                Ok(()) | Err(pmfs_core::Error::NoSpace) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether process `pid`, found holding a word of this pool (a log's digest cursor, a
    /// file's tail), may still use it: it runs and, where this process may read its mappings,
    /// maps the pool file ([`procs::maps_file`]). A holder killed long ago whose pid the
    /// kernel has since given to another program so reads as dead; a live holder never does.
    fn holder_alive(&self, pid: u32) -> bool {
        let now = Instant::now();
        let fresh = |seen: &Instant| now.duration_since(*seen) < ALIVE_FOR;
        if self.alive_seen().get(&pid).is_some_and(fresh) {
            return true;
        }
        let alive = self
            .m()
            .file_id()
            .and_then(|id| procs::maps_file(pid, id))
            .unwrap_or_else(|| procs::exists(pid));
        let mut seen = self.alive_seen();
        seen.retain(|_, t| fresh(t));
        if alive {
            seen.insert(pid, now);
        }
        alive
    }

    fn alive_seen(&self) -> MutexGuard<'_, FastMap<u32, Instant>> {
        self.alive_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the tail of file `ino` ([`TailGuard`]): waits for a live holder, replaces a
    /// dead one. Every update that changes the size or writes the partial last block holds
    /// it from its plan to its commit; it lets the holder write past the end of file in
    /// place. Taken under the inode's lock (shared or alone), never the other way round.
    fn lock_tail<'a>(&'a self, ino: u32, s: &'a Shared) -> Result<TailGuard<'a>> {
        let local = s.tail.lock().unwrap_or_else(|e| e.into_inner());
        let m = self.m();
        let at = self.inodes.field(ino, field::TAIL);
        let me = u64::from(self.holder);
        let mut tries = 0u32;
        loop {
            let cur = m.load_u64(at)?;
            // Another volume of this process may hold it too (the same id): wait for that.
            let dead =
                || cur != me && u32::try_from(cur).map_or(true, |pid| !self.holder_alive(pid));
            if (cur == 0 || (tries % 256 == 255 && dead())) && m.cas_u64(at, cur, me)?.is_ok() {
                return Ok(TailGuard {
                    media: m,
                    at,
                    _local: local,
                });
            }
            tries = tries.wrapping_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Stages fresh blocks for `[lblk, lblk + len)`, appending runs to `out`.
    fn stage(
        &self,
        f: &MapFile,
        lblk: u64,
        len: u64,
        goal: Option<u64>,
        out: &mut Vec<Run>,
    ) -> Result<()> {
        match &self.stage {
            Stager::Alloc(a) => {
                // Leave the mapping structure room for the nodes a digest may need: an
                // update whose digest could not run would keep its blocks in the log only.
                if a.free_blocks() < len.saturating_add(DIGEST_RESERVE) {
                    return Err(Error::NoSpace);
                }
                let first = out.len();
                let mut at = lblk;
                let mut goal = goal.map(BlockNo);
                while at < lblk + len {
                    let hint = AllocHint {
                        kind: AllocKind::Growing,
                        goal,
                    };
                    match a.alloc(lblk + len - at, hint) {
                        Ok(e) => {
                            out.push(Run {
                                lblk: at,
                                pblk: e.start,
                                len: e.len,
                            });
                            goal = Some(e.start + e.len);
                            at += e.len;
                        }
                        Err(e) => {
                            let got: Vec<Run> = out.drain(first..).collect();
                            self.unstage(&got)?;
                            return Err(e.into());
                        }
                    }
                }
                Ok(())
            }
            // The fence after the copies makes the claims durable before the commit.
            Stager::Hash(t) => Ok(t.stage_unfenced(handle::<HashFsFile>(f)?, lblk, len, out)?),
        }
    }

    /// The file's mapped-mode count.
    fn maps(&self, ino: u32) -> Result<u64> {
        self.inodes.load(self.m(), ino, field::MAPS)
    }

    /// Whether the log of file `ino` (head word `hw`) is pinned or the file is in mapped mode.
    /// Asked once this process has the file closed, it tells whether other processes hold
    /// it; what dead ones hold, [`clear_dead_pins`](Fs::clear_dead_pins) clears.
    pub(crate) fn held_by_others(&self, ino: u32, hw: HeadWord) -> Result<bool> {
        Ok(hw.pins() != 0 || self.maps(ino)? != 0)
    }

    /// Joins the file's mapped mode if it is in it (a count taken only from a nonzero one).
    /// The hold exists only once the count was taken: dropping one gives a share back.
    fn map_hold(&self, ino: u32) -> Result<Option<MapHold<'_>>> {
        let at = self.inodes.field(ino, field::MAPS);
        MAP_HOLDS_HERE.fetch_add(1, Ordering::SeqCst);
        let held = count_step(self.media(), at, true, true);
        if !matches!(held, Ok(true)) {
            MAP_HOLDS_HERE.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(held?.then(|| MapHold { fs: self, ino }))
    }

    /// Splits the segments of a mapped-mode update: the blocks the file maps now become
    /// `(run, segment)` pairs to write in place (their runs map them to themselves); the holes
    /// stay segments to stage fresh blocks for, unless `holes` is false (then they are left).
    #[allow(clippy::type_complexity)]
    fn split_mapped<'b>(
        &self,
        ov: Option<&Overlay>,
        f: &MapFile,
        segs: &[Seg<'b>],
        holes: bool,
    ) -> Result<(Vec<Seg<'b>>, Vec<(Run, Seg<'b>)>)> {
        let sub = |sg: &Seg<'b>, lblk: u64, len: u64| {
            let (lo, hi) = (lblk * BS, (lblk + len) * BS);
            let from = sg.from.clamp(lo, hi);
            let to = sg.to.clamp(from, hi);
            Seg {
                lblk,
                len,
                from,
                to,
                data: sg
                    .data
                    .filter(|_| to > from)
                    .map(|d| &d[(from - sg.from) as usize..(to - sg.from) as usize]),
            }
        };
        let (mut cow, mut own) = (Vec::new(), Vec::new());
        let mut runs = Vec::new();
        for sg in segs {
            runs.clear();
            self.runs_in(ov, f, sg.lblk, sg.len, &mut runs)?;
            let end = sg.lblk + sg.len;
            let mut at = sg.lblk;
            for r in &runs {
                let (rs, re) = (r.lblk.max(at), (r.lblk + r.len).min(end));
                if rs >= re {
                    continue;
                }
                if rs > at && holes {
                    cow.push(sub(sg, at, rs - at));
                }
                let run = Run {
                    lblk: rs,
                    pblk: BlockNo(r.pblk.0 + (rs - r.lblk)),
                    len: re - rs,
                };
                own.push((run, sub(sg, rs, re - rs)));
                at = re;
            }
            if end > at && holes {
                cow.push(sub(sg, at, end - at));
            }
        }
        Ok((cow, own))
    }

    /// Writes the in-place part of a committed mapped-mode update: each segment's new bytes,
    /// and zeros over the bytes of its blocks at or after `size` (the size it was planned at)
    /// that it does not write. Durable on return.
    fn write_in_place(&self, own: &[(Run, Seg<'_>)], size: u64) -> Result<()> {
        let m = self.m();
        for (r, sg) in own {
            let (rs, re) = (r.lblk * BS, (r.lblk + r.len) * BS);
            let at = |o: u64| r.pblk.offset() + (o - rs);
            if sg.from < sg.to {
                match sg.data {
                    Some(d) => m.write_nt(at(sg.from), d)?,
                    None => m.fill_nt(at(sg.from), sg.to - sg.from, 0)?,
                }
            }
            for (a, b) in [(rs, sg.from), (sg.to, re)] {
                let a = a.max(size);
                if a < b {
                    m.fill_nt(at(a), b - a, 0)?;
                }
            }
        }
        m.fence();
        Ok(())
    }

    /// Commits `e` (a truncation or a punch, which unmap blocks) at the tail unless the file
    /// is in mapped mode, checked after the tail was seen; returns whether it committed.
    fn commit_unless_mapped(&self, ino: u32, s: &Shared, e: &Entry) -> Result<bool> {
        let mut prepared = s.log.prepare(e)?;
        let mut since = s.log.tail()?;
        loop {
            if self.maps(ino)? > 0 {
                return Ok(false);
            }
            match prepared.try_commit(since)? {
                Commit::Done(_) => return Ok(true),
                Commit::Moved { prepared: p, tail } => {
                    prepared = p;
                    since = tail;
                }
            }
        }
    }

    /// Puts `n`'s file in mapped mode and returns the runs backing its logical blocks
    /// `[lblk, lblk + len)` after staging blocks for every hole among them, with the pin that
    /// keeps them the file's: while any pin lives, every update of the file in any process
    /// leaves its mapped blocks where they are (see the module documentation). Holes that
    /// need more than `fill_at_most` blocks fail the call with [`Error::NoSpace`], before any
    /// is filled.
    pub fn map_file(
        &self,
        n: &Node,
        lblk: u64,
        len: u64,
        fill_at_most: u64,
    ) -> Result<(MapPin, Vec<Run>)> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let ino = n.h.ino;
        let s = self.shared(n, true)?.ok_or(Error::Corrupt {
            what: "file log",
            at: self.inodes.field(ino, field::LOG),
        })?;
        let maps = self.inodes.field(ino, field::MAPS);
        let root = self.inodes.field(ino, field::LOG);
        let pinned = pmfs_core::log::pin_mapping(self.m(), root)?;
        let pin = MapPin {
            media: self.media().clone(),
            maps,
            log: root,
            pinned,
            times: KernelTimes::of(self, ino),
            writable: false,
            kernel_pages: self.kernel_pages.get().map(|hook| KernelPagesRequest {
                file: Ino::from_raw(n.h.word()),
                drop_pages: hook.clone(),
            }),
        };
        count_step(self.media(), maps, true, false)?;
        // The barrier: every update committed after it saw the count, and so leaves mapped
        // blocks in place; every one before it is in the view below.
        let barrier = Entry::Write {
            runs: Vec::new(),
            extend_to: 0,
        };
        s.log.prepare(&barrier)?.commit()?;
        self.after_commit(n, &s, self.node_map(n)?, None, DigestWhen::Now)?;
        if len > 0 {
            let holes = Fill::Holes {
                at_most: fill_at_most,
            };
            self.fill(n, lblk * BS, len * BS, true, holes)?;
        }
        let runs = self.data_runs(n, lblk, len)?;
        // Nothing unmaps a block of a file in mapped mode: a hole here is a bug.
        let covered = runs
            .iter()
            .try_fold(lblk, |at, r| (r.lblk == at).then_some(at + r.len));
        if covered != Some(lblk + len) {
            return Err(Error::Corrupt {
                what: "a hole left in a mapped range",
                at: root,
            });
        }
        Ok((pin, runs))
    }

    /// Gives staged blocks back.
    fn unstage(&self, runs: &[Run]) -> Result<()> {
        match &self.stage {
            Stager::Alloc(a) => {
                for r in runs {
                    a.free(Extent::new(r.pblk, r.len))?;
                }
                Ok(())
            }
            Stager::Hash(t) => Ok(t.unstage(runs)?),
        }
    }

    /// Copies the old contents of a partial block outside its new bytes: from `src`, where
    /// the block lives now (zeros for a hole), zeros at and after `size`.
    fn copy_old(&self, src: Option<u64>, p: &Partial, size: u64) -> Result<()> {
        let m = self.m();
        let bs = p.lblk * BS;
        for (a, b) in [(bs, p.new_from), (p.new_to, bs + BS)] {
            if a >= b {
                continue;
            }
            let keep = b.min(size.max(a));
            let dst = PmOff(p.pblk * BS);
            if let Some(sp) = src
                && keep > a
            {
                m.copy_within_nt(PmOff(sp * BS) + (a - bs), dst + (a - bs), keep - a)?;
            } else if keep > a {
                m.fill_nt(dst + (a - bs), keep - a, 0)?;
            }
            if b > keep {
                m.fill_nt(dst + (keep - bs), b - keep, 0)?;
            }
        }
        Ok(())
    }

    /// Commits one copy-on-write update of `n` (see the module documentation): `plan` gives
    /// the segments and the size to extend to from the current size (`None`: nothing to do).
    /// In mapped mode the segments' mapped blocks are written in place instead.
    fn cow_update<'b>(
        &self,
        n: &Node,
        how: Update,
        plan: &mut Plan<'_, 'b>,
    ) -> Result<Option<u64>> {
        self.cow_update_with(n, how, plan, &mut |_| Ok(()))
    }

    /// [`cow_update`](Fs::cow_update), calling `before_commit` with the staged runs right before
    /// each commit attempt.
    fn cow_update_with<'b>(
        &self,
        n: &Node,
        how: Update,
        plan: &mut Plan<'_, 'b>,
        before_commit: &mut dyn FnMut(&[Run]) -> Result<()>,
    ) -> Result<Option<u64>> {
        let s = self.shared(n, true)?.ok_or(Error::Corrupt {
            what: "file log",
            at: self.inodes.field(n.h.ino, field::LOG),
        })?;
        let f = self.node_map(n)?;
        // Staging may find no space while blocks that undigested writes replaced are still
        // allocated: digest them and try once more.
        let mut digested = false;
        let mut tail: Option<TailGuard<'_>> = None;
        loop {
            let since = s.log.tail()?;
            // Mapped mode: joined before the commit, left once the bytes are in place. Read
            // after the tail was seen, the count also serves the first commit attempt.
            let hold = self.map_hold(n.h.ino)?;
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.catch_up(n.h.ino, &s, &mut ov, since.lsn())?;
            let size = ov.size(self.digested_size(n.h.ino)?);
            let Some((mut segs, extend_to)) = plan(self, Some(&ov), f, size)? else {
                return Ok(None);
            };
            let tail_held = tail.is_some();
            if !tail_held && needs_tail(&segs, extend_to, size) {
                drop(ov);
                drop(hold);
                tail = Some(self.lock_tail(n.h.ino, &s)?);
                continue;
            }
            // Holding the tail, and out of mapped mode, the bytes past the end of file in its
            // partial last block are nobody's: they go there in place.
            let in_place = match hold {
                None if tail_held && !size.is_multiple_of(BS) => {
                    match self.block_at(Some(&ov), f, size / BS)? {
                        Some(pblk) => tail_in_place(&mut segs, size).map(|p| (p, pblk)),
                        None => None,
                    }
                }
                _ => None,
            };
            let (segs, own) = match hold {
                Some(_) => self.split_mapped(Some(&ov), f, &segs, how.holes)?,
                None => (segs, Vec::new()),
            };
            if segs.is_empty() && own.is_empty() && in_place.is_none() && extend_to == 0 {
                return Ok(None);
            }
            // What the overlay has for the blocks to be written in part, and (HashFS places
            // blocks by hash: only the allocator takes a goal) for the block before each
            // segment, whose successor is the segment's goal.
            let old_src: Vec<(u64, Src)> = segs
                .iter()
                .flat_map(partial_blocks)
                .map(|b| (b, overlay_src(&ov, b)))
                .collect();
            let goal_src: Vec<Option<Src>> = match &self.stage {
                Stager::Alloc(_) => segs
                    .iter()
                    .map(|sg| sg.lblk.checked_sub(1).map(|prev| overlay_src(&ov, prev)))
                    .collect(),
                Stager::Hash(_) => Vec::new(),
            };
            // The overlay has every entry below this LSN, and nothing below needs it: the
            // mapping's lookups and the copies run without its lock, so that readers and other
            // writers of the file are not held up by them (see `resolve_pieces`). A block they
            // copy from that a newer entry replaced (and a digest may have freed) is caught by
            // the commit's check of the entries from here on, as for a writer in another
            // process.
            let folded = ov.next_lsn();
            drop(ov);
            // Where the blocks to be written in part live now, looked up and hinted before
            // the staging, so that their copies find them in the cache.
            let mut old: Vec<(u64, Option<u64>)> = Vec::with_capacity(old_src.len());
            for (b, src) in old_src {
                let at = self.resolve_block(f, b, src)?;
                if let Some(pblk) = at {
                    self.m().prefetch_range(PmOff(pblk * BS), BS);
                }
                old.push((b, at));
            }
            let mut goals = Vec::with_capacity(goal_src.len());
            for (sg, src) in segs.iter().zip(goal_src) {
                goals.push(match src {
                    Some(src) => self.resolve_block(f, sg.lblk - 1, src)?.map(|p| p + 1),
                    None => None,
                });
            }
            let mut runs: Vec<Run> = Vec::new();
            let mut partials: Vec<Partial> = Vec::new();
            let mut stale = false;
            let staged = (|| -> Result<()> {
                // The times go with the data: the fence after the copies makes both durable
                // before the commit.
                self.stamp_write_times(n.h.ino, &s)?;
                for (i, sg) in segs.iter().enumerate() {
                    let goal = goals.get(i).copied().flatten();
                    let first = runs.len();
                    self.stage(f, sg.lblk, sg.len, goal, &mut runs)?;
                    for r in &runs[first..] {
                        for k in 0..r.len {
                            let b = r.lblk + k;
                            let (bs, be) = (b * BS, b * BS + BS);
                            let nf = sg.from.max(bs).min(be);
                            let nt = sg.to.min(be).max(nf);
                            if sg.partly_writes(b) {
                                partials.push(Partial {
                                    lblk: b,
                                    pblk: r.pblk.0 + k,
                                    new_from: nf,
                                    new_to: nt,
                                });
                            }
                        }
                        // The new bytes of this run.
                        let (rs, re) = (r.lblk * BS, (r.lblk + r.len) * BS);
                        let (a, b) = (sg.from.max(rs), sg.to.min(re));
                        if a < b {
                            let dst = r.pblk.offset() + (a - rs);
                            match sg.data {
                                Some(d) => self.m().write_nt(
                                    dst,
                                    &d[(a - sg.from) as usize..(b - sg.from) as usize],
                                )?,
                                None => self.m().fill_nt(dst, b - a, 0)?,
                            }
                        }
                    }
                }
                for p in &partials {
                    let src = match old.iter().find(|o| o.0 == p.lblk) {
                        Some(&(_, at)) => at,
                        // Not expected (one predicate, `Seg::partly_writes`, picks both), but a
                        // lookup is right too: one at a later LSN than `folded` is only
                        // checked against more entries than it needs.
                        None => {
                            let ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                            self.block_at(Some(&ov), f, p.lblk)?
                        }
                    };
                    // The block the view holds the old bytes in was freed since (another
                    // process's write replaced it, and its digest released it) and staged
                    // again here: the view is stale, plan again.
                    if src == Some(p.pblk) {
                        stale = true;
                        return Ok(());
                    }
                    self.copy_old(src, p, size)?;
                }
                if let Some((p, pblk)) = in_place {
                    self.write_in_tail(&p, pblk)?;
                }
                Ok(())
            })();
            if stale {
                self.unstage(&runs)?;
                continue;
            }
            let entry = Entry::Write {
                runs: runs
                    .iter()
                    .chain(own.iter().map(|(r, _)| r))
                    .copied()
                    .collect(),
                extend_to,
            };
            let staged = staged.and_then(|()| {
                if since.room() < LOG_RESERVE + entry.slots() {
                    s.log.keep_a_spare()?;
                }
                Ok(())
            });
            if let Err(e) = staged {
                self.unstage(&runs)?;
                if matches!(e, Error::NoSpace) && !digested && !how.shared {
                    digested = true;
                    self.digest(n.h.ino, &s, f)?;
                    self.digest_others(n.h.ino)?;
                    self.release_deferred()?;
                    continue;
                }
                return Err(e);
            }
            self.m().fence();
            if let Err(e) = before_commit(&runs) {
                self.unstage(&runs)?;
                return Err(e);
            }
            match self.commit_cow(
                n,
                &s,
                f,
                since,
                folded,
                &entry,
                &partials,
                size,
                how.append,
                hold.is_some(),
            ) {
                Ok(Attempt::Committed { from, lsn }) => {
                    drop(tail.take());
                    if hold.is_some() {
                        self.write_in_place(&own, size)?;
                    }
                    drop(hold);
                    self.reveal_to_kernel(n.h)?;
                    let blocks = runs.iter().map(|r| r.len).sum();
                    let own = Own {
                        from,
                        lsn,
                        entry: &entry,
                    };
                    let when = match (how.lazy, how.shared) {
                        (false, _) => DigestWhen::Now,
                        (true, false) => DigestWhen::Batched(blocks),
                        (true, true) => DigestWhen::ByCaller(blocks),
                    };
                    self.after_commit(n, &s, f, Some(own), when)?;
                    return Ok(Some(size));
                }
                Ok(Attempt::Replan) => {
                    self.unstage(&runs)?;
                    continue;
                }
                Err(e) => {
                    // Nothing was committed: the staged blocks are nobody's.
                    self.unstage(&runs)?;
                    return Err(e);
                }
            }
        }
    }

    /// The commit loop of [`cow_update`](Fs::cow_update). `mapped`: the update was planned in
    /// mapped mode, and must plan again if any newer entry touches one of its blocks; else it
    /// must plan again (in mapped mode) once the file is in mapped mode.
    #[allow(clippy::too_many_arguments)]
    fn commit_cow(
        &self,
        n: &Node,
        s: &Shared,
        f: &MapFile,
        mut since: Position,
        mut folded: u64,
        entry: &Entry,
        partials: &[Partial],
        planned_size: u64,
        append: bool,
        mapped: bool,
    ) -> Result<Attempt> {
        let mut prepared = s.log.prepare(entry)?;
        let Entry::Write { runs: mine, .. } = entry else {
            return Err(Error::InvalidArgument(
                "a copy-on-write commit of a non-write",
            ));
        };
        let mut first = true;
        loop {
            // After the tail was seen (by the caller for the first attempt): a mapper raised
            // the count before committing its barrier entry, which every later commit has seen.
            if !mapped && !std::mem::take(&mut first) && self.maps(n.h.ino)? > 0 {
                return Ok(Attempt::Replan);
            }
            let attempt = match prepared.try_commit(since) {
                Ok(a) => a,
                // Another thread's compaction reclaimed the log blocks `since` points into.
                Err(_) if !s.log.is_current(since) => return Ok(Attempt::Replan),
                Err(e) => return Err(e.into()),
            };
            match attempt {
                Commit::Done(at) => {
                    return Ok(Attempt::Committed {
                        from: since.lsn(),
                        lsn: at.lsn(),
                    });
                }
                Commit::Moved { prepared: p, tail } => {
                    // The entries committed since our copies' view, read from the log: other
                    // threads may have folded the overlay past them meanwhile.
                    let mut truncated = false;
                    let mut clash = false;
                    let mut dirty = vec![false; partials.len()];
                    let mut newer = s.log.iter_from_lsn(folded)?;
                    // Entries compacted away unseen may have changed a partial block or
                    // truncated the file: plan again.
                    if newer.position().lsn() > folded {
                        return Ok(Attempt::Replan);
                    }
                    for item in newer.by_ref() {
                        let (_, e) = item?;
                        truncated |= matches!(e, Entry::Truncate { .. } | Entry::Resize { .. });
                        clash |= mapped && mine.iter().any(|r| touches_range(&e, r.lblk, r.len));
                        for (d, p) in dirty.iter_mut().zip(partials) {
                            *d |= touches(&e, p.lblk);
                        }
                    }
                    if clash {
                        return Ok(Attempt::Replan);
                    }
                    let checked = newer.position().lsn();
                    let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                    // At or past `checked`: the re-copies see at least what was checked.
                    self.catch_up(n.h.ino, s, &mut ov, u64::MAX)?;
                    let size = ov.size(self.digested_size(n.h.ino)?);
                    if truncated || (append && size != planned_size) {
                        return Ok(Attempt::Replan);
                    }
                    for (p, d) in partials.iter().zip(dirty) {
                        if d {
                            self.copy_old(self.block_at(Some(&ov), f, p.lblk)?, p, size)?;
                        }
                    }
                    // Entries after `checked` that the overlay folded are in the copies too,
                    // but were not checked: the next round checks from here.
                    folded = checked;
                    drop(ov);
                    self.m().fence();
                    prepared = p;
                    since = tail;
                }
            }
        }
    }

    /// After a commit: fold it, then digest (as `when` says), maybe compact the log.
    /// `own`: the committed entry, folded without reading the log when the overlay has folded
    /// everything before the log position its commit checked from (an extended entry's
    /// reservation, or padding, may lie between that position and the entry: no entry does).
    fn after_commit(
        &self,
        n: &Node,
        s: &Shared,
        f: &MapFile,
        own: Option<Own<'_>>,
        when: DigestWhen,
    ) -> Result<()> {
        {
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            match own {
                Some(o) if ov.next_lsn() >= o.from => ov.apply(o.lsn, o.entry),
                _ => {
                    self.catch_up(n.h.ino, s, &mut ov, u64::MAX)?;
                }
            }
        }
        match when {
            DigestWhen::Now => {}
            DigestWhen::Batched(blocks) | DigestWhen::ByCaller(blocks) => {
                s.pending_entries.fetch_add(1, Ordering::Relaxed);
                s.pending_blocks.fetch_add(blocks, Ordering::Relaxed);
                if matches!(when, DigestWhen::ByCaller(_)) || !s.batch_full() {
                    return Ok(());
                }
            }
        }
        self.digest_committed(n.h.ino, s, f)
    }

    /// After a write that held the file's lock shared ([`DigestWhen::ByCaller`]): digests the
    /// file's log under the lock taken alone if the batch is full ([`Shared::batch_full`]).
    /// Another writer of the file may have digested it while this one waited for the lock:
    /// then nothing is left to do.
    fn digest_if_due(&self, n: &Node) -> Result<()> {
        let Some(s) = self.shared(n, false)? else {
            return Ok(());
        };
        if !s.batch_full() {
            return Ok(());
        }
        let _il = self.tree_write_lock(n.h.ino);
        if !s.batch_full() {
            return Ok(());
        }
        self.digest_committed(n.h.ino, &s, self.node_map(n)?)
    }

    /// [`digest`](Fs::digest) after a committed update: the update is durable, and a digest
    /// that cannot get the blocks its mapping structure needs leaves the entry to the overlay
    /// and to the next digest.
    fn digest_committed(&self, ino: u32, s: &Shared, f: &MapFile) -> Result<()> {
        match self.digest(ino, s, f) {
            Err(Error::NoSpace) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Raises mtime and ctime to `now` (never backwards, by CAS: writers of a file race here),
    /// durable after the next fence.
    fn stamp_times(&self, ino: u32, now: u64) -> Result<()> {
        self.raise_times(ino, &[field::MTIME, field::CTIME], now)
    }

    /// Raises the time words `fields` of `ino` to `now` by CAS, never backwards; durable after
    /// the next fence.
    fn raise_times(&self, ino: u32, fields: &[u64], now: u64) -> Result<()> {
        for &f in fields {
            raise_words(self.m(), &[self.inodes.field(ino, f)], now)?;
        }
        Ok(())
    }

    /// [`stamp_times`](Fs::stamp_times) for a write through `s`, with the coarse clock.
    fn stamp_write_times(&self, ino: u32, s: &Shared) -> Result<()> {
        let now = self.now_coarse() as u64;
        if now <= s.stamped.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.stamp_times(ino, now)?;
        s.stamped.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// After a data-only client's update of `h` committed (its bytes in place): if the
    /// kernel may hold pages of the file ([`flag::KERNEL_CACHED`]), raises mtime and ctime to
    /// a fine-grained time strictly above the stored mtime, then has the owner make the
    /// kernel drop the pages ([`crate::kernel_pages`]), if the client can reach it. The update
    /// bypassed the kernel, which keeps its pages while the mtime and size it fetches stay as
    /// they were (`FUSE_AUTO_INVAL_DATA`): with the coarse clock of writes, for the rest of a
    /// clock tick, so a process reading through the kernel got the old bytes back, and a
    /// kernel mapping, which fetches nothing, kept them. The owner sets the flag before it
    /// reads for the kernel, and this looks after the commit: either that read saw the
    /// update, or this sees the flag. Nothing for the owner, whose updates go through the
    /// kernel.
    fn reveal_to_kernel(&self, h: Handle) -> Result<()> {
        if !self.client || !KernelTimes::of(self, h.ino).reveal(self.m(), || self.now())? {
            return Ok(());
        }
        if let Some(drop_pages) = self.kernel_pages.get() {
            drop_pages(Ino::from_raw(h.word()));
        }
        Ok(())
    }

    /// Before the kernel reads regular file `h` for a process (a copy inside the kernel):
    /// if some process maps it ([`map_file`](Fs::map_file)), stores through the mapping may
    /// have bypassed the kernel's pages: [revealed](Fs::reveal_to_kernel) as an update.
    pub fn reveal_mapped(&self, h: Handle) -> Result<()> {
        if self.maps(h.ino)? == 0 {
            return Ok(());
        }
        self.reveal_to_kernel(h)
    }

    /// The owner's side of [`crate::kernel_pages`]: before it has the kernel drop its pages
    /// of `h`, notes that the kernel caches none ([`flag::KERNEL_CACHED`] cleared). A kernel
    /// read after this sets the flag again, so a client's update after that read asks
    /// again; a read before it ends before the pages are dropped (the kernel locks the pages
    /// it reads into). Nothing for a file that is gone.
    pub fn forget_kernel_pages(&self, h: Handle) -> Result<()> {
        if self.client || self.read_only {
            return Err(Error::Unsupported(
                "dropping kernel pages outside the owner",
            ));
        }
        let _il = self.ilock(h.ino).read().unwrap_or_else(|e| e.into_inner());
        if self.inodes.load(self.m(), h.ino, field::STATE)? != h.live_state() {
            return Ok(());
        }
        self.inodes
            .clear_flags(self.m(), h.ino, flag::KERNEL_CACHED)
    }

    /// Notes that the kernel may cache pages of `ino` ([`flag::KERNEL_CACHED`]): called by the
    /// owner before it reads the file for the kernel.
    pub fn note_kernel_cached(&self, ino: u32) -> Result<()> {
        if self.client || self.inodes.flags(self.m(), ino)? & flag::KERNEL_CACHED != 0 {
            return Ok(());
        }
        // A change of group stores the flags' word whole, under the inode's lock.
        let _il = self.ilock(ino).read().unwrap_or_else(|e| e.into_inner());
        self.inodes.set_flags(self.m(), ino, flag::KERNEL_CACHED)
    }

    /// Stores mtime and ctime durably.
    fn touch_times(&self, ino: u32) -> Result<()> {
        self.stamp_times(ino, self.now() as u64)?;
        self.m().fence();
        Ok(())
    }

    /// Raises the ctime of `ino` to now, durably: a change of status that changed nothing
    /// else (see [`Client::chown_unchanged`](crate::Client::chown_unchanged)).
    pub(crate) fn touch_ctime(&self, ino: u32) -> Result<()> {
        self.raise_times(ino, &[field::CTIME], self.now() as u64)?;
        self.m().fence();
        Ok(())
    }

    /// Applies the undigested entries of `s`'s log to the mapping (unless another live process
    /// is doing it) and compacts the log once a block of applied entries has accumulated.
    pub fn digest(&self, ino: u32, s: &Shared, f: &MapFile) -> Result<()> {
        let cursor = self.inodes.field(ino, field::DIGEST);
        let me = self.holder;
        let mut failed = None;
        let mut note = |r: Result<()>| {
            r.map_err(|err| {
                failed = Some(err);
                pmfs_core::Error::InvalidArgument("applying a log entry failed")
            })
        };
        // HashFS applies batches of writes with two fences (`HashFs::apply_writes`); the other
        // structures batches of writes to disjoint blocks (`apply_disjoint`).
        let mut superseded = Vec::new();
        let disjoint = Disjoint::default();
        let alive = |pid| self.holder_alive(pid);
        let r = match &self.stage {
            Stager::Hash(t) => {
                let hf = handle::<HashFsFile>(f)?;
                s.log.digest_batched(
                    cursor,
                    me,
                    &alive,
                    &|batch, _| batch.len() < DIGEST_AFTER_ENTRIES as usize,
                    &mut |batch| note(self.apply_batch(ino, f, t, hf, batch, &mut superseded)),
                )
            }
            Stager::Alloc(_) => s.log.digest_batched(
                cursor,
                me,
                &alive,
                &|batch, e| batch.len() < DIGEST_AFTER_ENTRIES as usize && disjoint.joins(batch, e),
                &mut |batch| note(self.apply_disjoint(ino, f, batch)),
            ),
        };
        if let Some(err) = failed {
            return Err(err);
        }
        let r = r?;
        if let (Digest::Done { .. }, Stager::Hash(t)) = (r, &self.stage) {
            t.drop_superseded(handle::<HashFsFile>(f)?, &superseded)?;
        }
        // Done: applied; Busy: the live holder applies them.
        s.pending_entries.store(0, Ordering::Relaxed);
        s.pending_blocks.store(0, Ordering::Relaxed);
        if let Digest::Done { applied } = r {
            s.ov.lock()
                .unwrap_or_else(|e| e.into_inner())
                .prune(applied);
            if applied >= s.gc_at.load(Ordering::Relaxed) + ENTRIES_PER_BLOCK {
                s.gc_at.store(applied, Ordering::Relaxed);
                s.log.compact_applied(cursor)?;
            }
        }
        Ok(())
    }

    /// Digests the logs of the other files this process has written and not digested yet:
    /// the blocks their overwrites replaced go back to the allocator only then, and a write
    /// that ran out of space retries after this. A file whose lock is taken (possibly by the
    /// caller: locks are striped) is left alone. The lock also keeps the file's last close
    /// out, which closes the log only when it holds the last reference to it.
    fn digest_others(&self, own: u32) -> Result<()> {
        let pending: Vec<u32> = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|&(&ino, s)| ino != own && s.pending_entries.load(Ordering::Relaxed) > 0)
            .map(|(&ino, _)| ino)
            .collect();
        for ino in pending {
            let Ok(_lock) = self.ilock(ino).try_write() else {
                continue;
            };
            let Some(s) = self.registered_log(ino) else {
                continue;
            };
            let f = self.map.open_file(self.file_id(ino))?;
            match self.digest(ino, &s, &f) {
                Ok(()) | Err(Error::NoSpace) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Applies a batch of [`Log::digest_batched`] on a HashFS volume: an entry of another kind
    /// alone through [`apply`](Fs::apply), writes together through
    /// [`HashFs::apply_writes`], whose losing slots are added to `superseded`. The size words
    /// are stored first (idempotent maxima): the first fence of `apply_writes` makes them
    /// durable before any block is promoted.
    fn apply_batch(
        &self,
        ino: u32,
        f: &MapFile,
        t: &HashFs<Pm>,
        hf: &HashFsFile,
        batch: &[(u64, Entry)],
        superseded: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let m = self.m();
        let Some((runs, size)) = batch_writes(batch)? else {
            return self.apply(ino, f, &batch[0].1);
        };
        let hi = runs.iter().map(|r| r.lblk + r.len).max().unwrap_or(0);
        if hi > self.inodes.load(m, ino, field::MAPPED_END)? {
            self.inodes.store(m, ino, field::MAPPED_END, hi)?;
        }
        if size > self.inodes.load(m, ino, field::SIZE)? {
            self.inodes.store(m, ino, field::SIZE, size)?;
        }
        superseded.extend(t.apply_writes(hf, &runs)?);
        Ok(())
    }

    /// Applies a batch of [`Log::digest_batched`] on a structure other than HashFS: writes
    /// to disjoint blocks (see [`Disjoint`]), or one entry of another kind alone through
    /// [`apply`](Fs::apply). Their runs are applied in block order, those that continue each
    /// other on both sides as one (appends become one mapping update per batch); a run the
    /// mapping already maps exactly is skipped. With no block written twice, applying again a
    /// batch that a crash cut short, or a longer one from the same entry, maps every block to
    /// the same place: no write can undo a later one.
    fn apply_disjoint(&self, ino: u32, f: &MapFile, batch: &[(u64, Entry)]) -> Result<()> {
        let m = self.m();
        let Some((mut runs, size)) = batch_writes(batch)? else {
            return self.apply(ino, f, &batch[0].1);
        };
        runs.sort_unstable_by_key(|r| r.lblk);
        let merged = merge_runs(&runs);
        let hi = merged.last().map_or(0, |r| r.lblk + r.len);
        if hi > self.inodes.load(m, ino, field::MAPPED_END)? {
            self.inodes.store(m, ino, field::MAPPED_END, hi)?;
            m.fence();
        }
        self.map.replace_many(f, &merged)?;
        if size > self.inodes.load(m, ino, field::SIZE)? {
            self.inodes.store(m, ino, field::SIZE, size)?;
        }
        m.fence();
        Ok(())
    }

    /// Applies one entry to the mapping and the size word, idempotently (see the module
    /// documentation). Durable when it returns.
    pub fn apply(&self, ino: u32, f: &MapFile, e: &Entry) -> Result<()> {
        let m = self.m();
        match e {
            Entry::Write { runs, extend_to } => {
                let hi = runs.iter().map(|r| r.lblk + r.len).max().unwrap_or(0);
                if hi > self.inodes.load(m, ino, field::MAPPED_END)? {
                    self.inodes.store(m, ino, field::MAPPED_END, hi)?;
                    m.fence();
                }
                self.map.replace_many(f, runs)?;
                if *extend_to > self.inodes.load(m, ino, field::SIZE)? {
                    self.inodes.store(m, ino, field::SIZE, *extend_to)?;
                }
            }
            Entry::Truncate { size } => {
                let old = self.inodes.load(m, ino, field::SIZE)?;
                self.inodes.store(m, ino, field::SIZE, *size)?;
                m.fence();
                let from = size.div_ceil(BS);
                let upto = self
                    .inodes
                    .load(m, ino, field::MAPPED_END)?
                    .max(old.div_ceil(BS))
                    .min(MAX_FILE_SIZE / BS);
                if upto > from {
                    self.map.remove(f, from, upto - from)?;
                }
                self.inodes.store(m, ino, field::MAPPED_END, from)?;
            }
            Entry::Resize { size } => self.inodes.store(m, ino, field::SIZE, *size)?,
            Entry::Punch { lblk, len } => {
                self.map.remove(f, *lblk, *len)?;
            }
        }
        m.fence();
        Ok(())
    }

    /// Writes `buf` at `off` (see the module documentation).
    pub fn write_at(&self, n: &Node, buf: &[u8], off: u64) -> Result<usize> {
        self.write_inner(n, buf, Some(off)).map(|_| buf.len())
    }

    /// Appends `buf` at end of file as one atomic update; returns the offset it landed at.
    pub fn append(&self, n: &Node, buf: &[u8]) -> Result<u64> {
        self.write_inner(n, buf, None)
    }

    /// A write ([`write_at`](Fs::write_at), or an append with `at` `None`). On a structure
    /// other than HashFS it holds the file's lock shared, as readers do: writers of a file
    /// stage, copy and commit side by side (as on HashFS, racing on the log's tail and taking
    /// the file's tail to write past the end of file), and only a digest, which changes the
    /// tree, waits for the lock alone. So the digest of a full batch follows the write, under
    /// the lock taken alone ([`digest_if_due`](Fs::digest_if_due)), and a write that finds no
    /// space runs again holding the lock alone, which lets it digest to free the blocks that
    /// undigested writes replaced.
    fn write_inner(&self, n: &Node, buf: &[u8], at: Option<u64>) -> Result<u64> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if let Some(off) = at {
            // On the hash tables, the line of the first block is read by the staging (cuckoo's
            // goal lookup, HashFS's slot claim) and the digest: start its miss before the log
            // work (the trees do nothing with the hint).
            self.map.prefetch(self.node_map(n)?, off / BS);
        }
        let shared = self.tree_read_lock(n.h.ino);
        if shared.is_none() {
            return self.write_locked(n, buf, at, false);
        }
        let r = self.write_locked(n, buf, at, true);
        drop(shared);
        match r {
            Err(Error::NoSpace) => {
                let _il = self.tree_write_lock(n.h.ino);
                self.write_locked(n, buf, at, false)
            }
            Ok(landed) => {
                self.digest_if_due(n)?;
                Ok(landed)
            }
            Err(e) => Err(e),
        }
    }

    /// [`write_inner`](Fs::write_inner) under the file's lock, held `shared` (see
    /// [`Update::shared`]) or alone (or, on HashFS, not at all).
    fn write_locked(&self, n: &Node, buf: &[u8], at: Option<u64>, shared: bool) -> Result<u64> {
        if buf.is_empty() {
            return match at {
                Some(o) => Ok(o),
                None => self.size_of(n),
            };
        }
        let len = buf.len() as u64;
        let mut landed = 0;
        let how = Update {
            append: at.is_none(),
            shared,
            ..Update::WRITE
        };
        self.cow_update(n, how, &mut |fs, ov, f, size| {
            let off = at.unwrap_or(size);
            let end = off
                .checked_add(len)
                .filter(|&e| e <= MAX_FILE_SIZE)
                .ok_or(Error::FileTooLarge)?;
            landed = off;
            let first = off / BS;
            let last = (end - 1) / BS;
            if first > size.div_ceil(BS) {
                fs.mark_holes(n.h.ino)?;
            }
            let mut segs = vec![Seg {
                lblk: first,
                len: last - first + 1,
                from: off,
                to: end,
                data: Some(buf),
            }];
            segs.extend(fs.eof_seg(ov, f, size, first)?);
            Ok(Some((segs, if end > size { end } else { 0 })))
        })?;
        Ok(landed)
    }

    /// The copy of the old last block when the file grows past an unaligned end of file and
    /// the update does not cover that block itself (`cover_from`: its first logical block).
    fn eof_seg(
        &self,
        ov: Option<&Overlay>,
        f: &MapFile,
        size: u64,
        cover_from: u64,
    ) -> Result<Option<Seg<'static>>> {
        let eb = size / BS;
        if size.is_multiple_of(BS) || eb >= cover_from || self.block_at(ov, f, eb)?.is_none() {
            return Ok(None);
        }
        Ok(Some(Seg {
            lblk: eb,
            len: 1,
            from: size,
            to: size,
            data: None,
        }))
    }

    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, n: &Node, len: u64) -> Result<()> {
        self.resize(n, len, false)
    }

    /// Truncates the file to 0 for an `open` with `O_TRUNC`, then closes this process's
    /// handle of its log unless something else of the process uses it: the opener is most
    /// likely a data-only client (a program under the library) that writes the file itself,
    /// alone with the log once the owner's handle is closed (see
    /// [`close_log_if_unused`](Fs::close_log_if_unused)); if it writes through the kernel
    /// instead, the owner opens the log again at its first write.
    pub fn truncate_at_open(&self, n: &Node) -> Result<()> {
        self.resize(n, 0, true)
    }

    /// [`set_len`](Fs::set_len), then [`close_log_if_unused`](Fs::close_log_if_unused).
    fn resize(&self, n: &Node, len: u64, close_even_alone: bool) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if len > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        self.set_len_locked(n, len)?;
        self.close_log_if_unused(n, close_even_alone)
    }

    /// After the owner served an operation on `n`'s file for somebody else (a request of the
    /// kernel), closes its handle of the file's log as
    /// [`close_log_if_unused`](Fs::close_log_if_unused) does, if another process has the log
    /// open. Reads the head word first, without the inode lock.
    pub fn let_go_of_log(&self, n: &Node) -> Result<()> {
        if self.client || self.read_only {
            return Ok(());
        }
        if n.log.lock().unwrap_or_else(|e| e.into_inner()).is_none()
            || HeadWord(self.inodes.load(self.m(), n.h.ino, field::LOG)?).opens() < 2
        {
            return Ok(());
        }
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        self.close_log_if_unused(n, false)
    }

    /// After the owner changed `n`'s file for somebody else (a truncation through the
    /// kernel), closes its handle of the file's log if nothing else of the owner uses it and
    /// another process has the log open (or, with `even_alone`, in any case). Otherwise the
    /// owner's handle would stay open until the kernel releases the file, and a data-only
    /// client writing the file meanwhile (under the library) would never be alone with the
    /// log, so it could free none of the blocks its compactions retire (see
    /// `pmfs_core::log`). The owner's next operation on the file opens the log again. Called
    /// under the inode lock (write), as [`release_node`](Fs::release_node) closes it.
    fn close_log_if_unused(&self, n: &Node, even_alone: bool) -> Result<()> {
        if self.client {
            return Ok(());
        }
        let ino = n.h.ino;
        let s = {
            let mut mine = n.log.lock().unwrap_or_else(|e| e.into_inner());
            let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
            let Some(s) = mine.as_ref() else {
                return Ok(());
            };
            // The node's reference and the registry's: no other node of the inode holds one.
            if Arc::strong_count(s) != 2
                || !even_alone && HeadWord(self.inodes.load(self.m(), ino, field::LOG)?).opens() < 2
            {
                return Ok(());
            }
            logs.remove(&ino);
            mine.take()
        };
        match s {
            Some(s) => self.digest_and_close(n, s),
            None => Ok(()),
        }
    }

    /// Digests the log of `n`'s inode and closes this process's handle `s` of it, taken out
    /// of the registry, if it holds the last reference (else the holder closes it).
    fn digest_and_close(&self, n: &Node, s: Arc<Shared>) -> Result<()> {
        let digested = if self.read_only {
            Ok(())
        } else {
            self.node_map(n).and_then(|f| self.digest(n.h.ino, &s, f))
        };
        let closed = match Arc::try_unwrap(s) {
            Ok(s) => s.log.close().map_err(Error::from),
            Err(_) => Ok(()),
        };
        digested?;
        closed
    }

    fn set_len_locked(&self, n: &Node, len: u64) -> Result<()> {
        let ino = n.h.ino;
        loop {
            let size = self.size_of(n)?;
            if len == size {
                return self.touch_times(ino);
            }
            if len > size {
                break;
            }
            let s = self.shared(n, true)?.ok_or(Error::Corrupt {
                what: "file log",
                at: self.inodes.field(ino, field::LOG),
            })?;
            let _tail = self.lock_tail(ino, &s)?;
            if self.size_of(n)? != size {
                continue;
            }
            self.touch_times(ino)?;
            // Each refuses when the mode changed (or the size moved) under it: look again.
            if self.maps(ino)? > 0 {
                if self.shrink_mapped(n, &s, len)? {
                    return Ok(());
                }
            } else if self.commit_unless_mapped(ino, &s, &Entry::Truncate { size: len })? {
                self.reveal_to_kernel(n.h)?;
                self.after_commit(n, &s, self.node_map(n)?, None, DigestWhen::Now)?;
                return self.restore_log_reserve(&s);
            }
        }
        self.cow_update(n, Update::NOW, &mut |fs, ov, f, size| {
            if len <= size {
                return Ok(None);
            }
            if len.div_ceil(BS) > size.div_ceil(BS) {
                fs.mark_holes(n.h.ino)?;
            }
            let segs: Vec<Seg<'_>> = fs.eof_seg(ov, f, size, u64::MAX)?.into_iter().collect();
            Ok(Some((segs, len)))
        })?;
        Ok(())
    }

    /// Shrinks a file in mapped mode to `len` bytes: a `Resize` (the blocks stay), committed at
    /// the tail the size was read at, then zeros in place from `len` to the end of the old last
    /// block, so that growing the file again reads zeros there. Returns false, having done
    /// nothing, if the file left mapped mode, is not longer than `len` or the tail moved.
    fn shrink_mapped(&self, n: &Node, s: &Shared, len: u64) -> Result<bool> {
        let ino = n.h.ino;
        let Some(hold) = self.map_hold(ino)? else {
            return Ok(false);
        };
        let f = self.node_map(n)?;
        let since = s.log.tail()?;
        let mut runs = Vec::new();
        let size = {
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.catch_up(ino, s, &mut ov, since.lsn())?;
            let size = ov.size(self.digested_size(ino)?);
            if len < size {
                let first = len / BS;
                self.runs_in(Some(&ov), f, first, size.div_ceil(BS) - first, &mut runs)?;
            }
            size
        };
        if len >= size {
            return Ok(false);
        }
        match s
            .log
            .prepare(&Entry::Resize { size: len })?
            .try_commit(since)?
        {
            Commit::Done(_) => {}
            Commit::Moved { .. } => return Ok(false),
        }
        let m = self.m();
        for r in &runs {
            let (rs, re) = (r.lblk * BS, (r.lblk + r.len) * BS);
            let a = rs.max(len);
            if a < re {
                m.fill_nt(r.pblk.offset() + (a - rs), re - a, 0)?;
            }
        }
        m.fence();
        drop(hold);
        self.reveal_to_kernel(n.h)?;
        self.after_commit(n, s, f, None, DigestWhen::Now)?;
        Ok(true)
    }

    /// Maps zeroed blocks over every hole of `[offset, offset + len)` and, unless `keep_size`,
    /// makes the file at least `offset + len` long: one atomic update.
    pub fn allocate(&self, n: &Node, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.fill(n, offset, len, keep_size, Fill::Holes { at_most: u64::MAX })
    }

    /// Makes `[offset, offset + len)` read as zeros on allocated blocks and, unless
    /// `keep_size`, the file at least `offset + len` long (`FALLOC_FL_ZERO_RANGE`): one atomic
    /// update, a copy-on-write of zeros over the range (the partial edge blocks keep their
    /// bytes outside it), in place in mapped mode, where holes get fresh zeroed blocks.
    pub fn zero_range(&self, n: &Node, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.fill(n, offset, len, keep_size, Fill::Zeros)?;
        self.touch_times(n.h.ino)
    }

    /// [`allocate`](Fs::allocate) or [`zero_range`](Fs::zero_range), as `what` says.
    fn fill(&self, n: &Node, offset: u64, len: u64, keep_size: bool, what: Fill) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooLarge)?;
        if len == 0 {
            return Ok(());
        }
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let first = offset / BS;
        let last = end.div_ceil(BS);
        self.cow_update(n, Update::NOW, &mut |fs, ov, f, size| {
            let mut segs = Vec::new();
            match what {
                Fill::Zeros => segs.push(Seg {
                    lblk: first,
                    len: last - first,
                    from: offset,
                    to: end,
                    data: None,
                }),
                Fill::Holes { at_most } => {
                    let mut runs = Vec::new();
                    fs.runs_in(ov, f, first, last - first, &mut runs)?;
                    let mut cursor = first;
                    for r in runs.iter().chain([&Run {
                        lblk: last,
                        pblk: BlockNo(0),
                        len: 0,
                    }]) {
                        if r.lblk > cursor {
                            segs.push(Seg {
                                lblk: cursor,
                                len: r.lblk - cursor,
                                from: cursor * BS,
                                to: r.lblk * BS,
                                data: None,
                            });
                        }
                        cursor = cursor.max(r.lblk + r.len);
                    }
                    if segs.iter().map(|s| s.len).sum::<u64>() > at_most {
                        return Err(Error::NoSpace);
                    }
                }
            }
            let grow = !keep_size && end > size;
            if grow && first > size.div_ceil(BS) {
                fs.mark_holes(n.h.ino)?;
            }
            if grow {
                segs.extend(
                    fs.eof_seg(ov, f, size, u64::MAX)?
                        .filter(|e| !segs.iter().any(|s| s.covers(e.lblk))),
                );
            }
            if segs.is_empty() && !grow {
                return Ok(None);
            }
            Ok(Some((segs, if grow { end } else { 0 })))
        })?;
        Ok(())
    }

    /// A hole punch in mapped mode: `[offset, end)` is zeroed in place, and no block is
    /// unmapped (holes stay holes).
    fn zero_mapped(&self, n: &Node, offset: u64, end: u64) -> Result<()> {
        let how = Update {
            holes: false,
            ..Update::NOW
        };
        self.cow_update(n, how, &mut |_, _, _, _| {
            let first = offset / BS;
            Ok(Some((
                vec![Seg {
                    lblk: first,
                    len: (end - 1) / BS - first + 1,
                    from: offset,
                    to: end,
                    data: None,
                }],
                0,
            )))
        })?;
        self.touch_times(n.h.ino)
    }

    /// Deallocates `[offset, offset + len)` clamped to the file: the range reads as zeros,
    /// the size does not change. The partial edge blocks are copied with the range zeroed
    /// (one update), then the whole blocks are punched (a second one).
    pub fn punch_hole(&self, n: &Node, offset: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let size = self.size_of(n)?;
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(());
        }
        if self.maps(n.h.ino)? > 0 {
            return self.zero_mapped(n, offset, end);
        }
        let whole_from = offset.div_ceil(BS);
        let whole_to = end / BS;
        if whole_to > whole_from {
            self.mark_holes(n.h.ino)?;
        }
        // With both an edge copy and whole blocks, the punch takes two log updates: a journal
        // cleanup armed before the first finishes the second after a crash between them.
        let mut tx: Option<crate::journal::Tx<'_>> = None;
        let mut arm = |runs: &[Run]| -> Result<()> {
            // The journal's slots are locked in the owner's DRAM: a data-only client does not
            // use them (see `Volume::attach`).
            if whole_to <= whole_from || self.client {
                return Ok(());
            }
            if let Some(old) = tx.take() {
                old.finish(self.m())?;
            }
            let Some(r) = runs.first() else {
                return Ok(());
            };
            let mut t = self.journal.begin();
            t.cleanup(crate::journal::Cleanup::PunchIf {
                inode: n.h,
                from: whole_from,
                len: whole_to - whole_from,
                edge: r.lblk,
                pblk: r.pblk.0,
            });
            t.arm(self.m())?;
            tx = Some(t);
            Ok(())
        };
        let edges = self.cow_update_with(
            n,
            Update::NOW,
            &mut |fs, ov, f, _| {
                let mut segs = Vec::new();
                let mut edge = |b: u64| -> Result<()> {
                    let (bs, be) = (b * BS, b * BS + BS);
                    let (a, z) = (offset.max(bs), end.min(be));
                    if a < z && (a > bs || z < be) && fs.block_at(ov, f, b)?.is_some() {
                        segs.push(Seg {
                            lblk: b,
                            len: 1,
                            from: a,
                            to: z,
                            data: None,
                        });
                    }
                    Ok(())
                };
                edge(offset / BS)?;
                if (end - 1) / BS != offset / BS {
                    edge((end - 1) / BS)?;
                }
                Ok((!segs.is_empty()).then_some((segs, 0)))
            },
            &mut arm,
        );
        if let Err(e) = edges {
            if let Some(t) = tx {
                t.finish(self.m())?;
            }
            return Err(e);
        }
        if whole_to > whole_from {
            let s = self.shared(n, true)?.ok_or(Error::Corrupt {
                what: "file log",
                at: self.inodes.field(n.h.ino, field::LOG),
            })?;
            self.touch_times(n.h.ino)?;
            let punch = Entry::Punch {
                lblk: whole_from,
                len: whole_to - whole_from,
            };
            if self.commit_unless_mapped(n.h.ino, &s, &punch)? {
                self.reveal_to_kernel(n.h)?;
                self.after_commit(n, &s, self.node_map(n)?, None, DigestWhen::Now)?;
                self.restore_log_reserve(&s)?;
            } else {
                self.zero_mapped(n, whole_from * BS, whole_to * BS)?;
            }
        } else {
            self.touch_times(n.h.ino)?;
        }
        if let Some(t) = tx {
            t.finish(self.m())?;
        }
        Ok(())
    }
}

/// The runs of a digest batch of writes and the largest size they extend the file to; `None`
/// for a batch of one entry of another kind (which is applied alone).
fn batch_writes(batch: &[(u64, Entry)]) -> Result<Option<(Vec<Run>, u64)>> {
    let mut runs: Vec<Run> = Vec::new();
    let mut size = 0;
    for (_, e) in batch {
        let Entry::Write { runs: r, extend_to } = e else {
            return match batch {
                [_] => Ok(None),
                _ => Err(Error::InvalidArgument("a digest batch mixes entry kinds")),
            };
        };
        size = size.max(*extend_to);
        runs.extend_from_slice(r);
    }
    Ok(Some((runs, size)))
}

/// The batching rule of the structures other than HashFS: a write joins a batch of writes
/// when it writes none of the blocks they write (see [`Fs::apply_disjoint`]). Keeps the
/// blocks of the batch being built as disjoint intervals (start → end): the log asks about
/// each next write once, with the batch so far.
#[derive(Default)]
struct Disjoint(RefCell<BTreeMap<u64, u64>>);

impl Disjoint {
    fn joins(&self, batch: &[(u64, Entry)], e: &Entry) -> bool {
        let Entry::Write { runs, .. } = e else {
            return false;
        };
        let mut taken = self.0.borrow_mut();
        if let [(_, first)] = batch {
            taken.clear();
            if let Entry::Write { runs, .. } = first {
                for r in runs {
                    taken.insert(r.lblk, r.lblk + r.len);
                }
            }
        }
        let free = |r: &Run| {
            taken
                .range(..r.lblk + r.len)
                .next_back()
                .is_none_or(|(_, &end)| end <= r.lblk)
        };
        if !runs.iter().all(free) {
            return false;
        }
        for r in runs {
            taken.insert(r.lblk, r.lblk + r.len);
        }
        true
    }
}
