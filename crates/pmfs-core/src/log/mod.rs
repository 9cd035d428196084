//! The per-file operation log (MadFS §4.3–4.6): a chain of log blocks of 8-byte slots, one
//! slot per metadata update, committed by a compare-and-swap into the first empty slot.
//!
//! The log is a data structure over [`Media`] and nothing else: it knows neither files nor
//! mapping structures. A caller (the engine) keeps one 8-byte *head word* per log, e.g. in
//! the inode, and hands its offset to [`Log::create`] / [`Log::open`]. Entries say which
//! logical blocks now live where and how the size changes ([`Entry`]); replaying them in log
//! order rebuilds a file's block table.
//!
//! # On-media format
//!
//! A **log block** is a 4 KiB block: a 64-byte header, then 504 slots of 8 bytes.
//!
//! | bytes | field | |
//! |---|---|---|
//! | 0..4 | magic | `"PLOG"` |
//! | 4..6 | version | 1 |
//! | 6..8 | flags | bit 0: written by a compaction; others 0 |
//! | 8..16 | next | next block of the chain, 0 for none; set once, by CAS |
//! | 16..24 | base | log sequence number (LSN) of the first slot |
//! | 24..32 | owner | offset of the log's head word (the log's identity) |
//! | 32..36 | crc | crc32c of bytes 0..8 and 16..32 |
//! | 36..64 | reserved | 0 |
//!
//! Every header field but `next` is written before the block becomes reachable and never
//! changes. Along a chain the LSNs are contiguous (`next.base = base + 504`).
//!
//! A **slot** is a little-endian `u64` written once, by an 8-byte CAS from zero, so it is
//! never torn. Its top two bits say what it is:
//!
//! | bits 63..62 | kind | remaining bits |
//! |---|---|---|
//! | — | empty | the whole word is 0 |
//! | `10` | inline entry | 61..56 `len - 1` (runs of 1..=64 blocks), 55..32 `lblk` (24 bits), 31..0 `pblk` (32 bits) |
//! | `11` | inline entry, extending | as `10`; the size becomes at least `(lblk + len) * 4096` |
//! | `01` | indirect entry | 61..48 low 14 bits of the first segment's crc, 47..0 segment offset / 8 |
//! | `00` | `RESERVE n` | 61..16 a fixed 46-bit constant, 15..0 `n`: the next `n` slots are reserved |
//! | `00` | `GROW size` (inline entry) | 61..48 another fixed 14-bit constant, 47..0 `size` (not 0): the size becomes at least `size` |
//!
//! Any other word with tag `00` is garbage ([`Error::Corrupt`]). Slots covered by a
//! reservation are not entries: they hold the *segments* of an extended entry, or nothing
//! (padding). The slots that are not inside a reservation are the *boundary* slots.
//!
//! An **extended entry** is a record of payload words split into one or more segments, each
//! in its own reservation (`RESERVE n` followed by a 24-byte header and `n - 3` payload
//! words):
//!
//! | bytes | field | |
//! |---|---|---|
//! | 0..2 | magic | `0x5E6D` |
//! | 2 | version | 1 |
//! | 3 | flags | 0 |
//! | 4..6 | words | payload words in this segment |
//! | 6..8 | index | segment number in the record, from 0 |
//! | 8..16 | next | offset of the next segment's header, 0 for the last |
//! | 16..20 | crc | crc32c of the owner, this header with crc 0, and the payload |
//! | 20..24 | total | payload words of the whole record |
//!
//! The record's payload words: `w0` = kind (bits 7..0: 1 write, 2 truncate, 3 punch, 4
//! resize) and the run count (bits 63..32); a write continues with `extend_to` and two words
//! per run (`lblk`; `pblk` in bits 39..0 and `len` in bits 63..40); a truncate and a resize
//! with the new size; a punch with `lblk` and `len`. An entry is inline when it is a write of
//! one run that fits the inline fields and leaves the size alone or extends it to exactly the
//! run's end, or a write of no run that extends the size below 2^48 (a `GROW`: an append
//! written in place into the partial last block); everything else (long or scattered runs,
//! other unaligned size changes, truncation, resizing, punching) is extended.
//!
//! # Commit protocol
//!
//! The commit point of an update is one CAS of its slot word into the first empty boundary
//! slot: slot order is commit order, and the tail is a timestamp for optimistic concurrency
//! control (MadFS §4.4). [`Log::prepare`] encodes the entry: an inline word, or, for an
//! extended entry, it first reserves spans (each reservation is itself a CAS of a `RESERVE`
//! word into the first empty slot), writes the segments with non-temporal stores and fences,
//! and only then builds the indirect word — extended entries are durable before anything
//! points at them. [`Prepared::try_commit`] then commits at the first empty slot *unless an
//! entry was committed since the caller's snapshot position*, in which case the caller gets the
//! new tail back to check the winners for conflicts (re-copy its unaligned parts) and retry
//! with the same prepared entry. [`Log::append`] and [`Log::append_since`] commit
//! unconditionally (the latter reporting the entries that won before it).
//!
//! When the walk reaches the end of a full block, the appender links a new one: it writes the
//! block (header and its own word already in the first slot), persists it and the body of the
//! full block, and CASes the full block's `next` from 0. Concurrent appenders agree on the
//! winner; a loser keeps its block as a spare for the next link.
//!
//! # Persistence and ordering (MadFS §4.6)
//!
//! The CAS orders; durability follows separately. Each handle keeps a *tail hint*: a position
//! before which every boundary slot is committed and durable, and every link too. An appender
//! starts from the hint, commits, then flushes only the lines between the hint and its own slot
//! (plus the headers of blocks it crossed, for their links), fences, and advances the hint: a
//! commit costs one fence and usually one or two line flushes, and when [`append`](Log::append)
//! returns, the entry and everything before it are durable. The linker persists a full block
//! before linking it, so a visible link implies a durable body. The hint only moves forward in
//! LSN order, and whether it is ahead of a walk is judged by LSN: a block outside the current
//! chain's retained suffix is durable as a whole (full and linked, or written by a
//! compaction), so a hint and a walk on different sides of a compaction compare correctly.
//!
//! A reader that sees an entry it did not commit may see it before its committer flushed it
//! (or after the committer died). Readers *help*: a [`Replay`] persists each batch of slots it
//! read beyond the hint (same flushes, one fence) before handing out its entries, a
//! [`Moved`](Commit::Moved) tail and [`Log::tail`] are made durable before they are returned,
//! and [`Log::open`] persists the tail block and every link it walks over. So no caller ever
//! acts on an entry that a crash could take back, and a crash leaves a prefix of the commit
//! order: replay stops at the first empty boundary slot. What lies beyond a hole after a crash
//! (slots of lines written back early, a reservation whose `RESERVE` word was lost) was never
//! returned to anyone; [`recover()`] zeroes it before the log is used again.
//!
//! # Garbage collection and reclamation (MadFS §4.5)
//!
//! [`Log::compaction_point`] names the start of the block holding the tail; every block before
//! it is full and immutable. The caller folds the entries before that point into a shorter list
//! of live entries and hands it to [`Log::compact`], which writes them into fresh blocks
//! (flagged as compacted, LSNs ending right before the point, the last block padded and linked
//! to the tail block) with non-temporal stores and one fence, and publishes the new head with
//! one CAS on the head word, then persists it. Appends racing with the compaction are never
//! lost: they land in the tail block or later, which both the old and the new chain share.
//! Readers and writers are never blocked: whoever is inside the old chain keeps walking it
//! into the shared suffix. A compaction that would not save a block changes nothing
//! ([`Compaction::NotSmaller`]); one that loses the head CAS to another compaction frees its
//! blocks and reports [`Compaction::Raced`].
//!
//! The old blocks are retired, not freed. Inside a process, every operation runs pinned in a
//! grace-period epoch (two pin counters and a global epoch; pinning never waits). A
//! reclamation ([`Log::reclaim`], also tried by `compact` and on close) first moves the hint
//! into the current chain's retained suffix if it is behind it, then bumps the handle's
//! *era*, then frees the retired blocks only if every operation pinned before that has
//! finished; otherwise it frees nothing and a later call retries. Positions the caller keeps
//! across calls are not pinned: each [`Position`] carries the era it was taken in, and one
//! taken before a reclamation that lies below the retained suffix is refused
//! ([`Error::InvalidArgument`], see [`Log::is_current`]); the caller then replays from
//! [`Log::start`]. (Positions inside the freshly compacted blocks are refused too, although
//! those blocks live on: the check is conservative.) A segment reserved before a compaction
//! but referenced by an entry committed after it (an extended entry whose reservation and
//! commit straddle the compaction point) is *held*: its block is freed by a later reclamation
//! once no entry of the current chain references it. The retire queue is behind a DRAM mutex,
//! taken only by compaction and reclamation, never by commits or reads.
//!
//! # Across processes
//!
//! The log lives in a pool that several processes map; a DRAM epoch protects only the threads
//! of one process. Cross-process protection is in PM: the top 16 bits of the head word count
//! the handles open on the log in every process (opens, changed by CAS when a handle opens or
//! closes). Holders that keep the log from being freed without ever reading it, such as a
//! mapping of the file's blocks, are counted apart ([`pin_mapping`]: bits 39..46, up to
//! [`MAX_MAP_PINS`], then as opens), so that a process that maps a file and writes it still
//! finds its handle alone. Retired blocks are freed only while the reclaiming handle is the
//! only one open, so a block another process may still be reading, or appending from a stale
//! hint into, is never reused under it; such a process keeps walking the old chain into the
//! shared suffix. If another process keeps the log open, retired blocks wait.
//!
//! A handle that closes while another is open hands its retired blocks on (those it holds
//! because live entries use their segments excepted: the compaction that drops the entries
//! retires them again): it sets the head word's *orphans* flag (bit 47), and the next
//! reclamation that finds its handle alone
//! *sweeps* ([`Log::reclaim`]): it asks the allocator for every block it handed out for this
//! log ([`BlockAllocator::outstanding`]; HashFS's per-file log-block allocator scans its table
//! for them) and frees those that are not in the current chain, hold no segment of its entries,
//! and are not the handle's own (held or spare). What makes that safe is the head word. The
//! sweeper read it, alone and unchanged, before it kept its own operations out of blocks
//! outside the chain; it marks it *sweeping* (bit 46) by a CAS from that value and clears both
//! flags by a CAS from the marked value before it frees anything. A compaction in between
//! (whose readers may be in the blocks it unlinked) changes the head, an open in between (whose
//! opener may hold blocks it allocated and has not linked yet) clears the mark; either makes
//! the sweep give up and a later one retry. Blocks this process has in flight (allocated, not
//! yet linked, published, queued or kept as the spare) are counted, and a sweep during which
//! one went in flight gives up too. So a compaction's old blocks come back once one process has
//! the log alone, at its next compaction or close; only while several keep it open do they
//! wait. A process killed while holding retired blocks leaves them without the flag, unfreed
//! until the next mount frees every block the log does not own ([`owned_blocks`] reports those
//! it does). A process killed while open leaves its pin behind, which only delays reclamation:
//! [`recover()`], run once at mount before any handle opens, resets the counts and the flags.
//! Each process also counts the pins it holds itself ([`pins_here`]), so that a caller who
//! knows that no other process can hold one (the engine, after its last close of a file whose
//! log is still pinned) can tell the pins that dead processes left.
//! This is coarser than MadFS's per-thread registry of the log block being read (in shared
//! memory, with robust mutexes for liveness): reclamation waits for every other opener rather
//! than for readers of the old blocks only.
//!
//! Commit, linking and compaction need no DRAM lock and no liveness of other processes: a
//! process killed at any instruction leaves at worst an unreferenced reservation, an
//! unpersisted committed slot (the next reader persists it), or an unlinked block (leaked until
//! the next mount).
//!
//! # Digest
//!
//! The log is the truth of the entries not yet applied to the state they describe (for a file:
//! its mapping structure and size word); *digesting* applies them, in LSN order, so that their
//! blocks can be dropped. Progress is kept in a **cursor word**, 8 bytes in PM owned by the
//! caller (e.g. in the inode, next to the head word): bits 0..40 the LSN of the first entry not
//! yet applied, bits 40..63 the *holder* applying entries right now (0: nobody; a process id,
//! the same for all threads of a process), bit 63 zero. [`init_cursor`] makes a fresh one.
//!
//! [`Log::digest`] takes the cursor with a CAS (free → its own id), replays from the cursor's
//! LSN ([`Log::iter_from_lsn`]), and after each entry the caller's `apply` returned from, moves
//! the cursor past it with a CAS that keeps the holder, and persists it. At the tail it moves
//! the cursor to the tail and frees it in one CAS, then looks at the tail once more and starts
//! over if entries arrived. One holder at a time, with no DRAM lock: the cursor is a PM word,
//! so the rule holds across processes, and `apply` runs under no lock at all.
//! [`Log::digest_batched`] does the same with batches of consecutive writes, as long as the
//! caller's rule lets each join (a truncation or punch always alone, the cursor moved up to
//! it first), and moves the cursor once per batch; its applier must then be idempotent over
//! a batch left half applied, also when it comes back longer (HashFS's `apply_writes` is; the
//! engine batches writes to disjoint blocks on the other structures).
//!
//! **Busy and takeover.** A caller that finds another holder in the cursor asks its liveness
//! oracle (`alive`, e.g. "does this pid run"): if the holder is alive the call returns
//! [`Digest::Busy`] at once — the holder will apply the caller's entries, because a busy caller
//! still swaps the word for itself (a read-modify-write), and the holder looks at the tail
//! again after its freeing CAS, which comes later in the word's modification order and so
//! sees everything the busy caller committed before. If the holder is dead, the caller takes
//! the cursor over with a CAS and goes on from the cursor's LSN. A caller that finds its *own*
//! id gets `Busy` too: that is another thread of its process. A holder whose cursor was taken
//! over (its liveness was misjudged) notices at its next CAS, stops, and returns `Busy`
//! without touching the word again — but it may have been applying an entry while its taker
//! applied the same one, so the oracle must never call a live holder dead. Calling a dead
//! holder alive is safe, only late: with pids as ids, "the pid runs" would keep a cursor whose
//! holder's pid the kernel gave to another program busy until the next mount resets it, so the
//! engine asks "the pid runs and maps the pool file" ([`maps_file`](crate::pm::procs::maps_file)),
//! which a live holder always answers yes (a new process of the pool that got the dead
//! holder's pid finds its own id and gets `Busy` until that mount).
//!
//! **Why apply must be idempotent.** The cursor moves after the entry's effects are durable,
//! never together with them: a holder killed (or taken over) between the two leaves the entry
//! applied and the cursor before it, and the next holder applies it again. `apply` must
//! therefore leave the same state when run twice on the same entry (a remap that is already
//! in place is skipped, a size that is already set is set again), and must make its effects
//! durable before it returns. So every entry is applied *at least once, in order, never
//! skipped*; exactly once when no holder dies.
//!
//! **What a killed holder leaves.** Its id in the cursor word (taken over by the next digest
//! that finds it dead, or cleared at mount by [`reset_holder`]), the cursor at the first entry
//! it had not finished, and that entry possibly half applied (the next holder redoes it). A
//! panic or an error in `apply` frees the cursor before that entry.
//!
//! **Dropping applied blocks.** [`Log::compact_applied`] compacts with no live entries up to
//! the start of the block holding the cursor's LSN: the log then starts there, and entries at
//! or after the cursor keep their LSNs. It persists the cursor word first, so a crash never
//! leaves the cursor below the head (a cursor below the head would start at the head: what
//! lies before it is never applied again). When a log has a cursor, compact it this way
//! only: [`Log::compact`] with live entries gives them LSNs right below its point, which a
//! cursor below that point would apply again.
//!
//! # Using it
//!
//! ```text
//! mount:   for each log: recover(media, root); owned_blocks(media, root, ..) -> allocator rebuild
//! open:    Log::open(media, root, alloc)               (Log::create for a new file)
//! catch up:for (pos, e) in log.iter_from(applied)? { apply(e); applied = pos }  (then the
//!          replay's position(): the tail; a refused position -> rebuild from log.start())
//! write:   since = log.tail(); ...copy-on-write...; p = log.prepare(&entry);
//!          loop { match p.try_commit(since) { Done(at) => break,
//!                 Moved { prepared, tail } => { check iter_from(since) up to tail for
//!                 conflicts, re-copy, p = prepared, since = tail } } }
//! gc:      point = log.compaction_point(); live = fold(entries before point);
//!          log.compact(point, &live)    (log.reclaim() later if it could not free yet)
//! digest:  mount: reset_holder(media, cursor); then, after writes:
//!          log.digest(cursor, pid, &|h| pid_alive(h), &mut |lsn, e| apply(e))
//!          log.compact_applied(cursor)  (drops the blocks every entry of which is applied)
//! check:   r = inspect(media, root); cursor_lsn(media, cursor) <= r.tail, else damage took
//!          applied entries: repair with clamp_cursor(media, cursor, r.tail)
//! ```
//!
//! # Limits
//!
//! Inline entries: runs of up to 64 blocks, logical blocks below 2^24, physical blocks below
//! 2^32. Extended entries: runs of up to [`MAX_RUN_LEN`] blocks, physical blocks below 2^40,
//! up to 65535 segments (about 16 million runs). Regions up to 2 PiB; up to 65535 open
//! handles per log. Under `cfg(loom)` a block uses only 16 slots (8 entries), so loom models
//! chain blocks after a handful of appends; the format is otherwise identical.

