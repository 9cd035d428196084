//! Open files and the copy-on-write data path (MadFS §4.1–4.6) on each file's log.
//!
//! This module opens and closes files and their logs; its submodules hold the rest: `read`
//! (reads, and the lookups of blocks that writes share), `write` (the file's tail, staging,
//! the copy-on-write update and its commit), `digest`, `size` (sizes and block counts),
//! `resize` (`set_len`, `fallocate`, hole punching) and `mapped` (mapped mode).
//!
//! # Truth
//!
//! A regular file's blocks and size are the volume's mapping structure plus the inode's `SIZE`
//! word (the *digested* state) plus the entries of the file's log ([`pmfs_core::log`], head
//! word `LOG` in the inode) that are not digested yet: the digest cursor word `DIGEST` holds the
//! LSN of the first entry not applied to the mapping. `MAPPED_END` bounds the mapped logical
//! blocks, whatever the size (fallocate with KEEP_SIZE maps blocks past end of file, and a
//! growing `set_len` maps none), so a truncation knows what to unmap and the lookups of long
//! ranges (`SEEK_DATA`, block counts) stop there ([`Fs::mapped_bound`]). A file gets its log
//! on its first data update.
//!
//! Each process keeps, per open inode, one log handle and an [`Overlay`]: the DRAM fold of the
//! undigested entries, caught up from the log before every operation.
//!
//! # Updates
//!
//! Every data update is one log entry, committed by one CAS ([`Log::prepare`] and
//! [`try_commit`](pmfs_core::log::Prepared::try_commit)):
//!
//! - a write stages fresh blocks for every block it touches (the volume allocator, or HashFS
//!   staging: a write that grows the file, fills holes or continues the latest write takes a
//!   `Growing` hint whose goal follows the previous logical block, a random overwrite of a
//!   file without holes a `Fixed` one without a goal, see [`write::placement`]), copies
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
//! at mount). The word matters on HashFS, whose files other processes write too. An update
//! finds out from its plan whether it needs the tail, and if so takes it and plans again;
//! appends, writes that reach the last block of the digested size and truncations that grow
//! the file take it before their first plan instead.
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
//! - a *mapper* raises `MAPS`, then commits an empty write (a barrier), then zeroes the bytes
//!   past the end of file in its partial last block under the file's tail (a truncation left
//!   them; a mapping must show zeros there), then allocates the holes of its range and reads
//!   the file's runs;
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
//!
//! [`HashFs::apply_writes`]: pmfs_mapping::hashfs::HashFs::apply_writes

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard, RwLockWriteGuard};

use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::log::{HeadWord, Log};
use pmfs_core::traits::{BlockAllocator, Run};

use super::path::{Follow, Target};
use super::{Fs, Release};
use crate::error::{Error, Result};
use crate::hash::FastMap;
use crate::inode::{Handle, Kind, field, flag};
use crate::mapping::MapFile;
use crate::overlay::{Overlay, Src};
use crate::parts::{Pm, Stager};

mod digest;
mod mapped;
mod read;
mod resize;
mod size;
mod write;

pub(crate) use mapped::DropKernelPages;
pub(super) use mapped::map_holds_here;
pub use mapped::{KernelPagesRequest, MapPin};
pub(crate) use size::Counted;

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
    /// The block after the last one this process's latest write of the file covered: a
    /// write that starts there continues it (see [`placement`](write::placement)).
    written_to: AtomicU64,
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
            written_to: AtomicU64::new(0),
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

/// The segments of one update: one or two for a write (its range, and the old last block
/// when it grows the file past an unaligned end), kept inline.
type Segs<'b> = smallvec::SmallVec<[Seg<'b>; 2]>;

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
    /// Take the file's tail ([`Fs::lock_tail`]) before the first plan: the update most likely
    /// changes the size or writes the partial last block (an append), and would otherwise
    /// plan, find that it needs the tail, take it and plan again. A guess: an update that
    /// turns out not to need the tail holds it anyway (appenders wait a little), and one that
    /// does not guess takes it as before.
    tail_first: bool,
    /// Raise the file's mtime and ctime with the update. Not for the holes a mapping fills
    /// ([`Fs::map_file`]): the bytes read the same, and mapping a file changes no time.
    times: bool,
}

