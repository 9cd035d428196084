//! loom models of the HashFS reclaim/seal handshake (the "Deletion: tombstones" and
//! "Concurrency" sections of the `hashfs` module docs): inserts whose walks passed entries
//! while they were live claim slots past their homes while removals tombstone those entries
//! and reclaim them, one slot at a time (`remove`, `unstage`: `HashFs::reclaim`) or in a batch
//! (`HashFs::tombstone_files`, then `HashFs::reclaim_all`: what `remove_files` does on a table
//! with few empty slots; on others it reclaims each slot as `remove` does).
//!
//! Checked in every interleaving, once the threads are done: every claimed slot is reachable
//! from its home (no empty slot lies between them), so an inserted block is found by a lookup;
//! no slot is left purging; the removed entries are gone and no two claims share a slot.
//!
//! One model stages a run of two blocks of one cluster, whose second claim starts where the
//! first one's ended and seals only the slots past it (`HashFs::claim_from`), while removals
//! free the entries both walk past; it fails if the second claim skips a slot or its seal.
//!
//! Two more models check the claims of log blocks (the "Log blocks" section,
//! `LogBlocks::alloc`): two threads allocate a log block of one file each, through handles
//! of their own that try the same key first, in an empty table or past an entry that a
//! `remove` frees meanwhile. Checked once the threads are done: the two blocks differ and
//! each is a committed log block of the file; no key is committed in two slots; every
//! committed slot is reachable from its home; no slot is left tentative or purging.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
//!     cargo test -p pmfs-mapping --release --test loom_hashfs
//! ```
//!
//! The table has eight slots, one cluster group, so a key's home is its logical block's place
//! in its cluster. The entries that the removals free sit in their home slots, followed by an
//! empty slot: a claim walks past them and lands on the slot whose emptiness the reclaim's
//! handshake re-checks, so every order of the claim's CAS, its seal and the reclaim's three
//! steps (purging, re-check, empty) is a possible interleaving. The threads touch nothing but
//! slot words and the header's free-count word, and every fence of the handshake comes from
//! `pmfs_core::sync` (loom's under `cfg(loom)`), so loom explores all their interleavings and
//! weak-memory outcomes under the [`Media`] contract (loads acquire, stores release, CAS
//! acquire-release). Flushes and persistence fences are no-ops: durability is the crash tests'
//! business. One entry and one or two claimers cover every step of the handshake on the claim's
//! side and on the reclaim's; two entries make the seal refill two slots (see below for what
//! that found).
//!
//! The table is formatted and filled on a heap region outside the model; each execution starts
//! from a copy of the words the operations use (the header and the slot table) in loom atomics,
//! and any other access panics.
//!
//! A log handle holds its table and tries keys in a sequence from a random start, so the log
//! models keep one table and two handles across executions. The table's media ([`Stage`])
//! reads the starting words between executions and the loom atomics of an execution during
//! it. Before each execution, the handles try keys on the starting words with every claim's
//! CAS refused, which changes nothing but their place in their sequences, until both try the
//! same key next and its home is [`HOME`] ([`align`]). The keys then differ from one
//! execution to the next only above their low three bits, which alone make the home in a
//! table of one cluster group, so every execution runs the same steps.
//!
//! # What the models found
//!
//! The seal used to fence once, before its whole walk, which orders only its first load
//! against the reclaims. The models whose seal must refill two slots failed then. Slots 3
//! (entry P, home 3) and 4 (entry Q, home 4), slot 5 empty; an insert X with home 3 walks
//! past P and Q, and one thread removes Q, then P:
//!
//! 1. The removal of Q empties slot 4 (it sees slot 5 still empty).
//! 2. The removal of P tombstones slot 3; its reclaim sees slot 4 empty.
//! 3. X claims slot 5, fences, finds slot 4 empty and CASes it to a tombstone, then loads
//!    slot 3 and still reads P: no fence of the removal's came after its tombstone, so
//!    nothing makes it visible.
//! 4. The reclaim marks slot 3 purging, fences, and re-checks slot 4: it reads it empty, as
//!    X's CAS on slot 4 came after X's fence. It empties slot 3, and X is cut off.
//!
//! With a second insert Y homed at slot 4 it happened without X writing anything: Y claims
//! slot 4 after step 1 (at its home, so no seal and no fence), X's seal fails its CAS on slot
//! 4 against Y's claim and reads slot 3 as P, and the reclaim's re-check reads slot 4 empty.
//! Neither outcome was possible on x86-64 hardware (a locked CAS is a full barrier, and
//! stores are seen by every core at once), but both are under the language's memory model.
//! The seal now fences before each load, and every model passes.
//!
//! The log models fail if a claimer does not search the key's whole chain for the other
//! claim (from the home, past its own slot, past tombstones, for tentative and committed
//! words), or leaves its slot tentative when it gives it up. Only the model with the removal
//! fails without the fence between the claim and the search. When no slot of the walks is
//! freed meanwhile, the claim whose slot lies further from the home walks past the other's
//! slot and either reads that claim or CASes the slot, and the two read-modify-writes order
//! the claimers. With the removal, one claim walks past the entry's slot while it is live,
//! the other takes the slot once it is freed, and only the fences make one of the two
//! searches see the other.