mod append;
mod chain;
mod digest;
mod entry;
mod epoch;
mod format;
mod gc;
mod here;
mod recover;
mod replay;

#[cfg(all(test, not(loom)))]
mod tests;

use std::fmt;
use std::sync::Arc as StdArc;

use crate::error::{Error, Result};
use crate::layout::{BlockNo, PmOff};
use crate::pm::Media;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::traits::{AllocHint, BlockAllocator, Extent};

use chain::{Chain, Walk};
use epoch::{Epoch, Guard};
use format::{BlockHeader, FIRST_SLOT, HEADER_SLOTS, SLOT_BYTES, SLOTS_PER_BLOCK, slot_off};
use gc::Retired;

pub use append::{Commit, Prepared};
pub use digest::{
    ApplyBatch, CURSOR_HOLDER_BITS, CURSOR_LSN_BITS, Digest, JoinsBatch, MAX_HOLDER, clamp_cursor,
    cursor_lsn, init_cursor, reset_holder,
};
pub use entry::{Entry, MAX_RUN_LEN};
pub use format::{
    ENTRIES_PER_BLOCK, HeadWord, INLINE_MAX_LEN, LOG_VERSION, MAX_MAP_PINS, MAX_PINS,
};
pub use gc::Compaction;
pub use here::pins_here;
pub use recover::{Recovery, inspect, owned_blocks, recover};
pub use replay::Replay;

