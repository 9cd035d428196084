//! The global cuckoo hash table with ranged entries (HashFS paper §3.2.1): one table for all
//! files, sized at format time, mapping `(ino, lblk)` to a physical block taken from a
//! [`BlockAllocator`].
//!
//! # On-media format
//!
//! | meta block | content                                                              |
//! |------------|----------------------------------------------------------------------|
//! | 0          | header: sixteen `Le64` words (below); lock epoch at byte 512, move gate at byte 1024 |
//! | 1, 2       | 64 intent records of two cache lines (operation, entry move)         |
//! | 3..        | buckets of one cache line each ([`bucket`] format), 64 per block     |
//!
//! | header word | field                                       |
//! |-------------|---------------------------------------------|
//! | 0           | magic `"PMFSCUCK"`                           |
//! | 1           | format version (1)                          |
//! | 2, 3        | meta extent: first block, length            |
//! | 4           | number of buckets                           |
//! | 5           | hash salt                                   |
//! | 6           | number of intent records (64)               |
//! | 7..14       | reserved, zero                              |
//! | 15          | crc32c of words 0..15 (low 32 bits)         |
//!
//! Each bucket holds a seqlock word and three 16-byte entries. An entry maps one logical block
//! and is *ranged*: besides its physical block it stores `size`, the number of blocks from it
//! to the end of its run of physically contiguous blocks, and `rev`, the number of blocks of
//! the run before it. Logical blocks 21..24 mapped to 100..103 are three entries
//! `21 -> 100 (size 3, rev 0)`, `22 -> 101 (2, 1)`, `23 -> 102 (1, 2)`. A lookup of a long
//! range therefore needs one probe per run, not per block; `rev` finds the start of a run
//! when a remove cuts it. Runs are at most [`RUN_MAX`] blocks (one
//! allocation each), which bounds the entries a cut has to rewrite. Lookups walk a range run
//! by run; there is no per-file translation cache (a lookup already costs one probe per run,
//! and a cached entry would have to be revalidated against a bucket that moves can change).
//!
//! # Hashing
//!
//! Two hash functions: the HashFS multiply-xorshift hash ([`crate::hashfs::simd`]) under two
//! per-file seeds derived from the inode number and the table's salt, each reduced to the
//! bucket count. A key may live in either of its two buckets, so a lookup reads at most two
//! cache lines. An insert whose two buckets are full searches breadth first (at most
//! [`MAX_DEPTH`] levels) for a chain of entries that can each move to their other bucket,
//! ending at a free way, and moves them one by one from the end of the chain.
//!
//! # Crash protocol
//!
//! - Insert: the data blocks are allocated first (`insert_at` is handed them instead and cuts
//!   them into runs of at most [`RUN_MAX`]; the rest is the same), then `(ino, lblk, end)` is
//!   recorded in the thread's intent record (one fence), the entries are written and flushed,
//!   one fence, and the record is freed durably (the commit point). Recovery of a live insert
//!   record removes every entry of the range, which was unmapped before the call. The
//!   allocator is volatile: after a crash it is rebuilt from
//!   [`owned_blocks`](FileMapping::owned_blocks).
//! - Remove: the record stores the range and the parts of the runs it cuts (`[left, lblk)`
//!   whose `size` must shrink, `[end, right)` whose `rev` must shrink), then the entries are
//!   rewritten and deleted; recovery redoes all of it (the rewrites are idempotent). The data
//!   blocks go back to the allocator only after the record is freed.
//! - Replace ([`replace_many`](FileMapping::replace_many)) of a range whose every block is
//!   mapped rewrites the value words in place, in pieces of at most [`RUN_MAX`] blocks. A
//!   piece that is one block and the whole run of its old entry (`size` 1, `rev` 0, the usual
//!   case once random overwrites have cut a file into single blocks) is one atomic 8-byte
//!   store, fenced with the rest of the batch. Any other piece is recorded first (range, new
//!   first block and the cut runs as for a remove), then the neighbours are trimmed and the
//!   values rewritten; recovery redoes it. The replaced blocks go back to the allocator after
//!   the final fence. A range with nothing mapped is an insert (as `insert_at`), and a range
//!   with a hole a remove followed by an insert.
//! - An entry move (displacement) is recorded in the record's second line (`src`, `dst`,
//!   key), then the entry is copied to `dst`, fenced, cleared at `src`, fenced, and the line is
//!   freed durably. A crash leaves the entry at `src`, at `dst`, or at both with identical
//!   content; recovery removes the copy at `dst` when both hold the key. Moves are resolved
//!   before operation records, so a rolled-back insert never leaves a duplicate behind.
//!
//! # Concurrency: seqlocks in PM
//!
//! The paper isolates displacement chains with Intel TSX, which current CPUs no longer have.
//! Each bucket instead carries a seqlock word in its own cache line: writers (insert, remove,
//! move) lock the two buckets of the key they change, in index order, with a CAS; readers take
//! no lock and retry while a seqlock word they read is locked or changes. A reader looks in the
//! key's first bucket alone first (inserts fill it first, so most keys are there, and the
//! second bucket's line need not arrive); if the key is not there it reads the second and
//! checks that the first one's word is still the same, so both were as read at one instant and
//! a reader never misses an entry that is halfway through a move. Writers never hold more than
//! two locks and take them in order, so they cannot deadlock.
//!
//! The locks live in PM, not in DRAM, because several processes may map the same pool and a
//! DRAM lock would not exclude another process. The price: a process that dies while holding
//! a bucket lock leaves it locked; other users of that bucket wait, and after a second of
//! waiting give up with [`Error::Corrupt`] (a damaged lock word looks the same), until
//! [`recover`](FileMapping::recover) runs. Recovery does not have to find such locks: each
//! lock word carries the *epoch* in which it was taken, recovery increments the epoch kept in
//! the header block, and a lock of an older epoch counts as free. (HashFS takes no locks —
//! every slot changes by CAS — and has no such window; this is one of the costs the paper's
//! comparison of the two tables does not show.) Mutations of one file are not concurrent with one another (the
//! [`FileMapping`] contract), so a key is only ever inserted or removed by one thread at a
//! time; moves of other files' entries are serialised by the bucket locks.
//!
//! An insert writes its entries one by one; when the table runs full partway it deletes
//! them again and fails with `NoSpace`, having changed nothing, so a lookup must not report
//! the entries it saw of such an insert. Each file handle counts the inserts made through it
//! (odd while one runs) and keeps the last one's range: a lookup through the handle that ran
//! beside exactly one insert reports that range unmapped, as it was before the insert (which
//! takes effect when it returns), and a lookup beside several looks again. Lookups through
//! other handles of the file are not covered; the engine keeps its lookups of a file out of
//! the way of its mutations anyway.
//!
//! A range larger than a quarter of the table (a truncate, `remove_file`, a whole-file lookup)
//! is answered by one pass over all buckets, and bucket seqlocks do not make such a pass a
//! snapshot: a move running meanwhile can carry an entry from a bucket the pass has not read
//! yet into one it has (the entry is missed) or the other way (seen twice). A *move gate* word
//! in the header block counts moves started and finished; a pass counts only if no move was
//! running when it began and none started before it ended. After a few overlapped passes the
//! scanner closes the gate (new moves wait), lets running moves finish and scans once more.
//! Lookups of shorter ranges probe key by key, each probe as above. Like a lock, a gate left
//! closed by a dead process makes movers give up after a second with an error; recovery reopens
//! it.

pub mod bucket;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, CACHE_LINE, Le64, PmOff, Pod, crc32c};
use pmfs_core::pm::{Media, MediaExt};
use pmfs_core::traits::{
    AllocHint, BlockAllocator, Extent, FileId, FileMapping, MappingKind, Run,
    first_mapped_by_lookups, maps_exactly,
};
use pmfs_core::{Error, Result};

use self::bucket::{Bucket, RUN_MAX, SeqLock, Value, WAYS, key_off, value_off};
use crate::hashfs::intent::{Intent, IntentTable};
use crate::hashfs::simd::{file_seed, home_slot};
use crate::hashfs::slot::{Key, LBLK_LIMIT, MAX_INO};

const MAGIC: u64 = u64::from_le_bytes(*b"PMFSCUCK");
const VERSION: u64 = 1;
const HEADER_WORDS: usize = 16;
const EPOCH_OFF: u64 = 512;
/// The move gate word in the header block (see [`CuckooMapping::gated`]).
const GATE_OFF: u64 = 1024;
/// Gate bit: a scanner has stopped new moves.
const GATE_FROZEN: u64 = 1 << 63;
/// Width mask of the gate's two move counters (started: bits 32..63, finished: bits 0..31).
const GATE_COUNT: u64 = (1 << 31) - 1;
/// Scans attempted while moves run before a scanner stops new moves.
const GATE_TRIES: usize = 4;
const INTENT_RECORDS: u64 = 64;
const INTENT_LINES: u64 = 2;
const FIRST_BUCKET_BLOCK: u64 = 3;
const BUCKETS_PER_BLOCK: u64 = BLOCK_SIZE / CACHE_LINE;
/// Target load factor of [`CuckooMapping::meta_blocks`], in percent.
const LOAD_PERCENT: u64 = 85;
/// Levels of the breadth-first search for a displacement chain.
pub const MAX_DEPTH: usize = 5;
/// Entries the displacement search may visit.
const MAX_NODES: usize = 1024;
/// How long a bucket may stay locked (or keep changing under a reader) before the wait
/// fails.
const LOCK_PATIENCE: Duration = Duration::from_secs(1);
/// Attempts of one entry insert when concurrent writers keep invalidating its chain.
const MAX_ATTEMPTS: usize = 32;
/// How many keys ahead a range update prefetches buckets (see
/// [`CuckooMapping::update_range`]).
const PREFETCH_KEYS: u64 = 8;
const SECOND_SEED: u64 = 0x5bd1_e995_c2b2_ae35;

const OP_INSERT: u8 = 2;
const OP_REMOVE: u8 = 3;
const OP_MOVE: u8 = 4;
const OP_REPLACE: u8 = 5;

type Header = [Le64; HEADER_WORDS];
const EMPTY_BUCKET: Bucket = Bucket {
    lock: 0,
    entries: [None; WAYS],
};
const _: () = assert!(size_of::<Header>() == 128);
const _: () = assert!(INTENT_RECORDS * INTENT_LINES * CACHE_LINE == 2 * BLOCK_SIZE);