#![cfg(loom)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run};
use pmfs_core::{Error, Result};
use pmfs_mapping::hashfs::slot::{EMPTY, PURGING, Slot};
use pmfs_mapping::hashfs::{HashFs, HashFsFile, LOG_LBLK_END, LOG_LBLK_FIRST, LogBlocks};

const SLOTS: u64 = 8;
const META: Extent = Extent {
    start: BlockNo(1),
    len: 3,
};
const DATA: Extent = Extent {
    start: BlockNo(4),
    len: SLOTS,
};
/// The slot table: meta blocks 2.. (the module docs' format).
const TABLE: PmOff = PmOff((META.start.0 + 2) * BLOCK_SIZE);
const HEADER_WORDS: u64 = 16;
/// The header block's free-count word, which claims and frees read: it stays zero (nothing
/// counts in the models), so their notes touch no chunk word.
const FREE_COUNT_WORD: u64 = 256;
/// The home of the claims' blocks (of the first one's with two homes), of the first entry, and
/// of the key the log claims race on.
const HOME: u64 = 3;

/// A media whose words are loom atomics: the header and the slot table, nothing else.
/// Loads acquire, stores release, CAS acquire-release, as [`Media`] specifies.
struct LoomMedia {
    words: BTreeMap<u64, AtomicU64>,
}

impl LoomMedia {
    fn new(snapshot: &[(u64, u64)]) -> Self {
        let words = snapshot
            .iter()
            .map(|&(off, w)| (off, AtomicU64::new(w)))
            .collect();
        Self { words }
    }

    fn word(&self, off: PmOff) -> &AtomicU64 {
        self.words
            .get(&off.0)
            .unwrap_or_else(|| panic!("access outside the model at {off}"))
    }

    fn words_of(&self, off: PmOff, len: usize) -> impl Iterator<Item = &AtomicU64> {
        assert!(len.is_multiple_of(8), "partial word access at {off}");
        (0..len as u64 / 8).map(move |i| self.word(off + i * 8))
    }
}

impl Media for LoomMedia {
    fn size(&self) -> u64 {
        DATA.end().0 * BLOCK_SIZE
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        let n = buf.len();
        for (chunk, w) in buf.chunks_exact_mut(8).zip(self.words_of(off, n)) {
            chunk.copy_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        Ok(())
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        for (chunk, w) in src.chunks_exact(8).zip(self.words_of(off, src.len())) {
            w.store(
                u64::from_le_bytes(chunk.try_into().unwrap()),
                Ordering::Release,
            );
        }
        Ok(())
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.write(off, src)
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.write(off, &vec![byte; len as usize])
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        if off.0 + len > self.size() {
            return Err(Error::OutOfBounds {
                off,
                len,
                size: self.size(),
            });
        }
        Ok(())
    }

    fn fence(&self) {}

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        Ok(self.word(off).load(Ordering::Acquire))
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.word(off).store(val, Ordering::Release);
        Ok(())
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        Ok(self
            .word(off)
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire))
    }
}