/// Largest region a log may live in (indirect entries address segments in 48 bits of words).
const MAX_REGION: u64 = 1 << 51;

/// A place in the log: a boundary slot, named by block and slot, ordered by its log sequence
/// number (LSN).
///
/// Positions compare by LSN only. Blocks written by a compaction reuse the LSNs of the blocks
/// they replace, so positions taken on either side of a compaction compare meaningfully only
/// at or after the compaction point. A position belongs to the handle that produced it.
#[derive(Clone, Copy, Debug)]
pub struct Position {
    block: BlockNo,
    slot: u64,
    lsn: u64,
    era: u64,
}

impl Position {
    /// The log sequence number.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// The block holding the slot.
    pub fn block(&self) -> BlockNo {
        self.block
    }

    /// The slot index inside the block (`SLOTS_PER_BLOCK` for "past the last slot").
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// Slots from this one to the end of its block: at a tail, the room entries have before
    /// the log needs another block.
    pub fn room(&self) -> u64 {
        SLOTS_PER_BLOCK - self.slot
    }

    fn base(&self) -> u64 {
        self.lsn - (self.slot - FIRST_SLOT)
    }
}

impl PartialEq for Position {
    fn eq(&self, other: &Self) -> bool {
        self.lsn == other.lsn
    }
}