/// The global cuckoo table over a [`Media`], drawing data blocks from a [`BlockAllocator`].
pub struct CuckooMapping<M, A> {
    media: M,
    alloc: Arc<A>,
    meta: Extent,
    buckets: u64,
    first_bucket: PmOff,
    intents: IntentTable,
    salt: u64,
    epoch: AtomicU64,
    /// A bucket lock or the move gate could not be released (its store failed): only the
    /// next recovery's new epoch and gate reset free it.
    unreleased: AtomicBool,
    /// Opened by [`open_read_only`](Self::open_read_only): the lock epoch is one past the
    /// region's, no move gate is kept, and every change is refused.
    read_only: bool,
}

/// The DRAM handle of one file: its inode number, its two hash seeds, and the inserts made
/// through it (shared by its clones).
#[derive(Debug, Clone)]
pub struct CuckooFile {
    ino: u64,
    seeds: [u64; 2],
    inserts: Arc<Inserts>,
}

/// The inserts made through one file handle, for the lookups beside them (see "Concurrency"
/// in the module documentation). An insert writes its entries one at a time, and when the
/// table runs full partway it deletes them again and fails: a lookup through the handle
/// that ran beside exactly one insert reports the insert's range unmapped, as it was before
/// (an insert's range is unmapped until it returns), and one that ran beside more retries.
#[derive(Debug, Default)]
struct Inserts {
    /// Odd while an insert runs: bumped when one begins and when it ends.
    seq: AtomicU64,
    /// `seq` as the running or last insert set it, and that insert's range; changed with
    /// `seq`, under this lock.
    last: Mutex<(u64, u64, u64)>,
}

/// Ends the insert [`Inserts::begin`] began, when dropped.
struct InsertRunning<'a>(&'a Inserts);

impl Inserts {
    /// Marks an insert of `[lblk, end)` running until the guard is dropped.
    fn begin(&self, lblk: u64, end: u64) -> InsertRunning<'_> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        *last = (seq, lblk, end);
        InsertRunning(self)
    }

    /// The range to report unmapped for a lookup that read `before` and `after` from `seq`
    /// around its reads: `Ok(None)` if no insert ran beside it, `Ok(Some(range))` if exactly
    /// one did, `Err(())` if it must look again.
    fn beside(&self, before: u64, after: u64) -> std::result::Result<Option<(u64, u64)>, ()> {
        // Insert `i` runs while `seq` is `2i - 1`: those beside the lookup are the odd values
        // in `before..=after`.
        let beside = after.div_ceil(2) - before / 2;
        if beside == 0 {
            return Ok(None);
        }
        let (seq, lblk, end) = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        if beside == 1 && seq == after {
            Ok(Some((lblk, end)))
        } else {
            Err(())
        }
    }
}

impl Drop for InsertRunning<'_> {
    fn drop(&mut self) {
        let mut last = self.0.last.lock().unwrap_or_else(|e| e.into_inner());
        last.0 = self.0.seq.fetch_add(1, Ordering::AcqRel) + 1;
    }
}

/// Removes `[lblk, end)` from the runs `out[first..]`, splitting the runs it cuts.
fn cut_out(out: &mut Vec<Run>, first: usize, lblk: u64, end: u64) {
    let kept: Vec<Run> = out
        .drain(first..)
        .flat_map(|r| r.within(0, lblk).into_iter().chain(r.within(end, u64::MAX)))
        .collect();
    out.extend(kept);
}

impl<M, A> std::fmt::Debug for CuckooMapping<M, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuckooMapping")
            .field("meta", &self.meta)
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

/// A step of a displacement chain: the entry `key` at `(bucket, way)`.
#[derive(Clone, Copy, Debug)]
struct Hop {
    bucket: u64,
    way: usize,
    key: Key,
    parent: Option<usize>,
    depth: usize,
}

/// A displacement chain and the free `(bucket, way)` its last entry moves to.
type Chain = (Vec<Hop>, (u64, usize));

/// Appends `[lblk, lblk + len) -> [pblk, ..)` to `out`, merging with the last run appended by
/// this call (index `first` on) when contiguous.
fn push_run(out: &mut Vec<Run>, first: usize, lblk: u64, pblk: u64, len: u64) {
    if out.len() > first
        && let Some(last) = out.last_mut()
        && last.lblk + last.len == lblk
        && last.pblk.0 + last.len == pblk
    {
        last.len += len;
        return;
    }
    out.push(Run {
        lblk,
        pblk: BlockNo(pblk),
        len,
    });
}

fn header_crc(h: &Header) -> u32 {
    let bytes = h.as_bytes();
    crc32c(&bytes[..bytes.len() - 8])
}

fn in_region<M: Media>(media: &M, e: Extent) -> bool {
    e.start
        .0
        .checked_add(e.len)
        .is_some_and(|end| end <= media.blocks())
}

fn seeds(ino: u64, salt: u64) -> [u64; 2] {
    [file_seed(ino, salt), file_seed(ino, salt ^ SECOND_SEED)]
}

impl<M: Media, A: BlockAllocator> CuckooMapping<M, A> {
    /// Blocks of the `meta` extent for a table that maps up to `capacity` blocks at an 85%
    /// load factor.
    pub fn meta_blocks(capacity: u64) -> u64 {
        let buckets = (capacity * 100).div_ceil(WAYS as u64 * LOAD_PERCENT).max(2);
        FIRST_BUCKET_BLOCK + buckets.div_ceil(BUCKETS_PER_BLOCK)
    }

    /// Formats an empty table filling `meta` (its size decides the capacity) with a random
    /// hash salt.
    pub fn format(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        let salt = RandomState::new().hash_one(meta.start.0);
        Self::format_with_salt(media, meta, alloc, salt)
    }

    /// [`format`](Self::format) with a chosen hash salt (reproducible tests and benches).
    pub fn format_with_salt(media: M, meta: Extent, alloc: Arc<A>, salt: u64) -> Result<Self> {
        if meta.len <= FIRST_BUCKET_BLOCK {
            return Err(Error::InvalidArgument("cuckoo meta extent too small"));
        }
        if meta.len - FIRST_BUCKET_BLOCK > u32::MAX as u64 / BUCKETS_PER_BLOCK {
            return Err(Error::InvalidArgument("cuckoo meta extent too large"));
        }
        if !in_region(&media, meta) {
            return Err(Error::InvalidArgument("cuckoo extent outside the region"));
        }
        let buckets = (meta.len - FIRST_BUCKET_BLOCK) * BUCKETS_PER_BLOCK;
        let this = Self::new(media, alloc, meta, buckets, salt, 1);
        this.media
            .fill_nt(this.first_bucket, buckets * CACHE_LINE, 0)?;
        this.intents.format(&this.media)?;
        this.media.fence();
        let mut h: Header = [Le64::new(0); HEADER_WORDS];
        let fields = [
            MAGIC,
            VERSION,
            meta.start.0,
            meta.len,
            buckets,
            salt,
            INTENT_RECORDS,
        ];
        for (w, v) in h.iter_mut().zip(fields) {
            *w = Le64::new(v);
        }
        h[HEADER_WORDS - 1] = Le64::new(header_crc(&h) as u64);
        let at = meta.start.offset();
        this.media.write_pod(at, &h)?;
        this.media.store_u64(at + EPOCH_OFF, 1)?;
        this.media.store_u64(at + GATE_OFF, 0)?;
        this.media.flush(at + GATE_OFF, 8)?;
        this.media.flush(at, size_of::<Header>() as u64)?;
        this.media.persist(at + EPOCH_OFF, 8)?;
        Ok(this)
    }

    /// Opens a formatted table.
    pub fn open(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        if !in_region(&media, meta) || meta.len <= FIRST_BUCKET_BLOCK {
            return Err(Error::InvalidArgument("cuckoo extent outside the region"));
        }
        let at = meta.start.offset();
        let h: Header = media.read_pod(at)?;
        let corrupt = |what| Error::Corrupt { what, at };
        if h[0].get() != MAGIC {
            return Err(corrupt("cuckoo header magic"));
        }
        if h[HEADER_WORDS - 1].get() != header_crc(&h) as u64 {
            return Err(corrupt("cuckoo header checksum"));
        }
        if h[1].get() != VERSION {
            return Err(Error::Unsupported("cuckoo format version"));
        }
        let buckets = (meta.len - FIRST_BUCKET_BLOCK) * BUCKETS_PER_BLOCK;
        if h[2].get() != meta.start.0
            || h[3].get() != meta.len
            || h[4].get() != buckets
            || h[6].get() != INTENT_RECORDS
            || buckets > u32::MAX as u64
        {
            return Err(corrupt("cuckoo header geometry"));
        }
        let epoch = media.load_u64(at + EPOCH_OFF)?;
        Ok(Self::new(media, alloc, meta, buckets, h[5].get(), epoch))
    }

    /// Opens a formatted table for reading alone, as a checker reads a volume that no process
    /// uses, whether or not it was closed cleanly: the bucket locks and the move gate a dead
    /// process left behind are ignored, as they are once [`recover`](FileMapping::recover)
    /// has started a new lock epoch and reopened the gate, but nothing is written. Lookups
    /// see what the crash left (an entry halfway through a move, say, in both its buckets).
    /// Every change through the handle fails with [`Error::Unsupported`], and so does
    /// `recover`; a process changing the region meanwhile is not noticed.
    pub fn open_read_only(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        let mut t = Self::open(media, meta, alloc)?;
        let epoch = t.epoch.get_mut();
        *epoch = (*epoch + 1) & 0xffff_ffff;
        t.read_only = true;
        Ok(t)
    }

