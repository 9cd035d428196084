//! HashFS (HashFS paper §3.2.2): one global linear-probing table whose slot index *is* the
//! physical block, so that mapping a block and allocating it are one CAS.
//!
//! # On-media format
//!
//! The structure owns two extents: `meta` (header, intent records, slot table) and `data`
//! (the blocks it hands out). Slot `i` of the table maps data block `data.start + i`.
//!
//! | meta block | content                                                              |
//! |------------|----------------------------------------------------------------------|
//! | 0          | header: sixteen `Le64` words (below)                                 |
//! | 1          | 64 intent records of one cache line each ([`intent`] format)          |
//! | 2..        | the slot table: one 8-byte slot word per data block ([`slot`] format) |
//!
//! | header word | field                                         |
//! |-------------|-----------------------------------------------|
//! | 0           | magic `"PMFSHSHF"`                             |
//! | 1           | format version (2; 1: no clusters, below)      |
//! | 2, 3        | meta extent: first block, length              |
//! | 4, 5        | data extent: first block, length (= slots)    |
//! | 6           | hash salt                                     |
//! | 7           | number of intent records (64)                 |
//! | 8           | cluster shift (3; 0 in version-1 tables)       |
//! | 9..14       | reserved, zero                                |
//! | 15          | crc32c of words 0..15 (low 32 bits)           |
//!
//! Byte 256 of block 0 (a cache line of its own, outside the checksum) is the *free-count
//! word*, and bytes 512 to the block's end are the *chunk words*, one for each *count chunk*
//! (runs of the table of a power of two of slots, at most 448 of them): hints that are never
//! flushed, which let a process keep its count of the free slots ([`HashFs::free_blocks`]).
//! The free-count
//! word holds the token of the process that counted last, [`CHUNKS_CHANGED`] once a slot
//! changed between free and taken since, or zero when a change may have left no trace in the
//! chunk words; a chunk word holds the chunk token of the process that counted the chunk
//! last, or zero once one of its slots changed since. Code that knew the free-count word
//! alone zeroed it at every change: the chunk words came without a new table version, so a
//! process of such code must not use a table beside one that keeps chunk words (a pmfs
//! volume keeps such builds out with its format version 7).
//!
//! A slot word packs `lblk` (32 bits), `ino` (28 bits), a staged bit (copy-on-write, below)
//! and a 3-bit tag: empty (the zero word), tombstone, tentative, committed.
//! The table therefore keys files with inode numbers up to `2^28 - 1` and logical blocks below
//! `2^32` (16 TiB per file), and holds fewer than `2^32` slots.
//!
//! # Hashing and probing
//!
//! `home(ino, lblk)` is a multiply-xorshift hash of the logical block's *cluster* (its aligned
//! group of eight blocks) under a per-file seed (derived from the inode number and a random
//! per-table salt, which keeps adversarial file offsets from building long chains), reduced
//! to the table's groups of eight slots by multiply-shift, plus the block's place in its
//! cluster ([`simd`] has the exact function). The eight blocks of a cluster therefore have
//! consecutive home slots, which are consecutive data blocks: a file written in pieces of
//! 32 KiB or more lies in physically contiguous runs of 32 KiB, read with one copy each and
//! mapped (through the preload library) with one piece each, and the slot words of a cluster
//! share one cache line. (The paper hashes every block on its own; then every block of a
//! file lies apart, a 1 MiB read is 256 copies from 256 places, and `data_fig6`'s 1 MiB
//! reads and overwrites took 10-20% longer. Tables formatted before clusters, version 1,
//! keep that hash.) Collisions are resolved by linear probing: a key lives
//! at the first slot of `home, home + 1, ...` (wrapping) that was free when it was inserted.
//! Lookups walk from `home` until they find the key or an empty slot. Every walk is bounded
//! by the table size, so even a table full of garbage ends.
//!
//! Lookups of runs hash eight consecutive blocks at a time ([`simd`]: one AVX-512 vector, two
//! AVX2 vectors or scalar code, chosen at run time and forcible with [`HashFs::set_kernel`]),
//! prefetch the eight home slots, then walk them. Lookups and copy-on-write claims of more
//! than one batch prefetch each batch's home lines (and the line after them, where a claim
//! goes on past a cluster of current blocks) four batches before they walk them, so that the
//! misses of a long walk overlap. When a batch is not full (the end of a request) and the
//! request continues the previous lookup through the same handle (a sequential stream), the
//! spare lanes hash the blocks that follow the request, prefetch their home slots, and if
//! such a block is found within its home slot's cache line its translation goes into the
//! file's [translation cache](translation_cache), ready for the next request.
//! Random requests skip this read-ahead: it would load up to seven cold lines for nothing.
//! Blocks of a batch whose homes are consecutive (one cluster) and that the translation cache
//! does not know share one walk from the first home: in a table filled close to its size, a
//! block that is not mapped (a write past the end of file looking for the old version) walks
//! hundreds of slots to the next empty one, and the blocks of a cluster would each walk
//! nearly the same slots. Walks load the slot words straight from the mapped table
//! ([`Media::words`]), without a call per slot.
//! A range larger than a quarter of the table (a whole-file lookup or truncate) is answered
//! by one sequential scan of the table instead of one walk per block.
//!
//! # Deletion: tombstones
//!
//! A removed key's slot becomes a tombstone: free for any later insert, but not the end of a
//! probe sequence. Backward-shift deletion is not an option here: it moves entries to other
//! slots, and in HashFS a slot *is* a data block, so moving an entry would move the file's
//! data. Tombstones also suit PM and concurrency: a removal is one 8-byte CAS (atomic on a
//! crash, never blocks readers), whereas backward shift rewrites a chain of slots that a
//! concurrent lookup may be walking. Inserts reuse tombstones, so tombstones never cost
//! space; their cost is longer walks.
//!
//! Tombstones must also be turned back into empty slots: an insert whose walk meets an empty
//! slot before any tombstone takes the empty one, so if only tombstones were ever made, a
//! table filled to half and emptied a few times over would have no empty slot left, and every
//! lookup that misses would walk the whole table. Two mechanisms do it:
//!
//! - **Reclaim, online.** A tombstone followed by an empty slot lies on no live entry's walk
//!   (no empty slot ever lies between an entry and its home, below). So every operation that
//!   tombstones slots then follows each one's run of tombstones forwards and, if an empty slot
//!   ends the run, empties the run backwards (`HashFs::reclaim`). Emptying races with
//!   inserts: an insert may have walked past a slot while it was live, and claim the slot
//!   after it. Each slot therefore goes tombstone → *purging* → empty, re-checking that the
//!   next slot is still empty in between; and an insert that claims a slot past its home
//!   *seals* its walk (`HashFs::seal_walk`): from the claimed slot down to the home, every
//!   empty or purging slot becomes a tombstone. A fence on each side, per slot (between the
//!   reclaim's purging mark and its re-check, and before each load of the seal), makes one
//!   of the two see the other; a loom model checks it (`tests/loom_hashfs.rs`). A claim
//!   stays invisible to lookups (tentative or staged) until it is sealed. The blocks of a
//!   cluster that one insert or stage claims one after another walk and seal the slots past
//!   their homes once between them: each claim starts after the slot of the one before and
//!   seals down to there (`HashFs::claim_from`, and a loom model of its own).
//! - **Purge, at mount.** [`HashFs::purge_tombstones`] (and [`HashFs::purge_exclusive`],
//!   which the engine runs at every writable mount of the volume's owner) empties every
//!   tombstone that lies on no live entry's walk, including those a reclaim leaves (runs that
//!   end at a live entry whose home is after them). It needs exclusive access.
//!
//! # Crash protocol
//!
//! - A single-block insert is one CAS of a free slot to `tentative(ino, lblk)`, a seal, a
//!   store of `committed(ino, lblk)`, then flush and fence (a crash before the store leaves a
//!   tentative slot, which recovery drops). A single-block remove is one CAS to the tombstone.
//! - A multi-block insert reserves an intent record and records `(ino, lblk, end)` in state
//!   *claiming* (one fence). It claims one slot per block by CAS from free to
//!   `tentative(ino, lblk)` (invisible to lookups), flushes, fences, switches the record to
//!   *committed* (the commit point), rewrites the slots to `committed`, fences and frees the
//!   record.
//! - A multi-block remove records `(ino, lblk, end)` as *removing*, tombstones the slots,
//!   fences and frees the record.
//! - [`recover`](FileMapping::recover) scans the slot table once: tentative slots become
//!   committed if a *committed* record covers them and tombstones otherwise; committed slots
//!   covered by a *removing* record become tombstones. It then repairs probe chains. Claims
//!   are flushed but, to keep inserts at one fence, not ordered against the claims they walked
//!   past: a crash can make a claim durable while an earlier claim on the same chain (of the
//!   same operation, or of another thread's unfinished one) is lost and reads as empty,
//!   cutting the chain. Recovery turns every empty slot that lies between a live entry and
//!   its home into a tombstone; that also repairs a chain whose seal a crash cut short. A
//!   purging slot becomes a tombstone. Recovery therefore reads the whole slot table (8
//!   bytes per data block), the analogue of the allocator rebuild the other structures need.
//!   Reclaims do not flush what they empty: a slot read back as a tombstone is as correct.
//! - Out of space in the middle of a multi-block insert rolls back in line (claimed slots
//!   become tombstones), so the call changes nothing and returns [`Error::NoSpace`].
//!
//! # Concurrency
//!
//! Everything is lock-free and lives in PM, so it holds across processes sharing the pool:
//! slots are claimed and released with CAS, intent records are reserved with CAS. Two inserts
//! never claim the same slot; a lookup walking to a live entry is never cut short, because a
//! reclaim only empties slots that no sealed claim's walk crosses. As the
//! [`FileMapping`] contract allows, mutations of one file are not concurrent with one
//! another; mutations of different files and lookups of any file run in parallel.
//!
//! # Copy-on-write versions
//!
//! The copy-on-write data path writes a block out of place while the block's current version
//! stays mapped and readable, and makes the new block current later (when it applies the
//! file's log entry). A new version is a *staged* slot: the committed word of its key with
//! bit 60 set, `committed(ino, lblk) | 1 << 60` ([`slot`] has the table). So a table holds,
//! per key, at most one current version (committed, bit 60 clear) and any number of staged
//! versions — one per writer that staged the key.
//!
//! - [`HashFs::stage`] claims, by CAS of a free slot to `staged(ino, lblk)`, one slot per
//!   block on the key's own probe sequence (the hash ignores bit 60), then flushes and
//!   fences. Two writers staging one key CAS different free slots, so they get different
//!   blocks. It is not atomic: a crash leaves some slots staged, see below.
//! - Lookups, the translation cache, [`owned_blocks`](FileMapping::owned_blocks),
//!   [`remove`](FileMapping::remove) and [`insert`](FileMapping::insert)'s overlap check all
//!   look for the exact committed word (bit 60 clear), and the table scan only matches
//!   committed and tentative slots, so a staged slot is never data; it is not free either,
//!   and probe walks go past it.
//! - [`insert_at`](FileMapping::insert_at) promotes a staged run: each slot must hold
//!   `staged(ino, run.lblk + k)` (or already `committed(ino, run.lblk + k)`: a
//!   re-application after a crash is a no-op for those slots), and no block of the range may
//!   be mapped to another slot. One slot is one CAS from staged to committed, then flush and
//!   fence. Several slots are made atomic with an intent record *promoting*
//!   `(ino, lblk, end, first slot)`, written (one fence) after the checks and before the
//!   first flip; the flips are CASes, then flush, fence, and the record is freed. Per-slot
//!   atomicity would not do: the data path re-applies a log entry as "remove the range, then
//!   `insert_at`", and after a half-done promote the remove would tombstone the promoted half
//!   (the new data) and the `insert_at` would then refuse it.
//! - [`HashFs::unstage`] gives a staged run back: each slot is CASed to a tombstone.
//! - [`recover`](FileMapping::recover) keeps staged slots (a staged run may belong to a log
//!   entry that committed just before the crash; the data path promotes it when it replays
//!   its logs), except that a slot named by a live *promoting* record, at exactly its
//!   position in the record's run, is rolled forward to committed: other staged versions of
//!   the same key are not touched. [`HashFs::sweep_staged`] then tombstones every staged
//!   slot that is left (writes that never committed); the data path calls it at mount after
//!   replaying every log.
//!
//! # Log blocks
//!
//! [`HashFs::log_blocks`] is a [`BlockAllocator`](pmfs_core::traits::BlockAllocator) for the
//! blocks of one file's operation log. A log block is a committed slot keyed `(ino, lblk)`
//! with `lblk` in `[LOG_LBLK_FIRST, LOG_LBLK_END)`, 2^20 logical blocks just below the top 16
//! of the file (which the engine keeps for its extended attributes); file data stays below
//! `LOG_LBLK_FIRST`. An allocation picks a key of the range (a per-allocator sequence from a
//! random start), claims a slot for it as *tentative*, and after a sequentially consistent
//! fence walks the key's whole probe chain: if another slot holds the same key (committed,
//! or tentative from a concurrent claimer in any process) it gives its slot back and tries
//! another key; otherwise it flips its slot to committed and persists it. Since no slot
//! between a key's home and a claimed slot ever becomes empty while the table is shared, the
//! two walks of two concurrent claimers cover each other's slots, and the fences (a Dekker
//! handshake) make at least one of them see the other: keys stay unique without a lock. A
//! crash between the claim and the flip leaves a tentative slot, which recovery drops. The
//! blocks belong to the file: `owned_blocks` reports them and `remove_file` frees them.

mod cow;
pub mod intent;
mod log_blocks;
#[cfg(test)]
mod races;
pub mod simd;
pub mod slot;
pub mod translation_cache;

use std::hash::{BuildHasher, RandomState};
use std::ops::DerefMut;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, CACHE_LINE, Le64, PmOff, Pod, crc32c};
use pmfs_core::pm::{Media, MediaExt};
// The fences of the seal/reclaim handshake come from the facade, so that a loom model
// (`tests/loom_hashfs.rs`) explores them; a handle's cursor is a per-handle hint and stays std.
use pmfs_core::sync::atomic::fence_after_rmw;
use pmfs_core::sync::native;
use pmfs_core::traits::{Extent, FileId, FileMapping, MappingKind, Run, first_mapped_by_lookups};
use pmfs_core::{Error, Result};
use smallvec::SmallVec;

use self::intent::IntentTable;
pub use self::log_blocks::{LOG_LBLK_END, LOG_LBLK_FIRST, LogBlocks};
pub use self::simd::HashKernel;
use self::simd::{BATCH, CLUSTER_SHIFT, cluster_home, file_seed, home_slots};
use self::slot::{EMPTY, Key, PURGING, Slot, TOMBSTONE};
pub use self::slot::{LBLK_LIMIT, MAX_INO};
use self::translation_cache::TranslationCache;