impl Update {
    const WRITE: Update = Update {
        append: false,
        lazy: true,
        holes: true,
        shared: false,
        tail_first: false,
        times: true,
    };
    const NOW: Update = Update {
        append: false,
        lazy: false,
        holes: true,
        shared: false,
        tail_first: false,
        times: true,
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

impl Fs {
    /// Opens (and maybe creates) the file at `path`. The returned node is counted as open
    /// until [`release_node`](Fs::release_node).
    pub fn open(&self, path: &str, req: OpenReq) -> Result<Node> {
        if req.write || req.create || req.create_new || req.truncate {
            self.writable()?;
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
        // A volume that takes no changes (read-only, or left to recovery) writes nothing
        // here: what the next mount finds is what a crash would have left.
        let changes = self.writable().is_ok();
        if !self.client && changes {
            // The owner's last handle: the FUSE daemon keeps one while the kernel may hold
            // pages of the file, until the kernel forgets the file.
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
        if !changes || (self.client && !orphan) {
            return Ok(());
        }
        let rec = self.inodes.read(self.m(), n.h.ino)?;
        if rec.state != n.h.live_state() {
            return Ok(());
        }
        if orphan {
            if rec.nlink == 0 {
                self.free_inode(n.h, n.map.get(), Release::Bounded)?;
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
        if !self.held_elsewhere(n.h.ino)? {
            return Ok(());
        }
        if self.clear_dead_pins(n.h.ino, self.node_map(n)?)?.is_none() {
            self.pend_dead_pins(n.h);
        }
        Ok(())
    }

    /// [`drop_dead_pins`](Fs::drop_dead_pins) for live regular file `h` whether or not this
    /// process has it open (see [`Volume::look_for_dead_pins`](crate::Volume::look_for_dead_pins)):
    /// pins this process holds itself keep the clearing from happening, and the file is
    /// noted for [`collect_dead_pins`](Fs::collect_dead_pins) then.
    pub(crate) fn look_for_dead_pins(&self, h: Handle) -> Result<()> {
        if !self.held_elsewhere(h.ino)? {
            return Ok(());
        }
        let _il = self.ilock(h.ino).write().unwrap_or_else(|e| e.into_inner());
        if self.inodes.load(self.m(), h.ino, field::STATE)? != h.live_state() {
            return Ok(());
        }
        let f = self.map.open_file(self.file_id(h.ino))?;
        if self.clear_dead_pins(h.ino, &f)?.is_none() {
            self.pend_dead_pins(h);
        }
        Ok(())
    }

    /// Whether file `ino` has a log that is pinned, or is in mapped mode
    /// ([`held_by_others`](Fs::held_by_others)).
    fn held_elsewhere(&self, ino: u32) -> Result<bool> {
        let hw = HeadWord(self.m().load_u64(self.inodes.field(ino, field::LOG))?);
        Ok(hw.head().is_some() && self.held_by_others(ino, hw)?)
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
    /// A log that a volume taking no changes cannot digest, or whose digest failed, stays
    /// open and registered: entries not digested show only through it, and readers of the
    /// file find it there until a later close (or the next mount) digests them.
    fn digest_and_close(&self, n: &Node, s: Arc<Shared>) -> Result<()> {
        let digested = self
            .writable()
            .is_ok()
            .then(|| self.node_map(n).and_then(|f| self.digest(n.h.ino, &s, f)));
        if let Some(Ok(())) = digested {
            return match Arc::try_unwrap(s) {
                Ok(s) => s.log.close().map_err(Error::from),
                Err(_) => Ok(()),
            };
        }
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(n.h.ino)
            .or_insert(s);
        digested.unwrap_or(Ok(()))
    }
}