    /// Fails if the table was opened read-only.
    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Unsupported(
                "changing a cuckoo table opened read-only",
            ));
        }
        Ok(())
    }

    /// A free intent record, for a change.
    fn intent(&self) -> Result<Intent<'_, M>> {
        self.writable()?;
        self.intents.acquire(&self.media)
    }

    fn new(media: M, alloc: Arc<A>, meta: Extent, buckets: u64, salt: u64, epoch: u64) -> Self {
        Self {
            media,
            alloc,
            meta,
            buckets,
            first_bucket: (meta.start + FIRST_BUCKET_BLOCK).offset(),
            intents: IntentTable::new((meta.start + 1).offset(), INTENT_RECORDS, INTENT_LINES),
            salt,
            epoch: AtomicU64::new(epoch),
            unreleased: AtomicBool::new(false),
            read_only: false,
        }
    }

    /// The media the table lives on.
    pub fn media(&self) -> &M {
        &self.media
    }

    /// The allocator data blocks come from.
    pub fn allocator(&self) -> &Arc<A> {
        &self.alloc
    }

    /// Number of entries (mapped blocks) the table can hold at most.
    pub fn slots(&self) -> u64 {
        self.buckets * WAYS as u64
    }

    fn lock_rule(&self) -> SeqLock {
        SeqLock {
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }

    fn bucket_off(&self, b: u64) -> PmOff {
        self.first_bucket + b * CACHE_LINE
    }

    /// The two buckets of `key` (distinct).
    fn buckets_of(&self, seeds: [u64; 2], lblk: u64) -> (u64, u64) {
        let n = self.buckets as u32;
        let b1 = home_slot(seeds[0], lblk, n);
        let mut b2 = home_slot(seeds[1], lblk, n);
        if b2 == b1 {
            b2 = (b1 + 1) % self.buckets;
        }
        (b1, b2)
    }

    fn key_buckets(&self, key: Key) -> (u64, u64) {
        self.buckets_of(seeds(key.ino, self.salt), key.lblk)
    }

    /// Reads and decodes a bucket line as it is (no seqlock check).
    fn read_raw(&self, b: u64) -> Result<std::result::Result<Bucket, PmOff>> {
        let off = self.bucket_off(b);
        let mut line = [0u8; CACHE_LINE as usize];
        self.media.read(off, &mut line)?;
        Ok(Bucket::decode(&line).ok_or(off))
    }

    /// Backs off while bucket `b` is locked or changing: spins, then yields, then sleeps.
    /// Gives up with [`Error::Corrupt`] after [`LOCK_PATIENCE`], which a live lock holder (a
    /// few stores and fences) never causes: the lock word is damaged or its holder died, and
    /// [`recover`](FileMapping::recover) has to run.
    fn wait(&self, b: u64, backoff: &mut Backoff) -> Result<()> {
        self.wait_on(
            self.bucket_off(b),
            "cuckoo bucket lock never released",
            backoff,
        )
    }

    /// The back-off of [`wait`](Self::wait) for any word at `at`.
    fn wait_on(&self, at: PmOff, what: &'static str, backoff: &mut Backoff) -> Result<()> {
        backoff.rounds += 1;
        if backoff.rounds < 64 {
            std::hint::spin_loop();
        } else if backoff.rounds < 1024 {
            std::thread::yield_now();
        } else {
            let since = *backoff.since.get_or_insert_with(Instant::now);
            if since.elapsed() > LOCK_PATIENCE {
                return Err(Error::Corrupt { what, at });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    fn gate_off(&self) -> PmOff {
        self.meta.start.offset() + GATE_OFF
    }

    /// Changes the gate word with `f` (CAS loop); `f` returns `None` to wait and retry.
    fn gate_update(&self, f: impl Fn(u64) -> Option<u64>) -> Result<u64> {
        let off = self.gate_off();
        let mut backoff = Backoff::default();
        loop {
            let w = self.media.load_u64(off)?;
            match f(w) {
                Some(new) => {
                    if self.media.cas_u64(off, w, new)?.is_ok() {
                        return Ok(new);
                    }
                }
                None => self.wait_on(off, "cuckoo move gate never reopened", &mut backoff)?,
            }
        }
    }

    /// Announces an entry move to scanners (waits while a scanner has stopped moves).
    fn gate_enter(&self) -> Result<GateGuard<'_, M, A>> {
        self.gate_update(|w| {
            (w & GATE_FROZEN == 0).then(|| {
                let started = ((w >> 32) + 1) & GATE_COUNT;
                (w & !(GATE_COUNT << 32)) | (started << 32)
            })
        })?;
        Ok(GateGuard { table: self })
    }

    /// Runs `scan`, a pass over all buckets, so that no entry move overlaps it: a move in
    /// flight could carry an entry from a bucket the pass has not read yet into one it has
    /// (missed) or the other way round (seen twice). The gate word counts moves started and
    /// finished; a pass is accepted if no move was in flight when it began and none started
    /// until it ended. After [`GATE_TRIES`] overlapped passes the scanner stops new moves,
    /// waits for the running ones and scans once more. A read-only table scans at once: no
    /// move runs beside it, and the gate word may be one a dead process left.
    fn gated<T>(&self, mut scan: impl FnMut() -> Result<T>) -> Result<T> {
        if self.read_only {
            return scan();
        }
        let off = self.gate_off();
        let quiet = |w: u64| w & GATE_FROZEN == 0 && (w >> 32) & GATE_COUNT == w & GATE_COUNT;
        for _ in 0..GATE_TRIES {
            let w0 = self.media.load_u64(off)?;
            if quiet(w0) {
                let r = scan()?;
                if self.media.load_u64(off)? == w0 {
                    return Ok(r);
                }
            }
            std::thread::yield_now();
        }
        self.gate_update(|w| (w & GATE_FROZEN == 0).then_some(w | GATE_FROZEN))?;
        let _open = Unfreeze { table: self };
        self.gate_update(|w| ((w >> 32) & GATE_COUNT == w & GATE_COUNT).then_some(w))?;
        scan()
    }

    /// Reads buckets `bs` as one consistent snapshot (seqlock read side).
    fn read_snapshot<const N: usize>(&self, bs: [u64; N]) -> Result<[Bucket; N]> {
        self.read_versioned(bs).map(|(out, _)| out)
    }

    /// [`read_snapshot`](Self::read_snapshot), also returning the buckets' lock words as the
    /// snapshot saw them: a bucket is unchanged since while its word is.
    fn read_versioned<const N: usize>(&self, bs: [u64; N]) -> Result<([Bucket; N], [u64; N])> {
        let rule = self.lock_rule();
        let mut backoff = Backoff::default();
        'retry: loop {
            let mut before = [0u64; N];
            for (v, &b) in before.iter_mut().zip(&bs) {
                *v = self.media.load_u64(self.bucket_off(b))?;
                if rule.is_locked(*v) {
                    self.wait(b, &mut backoff)?;
                    continue 'retry;
                }
            }
            let mut raw = [Err(PmOff(0)); N];
            for (r, &b) in raw.iter_mut().zip(&bs) {
                *r = self.read_raw(b)?;
            }
            fence(Ordering::Acquire);
            for (v, &b) in before.iter().zip(&bs) {
                if self.media.load_u64(self.bucket_off(b))? != *v {
                    self.wait(b, &mut backoff)?;
                    continue 'retry;
                }
            }
            let mut out = [EMPTY_BUCKET; N];
            for (o, r) in out.iter_mut().zip(raw) {
                *o = r.map_err(|at| Error::Corrupt {
                    what: "cuckoo bucket",
                    at,
                })?;
            }
            return Ok((out, before));
        }
    }

    /// Locks buckets `a` and `b` (possibly equal) in index order; returns the guard.
    fn lock_pair(&self, a: u64, b: u64) -> Result<PairGuard<'_, M, A>> {
        let (lo, hi) = (a.min(b), a.max(b));
        let first = self.lock_one(lo)?;
        let second = if hi == lo {
            None
        } else {
            match self.lock_one(hi) {
                Ok(w) => Some((hi, w)),
                Err(e) => {
                    self.unlock_one(lo, first);
                    return Err(e);
                }
            }
        };
        Ok(PairGuard {
            table: self,
            first: (lo, first),
            second,
        })
    }

    fn lock_one(&self, b: u64) -> Result<u64> {
        self.writable()?;
        let off = self.bucket_off(b);
        let mut backoff = Backoff::default();
        loop {
            let rule = self.lock_rule();
            let w = self.media.load_u64(off)?;
            if !rule.is_locked(w) {
                let locked = rule.locked(w);
                if self.media.cas_u64(off, w, locked)?.is_ok() {
                    return Ok(locked);
                }
            }
            self.wait(b, &mut backoff)?;
        }
    }

    /// Notes a lock or gate release that failed: see [`recovery_owed`](FileMapping::recovery_owed).
    fn unreleased_if<T>(&self, released: Result<T>) {
        if released.is_err() {
            self.unreleased.store(true, Ordering::Relaxed);
        }
    }

    fn unlock_one(&self, b: u64, locked: u64) {
        // A failed store leaves the bucket locked until recovery starts a new epoch.
        let unlocked = self
            .media
            .store_u64(self.bucket_off(b), self.lock_rule().unlocked(locked));
        self.unreleased_if(unlocked);
    }

    /// Decodes a bucket the caller has locked.
    fn locked_bucket(&self, b: u64) -> Result<Bucket> {
        self.read_raw(b)?.map_err(|at| Error::Corrupt {
            what: "cuckoo bucket",
            at,
        })
    }

    /// Stores an entry (not flushed: the caller collects the bucket for
    /// [`flush_buckets`](Self::flush_buckets)).
    fn write_entry(&self, b: u64, way: usize, key: Key, v: Value) -> Result<()> {
        let at = self.bucket_off(b);
        self.media.store_u64(value_off(at, way), v.encode())?;
        self.media.store_u64(key_off(at, way), key.committed())
    }

    /// Frees an entry (not flushed, like [`write_entry`](Self::write_entry)).
    fn clear_entry(&self, b: u64, way: usize) -> Result<()> {
        let at = self.bucket_off(b);
        self.media.store_u64(key_off(at, way), 0)?;
        self.media.store_u64(value_off(at, way), 0)
    }

    /// Writes back the buckets in `dirty` and empties it. Entries are flushed after all the
    /// locked updates of an operation, not one by one: on x86 a locked instruction (the next
    /// bucket lock's CAS) waits for earlier CLWB/CLFLUSHOPT to complete, which would
    /// serialise the write-backs.
    fn flush_buckets(&self, dirty: &mut Vec<u64>) -> Result<()> {
        dirty.sort_unstable();
        dirty.dedup();
        for &b in dirty.iter() {
            self.media.flush(self.bucket_off(b), CACHE_LINE)?;
        }
        dirty.clear();
        Ok(())
    }

    /// The value of `key`, read without locks.
    fn get(&self, file: &CuckooFile, lblk: u64) -> Result<Option<Value>> {
        let (b1, b2) = self.buckets_of(file.seeds, lblk);
        let key = Key::new(file.ino, lblk);
        // Inserts fill the first bucket first, so most keys are found there, without waiting
        // for the second bucket's line. An entry in a consistent snapshot of one bucket is
        // mapped; its absence needs both buckets at one instant (a displacement may be moving
        // it from one to the other): the first bucket's word unchanged after the second was
        // read makes its snapshot still true then.
        loop {
            let ([x], [word]) = self.read_versioned([b1])?;
            if let Some((_, v)) = x.find(key) {
                return Ok(Some(v));
            }
            let [y] = self.read_snapshot([b2])?;
            if self.media.load_u64(self.bucket_off(b1))? == word {
                return Ok(y.find(key).map(|(_, v)| v));
            }
        }
    }

    /// Applies `f` to the entry of `key` under its bucket locks; `f` returns the new value,
    /// or `None` to delete the entry. Returns the old value.
    fn update(
        &self,
        key: Key,
        dirty: &mut Vec<u64>,
        f: impl FnOnce(Value) -> Option<Value>,
    ) -> Result<Option<Value>> {
        let (b1, b2) = self.key_buckets(key);
        let _guard = self.lock_pair(b1, b2)?;
        for b in [b1, b2] {
            if let Some((way, old)) = self.locked_bucket(b)?.find(key) {
                match f(old) {
                    Some(new) if new == old => {}
                    Some(new) => {
                        self.write_entry(b, way, key, new)?;
                        dirty.push(b);
                    }
                    None => {
                        self.clear_entry(b, way)?;
                        dirty.push(b);
                    }
                }
                return Ok(Some(old));
            }
        }
        Ok(None)
    }

    /// Inserts a new entry, displacing others if both buckets are full.
    fn insert_entry(
        &self,
        intent: &Intent<'_, M>,
        key: Key,
        v: Value,
        dirty: &mut Vec<u64>,
    ) -> Result<()> {
        let (b1, b2) = self.key_buckets(key);
        for _ in 0..MAX_ATTEMPTS {
            {
                let _guard = self.lock_pair(b1, b2)?;
                for b in [b1, b2] {
                    if let Some(way) = self.locked_bucket(b)?.free_way() {
                        dirty.push(b);
                        return self.write_entry(b, way, key, v);
                    }
                }
            }
            let Some((chain, free)) = self.find_chain(b1, b2)? else {
                return Err(Error::NoSpace);
            };
            self.run_chain(intent, &chain, free)?;
        }
        Err(Error::NoSpace)
    }

    /// The other bucket of the entry `key` stored in bucket `b`.
    fn alternate(&self, key: Key, b: u64) -> Result<u64> {
        let (k1, k2) = self.key_buckets(key);
        match b {
            _ if b == k1 => Ok(k2),
            _ if b == k2 => Ok(k1),
            _ => Err(Error::Corrupt {
                what: "cuckoo entry in a foreign bucket",
                at: self.bucket_off(b),
            }),
        }
    }

    /// Breadth-first search from buckets `b1`, `b2` for a chain of entries ending next to a
    /// free way. Returns the chain (first hop in `b1` or `b2`) and the free `(bucket, way)`.
    fn find_chain(&self, b1: u64, b2: u64) -> Result<Option<Chain>> {
        let mut hops: Vec<Hop> = Vec::new();
        for b in [b1, b2] {
            let [bucket] = self.read_snapshot([b])?;
            for (way, e) in bucket.entries.iter().enumerate() {
                if let Some((key, _)) = e {
                    hops.push(Hop {
                        bucket: b,
                        way,
                        key: *key,
                        parent: None,
                        depth: 1,
                    });
                }
            }
        }
        let mut next = 0;
        while next < hops.len() && hops.len() < MAX_NODES {
            let hop = hops[next];
            let alt = self.alternate(hop.key, hop.bucket)?;
            let [bucket] = self.read_snapshot([alt])?;
            if let Some(way) = bucket.free_way() {
                let mut chain = vec![hop];
                let mut at = hop.parent;
                while let Some(p) = at {
                    chain.push(hops[p]);
                    at = hops[p].parent;
                }
                chain.reverse();
                return Ok(Some((chain, (alt, way))));
            }
            if hop.depth < MAX_DEPTH {
                for (way, e) in bucket.entries.iter().enumerate() {
                    if let Some((key, _)) = e {
                        hops.push(Hop {
                            bucket: alt,
                            way,
                            key: *key,
                            parent: Some(next),
                            depth: hop.depth + 1,
                        });
                    }
                }
            }
            next += 1;
        }
        Ok(None)
    }

    /// Moves the entries of `chain` one step each, from its end; stops early (without error)
    /// if a concurrent writer changed a bucket on the way.
    fn run_chain(&self, intent: &Intent<'_, M>, chain: &[Hop], free: (u64, usize)) -> Result<()> {
        let mut dst = free;
        for hop in chain.iter().rev() {
            if !self.move_entry(intent, *hop, dst)? {
                return Ok(());
            }
            dst = (hop.bucket, hop.way);
        }
        Ok(())
    }

    /// Moves `hop.key` from `(hop.bucket, hop.way)` to the free way `dst` under both locks and
    /// a move record. Returns false if the source or destination changed meanwhile.
    fn move_entry(&self, intent: &Intent<'_, M>, hop: Hop, dst: (u64, usize)) -> Result<bool> {
        let _moving = self.gate_enter()?;
        let _guard = self.lock_pair(hop.bucket, dst.0)?;
        let src = self.locked_bucket(hop.bucket)?;
        let Some((_, value)) = src.entries[hop.way].filter(|(k, _)| *k == hop.key) else {
            return Ok(false);
        };
        if self.locked_bucket(dst.0)?.entries[dst.1].is_some() {
            return Ok(false);
        }
        let mut rec = intent.line(1)?;
        rec.begin(
            OP_MOVE,
            [
                hop.bucket,
                hop.way as u64,
                dst.0,
                dst.1 as u64,
                hop.key.committed(),
                0,
            ],
        )?;
        self.write_entry(dst.0, dst.1, hop.key, value)?;
        self.media.persist(self.bucket_off(dst.0), CACHE_LINE)?;
        self.clear_entry(hop.bucket, hop.way)?;
        self.media
            .persist(self.bucket_off(hop.bucket), CACHE_LINE)?;
        rec.finish()?;
        Ok(true)
    }

    /// Whether a range is better served by one scan of all buckets.
    fn use_scan(&self, lblk: u64, end: u64) -> bool {
        end - lblk > self.slots() / 4
    }

    /// Calls `f(index, bucket)` for every bucket. Reads a block of 64 buckets at a time,
    /// checking each bucket's seqlock word before and after; a bucket that was locked or
    /// changed meanwhile is read again on its own.
    fn scan_all(&self, f: &mut dyn FnMut(u64, &Bucket) -> Result<()>) -> Result<()> {
        let rule = self.lock_rule();
        let mut chunk = vec![0u8; BLOCK_SIZE as usize];
        let mut before = [0u64; BUCKETS_PER_BLOCK as usize];
        let mut start = 0;
        while start < self.buckets {
            let n = (self.buckets - start).min(BUCKETS_PER_BLOCK) as usize;
            for (i, v) in before[..n].iter_mut().enumerate() {
                *v = self.media.load_u64(self.bucket_off(start + i as u64))?;
            }
            self.media.read(
                self.bucket_off(start),
                &mut chunk[..n * CACHE_LINE as usize],
            )?;
            fence(Ordering::Acquire);
            for (i, line) in chunk[..n * CACHE_LINE as usize]
                .chunks_exact(CACHE_LINE as usize)
                .enumerate()
            {
                let b = start + i as u64;
                let after = self.media.load_u64(self.bucket_off(b))?;
                let bucket = if after == before[i] && !rule.is_locked(after) {
                    Bucket::decode(line).ok_or_else(|| Error::Corrupt {
                        what: "cuckoo bucket",
                        at: self.bucket_off(b),
                    })?
                } else {
                    let [one] = self.read_snapshot([b])?;
                    one
                };
                f(b, &bucket)?;
            }
            start += n as u64;
        }
        Ok(())
    }

    /// Every mapped block of `ino` in `[lblk, end)` from a scan of all buckets, ascending.
    fn scan_blocks(&self, ino: u64, lblk: u64, end: u64) -> Result<Vec<(u64, Value)>> {
        let mut hits = self.gated(|| {
            let mut hits = Vec::new();
            self.scan_all(&mut |b, bucket| {
                for (key, v) in bucket.entries.iter().flatten() {
                    if key.ino == ino && (lblk..end).contains(&key.lblk) {
                        self.alternate(*key, b)?;
                        hits.push((key.lblk, *v));
                    }
                }
                Ok(())
            })?;
            Ok(hits)
        })?;
        hits.sort_unstable_by_key(|h| h.0);
        // A block removed and inserted again by a writer of the file while a lookup scanned
        // may be seen twice; either value is one it had during the lookup.
        hits.dedup_by_key(|h| h.0);
        Ok(hits)
    }

    /// Appends the mapped runs of `[lblk, end)`.
    fn lookup_range(
        &self,
        file: &CuckooFile,
        lblk: u64,
        end: u64,
        out: &mut Vec<Run>,
    ) -> Result<()> {
        let first = out.len();
        if lblk >= end {
            return Ok(());
        }
        if self.use_scan(lblk, end) {
            for (l, v) in self.scan_blocks(file.ino, lblk, end)? {
                push_run(out, first, l, v.pblk, 1);
            }
            return Ok(());
        }
        let mut l = lblk;
        while l < end {
            match self.get(file, l)? {
                Some(v) => {
                    let len = v.size.min(end - l);
                    push_run(out, first, l, v.pblk, len);
                    l += len;
                }
                None => l += 1,
            }
        }
        Ok(())
    }

    /// Checks that `[lblk, lblk + len)` (`len` ≥ 1) lies below [`LBLK_LIMIT`], that none of
    /// its blocks is mapped and that the table could hold it; returns its end.
    fn check_insert(&self, file: &CuckooFile, lblk: u64, len: u64) -> Result<u64> {
        let end =
            lblk.checked_add(len)
                .filter(|&e| e <= LBLK_LIMIT)
                .ok_or(Error::InvalidArgument(
                    "logical block beyond the 2^32 limit of a global table",
                ))?;
        let mut existing = Vec::new();
        self.lookup_range(file, lblk, end, &mut existing)?;
        if !existing.is_empty() {
            return Err(Error::InvalidArgument("insert over mapped blocks"));
        }
        if len > self.slots() {
            return Err(Error::NoSpace);
        }
        Ok(end)
    }

    /// Maps `run`, which ends at logical block `end`, in pieces of at most [`RUN_MAX`] blocks
    /// (the body of `insert_at` after its checks).
    fn map_run(&self, file: &CuckooFile, run: Run, end: u64) -> Result<()> {
        let pieces: Vec<Extent> = (0..run.len.div_ceil(RUN_MAX))
            .map(|i| {
                let at = i * RUN_MAX;
                Extent::new(run.pblk + at, (run.len - at).min(RUN_MAX))
            })
            .collect();
        self.map_runs(file, run.lblk, end, &pieces, |_| Ok(()))
    }

    /// Maps `[lblk, end)` to `runs` (in logical order, each at most [`RUN_MAX`] blocks, one
    /// ranged run each) under an insert intent: the shared body of `insert` and `insert_at`.
    /// When the call fails before anything is mapped, or the table runs full and the entries
    /// written so far are deleted again, it calls `give_back` with `runs` (the data blocks are
    /// the caller's business) and returns the error.
    fn map_runs(
        &self,
        file: &CuckooFile,
        lblk: u64,
        end: u64,
        runs: &[Extent],
        give_back: impl FnOnce(&[Extent]) -> Result<()>,
    ) -> Result<()> {
        let mut intent = match self.intent() {
            Ok(i) => i,
            Err(e) => {
                give_back(runs)?;
                return Err(e);
            }
        };
        intent.begin(OP_INSERT, [file.ino, lblk, end, 0, 0, 0])?;
        let mut dirty = Vec::new();
        let mut l = lblk;
        for e in runs {
            for k in 0..e.len {
                let v = Value {
                    pblk: e.start.0 + k,
                    size: e.len - k,
                    rev: k,
                };
                match self.insert_entry(&intent, Key::new(file.ino, l + k), v, &mut dirty) {
                    Ok(()) => {}
                    Err(Error::NoSpace) => {
                        self.delete_range(file.ino, lblk, end, &mut dirty)?;
                        self.flush_buckets(&mut dirty)?;
                        self.media.fence();
                        intent.finish()?;
                        give_back(runs)?;
                        return Err(Error::NoSpace);
                    }
                    Err(err) => return Err(err),
                }
            }
            l += e.len;
        }
        self.flush_buckets(&mut dirty)?;
        self.media.fence();
        intent.finish()
    }

    /// Allocates `len` blocks as runs of at most [`RUN_MAX`]; frees them all on failure.
    fn allocate(&self, len: u64) -> Result<Vec<Extent>> {
        let mut got: Vec<Extent> = Vec::new();
        let mut done = 0;
        while done < len {
            let hint = AllocHint {
                goal: got.last().map(Extent::end),
                ..AllocHint::default()
            };
            let r = self
                .alloc
                .alloc((len - done).min(RUN_MAX), hint)
                .and_then(|e| {
                    if e.len == 0 || e.len > RUN_MAX || e.end().0 > bucket::PBLK_LIMIT {
                        Err(Error::InvalidArgument(
                            "allocator returned an unusable extent",
                        ))
                    } else {
                        Ok(e)
                    }
                });
            match r {
                Ok(e) => {
                    done += e.len;
                    got.push(e);
                }
                Err(err) => {
                    for e in got {
                        self.alloc.free(e)?;
                    }
                    return Err(err);
                }
            }
        }
        Ok(got)
    }

    /// Deletes every entry of `ino` in `[lblk, end)` (insert rollback); returns how many.
    fn delete_range(&self, ino: u64, lblk: u64, end: u64, dirty: &mut Vec<u64>) -> Result<u64> {
        if !self.use_scan(lblk, end) {
            return self.update_range(ino, lblk, end, dirty, |_, _| None);
        }
        let mut n = 0;
        for (l, _) in self.scan_blocks(ino, lblk, end)? {
            if self.update(Key::new(ino, l), dirty, |_| None)?.is_some() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// [`update`](Self::update)s the entries of `ino` in `[from, to)` with `f(lblk, value)`;
    /// returns how many it found. The buckets of keys a few ahead are prefetched: neighbouring
    /// keys hash to unrelated lines, and each would otherwise be a miss of its own.
    fn update_range(
        &self,
        ino: u64,
        from: u64,
        to: u64,
        dirty: &mut Vec<u64>,
        f: impl Fn(u64, Value) -> Option<Value>,
    ) -> Result<u64> {
        let seeds = seeds(ino, self.salt);
        let prefetch = |l: u64| {
            if l < to {
                let (b1, b2) = self.buckets_of(seeds, l);
                self.media.prefetch(self.bucket_off(b1));
                self.media.prefetch(self.bucket_off(b2));
            }
        };
        (from..to.min(from + PREFETCH_KEYS)).for_each(prefetch);
        let mut found = 0;
        for l in from..to {
            prefetch(l + PREFETCH_KEYS);
            if self.update(Key::new(ino, l), dirty, |v| f(l, v))?.is_some() {
                found += 1;
            }
        }
        Ok(found)
    }

    /// Trims the runs that `[lblk, end)` cuts: `size` of the entries in `[left, lblk)` so that
    /// they end at `lblk`, `rev` of those in `[end, right)` so that they start at `end`.
    fn trim_cut(&self, ino: u64, fields: [u64; 4], dirty: &mut Vec<u64>) -> Result<()> {
        let [lblk, end, left, right] = fields;
        self.update_range(ino, left, lblk, dirty, |l, v| {
            Some(Value {
                size: v.size.min(lblk - l),
                ..v
            })
        })?;
        self.update_range(ino, end, right, dirty, |l, v| {
            Some(Value {
                rev: v.rev.min(l - end),
                ..v
            })
        })?;
        Ok(())
    }

    /// The run repairs and deletions of a remove; idempotent (also the recovery redo).
    fn apply_remove(&self, ino: u64, fields: [u64; 4], dirty: &mut Vec<u64>) -> Result<()> {
        self.trim_cut(ino, fields, dirty)?;
        self.delete_range(ino, fields[0], fields[1], dirty)?;
        Ok(())
    }

    /// The in-place rewrite of a replace (see the module documentation), idempotent (also the
    /// recovery redo): the runs cut at `lblk` and `end` are trimmed
    /// ([`trim_cut`](Self::trim_cut)), then every entry of `[lblk, end)` gets its block of the
    /// run starting at `pblk`. Every key of the range must be mapped.
    fn apply_replace(&self, ino: u64, fields: [u64; 5], dirty: &mut Vec<u64>) -> Result<()> {
        let [lblk, end, pblk, left, right] = fields;
        self.trim_cut(ino, [lblk, end, left, right], dirty)?;
        let found = self.update_range(ino, lblk, end, dirty, |l, _| {
            Some(Value {
                pblk: pblk + (l - lblk),
                size: end - l,
                rev: l - lblk,
            })
        })?;
        if found != end - lblk {
            return Err(Error::Corrupt {
                what: "cuckoo replace of an unmapped block",
                at: self.meta.start.offset(),
            });
        }
        Ok(())
    }

    /// Replaces in place the mapping of `[lblk, lblk + len)` (`len` ≤ [`RUN_MAX`], every
    /// block mapped) by the run starting at `pblk`, without the final fence: a lone block is
    /// one value store left in `dirty`, any other piece runs under an intent record (flushing
    /// `dirty` and fencing before the record is freed).
    fn replace_piece(
        &self,
        file: &CuckooFile,
        lblk: u64,
        len: u64,
        pblk: u64,
        dirty: &mut Vec<u64>,
    ) -> Result<()> {
        let end = lblk + len;
        let corrupt = || Error::Corrupt {
            what: "cuckoo run fields",
            at: self.meta.start.offset(),
        };
        let first = self.get(file, lblk)?.ok_or_else(corrupt)?;
        let last = if len == 1 {
            first
        } else {
            self.get(file, end - 1)?.ok_or_else(corrupt)?
        };
        let left = lblk.checked_sub(first.rev).ok_or_else(corrupt)?;
        let right = (end - 1 + last.size).min(LBLK_LIMIT);
        let fields = [lblk, end, pblk, left, right];
        if len == 1 && left == lblk && right == end {
            return self.apply_replace(file.ino, fields, dirty);
        }
        let mut intent = self.intent()?;
        intent.begin(OP_REPLACE, [file.ino, lblk, end, pblk, left, right])?;
        self.apply_replace(file.ino, fields, dirty)?;
        self.flush_buckets(dirty)?;
        self.media.fence();
        intent.finish()
    }

    /// Whether `run` may be mapped by this table: below the logical limit, below the
    /// physical limit of a value word, and outside the table's own blocks.
    fn mappable(&self, run: &Run) -> bool {
        let given = run.extent();
        run.lblk
            .checked_add(run.len)
            .is_some_and(|e| e <= LBLK_LIMIT)
            && given
                .start
                .0
                .checked_add(run.len)
                .is_some_and(|e| e <= bucket::PBLK_LIMIT)
            && !(given.start < self.meta.end() && given.end() > self.meta.start)
    }

    /// Checks the whole table (fsck): every entry sits in one of its two buckets, no key and
    /// no physical block appears twice, and the run fields of neighbouring entries agree
    /// (`size` and `rev` of `lblk + 1` follow from those of `lblk`). Returns the number of
    /// entries.
    pub fn verify(&self) -> Result<u64> {
        let (keys, _) = self.gated(|| {
            let mut keys: HashMap<Key, Value> = HashMap::new();
            let mut pblks = HashSet::new();
            self.scan_all(&mut |b, bucket| {
                for (key, v) in bucket.entries.iter().flatten() {
                    self.alternate(*key, b)?;
                    if keys.insert(*key, *v).is_some() || !pblks.insert(v.pblk) {
                        return Err(Error::Corrupt {
                            what: "cuckoo key or block mapped twice",
                            at: self.bucket_off(b),
                        });
                    }
                }
                Ok(())
            })?;
            Ok((keys, pblks))
        })?;
        for (key, v) in &keys {
            let next = (v.size > 1).then(|| {
                keys.get(&Key::new(key.ino, key.lblk + 1)).copied()
                    == Some(Value {
                        pblk: v.pblk + 1,
                        size: v.size - 1,
                        rev: v.rev + 1,
                    })
            });
            let prev = (v.rev > 0).then(|| {
                key.lblk > 0
                    && keys.get(&Key::new(key.ino, key.lblk - 1)).copied()
                        == Some(Value {
                            pblk: v.pblk - 1,
                            size: v.size + 1,
                            rev: v.rev - 1,
                        })
            });
            if next == Some(false) || prev == Some(false) {
                return Err(Error::Corrupt {
                    what: "cuckoo run fields",
                    at: self.first_bucket,
                });
            }
        }
        Ok(keys.len() as u64)
    }

    /// The epoch bucket locks are currently taken in.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn check_recovered(&self, at: PmOff, ok: bool) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::Corrupt {
                what: "cuckoo intent record",
                at,
            })
        }
    }
}

