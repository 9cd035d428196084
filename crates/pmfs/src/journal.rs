//! The fine-grained, per-CPU undo journal (FLEX §3.6, "JDD").
//!
//! Operations that must change several 8-byte words atomically (rename, link, unlink of an
//! inode that keeps other links, truncate, set_times) run as a [`Tx`]:
//!
//! 1. *protect*: the operation names every word it may change;
//! 2. *arm*: the current (old) values of those words are written to the thread's journal slot
//!    together with a header that carries the state `ACTIVE`, a sequence number and a crc32c
//!    over everything; one flush + fence makes the slot durable;
//! 3. the words are updated in place (each store flushed);
//! 4. *commit*: a fence makes the updates durable, then one 8-byte store of the slot's state
//!    word (to `IDLE`, or to `CLEANUP` when redo cleanups follow) commits.
//!
//! After a crash, recovery restores the old values of every `ACTIVE` slot whose checksum
//! matches (a torn arm cannot match, and nothing was changed before the arm was durable).
//! A slot may also carry *cleanups*: idempotent actions that recovery runs whether or not the
//! transaction committed (trimming blocks beyond end of file, releasing the blocks of an inode
//! that never went live). They keep the few non-journalable changes (mapping inserts and
//! removals) crash-safe.
//!
//! Slots are per-CPU in the JDD sense: each thread prefers its own slot and only falls back to
//! others when it is busy, so journaled operations on different threads never contend.
//!
//! A transaction dropped before its slot reads idle again (a store of its rollback or of its
//! retirement failed) leaves the slot to recovery: no later transaction of the session arms
//! it, and the engine takes no more changes (`Fs::writable`), since recovery will restore the
//! words the slot names.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pmfs_core::layout::{BLOCK_SIZE, PmOff, crc32c_append};
use pmfs_core::pm::{Media, MediaExt};

use crate::codec::{get16, get32, get64, put16, put32, put64};
use crate::error::{Error, Result};
use crate::format::Geometry;
use crate::inode::Handle;

const IDLE: u64 = 0;
const ACTIVE: u64 = 1;
const CLEANUP: u64 = 2;
const JOURNAL_VERSION: u16 = 1;
const HEADER: u64 = 64;
const ENTRY: u64 = 24;
/// Entries that fit one slot.
pub(crate) const MAX_ENTRIES: usize = ((BLOCK_SIZE - HEADER) / ENTRY) as usize;

const K_UNDO: u64 = 1;
const K_TRIM: u64 = 2;
const K_RELEASE: u64 = 3;
/// A punch's whole blocks (inode handle; first block << 32 | blocks), always followed by
/// [`K_PUNCH_EDGE`].
const K_PUNCH: u64 = 4;
/// The edge block a punch's first update copies (logical block; the copy's physical block).
const K_PUNCH_EDGE: u64 = 5;

/// Offsets in a slot's 64-byte header: state word (sequence << 8 | state), entry count
/// (u32), version (u16), crc32c (u32) over sequence, count and entries.
mod hdr {
    pub const STATE: usize = 0;
    pub const COUNT: usize = 8;
    pub const VERSION: usize = 12;
    pub const CRC: usize = 16;
}

const _: () = assert!(hdr::CRC + 4 <= HEADER as usize);

/// One 24-byte entry: kind, and two words whose meaning depends on it (undo: offset and old
/// value; trim: inode handle and block limit; release: inode handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RawEntry {
    kind: u64,
    a: u64,
    b: u64,
}

impl RawEntry {
    fn encode(&self) -> [u8; ENTRY as usize] {
        let mut b = [0u8; ENTRY as usize];
        put64(&mut b, 0, self.kind);
        put64(&mut b, 8, self.a);
        put64(&mut b, 16, self.b);
        b
    }

    fn decode(b: &[u8]) -> RawEntry {
        RawEntry {
            kind: get64(b, 0),
            a: get64(b, 8),
            b: get64(b, 16),
        }
    }
}