type Table = HashFs<LoomMedia>;

fn file<M: Media>(t: &HashFs<M>, ino: u64) -> HashFsFile {
    t.open_file(FileId {
        ino,
        root: PmOff(0),
    })
    .unwrap()
}

/// The first logical block of `ino` whose home is `home`.
fn lblk_at<M: Media>(t: &HashFs<M>, ino: u64, home: u64) -> u64 {
    (0..).find(|&l| t.home_of(ino, l) == home).unwrap()
}

fn slot_off(i: u64) -> PmOff {
    TABLE + 8 * i
}

/// How an entry of the initial table is placed, and how a removal frees it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Inserted; freed by `remove` (a one-slot reclaim).
    Insert,
    /// Staged; freed by `unstage` (a one-slot reclaim).
    Stage,
    /// Inserted; freed by `tombstone_files` and the batch reclaim, `reclaim_all`.
    Batch,
}

/// A table whose entries `(ino, slot)` sit in their home slots, every other slot empty, as
/// the words a model starts from.
fn snapshot(entries: &[(u64, u64)], via: Via) -> Vec<(u64, u64)> {
    let region = HeapRegion::new(DATA.end().0 * BLOCK_SIZE).unwrap();
    let t = HashFs::format_with_salt(region, META, DATA, 7).unwrap();
    for &(ino, slot) in entries {
        let f = file(&t, ino);
        let mut out = Vec::new();
        let l = lblk_at(&t, ino, slot);
        match via {
            Via::Insert | Via::Batch => t.insert(&f, l, 1, &mut out).unwrap(),
            Via::Stage => t.stage(&f, l, 1, &mut out).unwrap(),
        }
        assert_eq!(
            out[0].pblk,
            DATA.start + slot,
            "entry {ino} not at its home"
        );
    }
    let header = (0..HEADER_WORDS).map(|k| META.start.offset() + 8 * k);
    header
        .chain([META.start.offset() + FREE_COUNT_WORD])
        .chain((0..SLOTS).map(slot_off))
        .map(|off| (off.0, t.media().load_u64(off).unwrap()))
        .collect()
}

/// Frees the entries `(ino, slot)` of the initial table, one removal after the other (all
/// at once with [`Via::Batch`]).
fn free<M: Media>(t: &HashFs<M>, entries: &[(u64, u64)], via: Via) {
    match via {
        Via::Insert => {
            for &(ino, slot) in entries {
                let l = lblk_at(t, ino, slot);
                assert_eq!(t.remove(&file(t, ino), l, 1).unwrap(), 1);
            }
        }
        Via::Stage => {
            for &(ino, slot) in entries {
                let run = Run {
                    lblk: lblk_at(t, ino, slot),
                    pblk: DATA.start + slot,
                    len: 1,
                };
                t.unstage(&[run]).unwrap();
            }
        }
        Via::Batch => {
            let inos: HashSet<u64> = entries.iter().map(|e| e.0).collect();
            let (freed, _) = t.tombstone_files(&inos).unwrap();
            assert_eq!(freed.len(), entries.len());
            t.reclaim_all().unwrap();
        }
    }
}

/// Claims a slot for block `lblk` of `ino` as `via` places entries, and returns the slot.
fn claim(t: &Table, ino: u64, lblk: u64, via: Via) -> u64 {
    let mut out = Vec::new();
    match via {
        Via::Insert | Via::Batch => t.insert(&file(t, ino), lblk, 1, &mut out).unwrap(),
        Via::Stage => t.stage(&file(t, ino), lblk, 1, &mut out).unwrap(),
    }
    out[0].pblk.0 - DATA.start.0
}