/// State of one wait for a bucket.
#[derive(Debug, Default)]
struct Backoff {
    rounds: u32,
    since: Option<Instant>,
}

/// A move announced at the gate; counted as finished on drop.
struct GateGuard<'a, M: Media, A: BlockAllocator> {
    table: &'a CuckooMapping<M, A>,
}

impl<M: Media, A: BlockAllocator> Drop for GateGuard<'_, M, A> {
    fn drop(&mut self) {
        // On failure the gate keeps counting the move as running; scanners then stop with an
        // error after their patience until recovery resets the gate.
        let counted = self
            .table
            .gate_update(|w| Some((w & !GATE_COUNT) | ((w + 1) & GATE_COUNT)));
        self.table.unreleased_if(counted);
    }
}

/// Lets moves run again when a scanner that stopped them is done.
struct Unfreeze<'a, M: Media, A: BlockAllocator> {
    table: &'a CuckooMapping<M, A>,
}

impl<M: Media, A: BlockAllocator> Drop for Unfreeze<'_, M, A> {
    fn drop(&mut self) {
        // A failure leaves moves stopped until recovery resets the gate.
        let thawed = self.table.gate_update(|w| Some(w & !GATE_FROZEN));
        self.table.unreleased_if(thawed);
    }
}

/// Both bucket locks of one key, released on drop.
struct PairGuard<'a, M: Media, A: BlockAllocator> {
    table: &'a CuckooMapping<M, A>,
    first: (u64, u64),
    second: Option<(u64, u64)>,
}