/// An idempotent action recovery runs for a slot that was armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// Unmap the blocks of `inode` that lie at or beyond its end of file and below `upto`.
    Trim { inode: Handle, upto: u64 },
    /// If `inode` is not live, free every block its mapping holds.
    ReleaseIfDead { inode: Handle },
    /// The second half of a hole punch (two log updates: the partial edge blocks copied with
    /// the range zeroed, then the whole blocks unmapped): if `inode` is live and maps logical
    /// block `edge` to the copy `pblk` (the first update committed), unmap `len` blocks from
    /// `from`.
    PunchIf {
        inode: Handle,
        from: u64,
        len: u64,
        edge: u64,
        pblk: u64,
    },
}

impl Cleanup {
    fn encode(self, out: &mut Vec<RawEntry>) {
        let last = match self {
            Cleanup::Trim { inode, upto } => RawEntry {
                kind: K_TRIM,
                a: inode.word(),
                b: upto,
            },
            Cleanup::ReleaseIfDead { inode } => RawEntry {
                kind: K_RELEASE,
                a: inode.word(),
                b: 0,
            },
            Cleanup::PunchIf {
                inode,
                from,
                len,
                edge,
                pblk,
            } => {
                out.push(RawEntry {
                    kind: K_PUNCH,
                    a: inode.word(),
                    b: from << 32 | len,
                });
                RawEntry {
                    kind: K_PUNCH_EDGE,
                    a: edge,
                    b: pblk,
                }
            }
        };
        out.push(last);
    }

    /// Raw entries the cleanup takes.
    fn width(self) -> usize {
        match self {
            Cleanup::PunchIf { .. } => 2,
            _ => 1,
        }
    }
}

/// The journal area and the DRAM state of its slots.
#[derive(Debug)]
pub(crate) struct Journal {
    base: PmOff,
    slots: Vec<Mutex<Slot>>,
    /// Some transaction left its slot to recovery.
    left: AtomicBool,
}

/// The DRAM state of one slot.
#[derive(Debug)]
struct Slot {
    /// The sequence number of the slot's next transaction.
    seq: u64,
    /// A transaction left the slot armed, or committed with cleanups not run, because a store
    /// failed: only recovery may finish it, and no later transaction may write over it.
    left: bool,
}

thread_local! {
    static HOME_SLOT: Cell<Option<u32>> = const { Cell::new(None) };
}
static NEXT_HOME: AtomicU32 = AtomicU32::new(0);

fn home_slot() -> u32 {
    HOME_SLOT.with(|h| match h.get() {
        Some(s) => s,
        None => {
            let s = NEXT_HOME.fetch_add(1, Ordering::Relaxed);
            h.set(Some(s));
            s
        }
    })
}

fn state_word(seq: u64, st: u64) -> u64 {
    (seq << 8) | st
}

fn checksum(seq: u64, entries: &[RawEntry]) -> u32 {
    let mut crc = crc32c_append(0, &seq.to_le_bytes());
    crc = crc32c_append(crc, &(entries.len() as u32).to_le_bytes());
    for e in entries {
        crc = crc32c_append(crc, &e.encode());
    }
    crc
}

/// What recovery found in the journal.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// Cleanups to run once the rest of the volume is consistent.
    pub cleanups: Vec<Cleanup>,
    /// Number of transactions rolled back.
    pub rolled_back: usize,
}

/// The decoded content of one slot, for recovery and fsck.
#[derive(Debug)]
pub(crate) enum SlotContent {
    Idle,
    /// Armed and not committed: undo words (offset, old value) and cleanups.
    Active(Vec<(PmOff, u64)>, Vec<Cleanup>),
    /// Committed with cleanups still to run.
    Cleanup(Vec<Cleanup>),
    /// An arm that did not become durable: no word was changed.
    Torn,
}

impl Journal {
    pub fn new(geo: &Geometry) -> Journal {
        Journal {
            base: geo.journal_off(0),
            slots: (0..geo.journal_slots)
                .map(|_| {
                    Mutex::new(Slot {
                        seq: 1,
                        left: false,
                    })
                })
                .collect(),
            left: AtomicBool::new(false),
        }
    }