/// Whether a walk from `home` reaches slot `at` before an empty slot.
fn reachable<M: Media>(t: &HashFs<M>, home: u64, at: u64) -> bool {
    let mut i = home;
    while i != at {
        if t.media().load_u64(slot_off(i)).unwrap() == EMPTY {
            return false;
        }
        i = (i + 1) % SLOTS;
    }
    true
}

/// Runs every interleaving of one thread per home of `homes`, each claiming a slot for a
/// block of its own file with that home, beside a removal that frees `entries` (see
/// [`snapshot`]).
fn claims_beside_a_removal(entries: &'static [(u64, u64)], homes: &'static [u64], via: Via) {
    let start = snapshot(entries, via);
    loom::model(move || {
        let t = Arc::new(Table::open(LoomMedia::new(&start), META, DATA).unwrap());
        let keys: Vec<(u64, u64, u64)> = (1..)
            .zip(homes)
            .map(|(ino, &home)| (ino, home, lblk_at(&*t, ino, home)))
            .collect();
        let threads: Vec<_> = keys
            .iter()
            .map(|&(ino, _, lblk)| {
                let t = t.clone();
                thread::spawn(move || claim(&t, ino, lblk, via))
            })
            .collect();
        free(&t, entries, via);
        let claimed: Vec<u64> = threads.into_iter().map(|h| h.join().unwrap()).collect();

        let distinct: HashSet<&u64> = claimed.iter().collect();
        assert_eq!(distinct.len(), claimed.len(), "two claims of one slot");
        for (&(ino, home, lblk), &at) in keys.iter().zip(&claimed) {
            assert!(
                reachable(&t, home, at),
                "block {lblk} of file {ino} in slot {at} is cut off from its home"
            );
            if via != Via::Stage {
                let mut runs = Vec::new();
                t.lookup(&file(&t, ino), lblk, 1, &mut runs).unwrap();
                assert_eq!(runs.len(), 1, "block {lblk} of file {ino} is lost");
                assert_eq!(runs[0].pblk, DATA.start + at);
            }
        }
        for &(ino, slot) in entries {
            let before = start.iter().find(|w| w.0 == slot_off(slot).0).unwrap().1;
            assert_ne!(
                t.media().load_u64(slot_off(slot)).unwrap(),
                before,
                "entry {ino} in slot {slot} was not freed"
            );
        }
        for i in 0..SLOTS {
            assert_ne!(
                t.media().load_u64(slot_off(i)).unwrap(),
                PURGING,
                "slot {i} left purging"
            );
        }
    });
}

/// The one entry the removal frees: file 100's block in the claims' home slot.
const PASSED: &[(u64, u64)] = &[(100, HOME)];

/// An insert walks past the entry in its home and claims the next slot while a `remove` of
/// that entry reclaims it: the reclaim sees the claim, or the seal makes the emptied or
/// purging slot a tombstone again.
#[test]
fn an_insert_beside_a_removal() {
    claims_beside_a_removal(PASSED, &[HOME], Via::Insert);
}

/// The same race on the copy-on-write path: a `stage` claims past a staged entry that an
/// `unstage` gives back.
#[test]
fn a_stage_beside_an_unstage() {
    claims_beside_a_removal(PASSED, &[HOME], Via::Stage);
}

/// The same race with the batch removal: `tombstone_files` tombstones the entry and
/// `reclaim_all` empties it only if its scan finds no walk through it.
#[test]
fn an_insert_beside_a_batch_removal() {
    claims_beside_a_removal(PASSED, &[HOME], Via::Batch);
}

/// Two inserts with the same home walk past the entry: one lands right after it, the other
/// one further on, while the removal reclaims the entry.
#[test]
fn two_inserts_beside_a_removal() {
    claims_beside_a_removal(PASSED, &[HOME, HOME], Via::Insert);
}