impl<M: Media, A: BlockAllocator> Drop for PairGuard<'_, M, A> {
    fn drop(&mut self) {
        if let Some((b, w)) = self.second {
            self.table.unlock_one(b, w);
        }
        self.table.unlock_one(self.first.0, self.first.1);
    }
}

impl<M: Media, A: BlockAllocator> FileMapping for CuckooMapping<M, A> {
    type File = CuckooFile;

    fn kind(&self) -> MappingKind {
        MappingKind::Cuckoo
    }

    fn open_file(&self, id: FileId) -> Result<CuckooFile> {
        if id.ino > MAX_INO {
            return Err(Error::InvalidArgument(
                "inode number too large for a global table",
            ));
        }
        Ok(CuckooFile {
            ino: id.ino,
            seeds: seeds(id.ino, self.salt),
            inserts: Arc::default(),
        })
    }

    fn lookup(&self, file: &CuckooFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let end = lblk.saturating_add(len).min(LBLK_LIMIT);
        let first = out.len();
        loop {
            let before = file.inserts.seq.load(Ordering::Acquire);
            self.lookup_range(file, lblk, end, out)?;
            fence(Ordering::Acquire);
            let after = file.inserts.seq.load(Ordering::Relaxed);
            match file.inserts.beside(before, after) {
                Ok(None) => return Ok(()),
                Ok(Some((a, b))) => {
                    cut_out(out, first, a, b);
                    return Ok(());
                }
                Err(()) => out.truncate(first),
            }
        }
    }