    fn slot_off(&self, i: usize) -> PmOff {
        self.base + i as u64 * BLOCK_SIZE
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Starts a transaction on the calling thread's slot, or any free one, or waits for one.
    /// Slots left to recovery are skipped; when every slot is, the volume takes no more
    /// journaled changes ([`Error::LeftForRecovery`]).
    pub fn begin(&self) -> Result<Tx<'_>> {
        let n = self.slots.len();
        let home = home_slot() as usize % n;
        let order = (0..n).map(|i| (home + i) % n);
        for idx in order.clone() {
            let slot = match self.slots[idx].try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => continue,
            };
            if !slot.left {
                return Ok(self.tx(idx, slot));
            }
        }
        for idx in order {
            let slot = self.slots[idx].lock().unwrap_or_else(|e| e.into_inner());
            if !slot.left {
                return Ok(self.tx(idx, slot));
            }
        }
        Err(Error::LeftForRecovery("every journal slot"))
    }

    fn tx<'a>(&'a self, idx: usize, slot: MutexGuard<'a, Slot>) -> Tx<'a> {
        Tx {
            journal: self,
            idx,
            slot,
            words: Vec::new(),
            cleanups: Vec::new(),
            state: TxState::Planning,
        }
    }

    /// Whether a transaction of this session left its slot to recovery.
    pub fn left_to_recovery(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    /// Decodes slot `i`.
    pub fn read_slot(&self, m: &dyn Media, i: usize) -> Result<SlotContent> {
        let off = self.slot_off(i);
        let h: [u8; HEADER as usize] = m.read_pod(off)?;
        let state = get64(&h, hdr::STATE);
        let st = state & 0xff;
        if st == IDLE {
            return Ok(SlotContent::Idle);
        }
        let corrupt = Error::Corrupt {
            what: "journal slot",
            at: off,
        };
        if st != ACTIVE && st != CLEANUP {
            return Err(corrupt);
        }
        let count = get32(&h, hdr::COUNT) as usize;
        let valid = count <= MAX_ENTRIES && get16(&h, hdr::VERSION) == JOURNAL_VERSION;
        let mut entries = Vec::with_capacity(count.min(MAX_ENTRIES));
        if valid {
            let mut buf = vec![0u8; count * ENTRY as usize];
            m.read(off + HEADER, &mut buf)?;
            entries.extend(buf.chunks_exact(ENTRY as usize).map(RawEntry::decode));
        }
        if !valid || checksum(state >> 8, &entries) != get32(&h, hdr::CRC) {
            // An arm writes header and entries under one fence and changes nothing before it:
            // a mismatch while ACTIVE is a torn arm. A committed slot cannot mismatch.
            return if st == ACTIVE {
                Ok(SlotContent::Torn)
            } else {
                Err(corrupt)
            };
        }
        let mut undo = Vec::new();
        let mut cleanups = Vec::new();
        let mut it = entries.iter();
        while let Some(e) = it.next() {
            match e.kind {
                K_UNDO => undo.push((PmOff(e.a), e.b)),
                K_PUNCH => {
                    let Some(edge) = it.next().filter(|x| x.kind == K_PUNCH_EDGE) else {
                        return Err(corrupt);
                    };
                    cleanups.push(Cleanup::PunchIf {
                        inode: Handle::from_word(e.a),
                        from: e.b >> 32,
                        len: e.b & u64::from(u32::MAX),
                        edge: edge.a,
                        pblk: edge.b,
                    });
                }
                K_TRIM => cleanups.push(Cleanup::Trim {
                    inode: Handle::from_word(e.a),
                    upto: e.b,
                }),
                K_RELEASE => cleanups.push(Cleanup::ReleaseIfDead {
                    inode: Handle::from_word(e.a),
                }),
                _ => return Err(corrupt),
            }
        }
        Ok(if st == ACTIVE {
            SlotContent::Active(undo, cleanups)
        } else {
            SlotContent::Cleanup(cleanups)
        })
    }

    /// Rolls back every armed, uncommitted transaction and collects the cleanups of all
    /// non-idle slots. Slots stay non-idle until [`reset`](Journal::reset).
    pub fn recover(&self, m: &dyn Media, words_ok: impl Fn(PmOff) -> bool) -> Result<Recovered> {
        let mut out = Recovered::default();
        for i in 0..self.slots.len() {
            let off = self.slot_off(i);
            let seq = m.load_u64(off)? >> 8;
            self.slots[i].lock().unwrap_or_else(|e| e.into_inner()).seq = seq + 1;
            match self.read_slot(m, i)? {
                SlotContent::Idle | SlotContent::Torn => {}
                SlotContent::Active(undo, cleanups) => {
                    for &(w, _) in &undo {
                        if !words_ok(w) {
                            return Err(Error::Corrupt {
                                what: "journal entry outside metadata",
                                at: off,
                            });
                        }
                    }
                    for &(w, old) in undo.iter().rev() {
                        m.store_u64(w, old)?;
                        m.flush(w, 8)?;
                    }
                    m.fence();
                    out.rolled_back += 1;
                    out.cleanups.extend(cleanups);
                }
                SlotContent::Cleanup(cleanups) => out.cleanups.extend(cleanups),
            }
        }
        Ok(out)
    }

    /// The first slot that is not idle, if any: one a crash left, or one whose operation
    /// failed in a way that left it for recovery (its media refused a store).
    pub fn first_busy(&self, m: &dyn Media) -> Result<Option<PmOff>> {
        for i in 0..self.slots.len() {
            if !matches!(self.read_slot(m, i)?, SlotContent::Idle) {
                return Ok(Some(self.slot_off(i)));
            }
        }
        Ok(None)
    }

    /// Marks every slot idle (after recovery ran the cleanups).
    pub fn reset(&self, m: &dyn Media) -> Result<()> {
        for i in 0..self.slots.len() {
            let off = self.slot_off(i);
            let w = m.load_u64(off)?;
            if w & 0xff != IDLE {
                m.store_u64(off, state_word(w >> 8, IDLE))?;
                m.flush(off, 8)?;
            }
        }
        m.fence();
        Ok(())
    }

    /// Formats the journal area: every slot idle.
    pub fn format(m: &dyn Media, geo: &Geometry) -> Result<()> {
        let len = u64::from(geo.journal_slots) * BLOCK_SIZE;
        m.fill_nt(geo.journal_off(0), len, 0)?;
        Ok(())
    }
}