impl Eq for Position {}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Position {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.lsn.cmp(&other.lsn)
    }
}

/// The tail hint packs a block number and a slot index.
const HINT_SLOT_BITS: u32 = 10;

fn pack(block: BlockNo, slot: u64) -> u64 {
    block.0 << HINT_SLOT_BITS | slot
}

fn unpack(h: u64) -> (BlockNo, u64) {
    (
        BlockNo(h >> HINT_SLOT_BITS),
        h & ((1 << HINT_SLOT_BITS) - 1),
    )
}

/// One process's handle on a log. Share it between the threads of a process (it is `Sync`);
/// open one handle per log per process.
pub struct Log<M: Media, A: BlockAllocator + ?Sized> {
    media: M,
    alloc: StdArc<A>,
    /// Offset of the head word; also the log's identity (the `owner` of its blocks).
    root: PmOff,
    blocks: u64,
    /// Packed `(block, slot)`: every boundary slot before it is committed and durable, and so
    /// is every link up to its block.
    hint: AtomicU64,
    epoch: Epoch,
    /// Bumped by every reclamation (before it frees anything).
    era: AtomicU64,
    /// Positions of an older era below this LSN may lie in freed blocks.
    reclaimed_below: AtomicU64,
    /// A block prepared for a link that another appender won, or 0.
    spare: AtomicU64,
    /// Blocks of this handle allocated and not yet linked, published, kept as the spare or
    /// freed (see [`BlocksInFlight`]).
    blocks_in_flight: AtomicU64,
    /// Bumped whenever a block goes in flight: a sweep that sees it unchanged knows that this
    /// process allocated no block while it ran.
    flight_seq: AtomicU64,
    retired: Mutex<Retired>,
    /// Where the last walk to an LSN stopped (see [`WalkCache`]). A plain DRAM mutex, only
    /// ever tried, never waited for: a walk that finds it taken starts at the head.
    walk_cache: std::sync::Mutex<Option<WalkCache>>,
    closed: bool,
}