    /// A range longer than a quarter of the table's slots is one lookup, one pass over the
    /// table, instead of a probe per block.
    fn first_mapped(&self, file: &CuckooFile, lblk: u64, len: u64) -> Result<Option<u64>> {
        let end = lblk.saturating_add(len).min(LBLK_LIMIT);
        if lblk >= end || !self.use_scan(lblk, end) {
            return first_mapped_by_lookups(self, file, lblk, end.saturating_sub(lblk));
        }
        let mut runs = Vec::new();
        self.lookup(file, lblk, end - lblk, &mut runs)?;
        Ok(runs.first().map(|r| r.lblk))
    }

    fn prefetch(&self, file: &CuckooFile, lblk: u64) {
        let (b1, b2) = self.buckets_of(file.seeds, lblk);
        self.media.prefetch(self.bucket_off(b1));
        self.media.prefetch(self.bucket_off(b2));
    }

    fn insert(&self, file: &CuckooFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = self.check_insert(file, lblk, len)?;
        let runs = self.allocate(len)?;
        let _running = file.inserts.begin(lblk, end);
        self.map_runs(file, lblk, end, &runs, |runs| {
            runs.iter().try_for_each(|&e| self.alloc.free(e))
        })?;
        let first = out.len();
        let mut l = lblk;
        for e in &runs {
            push_run(out, first, l, e.start.0, e.len);
            l += e.len;
        }
        Ok(())
    }

    fn insert_at(&self, file: &CuckooFile, run: Run) -> Result<()> {
        if run.len == 0 {
            return Ok(());
        }
        // The same bounds as for blocks from the allocator (which may lie outside the
        // table's region), and never the table's own blocks.
        let given = run.extent();
        if given
            .start
            .0
            .checked_add(run.len)
            .is_none_or(|e| e > bucket::PBLK_LIMIT)
            || (given.start < self.meta.end() && given.end() > self.meta.start)
        {
            return Err(Error::InvalidArgument(
                "blocks beyond the table's physical limit or inside its meta area",
            ));
        }
        let end = self.check_insert(file, run.lblk, run.len)?;
        let _running = file.inserts.begin(run.lblk, end);
        self.map_run(file, run, end)
    }

    fn remove(&self, file: &CuckooFile, lblk: u64, len: u64) -> Result<u64> {
        let end = lblk.saturating_add(len).min(LBLK_LIMIT);
        if lblk >= end {
            return Ok(0);
        }
        let mut runs = Vec::new();
        self.lookup_range(file, lblk, end, &mut runs)?;
        if runs.is_empty() {
            return Ok(0);
        }
        let corrupt = || Error::Corrupt {
            what: "cuckoo run fields",
            at: self.meta.start.offset(),
        };
        let left = match self.get(file, lblk)? {
            Some(v) => lblk.checked_sub(v.rev).ok_or_else(corrupt)?,
            None => lblk,
        };
        let right = match self.get(file, end - 1)? {
            Some(v) => (end - 1 + v.size).min(LBLK_LIMIT),
            None => end,
        };
        let mut intent = self.intent()?;
        intent.begin(OP_REMOVE, [file.ino, lblk, end, left, right, 0])?;
        let mut dirty = Vec::new();
        self.apply_remove(file.ino, [lblk, end, left, right], &mut dirty)?;
        self.flush_buckets(&mut dirty)?;
        self.media.fence();
        intent.finish()?;
        for r in &runs {
            self.alloc.free(r.extent())?;
        }
        Ok(runs.iter().map(|r| r.len).sum())
    }

    fn replace_many(&self, file: &CuckooFile, runs: &[Run]) -> Result<u64> {
        let mut dirty = Vec::new();
        let mut replaced: Vec<Extent> = Vec::new();
        let mut freed = 0;
        let mut got = Vec::new();
        let mut r = runs.iter().try_for_each(|run| {
            got.clear();
            self.lookup(file, run.lblk, run.len, &mut got)?;
            if maps_exactly(run, &mut got) {
                return Ok(());
            }
            if got.is_empty() && self.mappable(run) && run.len <= self.slots() {
                // Nothing is mapped there (an append, a hole filled): an insert, without the
                // two more lookups of the same range that `replace` makes (its remove, and
                // `insert_at`'s check).
                let end = run.lblk + run.len;
                let _running = file.inserts.begin(run.lblk, end);
                return self.map_run(file, *run, end);
            }
            if !self.mappable(run) || got.iter().map(|g| g.len).sum::<u64>() != run.len {
                freed += self.replace(file, *run)?;
                return Ok(());
            }
            let mut at = 0;
            while at < run.len {
                let len = (run.len - at).min(RUN_MAX);
                self.replace_piece(file, run.lblk + at, len, run.pblk.0 + at, &mut dirty)?;
                at += len;
            }
            for g in &got {
                for k in 0..g.len {
                    let (old, new) = (g.pblk.0 + k, run.pblk.0 + (g.lblk + k - run.lblk));
                    if old == new {
                        continue;
                    }
                    match replaced.last_mut() {
                        Some(e) if e.end().0 == old => e.len += 1,
                        _ => replaced.push(Extent::new(BlockNo(old), 1)),
                    }
                }
            }
            Ok(())
        });
        // The pieces replaced so far are made durable, and only then are their old blocks
        // freed, also when a later run failed.
        let flushed = self.flush_buckets(&mut dirty);
        self.media.fence();
        r = r.and(flushed);
        replaced.sort_unstable();
        freed += replaced.iter().map(|e| e.len).sum::<u64>();
        self.alloc.free_many(&replaced)?;
        r.map(|()| freed)
    }

    fn remove_file(&self, file: &CuckooFile) -> Result<()> {
        self.remove(file, 0, LBLK_LIMIT).map(drop)
    }

    fn owned_blocks(&self, file: &CuckooFile, visit: &mut dyn FnMut(Extent)) -> Result<()> {
        let mut runs = Vec::new();
        self.lookup_range(file, 0, LBLK_LIMIT, &mut runs)?;
        runs.iter().for_each(|r| visit(r.extent()));
        Ok(())
    }