/// Two entries, freed in this order: file 101's block in the slot after the home, then file
/// 100's in the home. The claims walk past both.
const PASSED_TWO: &[(u64, u64)] = &[(101, HOME + 1), (100, HOME)];

/// An insert walks past two entries; `remove`s empty both behind it, the far one first, so
/// the seal may have to make both slots tombstones again.
#[test]
fn an_insert_beside_two_removals() {
    claims_beside_a_removal(PASSED_TWO, &[HOME], Via::Insert);
}

/// The same with one batch removal of both entries.
#[test]
fn an_insert_beside_a_batch_removal_of_two() {
    claims_beside_a_removal(PASSED_TWO, &[HOME], Via::Batch);
}

/// Two inserts homed at the two entries walk past them while `remove`s empty both.
#[test]
fn two_inserts_beside_two_removals() {
    claims_beside_a_removal(PASSED_TWO, &[HOME, HOME + 1], Via::Insert);
}

/// [`PASSED_TWO`] and, first of all, file 102's block two slots after them.
const PASSED_THREE: &[(u64, u64)] = &[(102, HOME + 3), (101, HOME + 1), (100, HOME)];

/// A stage of two blocks of one cluster, homed at the first two entries, walks past all three
/// while `unstage`s give them back, the far one first. The first block claims the slot after
/// the two entries; the second block's claim starts after that slot and seals only what lies
/// past it, the third entry's slot (`HashFs::claim_from`): the first claim's seal keeps the
/// slot after the second block's home non-empty.
#[test]
fn a_run_beside_three_removals() {
    let start = snapshot(PASSED_THREE, Via::Stage);
    loom::model(move || {
        let t = Arc::new(Table::open(LoomMedia::new(&start), META, DATA).unwrap());
        let ino = 1;
        let lblk = lblk_at(&*t, ino, HOME);
        assert_eq!(t.home_of(ino, lblk + 1), HOME + 1);
        let stager = {
            let t = t.clone();
            thread::spawn(move || {
                let mut out = Vec::new();
                t.stage(&file(&t, ino), lblk, 2, &mut out).unwrap();
                out.iter()
                    .flat_map(|r| (0..r.len).map(move |k| r.pblk.0 + k - DATA.start.0))
                    .collect::<Vec<u64>>()
            })
        };
        free(&t, PASSED_THREE, Via::Stage);
        let claimed = stager.join().unwrap();
        assert_eq!(claimed.len(), 2);
        assert_ne!(claimed[0], claimed[1], "two claims of one slot");
        for (k, &at) in claimed.iter().enumerate() {
            assert!(
                reachable(&t, HOME + k as u64, at),
                "block {} in slot {at} is cut off from its home",
                lblk + k as u64
            );
        }
        for i in 0..SLOTS {
            assert_ne!(
                t.media().load_u64(slot_off(i)).unwrap(),
                PURGING,
                "slot {i} left purging"
            );
        }
    });
}

/// The file whose log blocks the log models allocate.
const LOG_INO: u64 = 7;
/// Size of the log range of a file.
const LOG_SPAN: u64 = LOG_LBLK_END - LOG_LBLK_FIRST;

/// The media of a model whose table outlives its executions, so that the [`LogBlocks`]
/// handles holding it can too (see [`align`]). Each execution installs a [`LoomMedia`] made
/// from the starting words and takes it out at its end. Between executions, loads read the
/// starting words, a CAS is refused after noting the word it would have written (see
/// [`rehearse`]), and any write panics.
struct Stage {
    start: Vec<(u64, u64)>,
    live: Mutex<Option<std::sync::Arc<LoomMedia>>>,
    /// The word of the last CAS refused between executions.
    tried: Mutex<Option<u64>>,
}

impl Stage {
    fn new(start: Vec<(u64, u64)>) -> Self {
        Self {
            start,
            live: Mutex::new(None),
            tried: Mutex::new(None),
        }
    }