/// Block allocations of a handle in flight ([`Log::blocks_in_flight`]); counts one less on
/// drop.
struct BlocksInFlight<'a> {
    count: &'a AtomicU64,
}

impl Drop for BlocksInFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A boundary slot a walk to an LSN reached, kept so that the next walk to an LSN at or after
/// it starts there instead of at the head (digest and overlay catch-up ask for LSNs near the
/// tail, which would otherwise cost a read of every slot of the tail block).
///
/// It is used only while the head word names the same head block and the handle's era is the
/// same as when it was taken. No compaction has then published a new head since, so the slot
/// lies in the current chain on the way from the head to the requested LSN; and no reclamation
/// of this handle has started since, so its block is not freed under a pinned walker (other
/// processes never free while this handle is open).
#[derive(Clone, Copy, Debug)]
struct WalkCache {
    head: BlockNo,
    era: u64,
    block: BlockNo,
    base: u64,
    slot: u64,
}

impl<M: Media, A: BlockAllocator + ?Sized> fmt::Debug for Log<M, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, s) = unpack(self.hint.load(Ordering::Relaxed));
        f.debug_struct("Log")
            .field("root", &self.root)
            .field("hint_block", &b)
            .field("hint_slot", &s)
            .finish_non_exhaustive()
    }
}

fn check_root<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<()> {
    if !root.is_aligned(8) {
        return Err(Error::Unaligned(root));
    }
    if media.size() > MAX_REGION {
        return Err(Error::Unsupported("log regions above 2 PiB"));
    }
    if root.checked_add(8).is_none_or(|end| end.0 > media.size()) {
        return Err(Error::OutOfBounds {
            off: root,
            len: 8,
            size: media.size(),
        });
    }
    Ok(())
}

/// Counts one more open handle in the head word at `root`, as [`Log::open`] does, without
/// opening one: for a holder that may read the log with nothing but the media. A holder that
/// never reads it takes a [`pin_mapping`] instead. [`unpin`] gives it back.
///
/// # Errors
/// [`Error::InvalidArgument`] if the head word holds no log, [`Error::Unsupported`] if
/// [`MAX_PINS`] handles are open; bad offsets; media errors.
pub fn pin<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<()> {
    check_root(media, root)?;
    here::add(root);
    change_head_word(media, root, |hw| {
        if hw.opens() == MAX_PINS {
            return Err(Error::Unsupported("too many open handles on one log"));
        }
        Ok(hw.with_opens(hw.opens() + 1))
    })
    .inspect_err(|_| here::sub(root))
}