#[derive(Debug, PartialEq, Eq)]
enum TxState {
    Planning,
    /// The slot reads active: recovery undoes the words.
    Armed,
    /// The slot holds cleanups still to run.
    Committed,
    /// The slot reads idle again.
    Retired,
}

/// One journaled transaction; see the module documentation for the protocol.
///
/// [`run_armed`] arms it, runs the updates and commits, or rolls the words back in place when
/// an update fails, so an operation that fails half-way leaves nothing behind.
#[derive(Debug)]
pub(crate) struct Tx<'a> {
    journal: &'a Journal,
    idx: usize,
    slot: MutexGuard<'a, Slot>,
    words: Vec<(PmOff, u64)>,
    cleanups: Vec<Cleanup>,
    state: TxState,
}

impl Tx<'_> {
    /// Names a word the transaction may change. Must be called before [`arm`](Tx::arm).
    pub fn protect(&mut self, off: PmOff) {
        debug_assert_eq!(self.state, TxState::Planning);
        if !self.words.iter().any(|&(w, _)| w == off) {
            self.words.push((off, 0));
        }
    }

    /// Adds a cleanup recovery runs if the system crashes before [`finish`](Tx::finish).
    pub fn cleanup(&mut self, c: Cleanup) {
        debug_assert_eq!(self.state, TxState::Planning);
        self.cleanups.push(c);
    }

    /// Records the old values and makes the slot durable. After this the protected words may
    /// be changed in place.
    pub fn arm(&mut self, m: &dyn Media) -> Result<()> {
        let width: usize = self.cleanups.iter().map(|c| c.width()).sum();
        if self.words.len() + width > MAX_ENTRIES {
            return Err(Error::NoSpace);
        }
        let mut entries = Vec::with_capacity(self.words.len() + self.cleanups.len());
        for (off, old) in &mut self.words {
            *old = m.load_u64(*off)?;
            entries.push(RawEntry {
                kind: K_UNDO,
                a: off.0,
                b: *old,
            });
        }
        for c in &self.cleanups {
            c.encode(&mut entries);
        }
        let seq = self.slot.seq;
        self.slot.seq += 1;
        let off = self.journal.slot_off(self.idx);
        let mut buf = vec![0u8; HEADER as usize];
        put64(&mut buf, hdr::STATE, state_word(seq, ACTIVE));
        put32(&mut buf, hdr::COUNT, entries.len() as u32);
        put16(&mut buf, hdr::VERSION, JOURNAL_VERSION);
        put32(&mut buf, hdr::CRC, checksum(seq, &entries));
        for e in &entries {
            buf.extend_from_slice(&e.encode());
        }
        m.write(off, &buf)?;
        m.persist(off, buf.len() as u64)?;
        self.state = TxState::Armed;
        Ok(())
    }

    /// Makes every update durable and commits. When cleanups were registered the slot stays
    /// in the cleanup state until [`finish`](Tx::finish).
    pub fn commit(&mut self, m: &dyn Media) -> Result<()> {
        m.fence();
        let off = self.journal.slot_off(self.idx);
        let seq = m.load_u64(off)? >> 8;
        let (st, state) = if self.cleanups.is_empty() {
            (IDLE, TxState::Retired)
        } else {
            (CLEANUP, TxState::Committed)
        };
        m.store_u64_persist(off, state_word(seq, st))?;
        self.state = state;
        Ok(())
    }

    /// Retires the transaction after the caller ran its cleanups. A transaction that was
    /// armed but never committed (one that only registered cleanups) is finished by a fence
    /// that makes its work durable, then the slot goes idle. A transaction dropped before
    /// its slot is idle again leaves the slot to recovery.
    pub fn finish(mut self, m: &dyn Media) -> Result<()> {
        let off = self.journal.slot_off(self.idx);
        match self.state {
            TxState::Planning | TxState::Retired => return Ok(()),
            TxState::Armed => m.fence(),
            TxState::Committed => {}
        }
        let seq = m.load_u64(off)? >> 8;
        m.store_u64_persist(off, state_word(seq, IDLE))?;
        self.state = TxState::Retired;
        Ok(())
    }

    fn rollback(&mut self, m: &dyn Media) -> Result<()> {
        for &(w, old) in self.words.iter().rev() {
            m.store_u64(w, old)?;
            m.flush(w, 8)?;
        }
        m.fence();
        let off = self.journal.slot_off(self.idx);
        let seq = m.load_u64(off)? >> 8;
        m.store_u64_persist(off, state_word(seq, IDLE))?;
        self.state = TxState::Retired;
        Ok(())
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if matches!(self.state, TxState::Armed | TxState::Committed) {
            self.slot.left = true;
            self.journal.left.store(true, Ordering::Release);
        }
    }
}