    /// Installs the media of an execution (`Some`) or takes it out (`None`).
    fn install(&self, media: Option<LoomMedia>) {
        *self.live.lock().unwrap() = media.map(std::sync::Arc::new);
    }

    /// The media of the running execution, if one is installed. The lock is not held while
    /// the media is used: loom switches threads inside its accesses.
    fn live(&self) -> Option<std::sync::Arc<LoomMedia>> {
        self.live.lock().unwrap().clone()
    }

    /// The media of the running execution, for a write.
    fn playing(&self) -> std::sync::Arc<LoomMedia> {
        self.live().expect("a write between executions")
    }

    /// The starting word at `off`.
    fn start_word(&self, off: PmOff) -> u64 {
        let w = self.start.iter().find(|w| w.0 == off.0).map(|w| w.1);
        w.unwrap_or_else(|| panic!("access outside the model at {off}"))
    }
}

impl Media for Stage {
    fn size(&self) -> u64 {
        DATA.end().0 * BLOCK_SIZE
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        if let Some(m) = self.live() {
            return m.read(off, buf);
        }
        assert!(buf.len().is_multiple_of(8), "partial word access at {off}");
        for (k, chunk) in (0..).zip(buf.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&self.start_word(off + 8 * k).to_le_bytes());
        }
        Ok(())
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.playing().write(off, src)
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.playing().write_nt(off, src)
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.playing().fill_nt(off, len, byte)
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        self.playing().flush(off, len)
    }

    fn fence(&self) {}

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        match self.live() {
            Some(m) => m.load_u64(off),
            None => Ok(self.start_word(off)),
        }
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.playing().store_u64(off, val)
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        if let Some(m) = self.live() {
            return m.cas_u64(off, current, new);
        }
        *self.tried.lock().unwrap() = Some(new);
        Err(Error::Unsupported("a claim between executions"))
    }
}

/// Lets `h` try its next key between executions: the claim's CAS is refused, so nothing
/// changes but `h`'s place in its key sequence, which moves on by one. Returns the offset of
/// the key it tried in the log range.
fn rehearse(t: &HashFs<Stage>, h: &LogBlocks<Stage>) -> u64 {
    assert!(h.alloc(1, AllocHint::metadata()).is_err());
    let tried = t.media().tried.lock().unwrap().take();
    match tried.and_then(Slot::decode) {
        Some(Slot::Tentative(k)) if k.ino == LOG_INO => k.lblk - LOG_LBLK_FIRST,
        s => panic!("a log claim of {s:?}"),
    }
}

/// Brings handles `a` and `b` of file [`LOG_INO`] to the same next key, one whose home is
/// [`HOME`], by rehearsals (see [`rehearse`]). A handle tries the keys `x, x + step, x + 2 step,
/// ...` of the log range (offsets modulo its size) from a random `x`, and `step` is odd: from
/// the distance of two keys the handles tried, the inverse of `step` gives how many keys one
/// is ahead of the other, and the one behind catches up. Then both move on together, by one
/// key at least (which checks that they try the same keys), until the next key's home is
/// [`HOME`].
fn align(t: &HashFs<Stage>, a: &LogBlocks<Stage>, b: &LogBlocks<Stage>) {
    let a0 = rehearse(t, a);
    let a1 = rehearse(t, a);
    let step = a1.wrapping_sub(a0) & (LOG_SPAN - 1);
    // An odd `step` is its own inverse modulo 2^3; each round doubles the exponent (Newton).
    let mut inverse = step;
    for _ in 0..5 {
        inverse = inverse.wrapping_mul(2u64.wrapping_sub(step.wrapping_mul(inverse)));
    }
    let b1 = rehearse(t, b);
    let ahead = b1.wrapping_sub(a1).wrapping_mul(inverse) & (LOG_SPAN - 1);
    let (behind, lag) = if ahead < LOG_SPAN / 2 {
        (a, ahead)
    } else {
        (b, LOG_SPAN - ahead)
    };
    for _ in 0..lag {
        rehearse(t, behind);
    }
    let next = |x: u64| LOG_LBLK_FIRST + ((x + step) & (LOG_SPAN - 1));
    loop {
        let last = rehearse(t, a);
        assert_eq!(rehearse(t, b), last, "the handles did not align");
        if t.home_of(LOG_INO, next(last)) == HOME {
            break;
        }
    }
}