/// Counts one open handle less in the head word at `root` (never below zero): the end of a
/// [`pin`], or of a handle.
///
/// # Errors
/// Bad offsets; media errors.
pub fn unpin<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<()> {
    check_root(media, root)?;
    let mut cur = media.load_u64(root)?;
    loop {
        let hw = HeadWord(cur);
        match media.cas_u64(root, cur, hw.with_opens(hw.opens().saturating_sub(1)).0)? {
            Ok(_) => {
                here::sub(root);
                return Ok(());
            }
            Err(actual) => cur = actual,
        }
    }
}

/// How a [`pin_mapping`] was counted, to give it back with [`unpin_mapping`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapPinned {
    /// Among the mapping pins, which do not hold back reclamation.
    Apart,
    /// As an open handle: the mapping pins were at [`MAX_MAP_PINS`].
    AsOpen,
}

/// Counts one more holder that keeps the log (and the file it belongs to) from being freed
/// and never reads the log, such as a mapping of the file's blocks. It is counted apart from
/// the open handles, so that it does not hold back the reclamation of compacted blocks (a
/// process that maps a file and writes it would otherwise never find its handle alone), or
/// as an open handle when [`MAX_MAP_PINS`] are counted already.
///
/// # Errors
/// As [`pin`].
pub fn pin_mapping<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<MapPinned> {
    check_root(media, root)?;
    let mut how = MapPinned::Apart;
    here::add(root);
    change_head_word(media, root, |hw| {
        if hw.map_pins() < MAX_MAP_PINS {
            how = MapPinned::Apart;
            return Ok(hw.with_map_pins(hw.map_pins() + 1));
        }
        if hw.opens() == MAX_PINS {
            return Err(Error::Unsupported("too many open handles on one log"));
        }
        how = MapPinned::AsOpen;
        Ok(hw.with_opens(hw.opens() + 1))
    })
    .inspect_err(|_| here::sub(root))?;
    Ok(how)
}