/// Runs `op` inside an armed transaction: on error the words are rolled back.
pub(crate) fn run_armed<T>(
    tx: &mut Tx<'_>,
    m: &dyn Media,
    op: impl FnOnce(&Tx<'_>) -> Result<T>,
) -> Result<T> {
    tx.arm(m)?;
    match op(tx) {
        Ok(v) => match tx.commit(m) {
            Ok(()) => Ok(v),
            Err(e) => {
                // The slot still reads armed: undo the operation rather than leave the media
                // ahead of the caller, which takes it for failed.
                tx.rollback(m)?;
                Err(e)
            }
        },
        Err(e) => {
            tx.rollback(m)?;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Options;
    use pmfs_core::pm::HeapRegion;

    fn setup() -> (HeapRegion, Journal) {
        let g = Geometry::plan(&Options::default(), 2048, |_| 0, |_| 0, 0).unwrap();
        let m = HeapRegion::new(2048 * 4096).unwrap();
        Journal::format(&m, &g).unwrap();
        m.fence();
        (m, Journal::new(&g))
    }

    fn put(m: &HeapRegion, off: PmOff, v: u64) -> Result<()> {
        m.store_u64(off, v)?;
        m.flush(off, 8)?;
        Ok(())
    }

    const W1: PmOff = PmOff(1 << 20);
    const W2: PmOff = PmOff((1 << 20) + 64);

    #[test]
    fn armed_but_uncommitted_is_rolled_back() {
        let (m, j) = setup();
        m.store_u64(W1, 10).unwrap();
        m.store_u64(W2, 20).unwrap();
        let mut tx = j.begin().unwrap();
        tx.protect(W1);
        tx.protect(W2);
        tx.cleanup(Cleanup::ReleaseIfDead {
            inode: Handle {
                ino: 3,
                generation: 4,
            },
        });
        tx.arm(&m).unwrap();
        put(&m, W1, 11).unwrap();
        put(&m, W2, 21).unwrap();
        // Crash here: forget the transaction without running Drop logic.
        std::mem::forget(tx);
        let j2 = Journal::new(&Geometry::plan(&Options::default(), 2048, |_| 0, |_| 0, 0).unwrap());
        let r = j2.recover(&m, |_| true).unwrap();
        assert_eq!(r.rolled_back, 1);
        assert_eq!(
            r.cleanups,
            vec![Cleanup::ReleaseIfDead {
                inode: Handle {
                    ino: 3,
                    generation: 4
                }
            }]
        );
        assert_eq!(m.load_u64(W1).unwrap(), 10);
        assert_eq!(m.load_u64(W2).unwrap(), 20);
        j2.reset(&m).unwrap();
        assert!(matches!(j2.read_slot(&m, 0).unwrap(), SlotContent::Idle));
    }

    #[test]
    fn committed_keeps_values_and_only_cleanups_remain() {
        let (m, j) = setup();
        let mut tx = j.begin().unwrap();
        tx.protect(W1);
        tx.cleanup(Cleanup::Trim {
            inode: Handle {
                ino: 9,
                generation: 1,
            },
            upto: 77,
        });
        run_armed(&mut tx, &m, |_| put(&m, W1, 5)).unwrap();
        // Crash before the cleanup ran: the slot's lock dies with the "process".
        std::mem::forget(tx);
        let j2 = Journal::new(&Geometry::plan(&Options::default(), 2048, |_| 0, |_| 0, 0).unwrap());
        let r = j2.recover(&m, |_| true).unwrap();
        assert_eq!(r.rolled_back, 0);
        assert_eq!(r.cleanups.len(), 1);
        assert_eq!(m.load_u64(W1).unwrap(), 5);
    }

    #[test]
    fn a_slot_left_to_recovery_is_never_written_over() {
        let (m, j) = setup();
        let mut tx = j.begin().unwrap();
        tx.protect(W1);
        run_armed(&mut tx, &m, |_| put(&m, W1, 1)).unwrap();
        tx.finish(&m).unwrap();
        assert!(!j.left_to_recovery());
        for _ in 0..j.slots() {
            let mut tx = j.begin().unwrap();
            tx.protect(W1);
            tx.arm(&m).unwrap();
            // Dropped armed, as when a store of its rollback fails.
            drop(tx);
        }
        assert!(j.left_to_recovery());
        assert!(matches!(j.begin(), Err(Error::LeftForRecovery(_))));
        for i in 0..j.slots() {
            assert!(matches!(
                j.read_slot(&m, i).unwrap(),
                SlotContent::Active(..)
            ));
        }
    }

    #[test]
    fn failed_operation_rolls_back_and_torn_arm_is_ignored() {
        let (m, j) = setup();
        m.store_u64(W1, 1).unwrap();
        let mut tx = j.begin().unwrap();
        tx.protect(W1);
        let r: Result<()> = run_armed(&mut tx, &m, |_| {
            put(&m, W1, 2)?;
            Err(Error::NoSpace)
        });
        assert!(matches!(r, Err(Error::NoSpace)));
        assert_eq!(m.load_u64(W1).unwrap(), 1);
        tx.finish(&m).unwrap();
        // A torn arm: an ACTIVE header whose checksum does not match.
        let slot = j.slot_off(0);
        m.store_u64(slot, state_word(99, ACTIVE)).unwrap();
        assert!(matches!(j.read_slot(&m, 0).unwrap(), SlotContent::Torn));
        // A committed slot with a bad checksum is corrupt.
        m.store_u64(slot, state_word(99, CLEANUP)).unwrap();
        assert!(matches!(j.read_slot(&m, 0), Err(Error::Corrupt { .. })));
    }
}