    fn visit_all(&self, visit: &mut dyn FnMut(u64, Run)) -> Result<bool> {
        self.gated(|| {
            self.scan_all(&mut |b, bucket| {
                for (key, v) in bucket.entries.iter().flatten() {
                    self.alternate(*key, b)?;
                    visit(
                        key.ino,
                        Run {
                            lblk: key.lblk,
                            pblk: BlockNo(v.pblk),
                            len: 1,
                        },
                    );
                }
                Ok(())
            })
        })?;
        Ok(true)
    }

    fn recovery_owed(&self) -> bool {
        self.unreleased.load(Ordering::Relaxed) || self.intents.recovery_owed()
    }

    fn recover(&self) -> Result<()> {
        self.writable()?;
        let epoch_at = self.meta.start.offset() + EPOCH_OFF;
        let epoch = (self.media.load_u64(epoch_at)? + 1) & 0xffff_ffff;
        self.media.store_u64_persist(epoch_at, epoch)?;
        self.epoch.store(epoch, Ordering::Release);
        self.media.store_u64(self.gate_off(), 0)?;
        let records = self
            .intents
            .scan(&self.media, &[OP_INSERT, OP_REMOVE, OP_MOVE, OP_REPLACE])?;
        for r in records.iter().filter(|r| r.line == 1) {
            let at = self.intents.record(r.index) + CACHE_LINE;
            let [sb, sw, db, dw, key, _] = r.fields;
            self.check_recovered(
                at,
                r.kind == OP_MOVE
                    && sb < self.buckets
                    && db < self.buckets
                    && sw < WAYS as u64
                    && dw < WAYS as u64,
            )?;
            let src = self
                .media
                .load_u64(key_off(self.bucket_off(sb), sw as usize))?;
            let dst = self
                .media
                .load_u64(key_off(self.bucket_off(db), dw as usize))?;
            if src == key && dst == key {
                self.clear_entry(db, dw as usize)?;
                self.media.flush(self.bucket_off(db), CACHE_LINE)?;
            }
        }
        self.media.fence();
        let mut dirty = Vec::new();
        for r in records.iter().filter(|r| r.line == 0) {
            let at = self.intents.record(r.index);
            let [ino, lblk, end, left, right, _] = r.fields;
            let range_ok = ino <= MAX_INO && lblk <= end && end <= LBLK_LIMIT;
            match r.kind {
                OP_INSERT => {
                    self.check_recovered(at, range_ok)?;
                    self.delete_range(ino, lblk, end, &mut dirty)?;
                }
                OP_REMOVE => {
                    self.check_recovered(
                        at,
                        range_ok
                            && left <= lblk
                            && lblk - left < RUN_MAX
                            && end <= right
                            && right - end < RUN_MAX
                            && right <= LBLK_LIMIT,
                    )?;
                    self.apply_remove(ino, [lblk, end, left, right], &mut dirty)?;
                }
                OP_REPLACE => {
                    let [_, _, _, pblk, left, right] = r.fields;
                    self.check_recovered(
                        at,
                        range_ok
                            && end - lblk <= RUN_MAX
                            && left <= lblk
                            && lblk - left < RUN_MAX
                            && end <= right
                            && right - end < RUN_MAX
                            && right <= LBLK_LIMIT
                            && pblk
                                .checked_add(end - lblk)
                                .is_some_and(|e| e <= bucket::PBLK_LIMIT),
                    )?;
                    self.apply_replace(ino, [lblk, end, pblk, left, right], &mut dirty)?;
                }
                _ => self.check_recovered(at, false)?,
            }
        }
        self.flush_buckets(&mut dirty)?;
        self.media.fence();
        self.intents.reset(&self.media)
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::pm::HeapRegion;
    use pmfs_core::traits::SimpleAllocator;

    use super::*;

    type Table = CuckooMapping<Arc<HeapRegion>, SimpleAllocator>;

    /// A table of 64 buckets (192 entries) over `data` blocks starting at block 16.
    fn table(data: u64) -> Table {
        let r = Arc::new(HeapRegion::new((16 + data) * BLOCK_SIZE).unwrap());
        let alloc = Arc::new(SimpleAllocator::new(BlockNo(16), data));
        CuckooMapping::format_with_salt(r, Extent::new(BlockNo(1), 4), alloc, 3).unwrap()
    }

    fn file(t: &Table, ino: u64) -> CuckooFile {
        t.open_file(FileId {
            ino,
            root: PmOff(0),
        })
        .unwrap()
    }

    fn runs(t: &Table, f: &CuckooFile, lblk: u64, len: u64) -> Vec<Run> {
        let mut out = Vec::new();
        t.lookup(f, lblk, len, &mut out).unwrap();
        out
    }

    fn blocks(t: &Table, f: &CuckooFile) -> Vec<(u64, u64)> {
        runs(t, f, 0, 1000)
            .iter()
            .flat_map(|r| (0..r.len).map(move |k| (r.lblk + k, r.pblk.0 + k)))
            .collect()
    }

    #[test]
    fn meta_blocks_sizes_the_table_for_its_capacity() {
        assert_eq!(Table::meta_blocks(1), 4);
        let t = table(10);
        assert_eq!(t.slots(), 192);
        assert!(Table::meta_blocks(163) == 4 && Table::meta_blocks(164) == 5);
    }

    #[test]
    fn ranged_entries_describe_runs_and_survive_cuts() {
        let t = table(1000);
        let f = file(&t, 5);
        let mut out = Vec::new();
        t.insert(&f, 20, 10, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        let p = out[0].pblk.0;
        assert_eq!(
            t.get(&f, 23).unwrap(),
            Some(Value {
                pblk: p + 3,
                size: 7,
                rev: 3
            })
        );
        assert_eq!(t.verify().unwrap(), 10);
        assert_eq!(t.remove(&f, 24, 2).unwrap(), 2);
        assert_eq!(t.verify().unwrap(), 8);
        assert_eq!(
            t.get(&f, 23).unwrap(),
            Some(Value {
                pblk: p + 3,
                size: 1,
                rev: 3
            })
        );
        assert_eq!(
            t.get(&f, 26).unwrap(),
            Some(Value {
                pblk: p + 6,
                size: 4,
                rev: 0
            })
        );
        let got = runs(&t, &f, 0, 100);
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].lblk, got[0].len, got[1].lblk, got[1].len),
            (20, 4, 26, 4)
        );
        assert_eq!(runs(&t, &f, 22, 6).iter().map(|r| r.len).sum::<u64>(), 4);
        assert_eq!(t.allocator().free_blocks(), 1000 - 8);
    }

    #[test]
    fn long_inserts_split_into_runs_of_at_most_run_max() {
        let r = Arc::new(HeapRegion::new(2100 * BLOCK_SIZE).unwrap());
        let alloc = Arc::new(SimpleAllocator::new(BlockNo(40), 2000));
        let meta = Extent::new(BlockNo(1), Table::meta_blocks(2000));
        let t = CuckooMapping::format_with_salt(r, meta, alloc, 1).unwrap();
        let f = file(&t, 1);
        let mut out = Vec::new();
        t.insert(&f, 0, 1500, &mut out).unwrap();
        assert_eq!(out.len(), 1, "one physically contiguous run");
        assert_eq!(t.get(&f, 0).unwrap().unwrap().size, RUN_MAX);
        assert_eq!(t.get(&f, RUN_MAX).unwrap().unwrap().rev, 0);
        assert_eq!(t.verify().unwrap(), 1500);
        assert_eq!(t.remove(&f, 100, 1000).unwrap(), 1000);
        assert_eq!(t.verify().unwrap(), 500);
    }

    #[test]
    fn cut_out_splits_the_runs_it_cuts() {
        let run = |lblk, pblk, len| Run {
            lblk,
            pblk: BlockNo(pblk),
            len,
        };
        let mut out = vec![run(90, 9, 1), run(0, 100, 10), run(20, 300, 4)];
        cut_out(&mut out, 1, 3, 21);
        assert_eq!(
            out,
            [run(90, 9, 1), run(0, 100, 3), run(21, 301, 3)],
            "runs before `first` stay, cut runs keep their outer parts"
        );
        cut_out(&mut out, 1, 0, 100);
        assert_eq!(out, [run(90, 9, 1)]);
    }

    #[test]
    fn lookups_beside_one_insert_learn_its_range_and_beside_two_look_again() {
        let ins = Inserts::default();
        let seq = || ins.seq.load(Ordering::SeqCst);
        assert_eq!(ins.beside(seq(), seq()), Ok(None));
        let idle = seq();
        let running = ins.begin(5, 9);
        assert_eq!(ins.beside(idle, seq()), Ok(Some((5, 9))), "begun during");
        assert_eq!(
            ins.beside(seq(), seq()),
            Ok(Some((5, 9))),
            "running throughout"
        );
        let during = seq();
        drop(running);
        assert_eq!(ins.beside(during, seq()), Ok(Some((5, 9))), "ended during");
        assert_eq!(ins.beside(idle, seq()), Ok(Some((5, 9))), "begun and ended");
        assert_eq!(ins.beside(seq(), seq()), Ok(None));
        let second = ins.begin(20, 30);
        assert_eq!(ins.beside(idle, seq()), Err(()), "two inserts");
        assert_eq!(ins.beside(during, seq()), Err(()), "one ended, one begun");
        drop(second);
    }

    #[test]
    fn insert_at_splits_long_runs_and_refuses_mapped_or_foreign_blocks() {
        let r = Arc::new(HeapRegion::new(2100 * BLOCK_SIZE).unwrap());
        let alloc = Arc::new(SimpleAllocator::new(BlockNo(40), 2000));
        let meta = Extent::new(BlockNo(1), Table::meta_blocks(2000));
        let t = CuckooMapping::format_with_salt(r, meta, alloc.clone(), 1).unwrap();
        let f = file(&t, 1);
        let e = alloc.alloc(1500, AllocHint::default()).unwrap();
        assert_eq!(e.len, 1500);
        let run = Run {
            lblk: 7,
            pblk: e.start,
            len: 1500,
        };
        t.insert_at(&f, run).unwrap();
        assert_eq!(runs(&t, &f, 0, 2000), vec![run]);
        for (l, size, rev) in [
            (7, RUN_MAX, 0),
            (7 + RUN_MAX, RUN_MAX, 0),
            (6 + 1500, 1, 475),
        ] {
            let v = t.get(&f, l).unwrap().unwrap();
            assert_eq!((v.size, v.rev), (size, rev), "lblk {l}");
        }
        assert_eq!(t.verify().unwrap(), 1500);
        let free = alloc.free_blocks();
        let spare = alloc.alloc(4, AllocHint::default()).unwrap();
        let at = |lblk, pblk| Run { lblk, pblk, len: 4 };
        for (bad, why) in [
            (at(1505, spare.start), "the first two blocks are mapped"),
            (at(4, spare.start), "the first is mapped"),
            (at(3000, meta.start + 1), "meta blocks"),
            (
                at(3000, BlockNo(bucket::PBLK_LIMIT - 2)),
                "past the physical limit",
            ),
        ] {
            let r = t.insert_at(&f, bad);
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{why}: {r:?}");
        }
        assert_eq!(t.verify().unwrap(), 1500);
        assert_eq!(alloc.free_blocks(), free - 4, "refusals free nothing");
        // Copy-on-write: the old blocks out, the caller's in.
        assert_eq!(t.remove(&f, 1503, 4).unwrap(), 4);
        t.insert_at(&f, at(1503, spare.start)).unwrap();
        assert_eq!(runs(&t, &f, 1503, 10), vec![at(1503, spare.start)]);
        assert_eq!(t.verify().unwrap(), 1500);
    }

    #[test]
    fn insert_at_into_a_full_table_changes_nothing_and_keeps_the_callers_blocks() {
        let t = table(400);
        let files: Vec<_> = (1..=8).map(|i| file(&t, i)).collect();
        let mut inserted = 0;
        'fill: for round in 0..100 {
            for f in &files {
                let e = t.allocator().alloc(1, AllocHint::default()).unwrap();
                let run = Run {
                    lblk: round * 3,
                    pblk: e.start,
                    len: 1,
                };
                match t.insert_at(f, run) {
                    Ok(()) => inserted += 1,
                    Err(Error::NoSpace) => {
                        t.allocator().free(e).unwrap();
                        break 'fill;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert!(inserted > 175, "only {inserted} of 192 entries");
        assert_eq!(t.verify().unwrap(), inserted);
        let before: Vec<_> = files.iter().map(|f| blocks(&t, f)).collect();
        let e = t.allocator().alloc(30, AllocHint::default()).unwrap();
        let free = t.allocator().free_blocks();
        let run = Run {
            lblk: 900,
            pblk: e.start,
            len: e.len,
        };
        assert!(matches!(t.insert_at(&files[0], run), Err(Error::NoSpace)));
        assert_eq!(
            t.allocator().free_blocks(),
            free,
            "the caller's blocks stay"
        );
        let after: Vec<_> = files.iter().map(|f| blocks(&t, f)).collect();
        assert_eq!(before, after);
        assert_eq!(t.verify().unwrap(), inserted);
    }

    #[test]
    fn displacement_fills_the_table_and_nospace_changes_nothing() {
        let t = table(400);
        let files: Vec<_> = (1..=8).map(|i| file(&t, i)).collect();
        let mut inserted = 0;
        let mut out = Vec::new();
        'fill: for round in 0..100 {
            for f in &files {
                match t.insert(f, round * 3, 1, &mut out) {
                    Ok(()) => inserted += 1,
                    Err(Error::NoSpace) => break 'fill,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        // Two hash functions and three ways per bucket reach well over 90% load.
        assert!(inserted > 175, "only {inserted} of 192 entries");
        assert_eq!(t.verify().unwrap(), inserted);
        let before: Vec<_> = files.iter().map(|f| blocks(&t, f)).collect();
        let free = t.allocator().free_blocks();
        for _ in 0..3 {
            let e = t.insert(&files[0], 900, 30, &mut out);
            assert!(matches!(e, Err(Error::NoSpace)));
        }
        assert_eq!(t.allocator().free_blocks(), free);
        let after: Vec<_> = files.iter().map(|f| blocks(&t, f)).collect();
        assert_eq!(before, after);
        assert_eq!(t.verify().unwrap(), inserted);
    }

    #[test]
    fn recovery_resolves_moves_rolls_back_inserts_and_redoes_removes() {
        let t = table(100);
        let (a, b) = (file(&t, 1), file(&t, 2));
        let mut out = Vec::new();
        t.insert(&a, 0, 6, &mut out).unwrap();
        t.insert(&b, 0, 1, &mut out).unwrap();
        let before_a = blocks(&t, &a);
        // A move of b's entry that crashed after the copy: the entry is in both buckets.
        let key = Key::new(2, 0);
        let (b1, b2) = t.key_buckets(key);
        let (src, way, v) = [b1, b2]
            .into_iter()
            .find_map(|bk| {
                t.locked_bucket(bk)
                    .unwrap()
                    .find(key)
                    .map(|(w, v)| (bk, w, v))
            })
            .unwrap();
        let dst = if src == b1 { b2 } else { b1 };
        let dway = t.locked_bucket(dst).unwrap().free_way().unwrap();
        let rec = t.intents.acquire(&t.media).unwrap();
        let mut mv = rec.line(1).unwrap();
        mv.begin(
            OP_MOVE,
            [src, way as u64, dst, dway as u64, key.committed(), 0],
        )
        .unwrap();
        t.write_entry(dst, dway, key, v).unwrap();
        assert!(t.verify().is_err());
        // An insert of a's blocks 10..12 that crashed after one entry.
        let mut ins = t.intents.acquire(&t.media).unwrap();
        ins.begin(OP_INSERT, [1, 10, 12, 0, 0, 0]).unwrap();
        t.insert_entry(
            &ins,
            Key::new(1, 10),
            Value {
                pblk: 99,
                size: 2,
                rev: 0,
            },
            &mut Vec::new(),
        )
        .unwrap();
        // A remove of a's block 2 that crashed before touching anything.
        let mut rm = t.intents.acquire(&t.media).unwrap();
        rm.begin(OP_REMOVE, [1, 2, 3, 0, 6, 0]).unwrap();
        // A bucket lock held by a process that died.
        let w = t.media.load_u64(t.bucket_off(b1)).unwrap();
        t.media
            .store_u64(t.bucket_off(b1), t.lock_rule().locked(w))
            .unwrap();
        std::mem::forget((rec, mv, ins, rm));
        t.recover().unwrap();
        assert_eq!(t.verify().unwrap(), 6);
        assert_eq!(blocks(&t, &b).len(), 1);
        let want: Vec<_> = before_a.iter().copied().filter(|&(l, _)| l != 2).collect();
        assert_eq!(blocks(&t, &a), want);
        assert!(t.intents.scan(&t.media, &[2, 3, 4]).unwrap().is_empty());
    }

    #[test]
    fn a_lock_that_is_never_released_is_an_error_until_recovery() {
        let t = table(100);
        let f = file(&t, 1);
        let mut out = Vec::new();
        t.insert(&f, 0, 1, &mut out).unwrap();
        let (b1, _) = t.key_buckets(Key::new(1, 0));
        let w = t.media.load_u64(t.bucket_off(b1)).unwrap();
        t.media
            .store_u64(t.bucket_off(b1), t.lock_rule().locked(w))
            .unwrap();
        assert!(matches!(
            t.lookup(&f, 0, 1, &mut out),
            Err(Error::Corrupt { .. })
        ));
        t.recover().unwrap();
        out.clear();
        t.lookup(&f, 0, 1, &mut out).unwrap();
        assert_eq!(out.len(), 1);
    }

    /// A table a dead process left with a bucket locked and the move gate closed: a
    /// read-only handle reads through both at once, and writes nothing.
    #[test]
    fn a_read_only_table_ignores_a_dead_processs_lock_and_gate() {
        let t = table(100);
        let f = file(&t, 1);
        let mut out = Vec::new();
        t.insert(&f, 0, 3, &mut out).unwrap();
        let want = blocks(&t, &f);
        let (b1, _) = t.key_buckets(Key::new(1, 0));
        let w = t.media.load_u64(t.bucket_off(b1)).unwrap();
        t.media
            .store_u64(t.bucket_off(b1), t.lock_rule().locked(w))
            .unwrap();
        t.media.store_u64(t.gate_off(), GATE_FROZEN).unwrap();
        let image = |t: &Table| {
            let mut v = vec![0u8; t.media.size() as usize];
            t.media.read(PmOff(0), &mut v).unwrap();
            v
        };
        let before = image(&t);

        let ro = CuckooMapping::open_read_only(t.media.clone(), t.meta, t.alloc.clone()).unwrap();
        let g = file(&ro, 1);
        // A lookup of one block probes its buckets; one of the whole file scans the table
        // under the gate. Before recovery either would wait for the dead process and fail.
        let one = runs(&ro, &g, 0, 1);
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].lblk, one[0].pblk.0), want[0]);
        assert_eq!(blocks(&ro, &g), want);
        let mut all = Vec::new();
        assert!(
            ro.visit_all(&mut |ino, r| all.push((ino, r.lblk, r.pblk.0)))
                .unwrap()
        );
        all.sort_unstable();
        let tabled: Vec<_> = want.iter().map(|&(l, p)| (1, l, p)).collect();
        assert_eq!(all, tabled);
        for r in [
            ro.insert(&g, 5, 1, &mut out).map(drop),
            ro.remove(&g, 0, 1).map(drop),
            ro.recover(),
        ] {
            assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
        }
        assert!(image(&t) == before, "the read-only handle wrote");
        // The read-write handle still waits, and then fails, until recovery.
        assert!(matches!(
            t.lookup(&f, 0, 1, &mut out),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn corrupt_buckets_and_headers_are_errors() {
        let t = table(100);
        let f = file(&t, 1);
        let mut out = Vec::new();
        t.insert(&f, 0, 3, &mut out).unwrap();
        let media = t.media().clone();
        let alloc = t.allocator().clone();
        let meta = Extent::new(BlockNo(1), 4);
        for b in 0..t.buckets {
            media
                .store_u64(key_off(t.bucket_off(b), 2), 6 << 61)
                .unwrap();
        }
        assert!(matches!(
            t.lookup(&f, 0, 3, &mut out),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            t.lookup(&f, 0, 1 << 20, &mut out),
            Err(Error::Corrupt { .. })
        ));
        media.store_u64(meta.start.offset() + 32, 7).unwrap();
        assert!(matches!(
            CuckooMapping::open(media, meta, alloc),
            Err(Error::Corrupt { .. })
        ));
    }
}