/// Gives back a [`pin_mapping`] counted as `how` (never below zero).
///
/// # Errors
/// Bad offsets; media errors.
pub fn unpin_mapping<M: Media + ?Sized>(media: &M, root: PmOff, how: MapPinned) -> Result<()> {
    match how {
        MapPinned::AsOpen => unpin(media, root),
        MapPinned::Apart => {
            check_root(media, root)?;
            let mut cur = media.load_u64(root)?;
            loop {
                let hw = HeadWord(cur);
                let less = hw.with_map_pins(hw.map_pins().saturating_sub(1));
                match media.cas_u64(root, cur, less.0)? {
                    Ok(_) => {
                        here::sub(root);
                        return Ok(());
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
    }
}

/// Replaces the head word at `root`, which must hold a log, with `change` of it, by CAS.
fn change_head_word<M: Media + ?Sized>(
    media: &M,
    root: PmOff,
    mut change: impl FnMut(HeadWord) -> Result<HeadWord>,
) -> Result<()> {
    let mut cur = media.load_u64(root)?;
    loop {
        let hw = HeadWord(cur);
        if hw.head().is_none() {
            return Err(Error::InvalidArgument("no log at this head word"));
        }
        match media.cas_u64(root, cur, change(hw)?.0)? {
            Ok(_) => return Ok(()),
            Err(actual) => cur = actual,
        }
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Log<M, A> {
    /// Creates an empty log whose head word is at `root` (which must hold 0) and opens it.
    /// The first block comes from `alloc`, as will every block the log grows by.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the head word is in use; allocation and media errors.
    pub fn create(media: M, root: PmOff, alloc: StdArc<A>) -> Result<Self> {
        check_root(&media, root)?;
        if media.load_u64(root)? != 0 {
            return Err(Error::InvalidArgument("log head word in use"));
        }
        // Not pinned until the head word is published: dropping it early must not unpin.
        let mut log = Self::assemble(media, root, alloc);
        log.closed = true;
        let b = log.alloc_block()?;
        here::add(root);
        let published = log.write_block(b, 0, 0, &[], 0).and_then(|()| {
            log.media.fence();
            log.media.cas_u64(root, 0, HeadWord::new(b, 1).0)
        });
        match published {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => {
                here::sub(root);
                let _ = log.alloc.free(Extent::new(b, 1));
                return Err(Error::InvalidArgument("log head word in use"));
            }
            Err(e) => {
                here::sub(root);
                let _ = log.alloc.free(Extent::new(b, 1));
                return Err(e);
            }
        }
        log.closed = false;
        log.media.persist(root, 8)?;
        log.hint.store(pack(b, FIRST_SLOT), Ordering::Release);
        Ok(log)
    }

    /// Opens the log whose head word is at `root`. After a crash, [`recover()`] must have run
    /// once on it first (at mount, before any handle opens).
    ///
    /// Walks the chain to the tail, persisting what earlier handles may have left unflushed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the head word holds no log, [`Error::Unsupported`] if too
    /// many handles are open, [`Error::Corrupt`] on a damaged chain.
    pub fn open(media: M, root: PmOff, alloc: StdArc<A>) -> Result<Self> {
        pin(&media, root)?;
        // From here on, dropping the handle unpins.
        let log = Self::assemble(media, root, alloc);
        log.init_hint()?;
        Ok(log)
    }

    fn assemble(media: M, root: PmOff, alloc: StdArc<A>) -> Self {
        let blocks = media.size() / crate::layout::BLOCK_SIZE;
        Log {
            media,
            alloc,
            root,
            blocks,
            hint: AtomicU64::new(0),
            epoch: Epoch::new(),
            era: AtomicU64::new(0),
            reclaimed_below: AtomicU64::new(0),
            spare: AtomicU64::new(0),
            blocks_in_flight: AtomicU64::new(0),
            flight_seq: AtomicU64::new(0),
            retired: Mutex::new(Retired::default()),
            walk_cache: std::sync::Mutex::new(None),
            closed: false,
        }
    }

    /// Walks from the head to the tail, makes every link and the tail block's slots durable,
    /// and sets the hint at the tail.
    fn init_hint(&self) -> Result<()> {
        let _g = self.epoch.pin();
        let chain = self.chain();
        let mut walk = self.walk_from_head()?;
        chain.to_tail(&mut walk)?;
        if self.media.needs_flush() {
            for &b in walk.crossed.iter().chain([&walk.block]) {
                self.media.flush(b.offset(), HEADER_SLOTS * SLOT_BYTES)?;
            }
            self.flush_slots(walk.block, FIRST_SLOT, walk.slot)?;
        }
        self.media.fence();
        self.hint
            .store(pack(walk.block, walk.slot), Ordering::Release);
        Ok(())
    }

    /// Closes the handle: reclaims what it can, releases its spare block and its pin.
    /// Dropping the handle does the same but ignores errors.
    pub fn close(mut self) -> Result<()> {
        let r = self.shutdown();
        self.closed = true;
        r
    }

    fn shutdown(&mut self) -> Result<()> {
        let reclaimed = self.reclaim().map(drop);
        let orphaned = if self.has_unlinked() {
            self.mark_orphans()
        } else {
            Ok(())
        };
        let spare = self.spare.swap(0, Ordering::AcqRel);
        let freed = if spare != 0 {
            self.alloc.free(Extent::new(BlockNo(spare), 1))
        } else {
            Ok(())
        };
        unpin(&self.media, self.root)?;
        reclaimed.and(orphaned).and(freed)
    }

    /// The media the log lives on.
    pub fn media(&self) -> &M {
        &self.media
    }

    /// The offset of the head word.
    pub fn root(&self) -> PmOff {
        self.root
    }

    /// The first position of the log (the head block's first slot).
    pub fn start(&self) -> Result<Position> {
        let _g = self.epoch.pin();
        let era = self.era.load(Ordering::SeqCst);
        let walk = self.walk_from_head()?;
        Ok(self.position(&walk, era))
    }

    /// The tail: the first empty boundary slot (or the end of the last block). Everything
    /// before it is durable when this returns.
    pub fn tail(&self) -> Result<Position> {
        let _g = self.epoch.pin();
        let era = self.era.load(Ordering::SeqCst);
        let mut walk = self.walk_from_hint()?;
        self.chain().to_tail(&mut walk)?;
        let end = walk.slot;
        self.make_durable(&mut walk, end)?;
        Ok(self.position(&walk, era))
    }

    /// Whether `pos` may still be used: it was taken after this handle's last reclamation, or
    /// it lies at or after the end of every range compacted and reclaimed since.
    pub fn is_current(&self, pos: Position) -> bool {
        pos.era == self.era.load(Ordering::SeqCst)
            || pos.lsn >= self.reclaimed_below.load(Ordering::SeqCst)
    }

    fn check_pos(&self, pos: Position) -> Result<()> {
        if !(FIRST_SLOT..=SLOTS_PER_BLOCK).contains(&pos.slot) {
            return Err(Error::InvalidArgument("log position out of range"));
        }
        if !self.is_current(pos) {
            return Err(Error::InvalidArgument(
                "log position predates a reclaimed compaction",
            ));
        }
        Ok(())
    }

    fn chain(&self) -> Chain<'_, M> {
        Chain {
            media: &self.media,
            owner: self.root.0,
            blocks: self.blocks,
        }
    }

    fn position(&self, walk: &Walk, era: u64) -> Position {
        Position {
            block: walk.block,
            slot: walk.slot,
            lsn: walk.lsn(),
            era,
        }
    }

    /// The current head block and its header.
    fn head(&self) -> Result<(BlockNo, BlockHeader)> {
        let Some(head) = HeadWord(self.media.load_u64(self.root)?).head() else {
            return Err(Error::Corrupt {
                what: "log head word",
                at: self.root,
            });
        };
        Ok((head, self.chain().check_block(head, self.root)?))
    }

    fn walk_from_head(&self) -> Result<Walk> {
        let (head, h) = self.head()?;
        Ok(Walk::new(head, h.base.get(), FIRST_SLOT, self.blocks))
    }

    fn walk_from_hint(&self) -> Result<Walk> {
        let (b, s) = unpack(self.hint.load(Ordering::Acquire));
        Ok(Walk::new(b, self.chain().base(b)?, s, self.blocks))
    }

    /// A walk at a caller's position (checked for staleness; the caller holds a pin).
    fn walk_from(&self, pos: Position) -> Result<Walk> {
        self.check_pos(pos)?;
        Ok(Walk::new(pos.block, pos.base(), pos.slot, self.blocks))
    }

    fn flush_slots(&self, b: BlockNo, from: u64, to: u64) -> Result<()> {
        if to > from {
            self.media
                .flush(slot_off(b, from), (to - from) * SLOT_BYTES)?;
        }
        Ok(())
    }

    /// Makes every boundary slot before `(walk.block, end)` durable, with the links on the
    /// way, and advances the hint there.
    ///
    /// Only what lies between the hint and that position is flushed: blocks crossed on the way
    /// were persisted by their linkers, so only their headers (the links) are. Whether the
    /// hint is ahead is judged by LSN, which the hint only ever increases. Blocks that are not
    /// in the current chain's retained suffix are durable as a whole (full and linked, or
    /// written by a compaction), so a hint on another branch of the chain than the walk is
    /// correctly judged by its LSN too; when it is behind, everything the walk crossed since
    /// it last made itself durable is flushed. Afterwards the walk forgets the blocks it
    /// crossed.
    fn make_durable(&self, walk: &mut Walk, end: u64) -> Result<()> {
        let seen = self.hint.load(Ordering::Acquire);
        let (hb, hs) = unpack(seen);
        let target = walk.base + (end - FIRST_SLOT);
        let from = if hb == walk.block {
            (hs < end).then_some((walk.crossed.len(), hs))
        } else if let Some(i) = walk.crossed.iter().position(|&b| b == hb) {
            Some((i, FIRST_SLOT))
        } else {
            (self.hint_lsn(seen)? < target).then_some((0, FIRST_SLOT))
        };
        if let Some((i, first)) = from {
            if self.media.needs_flush() {
                for &b in &walk.crossed[i..] {
                    self.media.flush(b.offset(), HEADER_SLOTS * SLOT_BYTES)?;
                }
                self.flush_slots(walk.block, first, end)?;
            }
            self.media.fence();
            self.advance_hint(seen, pack(walk.block, end), target)?;
        }
        walk.crossed.clear();
        Ok(())
    }

    /// The LSN a packed hint stands for. The hint's block is never freed while it is the hint
    /// or while an operation pinned before it moved is running.
    fn hint_lsn(&self, h: u64) -> Result<u64> {
        let (b, s) = unpack(h);
        Ok(self.chain().base(b)? + (s - FIRST_SLOT))
    }

    /// Moves the hint from `seen` to `to` (at LSN `to_lsn`) unless it is already further.
    fn advance_hint(&self, mut seen: u64, to: u64, to_lsn: u64) -> Result<()> {
        loop {
            match self
                .hint
                .compare_exchange(seen, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(now) if self.hint_lsn(now)? < to_lsn => seen = now,
                Err(_) => return Ok(()),
            }
        }
    }

    /// Marks a block allocation of this handle as in flight until the guard drops; hold it
    /// from before the allocation until the block is linked, published, kept as the spare or
    /// freed, so that a sweep of orphaned blocks never takes it for one.
    fn blocks_in_flight(&self) -> BlocksInFlight<'_> {
        self.blocks_in_flight.fetch_add(1, Ordering::SeqCst);
        self.flight_seq.fetch_add(1, Ordering::SeqCst);
        BlocksInFlight {
            count: &self.blocks_in_flight,
        }
    }

    /// One block from the allocator, checked to lie in the region.
    fn alloc_block(&self) -> Result<BlockNo> {
        let ext = self.alloc.alloc(1, AllocHint::metadata())?;
        if ext.len > 1 {
            self.alloc.free(Extent::new(ext.start + 1, ext.len - 1))?;
        }
        if ext.len == 0 || ext.start.0 == 0 || ext.start.0 >= self.blocks {
            return Err(Error::InvalidArgument(
                "allocator returned a block outside the region",
            ));
        }
        Ok(ext.start)
    }

    /// Writes a whole log block with non-temporal stores (durable at the next fence): header
    /// with `base`, `flags` and `next`, then `slots` from the first entry slot, zeros after.
    fn write_block(
        &self,
        b: BlockNo,
        base: u64,
        flags: u16,
        slots: &[u64],
        next: u64,
    ) -> Result<()> {
        debug_assert!(slots.len() as u64 <= SLOTS_PER_BLOCK - FIRST_SLOT);
        let mut bytes = vec![0u8; (SLOTS_PER_BLOCK * SLOT_BYTES) as usize];
        let header = BlockHeader::new(self.root.0, base, flags).words(next);
        for (i, w) in header.iter().chain(slots).enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.media.write_nt(b.offset(), &bytes)
    }

    fn pin(&self) -> (Guard<'_>, u64) {
        let g = self.epoch.pin();
        let era = self.era.load(Ordering::SeqCst);
        (g, era)
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Drop for Log<M, A> {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.shutdown();
        }
    }
}