const MAGIC: u64 = u64::from_le_bytes(*b"PMFSHSHF");
const VERSION: u64 = 2;
/// Tables of this version hash every block on its own (cluster shift 0).
const VERSION_UNCLUSTERED: u64 = 1;
/// The largest cluster shift a header may name.
const MAX_SHIFT: u64 = 16;
const HEADER_WORDS: usize = 16;
const INTENT_RECORDS: u64 = 64;
const SLOTS_PER_BLOCK: u64 = BLOCK_SIZE / 8;
const SLOTS_PER_LINE: u64 = CACHE_LINE / 8;
/// How many batches ahead of the one it walks a walk of several batches hints the home
/// slots (see [`HomesAhead`]).
const PROBE_AHEAD: usize = 4;

const INSERT_CLAIMING: u8 = 2;
const INSERT_COMMITTED: u8 = 3;
const REMOVING: u8 = 4;
const PROMOTING: u8 = 5;
/// How far [`HashFs::reclaim`] follows a run of tombstones looking for the empty slot that
/// would let it empty them (the mount-time purge handles longer runs).
const RECLAIM_SCAN: u32 = 512;
/// Slot words per bulk read of a scan over the whole table
/// ([`HashFs::for_each_chunk`]): 32 KiB. The unit tests' tables have a few hundred slots:
/// there, 16 words, so that their scans cross chunks and end in a partial one.
const SCAN_CHUNK: u64 = if cfg!(test) { 16 } else { 4096 };
/// A batch removal ([`HashFs::remove_files`]) runs [`HashFs::reclaim_all`] when fewer than
/// one slot in this many was empty; else each freed slot's online reclaim.
const RECLAIM_ALL_BELOW: u64 = 4;

type Header = [Le64; HEADER_WORDS];
const _: () = assert!(size_of::<Header>() == 128);
/// Where the free-count word lies in the header block (see the module docs).
const FREE_COUNT_WORD: u64 = 256;
/// Byte offset in meta block 0 of the first chunk word (see the module docs).
const CHUNK_WORDS: u64 = 512;
/// How many count chunks a table has at most: the chunk words that fit in block 0.
const MAX_COUNT_CHUNKS: u64 = (BLOCK_SIZE - CHUNK_WORDS) / 8;
/// What a change leaves in the free-count word in place of a token: the chunk words tell
/// which chunks changed. Tokens are never 0 or 1.
pub const CHUNKS_CHANGED: u64 = 1;
const _: () = assert!(INTENT_RECORDS * CACHE_LINE == BLOCK_SIZE);

/// The HashFS table over a [`Media`].
pub struct HashFs<M> {
    media: M,
    meta: Extent,
    data: Extent,
    slots: u64,
    table: PmOff,
    intents: IntentTable,
    salt: u64,
    /// Blocks are hashed in aligned clusters of `2^shift` ([`simd`]'s module docs).
    shift: u32,
    kernel: HashKernel,
    /// The free-count word (see the module docs).
    free_word: PmOff,
    /// The count chunks (see the module docs).
    chunks: CountChunks,
    /// The last count of free slots, with the tokens this process left when it counted. A
    /// DRAM lock of this process only (std's, also under loom, whose models build tables
    /// outside the model and never count).
    free_count: Mutex<Option<KeptCount>>,
}

/// Where the chunk words are, and how many slots each count chunk has.
#[derive(Clone, Copy, Debug)]
struct CountChunks {
    words: PmOff,
    /// Slots per chunk, a power of two.
    len: u64,
    count: u64,
}

impl CountChunks {
    /// Chunks of a power of two of slots, at least [`SCAN_CHUNK`] (so that a scan's bulk
    /// reads never straddle two), and few enough for block 0.
    fn new(words: PmOff, slots: u64) -> Self {
        let len = slots
            .div_ceil(MAX_COUNT_CHUNKS)
            .max(SCAN_CHUNK)
            .next_power_of_two();
        Self {
            words,
            len,
            count: slots.div_ceil(len),
        }
    }

    /// The chunk of slot `i`.
    fn of(&self, i: u64) -> u64 {
        i >> self.len.trailing_zeros()
    }

    fn word(&self, chunk: u64) -> PmOff {
        self.words + chunk * 8
    }
}

/// A process's count of a table's free slots ([`HashFs::free_blocks`]).
#[derive(Debug)]
struct KeptCount {
    /// The token this process left in the free-count word.
    token: u64,
    /// The token it leaves in the chunk words of the chunks it counts.
    chunk_token: u64,
    /// The free slots of each count chunk.
    free: Vec<u64>,
}

/// A random token for a free-count or chunk word: never 0 or [`CHUNKS_CHANGED`].
fn new_token() -> u64 {
    RandomState::new().hash_one(0u8).max(CHUNKS_CHANGED + 1)
}

/// The end of logical range `[lblk, lblk + len)`, refused when it passes the 2^32 limit of a
/// global table's keys.
fn range_end(lblk: u64, len: u64) -> Result<u64> {
    lblk.checked_add(len)
        .filter(|&e| e <= LBLK_LIMIT)
        .ok_or(Error::InvalidArgument(
            "logical block beyond the 2^32 limit of a global table",
        ))
}

/// The DRAM handle of one file: its inode number, hash seed and translation cache.
#[derive(Debug)]
pub struct HashFsFile {
    ino: u64,
    seed: u64,
    cache: TranslationCache,
    /// Where the last lookup through this handle ended: a lookup starting there is sequential.
    cursor: AtomicU64,
}

impl HashFsFile {
    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// What the translation cache holds for `lblk` (unvalidated; for tests and diagnostics).
    pub fn cached_slot(&self, lblk: u64) -> Option<u64> {
        self.cache.get(lblk)
    }
}

/// Whether slot word `w` is free ([`Slot::is_free`]), without decoding it: `|`, not `||`, so
/// that loops over many words vectorise.
fn free_word(w: u64) -> bool {
    (w == EMPTY) | (w == TOMBSTONE) | (w == PURGING)
}

/// The home slots of the batches of `[lblk, end)`, for a walk of that range one batch at a
/// time. A range of more than one batch hints each batch's home lines [`PROBE_AHEAD`]
/// batches before the walk reaches it, so that the misses of a long walk overlap.
struct HomesAhead {
    /// `ring[k % PROBE_AHEAD]`: the homes of batch `k`, computed and hinted ahead.
    ring: [[u64; BATCH]; PROBE_AHEAD],
    /// The batch the walk takes next.
    next: usize,
    end: u64,
    pipelined: bool,
}

impl HomesAhead {
    fn new<M: Media>(t: &HashFs<M>, file: &HashFsFile, lblk: u64, end: u64) -> Self {
        let mut h = HomesAhead {
            ring: [[0; BATCH]; PROBE_AHEAD],
            next: 0,
            end,
            pipelined: end - lblk > BATCH as u64,
        };
        if h.pipelined {
            for (k, homes) in h.ring.iter_mut().enumerate() {
                *homes = Self::hint(t, file, lblk + (k * BATCH) as u64, end);
            }
        }
        h
    }

    /// The homes of the walk's next batch, which starts at `l`, already hinted; `None` for a
    /// range of one batch, whose caller computes its homes when it needs them.
    fn next<M: Media>(&mut self, t: &HashFs<M>, file: &HashFsFile, l: u64) -> Option<[u64; BATCH]> {
        if !self.pipelined {
            return None;
        }
        let at = self.next % PROBE_AHEAD;
        let homes = self.ring[at];
        self.ring[at] = Self::hint(t, file, l + (PROBE_AHEAD * BATCH) as u64, self.end);
        self.next += 1;
        Some(homes)
    }

    /// The home slots of the batch at `l` (see [`home_slots`]), with the cache lines of those
    /// below `end` hinted, one hint per line (a cluster's homes share lines), and the line
    /// after them: a walk that finds the homes taken, as a copy-on-write claim does in a
    /// cluster of current blocks, goes on there. A batch at or past `end` is neither computed
    /// nor hinted.
    fn hint<M: Media>(t: &HashFs<M>, file: &HashFsFile, l: u64, end: u64) -> [u64; BATCH] {
        if l >= end {
            return [0; BATCH];
        }
        let homes = home_slots(t.kernel, file.seed, l, t.n32(), t.shift);
        let mut last = u64::MAX;
        for &h in &homes[..BATCH.min((end - l) as usize)] {
            if h / SLOTS_PER_LINE != last {
                last = h / SLOTS_PER_LINE;
                t.media.prefetch(t.slot_off(h));
            }
        }
        t.media
            .prefetch(t.slot_off(((last + 1) * SLOTS_PER_LINE) % t.slots));
        homes
    }
}

/// How a walk loads slot words ([`HashFs::words`]): straight from the table where the media
/// map it, or through the media, one call per slot.
#[derive(Clone, Copy)]
enum Words<'a> {
    Mapped(&'a [AtomicU64]),
    Media,
}

/// What the pass of a batch removal did and saw ([`HashFs::tombstone_pass`]).
#[derive(Debug, Default)]
struct BatchPass {
    /// The slots it tombstoned.
    freed: Vec<u64>,
    /// Slots it saw empty.
    empty: u64,
}

/// Slot counts of a table, from a full scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Never-used (or purged) slots.
    pub empty: u64,
    /// Freed slots.
    pub tombstones: u64,
    /// Slots claimed by an unfinished multi-block insert.
    pub tentative: u64,
    /// Mapped slots.
    pub committed: u64,
    /// Slots staged for a new version of their key (copy-on-write, see the module docs).
    pub staged: u64,
}

impl Occupancy {
    /// Slots an insert may claim.
    pub fn free(&self) -> u64 {
        self.empty + self.tombstones
    }
}

impl<M> std::fmt::Debug for HashFs<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashFs")
            .field("meta", &self.meta)
            .field("data", &self.data)
            .field("kernel", &self.kernel)
            .finish_non_exhaustive()
    }
}

/// Appends block `lblk -> pblk` to `out`, extending the last run if it is contiguous and was
/// appended by this call (index `first` on).
fn push_block<V>(out: &mut V, first: usize, lblk: u64, pblk: u64)
where
    V: Extend<Run> + DerefMut<Target = [Run]>,
{
    if out.len() > first
        && let Some(last) = out.last_mut()
        && last.lblk + last.len == lblk
        && last.pblk.0 + last.len == pblk
    {
        last.len += 1;
        return;
    }
    out.extend([Run {
        lblk,
        pblk: BlockNo(pblk),
        len: 1,
    }]);
}

fn in_region<M: Media>(media: &M, e: Extent) -> bool {
    e.start
        .0
        .checked_add(e.len)
        .is_some_and(|end| end <= media.blocks())
}

impl<M: Media> HashFs<M> {
    /// Blocks of the `meta` extent for a data region of `data_blocks` blocks.
    pub fn meta_blocks(data_blocks: u64) -> u64 {
        2 + data_blocks.div_ceil(SLOTS_PER_BLOCK)
    }

    /// Formats an empty table with a random hash salt. `meta` must have at least
    /// [`meta_blocks(data.len)`](Self::meta_blocks) blocks; slot `i` maps block
    /// `data.start + i`.
    pub fn format(media: M, meta: Extent, data: Extent) -> Result<Self> {
        let salt = RandomState::new().hash_one(meta.start.0 ^ data.start.0.rotate_left(32));
        Self::format_with_salt(media, meta, data, salt)
    }

    /// [`format`](Self::format) with a chosen hash salt (reproducible tests and benches).
    pub fn format_with_salt(media: M, meta: Extent, data: Extent, salt: u64) -> Result<Self> {
        if data.len == 0 || data.len > u32::MAX as u64 {
            return Err(Error::InvalidArgument(
                "hashfs data region must hold 1 to 2^32 - 1 blocks",
            ));
        }
        if meta.len < Self::meta_blocks(data.len) {
            return Err(Error::InvalidArgument("hashfs meta extent too small"));
        }
        if !in_region(&media, meta) || !in_region(&media, data) {
            return Err(Error::InvalidArgument("hashfs extent outside the region"));
        }
        if meta.start < data.end() && data.start < meta.end() {
            return Err(Error::InvalidArgument(
                "hashfs meta and data extents overlap",
            ));
        }
        let shift = if data.len >> CLUSTER_SHIFT > 0 {
            CLUSTER_SHIFT
        } else {
            0
        };
        let this = Self::new(media, meta, data, salt, shift);
        this.media.fill_nt(this.table, this.slots * 8, 0)?;
        this.media.fill_nt(
            meta.start.offset() + FREE_COUNT_WORD,
            BLOCK_SIZE - FREE_COUNT_WORD,
            0,
        )?;
        this.intents.format(&this.media)?;
        this.media.fence();
        let mut h: Header = [Le64::new(0); HEADER_WORDS];
        let fields = [
            MAGIC,
            VERSION,
            meta.start.0,
            meta.len,
            data.start.0,
            data.len,
            salt,
            INTENT_RECORDS,
            u64::from(shift),
        ];
        for (w, v) in h.iter_mut().zip(fields) {
            *w = Le64::new(v);
        }
        h[HEADER_WORDS - 1] = Le64::new(header_crc(&h) as u64);
        let at = meta.start.offset();
        this.media.write_pod(at, &h)?;
        this.media.persist(at, size_of::<Header>() as u64)?;
        Ok(this)
    }

    /// Opens a formatted table; `meta` and `data` must be the extents it was formatted with.
    pub fn open(media: M, meta: Extent, data: Extent) -> Result<Self> {
        if !in_region(&media, meta) {
            return Err(Error::InvalidArgument("hashfs extent outside the region"));
        }
        let at = meta.start.offset();
        let h: Header = media.read_pod(at)?;
        let corrupt = |what| Error::Corrupt { what, at };
        if h[0].get() != MAGIC {
            return Err(corrupt("hashfs header magic"));
        }
        if h[HEADER_WORDS - 1].get() != header_crc(&h) as u64 {
            return Err(corrupt("hashfs header checksum"));
        }
        let version = h[1].get();
        if version != VERSION && version != VERSION_UNCLUSTERED {
            return Err(Error::Unsupported("hashfs format version"));
        }
        let shift = h[8].get();
        let geometry = [meta.start.0, meta.len, data.start.0, data.len];
        if h[2..6].iter().zip(geometry).any(|(w, v)| w.get() != v)
            || h[7].get() != INTENT_RECORDS
            || (version == VERSION_UNCLUSTERED && shift != 0)
            || shift > MAX_SHIFT
            || data.len >> shift == 0
            || data.len == 0
            || data.len > u32::MAX as u64
            || meta.len < Self::meta_blocks(data.len)
            || !in_region(&media, data)
        {
            return Err(corrupt("hashfs header geometry"));
        }
        Ok(Self::new(media, meta, data, h[6].get(), shift as u32))
    }

    fn new(media: M, meta: Extent, data: Extent, salt: u64, shift: u32) -> Self {
        Self {
            media,
            meta,
            data,
            slots: data.len,
            table: (meta.start + 2).offset(),
            intents: IntentTable::new((meta.start + 1).offset(), INTENT_RECORDS, 1),
            salt,
            shift,
            kernel: HashKernel::detect(),
            free_word: meta.start.offset() + FREE_COUNT_WORD,
            chunks: CountChunks::new(meta.start.offset() + CHUNK_WORDS, data.len),
            free_count: Mutex::new(None),
        }
    }

    /// The media the table lives on.
    pub fn media(&self) -> &M {
        &self.media
    }

    /// The data region whose blocks the table hands out.
    pub fn data(&self) -> Extent {
        self.data
    }