/// Runs every interleaving of two threads allocating a log block of file [`LOG_INO`] each
/// through handles of their own that try the same key first (home [`HOME`]), beside a
/// removal that frees `entries` (see [`snapshot`]).
fn log_claims_beside_a_removal(entries: &'static [(u64, u64)]) {
    let stage = Stage::new(snapshot(entries, Via::Insert));
    let t = std::sync::Arc::new(HashFs::open(stage, META, DATA).unwrap());
    let handles = [t.log_blocks(LOG_INO), t.log_blocks(LOG_INO)].map(std::sync::Arc::new);
    loom::model(move || {
        align(&t, &handles[0], &handles[1]);
        t.media().install(Some(LoomMedia::new(&t.media().start)));
        let threads: Vec<_> = handles
            .iter()
            .map(|h| {
                let h = h.clone();
                thread::spawn(move || h.alloc(1, AllocHint::metadata()).unwrap())
            })
            .collect();
        free(&*t, entries, Via::Insert);
        let got: Vec<u64> = threads
            .into_iter()
            .map(|h| {
                let e = h.join().unwrap();
                assert_eq!(e.len, 1);
                e.start.0 - DATA.start.0
            })
            .collect();

        assert_ne!(got[0], got[1], "two allocations of one block");
        let mut keys = HashSet::new();
        for i in 0..SLOTS {
            match Slot::decode(t.media().load_u64(slot_off(i)).unwrap()) {
                Some(Slot::Committed(k)) => {
                    let (ino, lblk) = (k.ino, k.lblk);
                    assert!(keys.insert(k), "block {lblk} of file {ino} in two slots");
                    assert!(
                        reachable(&*t, t.home_of(ino, lblk), i),
                        "block {lblk} of file {ino} in slot {i} is cut off from its home"
                    );
                    if ino == LOG_INO {
                        assert!(got.contains(&i), "log block in slot {i} not allocated");
                    }
                }
                Some(Slot::Empty | Slot::Tombstone) => {}
                s => panic!("slot {i} left {s:?}"),
            }
        }
        for &i in &got {
            let s = Slot::decode(t.media().load_u64(slot_off(i)).unwrap());
            assert!(
                matches!(s, Some(Slot::Committed(k)) if k.ino == LOG_INO
                    && (LOG_LBLK_FIRST..LOG_LBLK_END).contains(&k.lblk)),
                "slot {i} allocated but holds {s:?}"
            );
        }
        for &(ino, slot) in entries {
            assert_ne!(
                t.media().load_u64(slot_off(slot)).unwrap(),
                t.media().start_word(slot_off(slot)),
                "entry {ino} in slot {slot} was not freed"
            );
        }
        t.media().install(None);
    });
}

/// Two allocations of one file's log blocks race on one key in an empty table: the first
/// claim takes the home slot, the second the next one and seals its walk. At most one of
/// them keeps the key (both may give it up); a claimer that gives its slot back tries its
/// next key.
#[test]
fn two_log_claims_of_one_key() {
    log_claims_beside_a_removal(&[]);
}

/// The same race past the entry in the key's home while a `remove` frees it: the claims'
/// walks (the seal's and the search for the other claim) run against the reclaim, and one
/// claim may take the home slot after the other passed it while the entry was live.
#[test]
fn two_log_claims_of_one_key_beside_a_removal() {
    log_claims_beside_a_removal(PASSED);
}