    /// The hashing kernel in use.
    pub fn kernel(&self) -> HashKernel {
        self.kernel
    }

    /// Forces a hashing kernel (e.g. [`HashKernel::Scalar`] to test the portable path).
    /// Returns [`Error::Unsupported`] if this CPU cannot run it.
    pub fn set_kernel(&mut self, kernel: HashKernel) -> Result<()> {
        if !kernel.is_supported() {
            return Err(Error::Unsupported("hash kernel not supported by this CPU"));
        }
        self.kernel = kernel;
        Ok(())
    }

    fn slot_off(&self, i: u64) -> PmOff {
        self.table + 8 * i
    }

    fn n32(&self) -> u32 {
        // `slots` is checked to be below 2^32 at format and open.
        self.slots as u32
    }

    fn load(&self, i: u64) -> Result<(u64, Slot)> {
        self.load_in(Words::Media, i)
    }

    /// The table's words for a walk: with a mapped table, a walk of hundreds of slots (a table
    /// filled close to its size) costs a load per slot rather than a call.
    fn words(&self) -> Words<'_> {
        self.media
            .words(self.table, self.slots)
            .map_or(Words::Media, Words::Mapped)
    }

    /// The word of slot `i`, loaded through `words` (acquire, as [`Media::load_u64`]).
    /// Inlined into every walk: a call per slot costs more than the load.
    #[inline(always)]
    fn word(&self, words: Words<'_>, i: u64) -> Result<u64> {
        match words {
            Words::Mapped(t) => t
                .get(i as usize)
                .map(|w| u64::from_le(w.load(Ordering::Acquire)))
                .ok_or_else(|| Error::OutOfBounds {
                    off: self.slot_off(i),
                    len: 8,
                    size: self.media.size(),
                }),
            Words::Media => self.media.load_u64(self.slot_off(i)),
        }
    }

    /// [`load`](Self::load) through `words`.
    #[inline(always)]
    fn load_in(&self, words: Words<'_>, i: u64) -> Result<(u64, Slot)> {
        let w = self.word(words, i)?;
        let s = Slot::decode(w).ok_or_else(|| Error::Corrupt {
            what: "hashfs slot",
            at: self.slot_off(i),
        })?;
        Ok((w, s))
    }

    /// Reads the whole table in bulk, [`SCAN_CHUNK`] words at a time, and calls
    /// `visit(first, words)` with each chunk, `words[0]` being slot `first`: from the first
    /// chunk up, or with `down` from the last one down. Beside concurrent users each word is
    /// seen at its own moment, as loads one by one would see it.
    fn for_each_chunk(
        &self,
        down: bool,
        mut visit: impl FnMut(u64, &[u64]) -> Result<()>,
    ) -> Result<()> {
        let mut words = vec![0u64; SCAN_CHUNK as usize];
        let chunks = self.slots.div_ceil(SCAN_CHUNK);
        for c in 0..chunks {
            let first = SCAN_CHUNK * if down { chunks - 1 - c } else { c };
            let n = SCAN_CHUNK.min(self.slots - first) as usize;
            self.media
                .read_words(self.slot_off(first), &mut words[..n])?;
            visit(first, &words[..n])?;
        }
        Ok(())
    }

    /// Calls `visit(slot, word, decoded)` for every slot of the table, read in bulk
    /// ([`for_each_chunk`](Self::for_each_chunk)): from the first slot up, or with `down`
    /// from the last one down. Scans through [`load`](Self::load), one checked load a slot,
    /// made a `statfs` that followed unlinks on a 4 GiB pool (1 Mi slots; it frees the
    /// deferred files, see [`remove_files`](Self::remove_files)) take 17.8 ms, median of 20
    /// on the mount; in bulk, 7.6 ms. A word that decodes as no slot is loaded again on its
    /// own before it counts as corrupt, so that only [`load`](Self::load) says so.
    fn for_each_slot(
        &self,
        down: bool,
        mut visit: impl FnMut(u64, u64, Slot) -> Result<()>,
    ) -> Result<()> {
        self.for_each_chunk(down, |first, words| {
            let mut each = |k: usize| {
                let i = first + k as u64;
                let (w, s) = self.decoded(i, words[k])?;
                visit(i, w, s)
            };
            if down {
                (0..words.len()).rev().try_for_each(&mut each)
            } else {
                (0..words.len()).try_for_each(&mut each)
            }
        })
    }

    /// Tombstones every slot `i` for which `doomed(i, decoded)` holds, found in one bulk scan
    /// ([`for_each_slot`](Self::for_each_slot)), and settles them as removals do. Exclusive
    /// use (mount time). Returns how many slots it tombstoned.
    fn tombstone_where(&self, mut doomed: impl FnMut(u64, Slot) -> bool) -> Result<u64> {
        let mut gone = Vec::new();
        self.for_each_slot(false, |i, w, s| {
            if doomed(i, s) && self.media.cas_u64(self.slot_off(i), w, TOMBSTONE)?.is_ok() {
                gone.push(i);
            }
            Ok(())
        })?;
        self.settle_freed(&gone)?;
        Ok(gone.len() as u64)
    }

    /// Word `w` of slot `i`, read in bulk, decoded; or, if it decodes as no slot, the slot
    /// loaded again on its own (see [`for_each_slot`](Self::for_each_slot)).
    fn decoded(&self, i: u64, w: u64) -> Result<(u64, Slot)> {
        match Slot::decode(w) {
            Some(s) => Ok((w, s)),
            None => self.load(i),
        }
    }

    fn home(&self, seed: u64, lblk: u64) -> u64 {
        cluster_home(seed, lblk, self.n32(), self.shift)
    }

    /// The home slot of block `lblk` of inode `ino`: where its walk starts (for tests and
    /// diagnostics).
    pub fn home_of(&self, ino: u64, lblk: u64) -> u64 {
        self.home(file_seed(ino, self.salt), lblk)
    }

    /// The cluster size as a shift: blocks `c << shift ..` of a file hash as one key onto
    /// consecutive slots ([`simd`]'s module docs); 0 in tables formatted before clusters.
    pub fn cluster_shift(&self) -> u32 {
        self.shift
    }

    /// Walks the probe sequence of `key` from `home` for a slot whose word is `want`.
    fn probe(&self, home: u64, want: u64) -> Result<Option<u64>> {
        let words = self.words();
        let mut i = home;
        for _ in 0..self.slots {
            let (w, s) = self.load_in(words, i)?;
            if w == want {
                return Ok(Some(i));
            }
            if s == Slot::Empty {
                return Ok(None);
            }
            i = if i + 1 == self.slots { 0 } else { i + 1 };
        }
        Ok(None)
    }

    /// [`probe`](Self::probe) for several keys at once whose homes are consecutive slots,
    /// `home + j` for `want[j]` (the blocks of one cluster): one walk from `home` answers them
    /// all, where a walk each would pass the same slots up to eight times. Key `j`'s walk is
    /// the part of it from `home + j` to the first empty slot after that; sets `found[j]` to
    /// the first slot of it that holds `want[j]`, for each `j` with bit `j` of `mask` set
    /// (`found[j]` stays `None` for a key its walk does not find). Each key so sees the loads
    /// of its own walk, in order, as [`probe`](Self::probe) would.
    fn probe_run(
        &self,
        home: u64,
        want: &[u64],
        mask: u32,
        found: &mut [Option<u64>],
    ) -> Result<()> {
        let words = self.words();
        let n = want.len().min(BATCH) as u32;
        // Keys still walking, and keys whose walk has not begun.
        let mut walking = 0u32;
        let mut ahead = mask;
        let mut i = home;
        // Key `j`'s walk is slots `j..j + self.slots` of this one: in a table without an empty
        // slot, the whole table from its home round to the slot before it.
        for t in 0..self.slots + u64::from(n) - 1 {
            if t < u64::from(n) && ahead & 1 << t != 0 {
                ahead &= !(1 << t);
                walking |= 1 << t;
            }
            if t >= self.slots {
                walking &= !(1 << (t - self.slots));
            }
            let (w, s) = self.load_in(words, i)?;
            if s == Slot::Empty {
                walking = 0;
            } else {
                let mut m = walking;
                while m != 0 {
                    let j = m.trailing_zeros();
                    m &= m - 1;
                    if want[j as usize] == w {
                        found[j as usize] = Some(i);
                        walking &= !(1 << j);
                    }
                }
            }
            if walking == 0 && ahead == 0 {
                break;
            }
            i = if i + 1 == self.slots { 0 } else { i + 1 };
        }
        Ok(())
    }

    /// Looks for committed `key` in the cache line of its home slot only (spare-lane
    /// read-ahead: cheap because the line was just prefetched).
    fn probe_line(&self, home: u64, want: u64) -> Result<Option<u64>> {
        let line_end = ((home / SLOTS_PER_LINE) + 1) * SLOTS_PER_LINE;
        let words = self.words();
        for i in home..line_end.min(self.slots) {
            let (w, s) = self.load_in(words, i)?;
            if w == want {
                return Ok(Some(i));
            }
            if s == Slot::Empty {
                break;
            }
        }
        Ok(None)
    }

    /// Claims the first free slot on the probe sequence from `home` by CAS to `word`, then
    /// [seals](Self::seal_walk) the walk behind it. `word` must be invisible to lookups
    /// (tentative or staged): until the seal is done, a lookup may stop short of the slot.
    /// Callers flush the claimed slot.
    fn claim(&self, home: u64, word: u64) -> Result<Option<u64>> {
        self.claim_from(home, home, word)
    }

    /// Claims a slot for the block homed at `home` whose word is `word`, the next block of a
    /// run the caller claims for: `prev` is the home and the slot of the caller's claim just
    /// before, if any, and becomes this claim's. If that block was homed at `home - 1` (the
    /// blocks of a cluster), this claim starts right after its slot
    /// ([`claim_from`](Self::claim_from)), else at `home`.
    fn claim_next(
        &self,
        prev: &mut Option<(u64, u64)>,
        home: u64,
        word: u64,
    ) -> Result<Option<u64>> {
        let from = match *prev {
            Some((h, slot)) if h + 1 == home => (slot + 1) % self.slots,
            _ => home,
        };
        let claimed = self.claim_from(home, from, word)?;
        *prev = claimed.map(|i| (home, i));
        Ok(claimed)
    }

    /// [`claim`](Self::claim) from slot `from` of the walk from `home` on, sealing only
    /// `[from, at)`. `from` is [`claim_next`](Self::claim_next)'s: the caller's claim just
    /// before, for the key homed at `home - 1`, took slot `from - 1`, and with its seal (and
    /// those of the claims it chained on) left no empty slot from `home - 1` up to it, for
    /// as long as that slot stays non-empty. That slot (claimed, later perhaps a tombstone)
    /// stays non-empty while slot `from` does, since a reclaim empties a slot only when the
    /// next one is empty, and this claim's seal keeps `[from, at)` non-empty while its own
    /// slot is claimed: the whole walk from `home` has no empty slot, as a walk of its own
    /// would leave it. The blocks of a cluster so walk and seal the slots past their homes
    /// once between them, not once each. A slot before `from` freed since the claim before
    /// is skipped: this claim lands a little further out.
    fn claim_from(&self, home: u64, from: u64, word: u64) -> Result<Option<u64>> {
        let words = self.words();
        let mut i = from;
        let skipped = (from + self.slots - home) % self.slots;
        for _ in skipped..self.slots {
            let (mut w, mut s) = self.load_in(words, i)?;
            while s.is_free() {
                let off = self.slot_off(i);
                match self.media.cas_u64(off, w, word)? {
                    Ok(_) => {
                        self.note_free_change(true, Some(&[i]))?;
                        if i != from {
                            self.seal_walk(words, from, i)?;
                        }
                        return Ok(Some(i));
                    }
                    Err(actual) => {
                        w = actual;
                        s = Slot::decode(actual).ok_or(Error::Corrupt {
                            what: "hashfs slot",
                            at: off,
                        })?;
                    }
                }
            }
            i = if i + 1 == self.slots { 0 } else { i + 1 };
        }
        Ok(None)
    }

    /// Makes every slot of `[home, at)` non-empty for as long as slot `at` stays claimed: an
    /// empty or purging slot becomes a tombstone (flushed; the caller's fence orders it).
    /// The claim walked past these slots while they were in use, but a [reclaim](Self::reclaim)
    /// may have emptied one since. Walks down from `at - 1`, with a sequentially consistent
    /// fence before each slot's load: a reclaim empties slot `k` only after marking it purging
    /// and then seeing slot `k + 1` empty, while the seal loads slot `k` only after its write
    /// to slot `k + 1` (the claim, or the seal's own CAS there, or a failed CAS that read
    /// another claim), so of the two, one sees the other (a Dekker handshake per slot), and by
    /// induction from `at` down no slot of the walk is left empty. One fence before the whole
    /// walk is not enough: the loom model `tests/loom_hashfs.rs` finds a removal of two
    /// entries that cuts the claim off when the seal's later steps are not fenced.
    fn seal_walk(&self, words: Words<'_>, home: u64, at: u64) -> Result<()> {
        let mut i = at;
        while i != home {
            i = if i == 0 { self.slots - 1 } else { i - 1 };
            fence_after_rmw();
            let mut w = self.word(words, i)?;
            while w == EMPTY || w == PURGING {
                let off = self.slot_off(i);
                match self.media.cas_u64(off, w, TOMBSTONE)? {
                    Ok(_) => {
                        self.media.flush(off, 8)?;
                        break;
                    }
                    Err(actual) => w = actual,
                }
            }
        }
        Ok(())
    }

    /// Turns back into empty slots the tombstones that no walk needs because an empty slot
    /// follows them, starting from the run of tombstones at each of `freed` (slots just
    /// tombstoned, durably): the run is followed forwards to its end (at most
    /// [`RECLAIM_SCAN`] slots) and, if an empty slot ends it, emptied backwards. Each slot
    /// goes tombstone → purging (CAS), then, after a sequentially consistent fence, back to
    /// tombstone if the next slot is no longer empty, else to empty (CAS). A
    /// [seal](Self::seal_walk) that meets a purging slot turns it into a tombstone, which
    /// makes the last CAS fail. Lock-free and safe beside every other operation; the emptied
    /// slots are not flushed (a tombstone read back after a crash is as correct, and
    /// recovery reads a purging slot as one).
    fn reclaim(&self, freed: &[u64]) -> Result<()> {
        let next = |i: u64| if i + 1 == self.slots { 0 } else { i + 1 };
        let words = self.words();
        'runs: for &start in freed {
            let mut last = start;
            let mut scanned = 0;
            loop {
                let w = self.word(words, next(last))?;
                if w == EMPTY {
                    break;
                }
                scanned += 1;
                if w != TOMBSTONE || next(last) == start || scanned == RECLAIM_SCAN {
                    continue 'runs;
                }
                last = next(last);
            }
            let mut i = last;
            loop {
                let next_empty = || Ok(self.word(words, next(i))? == EMPTY);
                if !self.empty_if(i, next_empty)? {
                    continue 'runs;
                }
                i = if i == 0 { self.slots - 1 } else { i - 1 };
                // Mostly a live entry: a plain load spares a locked instruction.
                if self.word(words, i)? != TOMBSTONE {
                    continue 'runs;
                }
            }
        }
        Ok(())
    }

    /// The slot of committed `(file, lblk)` if the translation cache knows it and PM agrees.
    fn cached(&self, file: &HashFsFile, lblk: u64) -> Result<Option<u64>> {
        match file.cache.get(lblk) {
            Some(i) if i < self.slots => {
                let w = self.media.load_u64(self.slot_off(i))?;
                Ok((w == Key::new(file.ino, lblk).committed()).then_some(i))
            }
            _ => Ok(None),
        }
    }

    /// Whether a range is better served by one scan of the table than by one walk per block.
    fn use_scan(&self, lblk: u64, end: u64) -> bool {
        end - lblk > self.slots / 4
    }

    /// Calls `f(lblk, slot)` for every committed slot in `[lblk, end)` of `ino`, in ascending
    /// logical order, found by one scan of the table (for ranges [`use_scan`](Self::use_scan)
    /// picks).
    fn scan_committed(
        &self,
        ino: u64,
        lblk: u64,
        end: u64,
        f: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let mut hits = Vec::new();
        self.for_each_slot(false, |i, w, s| {
            if let Slot::Committed(k) = s
                && k.ino == ino
                && (lblk..end).contains(&k.lblk)
                && w == k.committed()
            {
                hits.push((k.lblk, i));
            }
            Ok(())
        })?;
        hits.sort_unstable();
        // A block removed and inserted again by a writer of the file while a lookup
        // scanned may be seen twice; either slot is one it had during the lookup.
        hits.dedup_by_key(|h| h.0);
        hits.into_iter().for_each(|(l, i)| f(l, i));
        Ok(())
    }

    /// Fills each `None` of `found` with the committed slot of block `lblk + j` of `file`, if
    /// it is mapped, walking from `homes[j]`: blocks with consecutive homes (one cluster) that
    /// are missing together share one walk ([`probe_run`](Self::probe_run)).
    fn probe_misses(
        &self,
        file: &HashFsFile,
        lblk: u64,
        homes: &[u64],
        found: &mut [Option<u64>],
    ) -> Result<()> {
        let want = |j: usize| Key::new(file.ino, lblk + j as u64).committed();
        let mut j = 0;
        while j < found.len() {
            if found[j].is_some() {
                j += 1;
                continue;
            }
            let mut end = j + 1;
            while end < found.len() && homes[end] == homes[end - 1] + 1 {
                end += 1;
            }
            let mask = (j..end)
                .filter(|&k| found[k].is_none())
                .fold(0u32, |m, k| m | 1 << (k - j));
            if mask.count_ones() == 1 {
                found[j] = self.probe(homes[j], want(j))?;
            } else {
                let wants: SmallVec<[u64; BATCH]> = (j..end).map(want).collect();
                self.probe_run(homes[j], &wants, mask, &mut found[j..end])?;
            }
            j = end;
        }
        Ok(())
    }

    /// The batched lookup of `[lblk, end)` (no scan), with the translation cache. A lookup
    /// on behalf of the caller (`client`) moves the handle's cursor and, if it continues the
    /// previous one, reads ahead with the spare lanes; internal lookups of inserts and removes
    /// do neither.
    fn lookup_batched(
        &self,
        file: &HashFsFile,
        lblk: u64,
        end: u64,
        out: &mut Vec<Run>,
        client: bool,
    ) -> Result<()> {
        let read_ahead = client && file.cursor.swap(end, Ordering::Relaxed) == lblk;
        let first = out.len();
        let mut ahead = HomesAhead::new(self, file, lblk, end);
        let mut l = lblk;
        while l < end {
            let count = BATCH.min((end - l) as usize);
            let hinted = ahead.next(self, file, l);
            let pipelined = hinted.is_some();
            let mut found = [None; BATCH];
            let mut misses = 0;
            for (j, f) in found[..count].iter_mut().enumerate() {
                *f = self.cached(file, l + j as u64)?;
                misses += usize::from(f.is_none());
            }
            if misses > 0 {
                let homes = hinted.unwrap_or_else(|| {
                    home_slots(self.kernel, file.seed, l, self.n32(), self.shift)
                });
                let lanes = if read_ahead {
                    BATCH.min((LBLK_LIMIT - l) as usize)
                } else {
                    count
                };
                for (j, &h) in homes[..lanes].iter().enumerate() {
                    if j >= count || (!pipelined && found[j].is_none()) {
                        self.media.prefetch(self.slot_off(h));
                    }
                }
                self.probe_misses(file, l, &homes[..count], &mut found[..count])?;
                for (j, f) in found[..count].iter().enumerate() {
                    if let Some(i) = *f {
                        file.cache.put(l + j as u64, i);
                    }
                }
                for (j, &h) in homes.iter().enumerate().take(lanes).skip(count) {
                    let b = l + j as u64;
                    if file.cache.get(b).is_none()
                        && let Some(i) = self.probe_line(h, Key::new(file.ino, b).committed())?
                    {
                        file.cache.put(b, i);
                    }
                }
            }
            for (j, f) in found[..count].iter().enumerate() {
                if let Some(i) = f {
                    push_block(out, first, l + j as u64, self.data.start.0 + i);
                }
            }
            l += count as u64;
        }
        Ok(())
    }

    fn lookup_range(
        &self,
        file: &HashFsFile,
        lblk: u64,
        end: u64,
        out: &mut Vec<Run>,
        client: bool,
    ) -> Result<()> {
        if lblk >= end {
            return Ok(());
        }
        if !self.use_scan(lblk, end) {
            return self.lookup_batched(file, lblk, end, out, client);
        }
        let first = out.len();
        let start = self.data.start.0;
        self.scan_committed(file.ino, lblk, end, &mut |l, i| {
            push_block(out, first, l, start + i)
        })
    }

    /// A single-block insert: a CAS to tentative, a store of the committed word, then flush
    /// and fence.
    fn insert_one(&self, file: &HashFsFile, lblk: u64) -> Result<u64> {
        let home = self.home(file.seed, lblk);
        let key = Key::new(file.ino, lblk);
        let i = self.claim(home, key.tentative())?.ok_or(Error::NoSpace)?;
        self.commit_claimed(i, key)?;
        Ok(i)
    }

    /// Flips slot `i`, claimed for `key`, to committed, durably. When that fails the slot
    /// holds a block the caller will not use: gives it back, or, should that fail too,
    /// leaves it to the next mount's sweep ([`recovery_owed`](FileMapping::recovery_owed)).
    fn commit_claimed(&self, i: u64, key: Key) -> Result<()> {
        let off = self.slot_off(i);
        let committed = self
            .media
            .store_u64(off, key.committed())
            .and_then(|()| self.media.persist(off, 8));
        if committed.is_err() && self.give_back(i).is_err() {
            self.intents.owe();
        }
        committed
    }

    /// Gives back slot `i`, which this thread claimed and nobody else writes.
    fn give_back(&self, i: u64) -> Result<()> {
        self.unclaim(&[i])?;
        self.persist_slots(&[i])?;
        self.reclaim(&[i])
    }

    /// A multi-block insert under an intent record (see the module docs).
    fn insert_many(&self, file: &HashFsFile, lblk: u64, end: u64) -> Result<Vec<u64>> {
        let mut intent = self.intents.acquire(&self.media)?;
        intent.begin(INSERT_CLAIMING, [file.ino, lblk, end, 0, 0, 0])?;
        let mut claimed = Vec::with_capacity((end - lblk) as usize);
        let mut l = lblk;
        let mut full = false;
        let mut prev = None;
        'claim: while l < end {
            let homes = home_slots(self.kernel, file.seed, l, self.n32(), self.shift);
            let count = BATCH.min((end - l) as usize);
            for &h in &homes[..count] {
                self.media.prefetch(self.slot_off(h));
            }
            for (j, &h) in homes[..count].iter().enumerate() {
                match self.claim_next(&mut prev, h, Key::new(file.ino, l + j as u64).tentative())? {
                    Some(i) => claimed.push(i),
                    None => {
                        full = true;
                        break 'claim;
                    }
                }
            }
            l += count as u64;
        }
        if full {
            self.unclaim(&claimed)?;
            self.persist_slots(&claimed)?;
            intent.finish()?;
            self.reclaim(&claimed)?;
            return Err(Error::NoSpace);
        }
        self.persist_slots(&claimed)?;
        intent.set_kind(INSERT_COMMITTED)?;
        for (j, &i) in claimed.iter().enumerate() {
            let key = Key::new(file.ino, lblk + j as u64);
            self.media.store_u64(self.slot_off(i), key.committed())?;
        }
        self.persist_slots(&claimed)?;
        intent.finish()?;
        Ok(claimed)
    }

    /// Writes back the lines of `slots`. Callers issue all their CASes and stores first and
    /// flush afterwards: on x86 a locked instruction waits for earlier CLWB/CLFLUSHOPT to
    /// complete, so a flush between two CASes would serialise the write-backs.
    fn flush_slots(&self, slots: &[u64]) -> Result<()> {
        // Slots come mostly in runs (a cluster's, a claim walk's): collapsing neighbours on
        // the same line first leaves the sort an eighth of the work.
        let mut lines: SmallVec<[u64; 16]> = SmallVec::new();
        for line in slots.iter().map(|i| i / SLOTS_PER_LINE) {
            if lines.last() != Some(&line) {
                lines.push(line);
            }
        }
        lines.sort_unstable();
        lines.dedup();
        for line in lines {
            self.media
                .flush(self.slot_off(line * SLOTS_PER_LINE), CACHE_LINE)?;
        }
        Ok(())
    }

    /// [Writes back](Self::flush_slots) the lines of `slots`, then fences: the slots'
    /// changes are durable on return.
    fn persist_slots(&self, slots: &[u64]) -> Result<()> {
        self.flush_slots(slots)?;
        self.media.fence();
        Ok(())
    }

    /// Tombstones the given slots (all committed blocks of one remove), atomically.
    fn tombstone(&self, ino: u64, lblk: u64, end: u64, hits: &[(u64, u64)]) -> Result<u64> {
        if hits.is_empty() {
            return Ok(0);
        }
        let mut intent = None;
        if hits.len() > 1 {
            let mut rec = self.intents.acquire(&self.media)?;
            rec.begin(REMOVING, [ino, lblk, end, 0, 0, 0])?;
            intent = Some(rec);
        }
        let mut freed = Vec::with_capacity(hits.len());
        for &(l, i) in hits {
            let off = self.slot_off(i);
            if self
                .media
                .cas_u64(off, Key::new(ino, l).committed(), TOMBSTONE)?
                .is_ok()
            {
                freed.push(i);
            }
        }
        self.freed(&freed)?;
        self.persist_slots(&freed)?;
        if let Some(rec) = intent {
            rec.finish()?;
        }
        self.reclaim(&freed)?;
        Ok(freed.len() as u64)
    }

    /// Tombstones every slot of the files `inos` (their data, log and extended-attribute
    /// blocks, staged and tentative versions too) in one pass over the table: what
    /// [`remove_file`](FileMapping::remove_file) does for each of them, with one scan for all.
    /// Nothing may use these files meanwhile. Durable when it returns; returns the slots
    /// freed.
    ///
    /// Then reclaims the tombstones: from each freed slot, as every removal does, unless fewer
    /// than one slot in four was empty during the pass. In such a table, and above all in one
    /// filled to the last slot (a batch removal is what follows an insert that found no space),
    /// the online reclaim, which needs an empty slot at the end of a run of tombstones, can do
    /// little; there [`reclaim_all`](Self::reclaim_all) empties every tombstone no walk needs,
    /// for two more scans of the table. Run after every batch, those scans made a `statfs` that
    /// followed unlinks on a mostly empty 4 GiB pool take 7.6 ms; 2.8 ms with the online
    /// reclaim.
    pub fn remove_files(&self, inos: &std::collections::HashSet<u64>) -> Result<u64> {
        if inos.is_empty() {
            return Ok(0);
        }
        let (freed, empty) = self.tombstone_files(inos)?;
        self.reclaim_batch(&freed, empty)?;
        Ok(freed.len() as u64)
    }

    /// [`remove_files`](Self::remove_files), then [`free_blocks`](Self::free_blocks), with
    /// the free slots counted in the removal's pass over the table instead of one more: a
    /// `statfs` frees the deferred files first. Returns the free slots.
    pub fn remove_files_and_count(&self, inos: &std::collections::HashSet<u64>) -> Result<u64> {
        let mut kept = self.free_count.lock().unwrap_or_else(|e| e.into_inner());
        let mut k = self.place_tokens()?;
        let pass = self.tombstone_pass(inos, &mut k.free)?;
        // No note of the change: the count saw each slot after this pass's own CAS on it,
        // and the tokens stay to show that nobody else changed one since they were placed.
        self.persist_slots(&pass.freed)?;
        self.reclaim_batch(&pass.freed, pass.empty)?;
        let n = k.free.iter().sum();
        *kept = Some(k);
        Ok(n)
    }

    /// The pass of [`remove_files`](Self::remove_files): tombstones the slots of `inos`,
    /// durably, and reclaims none. Returns the slots it freed and how many slots it saw
    /// empty. Public for the loom models, which follow it with
    /// [`reclaim_all`](Self::reclaim_all) as `remove_files` does on a crowded table.
    pub fn tombstone_files(
        &self,
        inos: &std::collections::HashSet<u64>,
    ) -> Result<(Vec<u64>, u64)> {
        let pass = self.tombstone_pass(inos, &mut self.chunk_counts())?;
        self.freed(&pass.freed)?;
        self.persist_slots(&pass.freed)?;
        Ok((pass.freed, pass.empty))
    }

    /// The compare-and-swaps of a batch removal, one pass over the table that also counts
    /// the slots it leaves empty, and those it leaves free into `free` (by count chunk, as
    /// [`chunk_counts`](Self::chunk_counts) has them); not flushed, and no note of the change.
    /// Each chunk's free and empty words are counted first, branch-free, and only the others
    /// decoded: a `statfs` after unlinks on a mostly empty 4 GiB pool took 3.1 ms when the
    /// pass decoded every word, and 1.3-1.5 ms so (medians of 20, two runs).
    fn tombstone_pass(
        &self,
        inos: &std::collections::HashSet<u64>,
        free: &mut [u64],
    ) -> Result<BatchPass> {
        let mut p = BatchPass::default();
        let len = self.chunks.len;
        self.for_each_chunk(false, |first, words| {
            p.empty += words.iter().map(|&w| u64::from(w == EMPTY)).sum::<u64>();
            let mut f = words.iter().map(|&w| u64::from(free_word(w))).sum::<u64>();
            for (k, &w) in words.iter().enumerate() {
                if free_word(w) {
                    continue;
                }
                let i = first + k as u64;
                match self.decoded(i, w)? {
                    (_, s) if s.is_free() => f += 1,
                    (w, Slot::Committed(k) | Slot::Tentative(k) | Slot::Staged(k))
                        if inos.contains(&k.ino)
                            && self.media.cas_u64(self.slot_off(i), w, TOMBSTONE)?.is_ok() =>
                    {
                        p.freed.push(i);
                        f += 1;
                    }
                    _ => {}
                }
            }
            free[(first / len) as usize] += f;
            Ok(())
        })?;
        Ok(p)
    }

    /// The reclaim of a batch removal that freed `freed` and saw `empty` empty slots (see
    /// [`remove_files`](Self::remove_files)).
    fn reclaim_batch(&self, freed: &[u64], empty: u64) -> Result<()> {
        if empty < self.slots / RECLAIM_ALL_BELOW {
            self.reclaim_all()?;
        } else {
            self.reclaim(freed)?;
        }
        Ok(())
    }

    /// Counts empty, tombstoned, tentative and committed slots (a full scan).
    pub fn occupancy(&self) -> Result<Occupancy> {
        let mut o = Occupancy::default();
        self.for_each_slot(false, |_, _, s| {
            match s {
                Slot::Empty => o.empty += 1,
                Slot::Tombstone | Slot::Purging => o.tombstones += 1,
                Slot::Tentative(_) => o.tentative += 1,
                Slot::Committed(_) => o.committed += 1,
                Slot::Staged(_) => o.staged += 1,
            }
            Ok(())
        })?;
        Ok(o)
    }

    /// Number of data blocks an insert may still claim: the free slots ([`Slot::is_free`]).
    ///
    /// Counting them is a scan of the table (8 bytes a block), so the count is kept and
    /// given again for as long as the free-count word still holds the token this call left
    /// there before it counted. Every change of a slot between free and taken, in any process,
    /// is noted after the change (`note_free_change`): it zeroes the chunk word of each count
    /// chunk it changed, then turns a token in the free-count word into [`CHUNKS_CHANGED`]. A
    /// count puts its tokens in those words before it scans: either the scan sees a change, or
    /// the change's note sees the token and zeroes it. So a count after a change scans again
    /// only the chunks whose word no longer holds this process's chunk token (a `statfs`
    /// after a file was created: one chunk, 1/256 of a 4 GiB pool's table, where it used to
    /// scan the whole table), and the whole table when the free-count word is zero (a note
    /// that could not tell which slots changed) or another process's token.
    /// A process that counts replaces another's tokens, which makes the other count again
    /// too. A batch removal that counts ([`remove_files_and_count`](Self::remove_files_and_count))
    /// places its tokens before its pass and leaves its own changes unnoted: its count saw
    /// each of them.
    pub fn free_blocks(&self) -> Result<u64> {
        let mut kept = self.free_count.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let w = self.media.load_u64(self.free_word)?;
            let Some(k) = kept.as_mut() else { break };
            if w == k.token {
                return Ok(k.free.iter().sum());
            }
            if w != CHUNKS_CHANGED {
                break;
            }
            let token = new_token();
            if self
                .media
                .cas_u64(self.free_word, CHUNKS_CHANGED, token)?
                .is_err()
            {
                continue;
            }
            native::fence_after_rmw();
            let mut words = Vec::new();
            for c in 0..self.chunks.count {
                let at = self.chunks.word(c);
                if self.media.load_u64(at)? != k.chunk_token {
                    self.media.store_u64(at, k.chunk_token)?;
                    std::sync::atomic::fence(Ordering::SeqCst);
                    k.free[c as usize] = self.count_chunk(c, &mut words)?;
                }
            }
            k.token = token;
            return Ok(k.free.iter().sum());
        }
        let mut k = self.place_tokens()?;
        let mut words = Vec::new();
        for (c, free) in k.free.iter_mut().enumerate() {
            *free = self.count_chunk(c as u64, &mut words)?;
        }
        let n = k.free.iter().sum();
        *kept = Some(k);
        Ok(n)
    }

    /// The free slots, counted afresh with a scan of the table that writes nothing (no
    /// tokens): for a reader that must leave the table as it is, such as a checker.
    /// [`free_blocks`](Self::free_blocks) keeps its count for the next call.
    pub fn count_free(&self) -> Result<u64> {
        let mut words = Vec::new();
        (0..self.chunks.count).try_fold(0, |n, c| Ok(n + self.count_chunk(c, &mut words)?))
    }

    /// A zero count for each count chunk.
    fn chunk_counts(&self) -> Vec<u64> {
        vec![0; self.chunks.count as usize]
    }

    /// Puts new tokens in the free-count word and every chunk word, before a count of the
    /// whole table: see [`free_blocks`](Self::free_blocks). Returns them, with zero counts.
    fn place_tokens(&self) -> Result<KeptCount> {
        let k = KeptCount {
            token: new_token(),
            chunk_token: new_token(),
            free: self.chunk_counts(),
        };
        for c in 0..self.chunks.count {
            self.media.store_u64(self.chunks.word(c), k.chunk_token)?;
        }
        self.media.store_u64(self.free_word, k.token)?;
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(k)
    }

    /// Notes that `slots` changed between free and taken: called after the change, before
    /// the change's operation returns (see [`free_blocks`](Self::free_blocks)). `after_rmw`:
    /// the changes were compare-and-swaps, after which x86 needs no fence to order the
    /// words' loads (as [`fence_after_rmw`]); after plain stores, a `SeqCst` fence. `None`:
    /// any slot may have changed, and every count starts again from the whole table. The
    /// fences are std's, not the loom facade's: the loom models never count, and they build
    /// their tables outside the model, where loom's fences cannot run.
    fn note_free_change(&self, after_rmw: bool, slots: Option<&[u64]>) -> Result<()> {
        if after_rmw {
            native::fence_after_rmw();
        } else {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        let w = self.media.load_u64(self.free_word)?;
        if w == 0 {
            // Every count starts again from the whole table: it scans after it placed its
            // tokens, and so sees this change, since this load did not see them.
            return Ok(());
        }
        let Some(slots) = slots else {
            self.media.store_u64(self.free_word, 0)?;
            return Ok(());
        };
        let chunks = self.chunks;
        let mut last = u64::MAX;
        let mut zeroed = false;
        for &i in slots {
            let c = chunks.of(i);
            if c != last {
                last = c;
                if self.media.load_u64(chunks.word(c))? != 0 {
                    self.media.store_u64(chunks.word(c), 0)?;
                    zeroed = true;
                }
            }
        }
        // A counter that finds CHUNKS_CHANGED here reads the chunk words after it: the
        // stores above must be visible before this load (store-load order needs a fence).
        if zeroed {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        let w = self.media.load_u64(self.free_word)?;
        if w != 0 && w != CHUNKS_CHANGED {
            // A failed CAS found the word changed: by an older process's note (zero), a
            // change's (CHUNKS_CHANGED), or a counter's token placed since this note zeroed
            // the chunk words, which that counter then reads.
            let _ = self.media.cas_u64(self.free_word, w, CHUNKS_CHANGED)?;
        }
        Ok(())
    }

    /// Makes the slots this thread claimed tombstones again (not flushed).
    fn unclaim(&self, claimed: &[u64]) -> Result<()> {
        for &i in claimed {
            self.media.store_u64(self.slot_off(i), TOMBSTONE)?;
        }
        self.note_free_change(false, Some(claimed))
    }

    /// [`note_free_change`](Self::note_free_change) after the compare-and-swaps that freed
    /// `slots`, if any did.
    fn freed(&self, slots: &[u64]) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        self.note_free_change(true, Some(slots))
    }

    /// Settles the tombstones that this thread's compare-and-swaps just made of `slots`:
    /// notes the free-count change, makes them durable, then [reclaims](Self::reclaim) the
    /// runs they end.
    fn settle_freed(&self, slots: &[u64]) -> Result<()> {
        self.freed(slots)?;
        self.persist_slots(slots)?;
        self.reclaim(slots)
    }

    /// The free slots of count chunk `c`, counted from bulk reads of [`SCAN_CHUNK`] words
    /// into `words` (grown to that size). A word that is no slot at all counts as taken
    /// here; [`occupancy`](Self::occupancy) reports it.
    fn count_chunk(&self, c: u64, words: &mut Vec<u64>) -> Result<u64> {
        words.resize(SCAN_CHUNK as usize, 0);
        let end = self.slots.min((c + 1) * self.chunks.len);
        let mut free = 0;
        let mut at = c * self.chunks.len;
        while at < end {
            let n = SCAN_CHUNK.min(end - at) as usize;
            self.media.read_words(self.slot_off(at), &mut words[..n])?;
            free += words[..n]
                .iter()
                .map(|&w| u64::from(free_word(w)))
                .sum::<u64>();
            at += n as u64;
        }
        Ok(free)
    }

    /// Turns every tombstone that no walk needs back into an empty slot, and returns how
    /// many it emptied. A tombstone is needed when it lies between a live entry and that
    /// entry's home; any other one only lengthens the walks of lookups that miss, and a long
    /// life of writes and removals can leave a table with no empty slot at all, where every
    /// miss walks the whole table.
    ///
    /// Two passes over the table and no memory. Needs exclusive use of the table: `&mut self`
    /// excludes other users in this process; the caller must also keep other processes out
    /// (mount or fsck time, see [`HashFs::purge_exclusive`]). Crash-safe at every point: an
    /// emptied slot lies on no live entry's walk, so no lookup stops early at it.
    pub fn purge_tombstones(&mut self) -> Result<u64> {
        self.purge_exclusive(&mut |_| {})
    }

    /// [`HashFs::purge_tombstones`] through a shared reference, for the owner of a pool at
    /// mount, before it lets any other thread or process use the table. The first pass also
    /// shows `owners` the inode number of every committed entry, once per slot: the mount
    /// learns from it which inodes map blocks without a second pass over the table.
    pub fn purge_exclusive(&self, owners: &mut dyn FnMut(u64)) -> Result<u64> {
        let mut purged = 0;
        self.tombstones_by_need(owners, &mut |i, s, needed| {
            let off = self.slot_off(i);
            if !needed {
                self.media.store_u64(off, EMPTY)?;
                self.media.flush(off, 8)?;
                purged += 1;
            } else if s == Slot::Purging {
                self.media.store_u64(off, TOMBSTONE)?;
                self.media.flush(off, 8)?;
            }
            Ok(())
        })?;
        self.media.fence();
        Ok(purged)
    }

    /// [`HashFs::purge_tombstones`] beside concurrent users of the table (other threads and
    /// processes): the same two passes pick the tombstones no walk needs, and each is emptied
    /// only after it is marked purging and a walk from it to the next empty slot finds no
    /// entry whose own walk passes it (the handshake of the module docs, with the scan
    /// standing in for "the next slot is empty"). Going down from the end of the table, the
    /// slots it empties end the next scans early; in a table with no empty slot the first
    /// scan walks the whole table. Returns how many slots it emptied.
    pub fn reclaim_all(&self) -> Result<u64> {
        let mut emptied = 0;
        self.tombstones_by_need(&mut |_| {}, &mut |i, s, needed| {
            if !needed && s == Slot::Tombstone && self.try_empty(i)? {
                emptied += 1;
            }
            Ok(())
        })?;
        Ok(emptied)
    }

    /// Calls `visit(slot, word, needed)` for every tombstone and purging slot, from the last
    /// slot down to the first, where `needed` tells whether a live entry's walk passes it.
    /// Two passes and no memory: the first finds the entries whose walk wraps past the end
    /// of the table (and shows `owners` the inode of each committed one), the second walks
    /// backwards keeping the smallest home among the entries after the slot, up to the next
    /// empty slot. Beside concurrent users the answer is a hint (the table changes under the
    /// scan).
    fn tombstones_by_need(
        &self,
        owners: &mut dyn FnMut(u64),
        visit: &mut dyn FnMut(u64, Slot, bool) -> Result<()>,
    ) -> Result<()> {
        let n = self.slots;
        let home = |s: Slot| match s {
            Slot::Tentative(k) | Slot::Committed(k) | Slot::Staged(k) => {
                Some(self.home(file_seed(k.ino, self.salt), k.lblk))
            }
            Slot::Empty | Slot::Tombstone | Slot::Purging => None,
        };
        // An entry whose home lies after it wrapped: it needs [home, n) and [0, slot).
        let (mut wrap_from, mut wrap_to) = (n, 0);
        self.for_each_slot(false, |i, w, s| {
            if let Slot::Committed(k) = s
                && w == k.committed()
            {
                owners(k.ino);
            }
            if let Some(h) = home(s)
                && h > i
            {
                wrap_from = wrap_from.min(h);
                wrap_to = wrap_to.max(i);
            }
            Ok(())
        })?;
        // The smallest home of the entries after slot `i`, up to the next empty slot, that
        // did not wrap.
        let mut min_home = n;
        self.for_each_slot(true, |i, _, s| {
            match s {
                Slot::Empty => min_home = n,
                Slot::Tombstone | Slot::Purging => {
                    visit(i, s, i < wrap_to || i >= wrap_from || min_home <= i)?;
                }
                _ => {
                    if let Some(h) = home(s)
                        && h <= i
                    {
                        min_home = min_home.min(h);
                    }
                }
            }
            Ok(())
        })
    }

    /// Empties tombstone `i` if no entry's walk passes it: marks it purging, then (after a
    /// sequentially consistent fence) walks from it to the next empty slot looking for an
    /// entry whose walk from its home passes `i`. Returns whether it emptied the slot.
    fn try_empty(&self, i: u64) -> Result<bool> {
        let n = self.slots;
        self.empty_if(i, || {
            let mut j = i;
            for _ in 1..n {
                j = if j + 1 == n { 0 } else { j + 1 };
                match self.load(j)?.1 {
                    Slot::Empty => break,
                    Slot::Tombstone | Slot::Purging => {}
                    Slot::Tentative(k) | Slot::Committed(k) | Slot::Staged(k) => {
                        let h = self.home(file_seed(k.ino, self.salt), k.lblk);
                        if (i + n - h) % n < (j + n - h) % n {
                            return Ok(false);
                        }
                    }
                }
            }
            Ok(true)
        })
    }

    /// The reclaim handshake on tombstone `i`, shared by [`reclaim`](Self::reclaim) and
    /// [`try_empty`](Self::try_empty): marks it purging (CAS), then, after a sequentially
    /// consistent fence, asks `unneeded` whether any walk still needs it. If one does, the
    /// slot goes back to a tombstone; if none does, it becomes empty (CAS), unless a
    /// [seal](Self::seal_walk) made it a tombstone meanwhile. Returns whether it emptied
    /// the slot.
    fn empty_if(&self, i: u64, unneeded: impl FnOnce() -> Result<bool>) -> Result<bool> {
        let off = self.slot_off(i);
        if self.media.cas_u64(off, TOMBSTONE, PURGING)?.is_err() {
            return Ok(false);
        }
        fence_after_rmw();
        if !unneeded()? {
            // Fails only if a seal already made it a tombstone.
            let _ = self.media.cas_u64(off, PURGING, TOMBSTONE)?;
            return Ok(false);
        }
        Ok(self.media.cas_u64(off, PURGING, EMPTY)?.is_ok())
    }

    /// Makes every live entry reachable again after a crash: an empty slot between an
    /// entry's home and the entry (a claim by an operation whose store never became durable,
    /// while a later claim walking past it did) becomes a tombstone. One pass over the table
    /// plus a walk over each broken chain. Returns how many slots it changed.
    fn repair_chains(&self) -> Result<u64> {
        let n = self.slots;
        let mut anchor = None;
        for i in 0..n {
            if self.load(i)?.1 == Slot::Empty {
                anchor = Some(i);
                break;
            }
        }
        let Some(e0) = anchor else {
            return Ok(0);
        };
        let mut last_empty = Some(e0);
        let mut fixed = 0;
        for step in 1..=n {
            let j = (e0 + step) % n;
            match self.load(j)?.1 {
                Slot::Empty => last_empty = Some(j),
                Slot::Tombstone | Slot::Purging => {}
                Slot::Tentative(k) | Slot::Committed(k) | Slot::Staged(k) => {
                    let h = self.home(file_seed(k.ino, self.salt), k.lblk);
                    let chain = (j + n - h) % n;
                    if last_empty.is_some_and(|e| (j + n - e) % n <= chain) {
                        let mut i = h;
                        while i != j {
                            if self.load(i)?.1 == Slot::Empty {
                                self.media.store_u64(self.slot_off(i), TOMBSTONE)?;
                                self.media.flush(self.slot_off(i), 8)?;
                                fixed += 1;
                            }
                            i = (i + 1) % n;
                        }
                        last_empty = self.prev_empty(h)?;
                    }
                }
            }
        }
        Ok(fixed)
    }

    /// The nearest empty slot before `from` (walking backwards, wrapping).
    fn prev_empty(&self, from: u64) -> Result<Option<u64>> {
        let mut i = from;
        for _ in 0..self.slots {
            i = if i == 0 { self.slots - 1 } else { i - 1 };
            if self.load(i)?.1 == Slot::Empty {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    fn check_recovered(&self, at: PmOff, ino: u64, lblk: u64, end: u64) -> Result<()> {
        if ino > MAX_INO || lblk > end || end > LBLK_LIMIT {
            return Err(Error::Corrupt {
                what: "hashfs intent record",
                at,
            });
        }
        Ok(())
    }
}

fn header_crc(h: &Header) -> u32 {
    let bytes = h.as_bytes();
    crc32c(&bytes[..bytes.len() - 8])
}

impl<M: Media> FileMapping for HashFs<M> {
    type File = HashFsFile;

    fn kind(&self) -> MappingKind {
        MappingKind::HashFs
    }

    fn open_file(&self, id: FileId) -> Result<HashFsFile> {
        if id.ino > MAX_INO {
            return Err(Error::InvalidArgument(
                "inode number too large for a global table",
            ));
        }
        Ok(HashFsFile {
            ino: id.ino,
            seed: file_seed(id.ino, self.salt),
            cache: TranslationCache::default(),
            cursor: AtomicU64::new(u64::MAX),
        })
    }

    fn lookup(&self, file: &HashFsFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let end = lblk.saturating_add(len).min(LBLK_LIMIT);
        self.lookup_range(file, lblk, end, out, true)
    }

    /// A range longer than a quarter of the table's slots costs one pass over the table that
    /// keeps the least block found, instead of a probe per block.
    fn first_mapped(&self, file: &HashFsFile, lblk: u64, len: u64) -> Result<Option<u64>> {
        let end = lblk.saturating_add(len).min(LBLK_LIMIT);
        if lblk >= end || !self.use_scan(lblk, end) {
            return first_mapped_by_lookups(self, file, lblk, end.saturating_sub(lblk));
        }
        let mut first = None;
        self.for_each_slot(false, |_, w, s| {
            if let Slot::Committed(k) = s
                && k.ino == file.ino
                && (lblk..end).contains(&k.lblk)
                && w == k.committed()
                && first.is_none_or(|f| k.lblk < f)
            {
                first = Some(k.lblk);
            }
            Ok(())
        })?;
        Ok(first)
    }

    fn prefetch(&self, file: &HashFsFile, lblk: u64) {
        self.media
            .prefetch(self.slot_off(self.home(file.seed, lblk)));
    }

    fn insert(&self, file: &HashFsFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = range_end(lblk, len)?;
        let mut existing = Vec::new();
        self.lookup_range(file, lblk, end, &mut existing, false)?;
        if !existing.is_empty() {
            return Err(Error::InvalidArgument("insert over mapped blocks"));
        }
        if len > self.slots {
            return Err(Error::NoSpace);
        }
        let claimed = if len == 1 {
            vec![self.insert_one(file, lblk)?]
        } else {
            self.insert_many(file, lblk, end)?
        };
        let first = out.len();
        for (j, &i) in claimed.iter().enumerate() {
            file.cache.put(lblk + j as u64, i);
            push_block(out, first, lblk + j as u64, self.data.start.0 + i);
        }
        Ok(())
    }

    fn insert_at(&self, file: &HashFsFile, run: Run) -> Result<()> {
        self.promote(file, run)
    }

    fn remove(&self, file: &HashFsFile, lblk: u64, len: u64) -> Result<u64> {
        let end = lblk.saturating_add(len).min(LBLK_LIMIT);
        if lblk >= end {
            return Ok(0);
        }
        let mut hits = Vec::new();
        if self.use_scan(lblk, end) {
            self.scan_committed(file.ino, lblk, end, &mut |l, i| hits.push((l, i)))?;
        } else {
            let mut runs = Vec::new();
            self.lookup_batched(file, lblk, end, &mut runs, false)?;
            for r in runs {
                for k in 0..r.len {
                    hits.push((r.lblk + k, r.pblk.0 - self.data.start.0 + k));
                }
            }
        }
        let freed = self.tombstone(file.ino, lblk, end, &hits)?;
        file.cache.invalidate(lblk, end);
        Ok(freed)
    }

    fn remove_file(&self, file: &HashFsFile) -> Result<()> {
        self.remove(file, 0, LBLK_LIMIT).map(drop)
    }

    fn owned_blocks(&self, file: &HashFsFile, visit: &mut dyn FnMut(Extent)) -> Result<()> {
        let mut runs = Vec::new();
        self.lookup_range(file, 0, LBLK_LIMIT, &mut runs, false)?;
        runs.iter().for_each(|r| visit(r.extent()));
        Ok(())
    }

    fn visit_all(&self, visit: &mut dyn FnMut(u64, Run)) -> Result<bool> {
        // Consecutive slots that hold consecutive blocks of one file (a cluster) make one run.
        let mut run: Option<(u64, Run)> = None;
        let start = self.data.start.0;
        self.for_each_slot(false, |i, w, s| {
            let Slot::Committed(k) = s else {
                return Ok(());
            };
            if w != k.committed() {
                return Ok(());
            }
            match &mut run {
                Some((ino, r))
                    if *ino == k.ino
                        && r.lblk + r.len == k.lblk
                        && r.pblk.0 + r.len == start + i =>
                {
                    r.len += 1;
                }
                _ => {
                    if let Some((ino, r)) = run.take() {
                        visit(ino, r);
                    }
                    run = Some((
                        k.ino,
                        Run {
                            lblk: k.lblk,
                            pblk: BlockNo(start + i),
                            len: 1,
                        },
                    ));
                }
            }
            Ok(())
        })?;
        if let Some((ino, r)) = run {
            visit(ino, r);
        }
        Ok(true)
    }

    fn recovery_owed(&self) -> bool {
        self.intents.recovery_owed()
    }

    fn recover(&self) -> Result<()> {
        let records = self.intents.scan(
            &self.media,
            &[INSERT_CLAIMING, INSERT_COMMITTED, REMOVING, PROMOTING],
        )?;
        let mut live = Vec::with_capacity(records.len());
        for r in &records {
            let [ino, lblk, end, first, ..] = r.fields;
            let at = self.intents.record(r.index);
            self.check_recovered(at, ino, lblk, end)?;
            if r.kind == PROMOTING && first.checked_add(end - lblk).is_none_or(|e| e > self.slots) {
                return Err(Error::Corrupt {
                    what: "hashfs promote record",
                    at,
                });
            }
            live.push((r.kind, ino, lblk..end, first));
        }
        let covered = |kind: u8, k: Key| {
            live.iter()
                .any(|(rk, ino, range, _)| *rk == kind && *ino == k.ino && range.contains(&k.lblk))
        };
        // A staged slot is promoted only if a promote record names exactly this slot for its
        // key: other writers may hold staged versions of the same key elsewhere.
        let promoted = |k: Key, i: u64| {
            live.iter().any(|(rk, ino, range, first)| {
                *rk == PROMOTING
                    && *ino == k.ino
                    && range.contains(&k.lblk)
                    && i == first + (k.lblk - range.start)
            })
        };
        for i in 0..self.slots {
            let new = match self.load(i)?.1 {
                Slot::Tentative(k) if covered(INSERT_COMMITTED, k) => Some(k.committed()),
                Slot::Tentative(_) => Some(TOMBSTONE),
                Slot::Committed(k) if covered(REMOVING, k) => Some(TOMBSTONE),
                Slot::Staged(k) if promoted(k, i) => Some(k.committed()),
                Slot::Purging => Some(TOMBSTONE),
                _ => None,
            };
            if let Some(w) = new {
                self.media.store_u64(self.slot_off(i), w)?;
                self.media.flush(self.slot_off(i), 8)?;
            }
        }
        self.note_free_change(false, None)?;
        self.repair_chains()?;
        self.media.fence();
        self.intents.reset(&self.media)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pmfs_core::pm::HeapRegion;

    use super::*;

    const META: Extent = Extent {
        start: BlockNo(1),
        len: 3,
    };

    fn table(slots: u64) -> HashFs<Arc<HeapRegion>> {
        let data = Extent::new(BlockNo(8), slots);
        let r = Arc::new(HeapRegion::new((8 + slots) * BLOCK_SIZE).unwrap());
        HashFs::format_with_salt(r, META, data, 7).unwrap()
    }

    fn file(t: &HashFs<Arc<HeapRegion>>, ino: u64) -> HashFsFile {
        t.open_file(FileId {
            ino,
            root: PmOff(0),
        })
        .unwrap()
    }

    fn blocks(t: &HashFs<Arc<HeapRegion>>, f: &HashFsFile, lblk: u64, len: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        t.lookup(f, lblk, len, &mut runs).unwrap();
        runs.iter()
            .flat_map(|r| (0..r.len).map(move |k| (r.lblk + k, r.pblk.0 + k)))
            .collect()
    }

    #[test]
    fn format_open_and_header_damage() {
        let t = table(100);
        let data = t.data();
        let media = t.media().clone();
        let f = file(&t, 3);
        let mut out = Vec::new();
        t.insert(&f, 10, 4, &mut out).unwrap();
        let t2 = HashFs::open(media.clone(), META, data).unwrap();
        let f2 = file(&t2, 3);
        assert_eq!(blocks(&t2, &f2, 0, 100), blocks(&t, &f, 0, 100));
        assert!(matches!(
            HashFs::open(media.clone(), META, Extent::new(BlockNo(8), 99)),
            Err(Error::Corrupt { .. })
        ));
        media.store_u64(META.start.offset() + 48, 12345).unwrap();
        assert!(matches!(
            HashFs::open(media.clone(), META, data),
            Err(Error::Corrupt { .. })
        ));
        media.store_u64(META.start.offset(), 1).unwrap();
        assert!(matches!(
            HashFs::open(media, META, data),
            Err(Error::Corrupt { .. })
        ));
    }

    /// Rewrites header word `w` of `t`'s table and reseals the header.
    fn rewrite_header(t: &HashFs<Arc<HeapRegion>>, w: usize, v: u64) {
        let at = META.start.offset();
        let mut h: Header = t.media().read_pod(at).unwrap();
        h[w] = Le64::new(v);
        h[HEADER_WORDS - 1] = Le64::new(header_crc(&h) as u64);
        t.media().write_pod(at, &h).unwrap();
    }

    fn runs_of(t: &HashFs<Arc<HeapRegion>>, f: &HashFsFile, lblk: u64, len: u64) -> Vec<Run> {
        let mut runs = Vec::new();
        t.lookup(f, lblk, len, &mut runs).unwrap();
        runs
    }

    #[test]
    fn a_file_lies_in_runs_of_whole_clusters_and_new_versions_stay_together() {
        let t = table(512);
        assert_eq!(t.cluster_shift(), CLUSTER_SHIFT);
        let f = file(&t, 3);
        let mut out = Vec::new();
        t.insert(&f, 0, 64, &mut out).unwrap();
        // Eight clusters of eight blocks: eight physically contiguous runs (fewer if two
        // happen to follow each other).
        let runs = runs_of(&t, &f, 0, 64);
        assert!(runs.len() <= 8, "{runs:?}");
        assert_eq!(runs.iter().map(|r| r.len).sum::<u64>(), 64);
        // Copy-on-write of a whole cluster: the new versions walk past the old ones together
        // and land in consecutive slots too.
        let mut staged = Vec::new();
        t.stage(&f, 16, 8, &mut staged).unwrap();
        assert_eq!(staged.len(), 1, "{staged:?}");
        let losers = t.apply_writes(&f, &staged).unwrap();
        t.drop_superseded(&f, &losers).unwrap();
        assert_eq!(runs_of(&t, &f, 16, 8), staged);
        // A table of version 1 hashes every block on its own.
        let t = table(512);
        rewrite_header(&t, 8, 0);
        rewrite_header(&t, 1, VERSION_UNCLUSTERED);
        let t = HashFs::open(t.media().clone(), META, t.data()).unwrap();
        assert_eq!(t.cluster_shift(), 0);
        let f = file(&t, 3);
        t.insert(&f, 0, 64, &mut out).unwrap();
        let seed = file_seed(3, t.salt);
        for (l, p) in blocks(&t, &f, 0, 64) {
            let h = simd::home_slot(seed, l, 512);
            assert_eq!(t.home_of(3, l), h);
            assert!(
                (p - t.data().start.0 + 512 - h) % 512 < 8,
                "block {l} far from home"
            );
        }
    }

    #[test]
    fn headers_with_a_bad_cluster_shift_are_refused() {
        let t = table(100);
        let (media, data) = (t.media().clone(), t.data());
        rewrite_header(&t, 8, MAX_SHIFT + 1);
        assert!(matches!(
            HashFs::open(media.clone(), META, data),
            Err(Error::Corrupt { .. })
        ));
        // A shift that leaves no whole group of slots.
        rewrite_header(&t, 8, 7);
        assert!(matches!(
            HashFs::open(media.clone(), META, data),
            Err(Error::Corrupt { .. })
        ));
        // Version 1 knows no clusters.
        rewrite_header(&t, 8, u64::from(CLUSTER_SHIFT));
        rewrite_header(&t, 1, VERSION_UNCLUSTERED);
        assert!(matches!(
            HashFs::open(media.clone(), META, data),
            Err(Error::Corrupt { .. })
        ));
        rewrite_header(&t, 1, VERSION + 1);
        assert!(matches!(
            HashFs::open(media.clone(), META, data),
            Err(Error::Unsupported(_))
        ));
        rewrite_header(&t, 1, VERSION);
        assert!(HashFs::open(media, META, data).is_ok());
        // A table too small for one cluster hashes every block on its own.
        assert_eq!(table(5).cluster_shift(), 0);
    }

    #[test]
    fn format_rejects_bad_geometry() {
        let r = Arc::new(HeapRegion::new(64 * BLOCK_SIZE).unwrap());
        let bad = [
            (META, Extent::new(BlockNo(8), 0)),
            (Extent::new(BlockNo(1), 2), Extent::new(BlockNo(8), 10)),
            (META, Extent::new(BlockNo(2), 10)),
            (META, Extent::new(BlockNo(60), 10)),
        ];
        for (meta, data) in bad {
            assert!(matches!(
                HashFs::format(r.clone(), meta, data),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert_eq!(HashFs::<HeapRegion>::meta_blocks(512), 3);
        assert_eq!(HashFs::<HeapRegion>::meta_blocks(513), 4);
    }

    #[test]
    fn slot_index_is_the_physical_block() {
        let t = table(64);
        let f = file(&t, 9);
        let mut out = Vec::new();
        t.insert(&f, 0, 20, &mut out).unwrap();
        for (l, p) in blocks(&t, &f, 0, 20) {
            let i = p - t.data().start.0;
            let (_, s) = t.load(i).unwrap();
            assert_eq!(s, Slot::Committed(Key::new(9, l)));
        }
        assert_eq!(t.occupancy().unwrap().committed, 20);
    }

    #[test]
    fn full_table_fails_without_change_and_wraps_around() {
        let t = table(16);
        let (a, b) = (file(&t, 1), file(&t, 2));
        let mut out = Vec::new();
        t.insert(&a, 0, 10, &mut out).unwrap();
        t.insert(&b, 100, 6, &mut out).unwrap();
        assert_eq!(t.free_blocks().unwrap(), 0);
        let before = (blocks(&t, &a, 0, 50), blocks(&t, &b, 0, 200));
        out.clear();
        assert!(matches!(t.insert(&a, 20, 1, &mut out), Err(Error::NoSpace)));
        assert!(matches!(t.insert(&a, 20, 3, &mut out), Err(Error::NoSpace)));
        assert!(out.is_empty());
        assert_eq!((blocks(&t, &a, 0, 50), blocks(&t, &b, 0, 200)), before);
        assert_eq!(t.remove(&b, 100, 6).unwrap(), 6);
        // Six free slots: a seven-block insert claims six, then rolls them back.
        assert!(matches!(t.insert(&a, 20, 7, &mut out), Err(Error::NoSpace)));
        assert_eq!(t.free_blocks().unwrap(), 6);
        assert_eq!(t.occupancy().unwrap().tentative, 0);
        t.insert(&a, 20, 6, &mut out).unwrap();
        assert_eq!(blocks(&t, &a, 0, 50).len(), 16);
    }

    /// A reclaim killed between marking a slot purging and emptying it leaves the slot
    /// purging for good: claims must take it like a tombstone, or a full table would lose it
    /// until the next mount.
    #[test]
    fn a_slot_left_purging_by_a_dead_reclaim_is_claimed() {
        let t = table(16);
        let (a, b) = (file(&t, 1), file(&t, 2));
        let mut out = Vec::new();
        t.insert(&a, 0, 16, &mut out).unwrap();
        let (gone, pblk) = blocks(&t, &a, 0, 16)[5];
        let slot = pblk - t.data().start.0;
        assert_eq!(t.remove(&a, gone, 1).unwrap(), 1);
        // No empty slot follows it in a full table: the removal left a tombstone.
        assert_eq!(t.load(slot).unwrap().1, Slot::Tombstone);
        t.media.store_u64(t.slot_off(slot), PURGING).unwrap();
        assert_eq!(t.free_blocks().unwrap(), 1);
        out.clear();
        t.insert(&b, 0, 1, &mut out).unwrap();
        assert_eq!(blocks(&t, &b, 0, 1), vec![(0, pblk)]);
        assert_eq!(t.load(slot).unwrap().1, Slot::Committed(Key::new(2, 0)));
        assert_eq!(t.free_blocks().unwrap(), 0);
    }

    #[test]
    fn insert_over_mapped_blocks_is_refused() {
        let t = table(64);
        let f = file(&t, 4);
        let mut out = Vec::new();
        t.insert(&f, 5, 3, &mut out).unwrap();
        assert!(matches!(
            t.insert(&f, 0, 6, &mut out),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            t.insert(&f, LBLK_LIMIT - 1, 2, &mut out),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(t.occupancy().unwrap().committed, 3);
    }

    /// The bulk counts of free slots, kept and fresh, agree with the slot-by-slot scan, over
    /// chunk edges and with every kind of slot in the table; the fresh count writes nothing.
    #[test]
    fn free_blocks_counts_what_occupancy_calls_free() {
        // Two header blocks and 18 blocks of slot words.
        let meta = Extent::new(BlockNo(1), 20);
        let data = Extent::new(BlockNo(24), 9000);
        let r = Arc::new(HeapRegion::new((24 + 9000) * BLOCK_SIZE).unwrap());
        let t = HashFs::format_with_salt(r, meta, data, 7).unwrap();
        let header = |t: &HashFs<Arc<HeapRegion>>| {
            let mut b = vec![0u8; BLOCK_SIZE as usize];
            t.media.read(meta.start.offset(), &mut b).unwrap();
            b
        };
        let check = |t: &HashFs<Arc<HeapRegion>>| {
            let free = t.occupancy().unwrap().free();
            let before = header(t);
            assert_eq!(t.count_free().unwrap(), free);
            assert!(header(t) == before, "the fresh count wrote to the header");
            assert_eq!(t.free_blocks().unwrap(), free);
        };
        check(&t);
        assert_eq!(t.free_blocks().unwrap(), 9000);
        let mut out = Vec::new();
        for ino in 1..=3 {
            t.insert(&file(&t, ino), 0, 2000, &mut out).unwrap();
        }
        check(&t);
        assert_eq!(t.free_blocks().unwrap(), 3000);
        let f = file(&t, 2);
        for l in (0..2000).step_by(3) {
            assert_eq!(t.remove(&f, l, 1).unwrap(), 1);
        }
        check(&t);
        let last = t.slots - 1;
        for (i, w) in [
            (0, PURGING),
            (last, Key::new(9, 1).tentative()),
            (last - 1, Key::new(9, 2).staged()),
        ] {
            t.media.store_u64(t.slot_off(i), w).unwrap();
            t.note_free_change(false, Some(&[i])).unwrap();
            check(&t);
        }
    }

    /// A count is kept until a slot changes between free and taken, through this handle or
    /// another one on the same table (another process), and each handle's count stays exact
    /// while the other counts too.
    #[test]
    fn kept_free_counts_follow_changes_made_through_any_handle() {
        let a = table(256);
        let b = HashFs::open(a.media().clone(), META, a.data()).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 256);
        assert_ne!(a.media.load_u64(a.free_word).unwrap(), 0);
        // Nothing changed: the kept count, and the token stays.
        let token = a.media.load_u64(a.free_word).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 256);
        assert_eq!(a.media.load_u64(a.free_word).unwrap(), token);
        let mut out = Vec::new();
        let f = file(&b, 1);
        b.insert(&f, 0, 20, &mut out).unwrap();
        assert_eq!(a.media.load_u64(a.free_word).unwrap(), CHUNKS_CHANGED);
        assert_eq!(a.free_blocks().unwrap(), 236);
        assert_eq!(b.free_blocks().unwrap(), 236);
        assert_eq!(b.remove(&f, 0, 5).unwrap(), 5);
        assert_eq!(a.free_blocks().unwrap(), 241);
        let g = file(&a, 2);
        let mut runs = Vec::new();
        a.stage(&g, 0, 3, &mut runs).unwrap();
        assert_eq!(b.free_blocks().unwrap(), 238);
        a.unstage(&runs).unwrap();
        assert_eq!(b.free_blocks().unwrap(), 241);
        assert_eq!(a.free_blocks().unwrap(), 241);
        b.remove_file(&f).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 256);
        assert_eq!(b.free_blocks().unwrap(), a.occupancy().unwrap().free());
    }

    /// A batch removal that counts returns the count a scan after it gives, keeps it while
    /// nothing changes, and lets a change through another handle end it: the others' counts
    /// end when it counts.
    #[test]
    fn a_counting_batch_removal_keeps_an_exact_count() {
        let a = table(256);
        let b = HashFs::open(a.media().clone(), META, a.data()).unwrap();
        let mut out = Vec::new();
        for ino in 1..=3 {
            a.insert(&file(&a, ino), 0, 30, &mut out).unwrap();
        }
        assert_eq!(b.free_blocks().unwrap(), 166);
        assert_eq!(a.remove_files_and_count(&[1, 3].into()).unwrap(), 226);
        assert_eq!(a.occupancy().unwrap().free(), 226);
        assert!(blocks(&a, &file(&a, 1), 0, 30).is_empty());
        let token = a.media.load_u64(a.free_word).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 226);
        assert_eq!(a.media.load_u64(a.free_word).unwrap(), token);
        assert_eq!(b.free_blocks().unwrap(), 226);
        b.remove(&file(&b, 2), 0, 10).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 236);
    }

    /// Takes slot `i` behind the table's back: a change that no note tells of, which only a
    /// scan of its chunk can see.
    fn take_unnoted(t: &HashFs<Arc<HeapRegion>>, i: u64) {
        assert_eq!(t.load(i).unwrap().1, Slot::Empty);
        t.media
            .store_u64(t.slot_off(i), Key::new(99, i).committed())
            .unwrap();
    }

    /// After a noted change, a count scans again the changed chunks alone: a slot taken
    /// unnoted in another chunk stays uncounted until a count of the whole table, which a
    /// zero free-count word asks for.
    #[test]
    fn a_count_after_changes_scans_only_the_chunks_that_changed() {
        let a = table(256);
        let chunks = a.chunks;
        assert_eq!((chunks.len, chunks.count), (SCAN_CHUNK, 256 / SCAN_CHUNK));
        let b = HashFs::open(a.media().clone(), META, a.data()).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 256);
        let f = file(&b, 1);
        let mut out = Vec::new();
        b.insert(&f, 0, 1, &mut out).unwrap();
        let taken = out[0].pblk.0 - a.data().start.0;
        let words = |t: &HashFs<Arc<HeapRegion>>| -> Vec<u64> {
            (0..chunks.count)
                .map(|c| t.media.load_u64(chunks.word(c)).unwrap())
                .collect()
        };
        let zeroed: Vec<u64> = (0..chunks.count)
            .filter(|&c| words(&a)[c as usize] == 0)
            .collect();
        assert_eq!(zeroed, [taken / chunks.len]);
        assert_eq!(a.media.load_u64(a.free_word).unwrap(), CHUNKS_CHANGED);
        // A slot of another chunk taken unnoted: the next count does not scan that chunk.
        let other = (taken + chunks.len) % 256 / chunks.len * chunks.len;
        take_unnoted(&a, other);
        assert_eq!(a.free_blocks().unwrap(), 255);
        assert!(
            words(&a)
                .iter()
                .all(|&w| w == words(&a)[0] && w > CHUNKS_CHANGED)
        );
        // b's count is of the whole table (its first), and replaces a's tokens.
        assert_eq!(b.free_blocks().unwrap(), 254);
        assert_eq!(b.remove(&f, 0, 1).unwrap(), 1);
        assert_eq!(a.free_blocks().unwrap(), 255);
        // A zero free-count word: the whole table again.
        a.media.store_u64(a.free_word, 0).unwrap();
        assert_eq!(a.free_blocks().unwrap(), 255);
        take_unnoted(&a, (other + 1) % 256);
        a.note_free_change(false, None).unwrap();
        assert_eq!(a.media.load_u64(a.free_word).unwrap(), 0);
        assert_eq!(a.free_blocks().unwrap(), 254);
        assert_eq!(a.occupancy().unwrap().free(), 254);
    }

    /// Counts kept beside inserts and removals in several threads and two handles (two
    /// processes): once the threads are done, the counting handle's count is the scan's. Only
    /// `a` counts during the rounds, so that its counts after the first rescan the changed
    /// chunks alone.
    #[test]
    fn kept_counts_are_exact_after_concurrent_changes() {
        let a = Arc::new(table(512));
        let b = Arc::new(HashFs::open(a.media().clone(), META, a.data()).unwrap());
        a.free_blocks().unwrap();
        for round in 0..20u64 {
            std::thread::scope(|s| {
                for (n, t) in [&a, &b, &a].into_iter().enumerate() {
                    s.spawn(move || {
                        let f = file(t, 1 + n as u64);
                        let mut out = Vec::new();
                        for k in 0..40 {
                            let lblk = (round * 7 + k * 3) % 60;
                            if (k + n as u64).is_multiple_of(3) {
                                t.remove(&f, lblk, 2).unwrap();
                            } else {
                                let _ = t.insert(&f, lblk, 1, &mut out);
                            }
                        }
                    });
                }
                s.spawn(|| {
                    for _ in 0..20 {
                        a.free_blocks().unwrap();
                    }
                });
            });
            assert_eq!(
                a.free_blocks().unwrap(),
                a.occupancy().unwrap().free(),
                "round {round}"
            );
        }
        assert_eq!(b.free_blocks().unwrap(), a.occupancy().unwrap().free());
    }

    #[test]
    fn tombstones_keep_chains_and_purge_restores_empty_slots() {
        let t = table(32);
        let f = file(&t, 1);
        let mut out = Vec::new();
        t.insert(&f, 0, 28, &mut out).unwrap();
        let all = blocks(&t, &f, 0, 28);
        for l in (0..28).step_by(2) {
            assert_eq!(t.remove(&f, l, 1).unwrap(), 1);
        }
        let odd: Vec<_> = all.iter().copied().filter(|(l, _)| l % 2 == 1).collect();
        assert_eq!(blocks(&t, &f, 0, 28), odd);
        let g = file(&t, 1);
        assert_eq!(blocks(&t, &g, 0, 28), odd);
        let mut t = t;
        let occ = t.occupancy().unwrap();
        assert_eq!((occ.committed, occ.tombstones + occ.empty), (14, 18));
        let purged = t.purge_tombstones().unwrap();
        assert_eq!(t.occupancy().unwrap().tombstones, occ.tombstones - purged);
        assert_eq!(blocks(&t, &g, 0, 28), odd);
        // With every entry gone, the removal's reclaim empties every tombstone.
        t.remove_file(&g).unwrap();
        assert_eq!(t.occupancy().unwrap().empty, 32);
        assert_eq!(t.purge_tombstones().unwrap(), 0);
    }

    /// The purge's pass names the owner of every committed slot, and of nothing else.
    #[test]
    fn the_purge_shows_the_owner_of_each_committed_slot() {
        let t = table(32);
        let mut out = Vec::new();
        let (f, g) = (file(&t, 1), file(&t, 5));
        t.insert(&f, 0, 6, &mut out).unwrap();
        t.insert(&g, 0, 3, &mut out).unwrap();
        t.remove(&g, 1, 2).unwrap();
        t.remove(&f, 4, 1).unwrap();
        let mut owners = std::collections::BTreeMap::new();
        t.purge_exclusive(&mut |ino| *owners.entry(ino).or_insert(0) += 1)
            .unwrap();
        assert_eq!(owners.into_iter().collect::<Vec<_>>(), [(1, 5), (5, 1)]);
    }

    /// After writes and removals fill a table to the last slot (no empty slot left, where
    /// every miss walks the whole table), the purge empties exactly the tombstones no walk
    /// needs, and every entry is still found.
    #[test]
    fn purge_empties_exactly_the_unneeded_tombstones_of_a_full_table() {
        full_tables_lose_exactly_their_unneeded_tombstones(|t| t.purge_tombstones().unwrap());
    }

    /// The same for the reclaim that runs beside other users (a batch removal's).
    #[test]
    fn reclaim_all_empties_exactly_the_unneeded_tombstones_of_a_full_table() {
        full_tables_lose_exactly_their_unneeded_tombstones(|t| t.reclaim_all().unwrap());
    }

    /// A batch removal from a table filled to the last slot, where no run of tombstones ends
    /// in an empty slot for the online reclaim, still leaves empty slots, and the other
    /// file's blocks where they were.
    #[test]
    fn a_batch_removal_from_a_full_table_leaves_empty_slots() {
        let t = table(256);
        let files = [file(&t, 1), file(&t, 2)];
        let mut out = Vec::new();
        let mut l = 0;
        while t.occupancy().unwrap().free() > 0 {
            t.insert(&files[(l % 2) as usize], l, 1, &mut out).unwrap();
            l += 1;
        }
        let kept: Vec<_> = (1..l)
            .step_by(2)
            .map(|k| blocks(&t, &files[1], k, 1))
            .collect();
        assert_eq!(t.remove_files(&[1].into()).unwrap(), l.div_ceil(2));
        assert!(t.occupancy().unwrap().empty > 0);
        for (k, b) in (1..l).step_by(2).zip(kept) {
            assert_eq!(blocks(&t, &files[1], k, 1), b);
        }
    }

    fn full_tables_lose_exactly_their_unneeded_tombstones(
        empty: impl Fn(&mut HashFs<Arc<HeapRegion>>) -> u64,
    ) {
        let mut total = 0;
        for seed in 1..=20u64 {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = |m: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % m
            };
            let slots = 64 + next(200);
            let mut t = table(slots);
            let files: Vec<_> = (1..=3).map(|ino| file(&t, ino)).collect();
            let mut out = Vec::new();
            // Single-block inserts at scattered offsets until the table is full.
            let mut live = Vec::new();
            while t.occupancy().unwrap().free() > 0 {
                let f = next(3) as usize;
                let l = next(10_000);
                if !live.contains(&(f, l)) {
                    t.insert(&files[f], l, 1, &mut out).unwrap();
                    live.push((f, l));
                }
            }
            // Remove about half, leaving tombstones everywhere and no empty slot.
            let mut kept = Vec::new();
            for (f, l) in live {
                if next(2) == 0 {
                    assert_eq!(t.remove(&files[f], l, 1).unwrap(), 1);
                } else {
                    kept.push((f, l));
                }
            }
            assert_eq!(t.occupancy().unwrap().empty, 0, "seed {seed}");
            let before: Vec<_> = kept
                .iter()
                .map(|&(f, l)| blocks(&t, &files[f], l, 1))
                .collect();

            // The tombstones on no live entry's walk, by brute force.
            let n = t.slots;
            let walks: Vec<(u64, u64)> = (0..n)
                .filter_map(|p| match t.load(p).unwrap().1 {
                    Slot::Committed(k) => Some((t.home(file_seed(k.ino, t.salt), k.lblk), p)),
                    _ => None,
                })
                .collect();
            let unneeded: Vec<u64> = (0..n)
                .filter(|&i| {
                    t.load(i).unwrap().1 == Slot::Tombstone
                        && !walks
                            .iter()
                            .any(|&(h, p)| (i + n - h) % n < (p + n - h) % n)
                })
                .collect();

            assert_eq!(empty(&mut t), unneeded.len() as u64, "seed {seed}");
            total += unneeded.len();
            for i in 0..n {
                let empty = t.load(i).unwrap().1 == Slot::Empty;
                assert_eq!(empty, unneeded.contains(&i), "seed {seed}: slot {i}");
            }
            for (i, &(f, l)) in kept.iter().enumerate() {
                assert_eq!(
                    blocks(&t, &files[f], l, 1),
                    before[i],
                    "seed {seed}: lost {l}"
                );
            }
            assert_eq!(empty(&mut t), 0, "seed {seed}: a second purge");
        }
        assert!(total > 20, "only {total} tombstones were unneeded");
    }

    /// Churn at half load would wear the empty slots away (inserts take an empty slot whenever
    /// their walk meets one before a tombstone) if removals left only tombstones: after eight
    /// rounds no slot was empty and every miss walked the whole table. Reclaim keeps them.
    #[test]
    fn churn_keeps_empty_slots_because_removals_reclaim_them() {
        let slots = 512;
        let t = table(slots);
        let files: Vec<_> = (1..=8).map(|ino| file(&t, ino)).collect();
        let mut out = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for round in 0..64u64 {
            // Half the table in runs of 1 to 16 blocks at fresh offsets, then all removed.
            let mut made = Vec::new();
            let mut used = 0;
            while used < slots / 2 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let (f, len) = ((rng % 8) as usize, 1 + (rng >> 8) % 16);
                let lblk = round * 100_000 + used;
                t.insert(&files[f], lblk, len, &mut out).unwrap();
                made.push((f, lblk, len));
                used += len;
            }
            let half = t.occupancy().unwrap();
            assert!(
                half.empty >= slots / 4,
                "round {round}: {} of {slots} slots empty at half load",
                half.empty
            );
            for (f, lblk, len) in made {
                assert_eq!(t.remove(&files[f], lblk, len).unwrap(), len);
            }
            assert_eq!(t.occupancy().unwrap().empty, slots, "round {round}");
        }
    }

    /// One walk for the blocks of a cluster finds what one walk per block finds, whichever of
    /// them are asked for, as the table fills to the last slot (where walks go all the way
    /// round) and empties again.
    #[test]
    fn a_shared_walk_finds_what_one_walk_per_key_finds() {
        let t = table(64);
        let files: Vec<_> = (1..=3).map(|ino| file(&t, ino)).collect();
        let mut live: Vec<(usize, u64, u64)> = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut full_seen = false;
        for step in 0..3000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let f = (rng % 3) as usize;
            if (step / 500) % 2 == 0 {
                let len = 1 + (rng >> 8) % 4;
                let lblk = step * 8 + (rng >> 12) % 4;
                match t.insert(&files[f], lblk, len, &mut Vec::new()) {
                    Ok(()) => live.push((f, lblk, len)),
                    Err(Error::NoSpace) => full_seen = true,
                    Err(e) => panic!("insert: {e}"),
                }
            } else if !live.is_empty() {
                let (f, lblk, len) = live.swap_remove((rng >> 16) as usize % live.len());
                assert_eq!(t.remove(&files[f], lblk, len).unwrap(), len);
            }
            // Each live run's cluster, and a block or two around it that may be unmapped.
            for &(f, lblk, len) in &live {
                let file = &files[f];
                let first = lblk & !7;
                let homes = home_slots(t.kernel, file.seed, first, t.n32(), t.shift);
                let mut found = [None; BATCH];
                for (j, slot) in found.iter_mut().enumerate() {
                    // Blocks asked for are `None`; some others stand in as already known.
                    if (rng >> (20 + j)) & 3 == 0
                        && !(lblk..lblk + len).contains(&(first + j as u64))
                    {
                        *slot = Some(u64::MAX);
                    }
                }
                let asked = found;
                t.probe_misses(file, first, &homes, &mut found).unwrap();
                for j in 0..BATCH {
                    let want = if asked[j].is_some() {
                        asked[j]
                    } else {
                        t.probe(homes[j], Key::new(file.ino, first + j as u64).committed())
                            .unwrap()
                    };
                    assert_eq!(
                        found[j],
                        want,
                        "step {step}: block {} of file {}",
                        first + j as u64,
                        file.ino
                    );
                }
            }
        }
        assert!(full_seen, "the table never filled");
    }

    /// In a full table a block may live in the slot just before its home, at the end of a
    /// walk all the way round: the shared walk of its cluster must go that far for it.
    #[test]
    fn a_shared_walk_goes_all_the_way_round_a_full_table() {
        let t = table(64);
        let (a, b) = (file(&t, 1), file(&t, 2));
        let mut l = 0;
        while t.insert(&a, l, 1, &mut Vec::new()).is_ok() {
            l += 8;
        }
        // The cluster of `b` whose block 0 is homed at a group's first slot `g`: free `g`
        // alone, then insert block 1, which walks from `g + 1` round to `g`.
        let g = t.home_of(2, 0);
        let at_g = (0..l)
            .step_by(8)
            .find(|&l| blocks(&t, &a, l, 1)[0].1 - t.data().start.0 == g)
            .unwrap();
        assert_eq!(t.remove(&a, at_g, 1).unwrap(), 1);
        t.insert(&b, 1, 1, &mut Vec::new()).unwrap();
        let homes = home_slots(t.kernel, b.seed, 0, t.n32(), t.shift);
        let mut found = [None; BATCH];
        t.probe_misses(&b, 0, &homes, &mut found).unwrap();
        assert_eq!(found[1], Some(g));
        assert!(found.iter().enumerate().all(|(j, f)| j == 1 || f.is_none()));
    }

    /// Threads insert, look up and remove blocks of their own files in a small table while
    /// the others' removals reclaim tombstones around them: every block a thread has inserted
    /// and not removed is found, at every step.
    #[test]
    fn reclaims_beside_inserts_never_hide_an_entry() {
        let t = table(128);
        std::thread::scope(|s| {
            for ino in 1..=4u64 {
                let t = &t;
                s.spawn(move || {
                    let f = file(t, ino);
                    let mut live: Vec<(u64, u64)> = Vec::new();
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ino;
                    let mut out = Vec::new();
                    for step in 0..4000u64 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if live.len() < 24 && !rng.is_multiple_of(3) {
                            let len = 1 + (rng >> 8) % 3;
                            let lblk = step * 4;
                            out.clear();
                            match t.insert(&f, lblk, len, &mut out) {
                                Ok(()) => live.push((lblk, len)),
                                Err(Error::NoSpace) => {}
                                Err(e) => panic!("insert: {e}"),
                            }
                        } else if !live.is_empty() {
                            let (lblk, len) = live.swap_remove((rng >> 16) as usize % live.len());
                            assert_eq!(t.remove(&f, lblk, len).unwrap(), len);
                        }
                        let g = file(t, ino);
                        for &(lblk, len) in &live {
                            assert_eq!(
                                blocks(t, &g, lblk, len).len() as u64,
                                len,
                                "file {ino} step {step}: block {lblk} lost"
                            );
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn translation_cache_is_filled_by_spare_lanes_and_validated() {
        let t = table(256);
        let f = file(&t, 6);
        let mut out = Vec::new();
        t.insert(&f, 0, 16, &mut out).unwrap();
        let map = blocks(&t, &f, 0, 16);
        let reader = file(&t, 6);
        // A lookup that does not continue the previous one reads nothing ahead.
        assert_eq!(blocks(&t, &reader, 0, 1), map[..1]);
        assert!((1..8).all(|l| reader.cached_slot(l).is_none()));
        // The next one is sequential: its seven spare lanes translate blocks 2..9, as far as
        // each is in its home slot's cache line.
        assert_eq!(blocks(&t, &reader, 1, 1), map[1..2]);
        let ahead = (2..9).filter(|&l| reader.cached_slot(l).is_some()).count();
        assert!(ahead >= 5, "only {ahead} of 7 blocks read ahead");
        for l in 2..9 {
            if let Some(i) = reader.cached_slot(l) {
                assert_eq!(t.data().start.0 + i, map[l as usize].1);
            }
        }
        // A remove through another handle must not be hidden by the reader's cache.
        assert_eq!(t.remove(&f, 2, 7).unwrap(), 7);
        assert_eq!(blocks(&t, &reader, 0, 16), [&map[..2], &map[9..]].concat());
    }

    #[test]
    fn recovery_rolls_claims_back_or_forward() {
        for kind in [INSERT_CLAIMING, INSERT_COMMITTED] {
            let t = table(64);
            let f = file(&t, 2);
            let mut rec = t.intents.acquire(&t.media).unwrap();
            rec.begin(kind, [2, 10, 13, 0, 0, 0]).unwrap();
            let mut slots = Vec::new();
            for l in 10..13 {
                let h = t.home(f.seed, l);
                slots.push(t.claim(h, Key::new(2, l).tentative()).unwrap().unwrap());
            }
            assert!(blocks(&t, &f, 0, 64).is_empty());
            std::mem::forget(rec);
            t.recover().unwrap();
            let got = blocks(&t, &f, 0, 64);
            if kind == INSERT_CLAIMING {
                assert!(got.is_empty());
                assert_eq!(t.occupancy().unwrap().tombstones, 3);
            } else {
                let want: Vec<_> = (10..13)
                    .zip(&slots)
                    .map(|(l, &i)| (l, t.data().start.0 + i))
                    .collect();
                assert_eq!(got, want);
            }
            assert_eq!(t.occupancy().unwrap().tentative, 0);
            assert!(t.intents.scan(&t.media, &[2, 3, 4]).unwrap().is_empty());
        }
    }

    #[test]
    fn recovery_repairs_chains_cut_by_lost_claims() {
        let t = table(64);
        let f = file(&t, 8);
        // Two blocks with the same home slot: the second lands behind the first.
        let h0 = t.home(f.seed, 0);
        let twin = (1..10_000).find(|&l| t.home(f.seed, l) == h0).unwrap();
        let mut out = Vec::new();
        t.insert(&f, 0, 1, &mut out).unwrap();
        t.insert(&f, twin, 1, &mut out).unwrap();
        let before = blocks(&t, &f, twin, 1);
        assert_eq!(before.len(), 1);
        // The first claim is lost in a crash (its slot reads empty), the second survived.
        t.media.store_u64(t.slot_off(h0), 0).unwrap();
        let g = file(&t, 8);
        assert!(blocks(&t, &g, twin, 1).is_empty(), "the chain is cut");
        t.recover().unwrap();
        assert_eq!(blocks(&t, &g, twin, 1), before);
        assert_eq!(t.load(h0).unwrap().1, Slot::Tombstone);
        assert_eq!(t.occupancy().unwrap().tombstones, 1);
    }

    #[test]
    fn corrupt_slots_are_errors_not_panics() {
        let t = table(32);
        let f = file(&t, 1);
        for i in 0..32 {
            t.media.store_u64(t.slot_off(i), 7 << 61).unwrap();
        }
        let mut out = Vec::new();
        assert!(matches!(
            t.lookup(&f, 0, 4, &mut out),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            t.lookup(&f, 0, 1000, &mut out),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            t.insert(&f, 0, 1, &mut out),
            Err(Error::Corrupt { .. })
        ));
        // A table full of other keys (valid words, no empty slot) ends every walk.
        for i in 0..32 {
            t.media
                .store_u64(t.slot_off(i), Key::new(5, i).committed())
                .unwrap();
        }
        t.lookup(&f, 0, 4, &mut out).unwrap();
        assert!(out.is_empty());
        assert!(matches!(t.insert(&f, 0, 1, &mut out), Err(Error::NoSpace)));
    }
}
