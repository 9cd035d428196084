//! Intent records: small per-thread redo/undo notes in PM that make multi-word operations of
//! the global tables atomic across a crash. Used by HashFS and by the cuckoo table.
//!
//! A table holds a fixed array of records, each one cache line:
//!
//! | word | field                                                                      |
//! |------|----------------------------------------------------------------------------|
//! | 0    | state: `seq << 8 \| kind` (kind 0 free, 1 reserved, >= 2 defined by the user) |
//! | 1..7 | six operation fields                                                       |
//! | 7    | crc32c of `seq` and the six fields (low 32 bits)                           |
//!
//! A record may own further lines right after it (same format, see [`Intent::line`]) for
//! sub-steps of its operation, such as the cuckoo table's entry moves.
//!
//! A thread reserves a free record with one CAS on its state word (so records also work across
//! processes sharing the pool), then [`begin`](Intent::begin)s it: fields, checksum and the
//! active state are stored together and made durable with a single fence. The checksum covers
//! the sequence number, so a torn record — or stale fields of an earlier operation next to a
//! new state word — never validates; recovery ignores records that do not validate, which is
//! right because the user makes no other change before `begin` returns.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use pmfs_core::layout::{CACHE_LINE, PmOff, crc32c_append};
use pmfs_core::pm::Media;
use pmfs_core::{Error, Result};

/// Number of user fields in a record.
pub const FIELDS: usize = 6;

const KIND_FREE: u64 = 0;
const KIND_RESERVED: u64 = 1;
const KIND_MASK: u64 = 0xff;

/// Reservation rounds over all records before giving up with [`Error::NoSpace`]: only reached
/// if every record stays held (e.g. by processes that died), which recovery repairs.
const MAX_ROUNDS: u32 = 1 << 16;

/// A fixed array of intent records in PM.
#[derive(Debug)]
pub struct IntentTable {
    base: PmOff,
    count: u64,
    lines: u64,
    /// A record was left active or reserved by a failed store: recovery must free it.
    owed: AtomicBool,
}

/// A record a thread has reserved. Dropping it without [`finish`](Intent::finish) before
/// [`begin`](Intent::begin) frees it; after `begin` the record is left for recovery.
#[derive(Debug)]
pub struct Intent<'a, M: Media> {
    media: &'a M,
    owed: &'a AtomicBool,
    off: PmOff,
    seq: u64,
    begun: bool,
    done: bool,
}

/// A valid, active record found by [`IntentTable::scan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// Index of the record.
    pub index: u64,
    /// Which of the record's lines (0 for the record itself).
    pub line: u64,
    /// The user kind stored in its state word.
    pub kind: u8,
    /// Its fields.
    pub fields: [u64; FIELDS],
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A small per-thread number, so threads start their search at different records.
fn thread_slot() -> usize {
    THREAD_SLOT.with(|c| {
        c.get().unwrap_or_else(|| {
            let v = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            c.set(Some(v));
            v
        })
    })
}

fn checksum(seq: u64, fields: &[u64; FIELDS]) -> u64 {
    let mut crc = crc32c_append(0, &seq.to_le_bytes());
    for f in fields {
        crc = crc32c_append(crc, &f.to_le_bytes());
    }
    crc as u64
}

impl IntentTable {
    /// `count` records at `base`, each `lines` cache lines long (at least 1).
    pub fn new(base: PmOff, count: u64, lines: u64) -> Self {
        debug_assert!(base.is_aligned(CACHE_LINE) && lines >= 1);
        Self {
            base,
            count,
            lines,
            owed: AtomicBool::new(false),
        }
    }

    /// Whether a failed operation or store left a record for [`scan`](Self::scan) to find
    /// at recovery (see [`Intent`]).
    pub fn recovery_owed(&self) -> bool {
        self.owed.load(Ordering::Relaxed)
    }

    /// Notes work that a failed store left to recovery outside any record: a slot claimed and
    /// not given back, which the next mount's sweep frees.
    pub fn owe(&self) {
        self.owed.store(true, Ordering::Relaxed);
    }

    /// Bytes the table covers.
    pub fn bytes(&self) -> u64 {
        self.count * self.lines * CACHE_LINE
    }

    /// Offset of record `i`.
    pub fn record(&self, i: u64) -> PmOff {
        self.base + i * self.lines * CACHE_LINE
    }

    /// Zeroes every record (at format time); durable after the caller's next fence.
    pub fn format<M: Media>(&self, media: &M) -> Result<()> {
        media.fill_nt(self.base, self.bytes(), 0)
    }

    /// Reserves a free record, waiting while all are held.
    pub fn acquire<'a, M: Media>(&'a self, media: &'a M) -> Result<Intent<'a, M>> {
        let start = thread_slot() as u64;
        for round in 0..MAX_ROUNDS {
            for i in 0..self.count {
                let off = self.record((start + i) % self.count);
                let w = media.load_u64(off)?;
                if w & KIND_MASK != KIND_FREE {
                    continue;
                }
                let seq = (w >> 8).wrapping_add(1) & (u64::MAX >> 8);
                if media.cas_u64(off, w, (seq << 8) | KIND_RESERVED)?.is_ok() {
                    return Ok(Intent {
                        media,
                        owed: &self.owed,
                        off,
                        seq,
                        begun: false,
                        done: false,
                    });
                }
            }
            if round > 4 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Err(Error::NoSpace)
    }

    /// The valid active lines of all records (after a crash), in record order. A line whose
    /// checksum validates but whose kind is not in `kinds` is corrupt.
    pub fn scan<M: Media>(&self, media: &M, kinds: &[u8]) -> Result<Vec<Recovered>> {
        let mut out = Vec::new();
        for index in 0..self.count {
            for line in 0..self.lines {
                let off = self.record(index) + line * CACHE_LINE;
                let state = media.load_u64(off)?;
                let kind = state & KIND_MASK;
                if kind == KIND_FREE || kind == KIND_RESERVED {
                    continue;
                }
                let mut fields = [0u64; FIELDS];
                for (j, f) in fields.iter_mut().enumerate() {
                    *f = media.load_u64(off + 8 * (j as u64 + 1))?;
                }
                let crc = media.load_u64(off + 8 * (FIELDS as u64 + 1))?;
                if crc != checksum(state >> 8, &fields) {
                    continue;
                }
                if !kinds.contains(&(kind as u8)) {
                    return Err(Error::Corrupt {
                        what: "intent record kind",
                        at: off,
                    });
                }
                out.push(Recovered {
                    index,
                    line,
                    kind: kind as u8,
                    fields,
                });
            }
        }
        Ok(out)
    }

    /// Frees every record and makes that durable (end of recovery, single-threaded).
    pub fn reset<M: Media>(&self, media: &M) -> Result<()> {
        for i in 0..self.count * self.lines {
            let off = self.base + i * CACHE_LINE;
            let w = media.load_u64(off)?;
            if w & KIND_MASK != KIND_FREE {
                media.store_u64(off, (w >> 8) << 8)?;
                media.flush(off, 8)?;
            }
        }
        media.fence();
        Ok(())
    }
}

impl<'a, M: Media> Intent<'a, M> {
    /// Line `n` (>= 1) of this record, which the holder of the record owns as well.
    pub fn line(&self, n: u64) -> Result<Intent<'a, M>> {
        debug_assert!(n >= 1);
        let off = self.off + n * CACHE_LINE;
        let seq = (self.media.load_u64(off)? >> 8).wrapping_add(1) & (u64::MAX >> 8);
        Ok(Intent {
            media: self.media,
            owed: self.owed,
            off,
            seq,
            begun: false,
            done: false,
        })
    }

    /// Stores `fields` under user kind `kind` (>= 2) and makes the record durable.
    pub fn begin(&mut self, kind: u8, fields: [u64; FIELDS]) -> Result<()> {
        debug_assert!(kind as u64 > KIND_RESERVED);
        for (j, f) in fields.iter().enumerate() {
            self.media.store_u64(self.off + 8 * (j as u64 + 1), *f)?;
        }
        self.media.store_u64(
            self.off + 8 * (FIELDS as u64 + 1),
            checksum(self.seq, &fields),
        )?;
        self.media
            .store_u64(self.off, (self.seq << 8) | kind as u64)?;
        self.begun = true;
        self.media.persist(self.off, CACHE_LINE)
    }

    /// Switches a begun record to another user kind (e.g. from "claiming" to "committed"),
    /// durably.
    pub fn set_kind(&mut self, kind: u8) -> Result<()> {
        debug_assert!(self.begun && kind as u64 > KIND_RESERVED);
        self.media
            .store_u64_persist(self.off, (self.seq << 8) | kind as u64)
    }

    /// Frees the record durably: the operation it described is complete.
    pub fn finish(mut self) -> Result<()> {
        self.done = true;
        let freed = self.media.store_u64_persist(self.off, self.seq << 8);
        if freed.is_err() {
            self.owed.store(true, Ordering::Relaxed);
        }
        freed
    }
}

impl<M: Media> Drop for Intent<'_, M> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Begun: the operation failed part way and recovery finishes or undoes it. Not
        // begun: nothing was recorded, the reservation goes back; should that store fail,
        // recovery frees the record.
        if self.begun || self.media.store_u64(self.off, self.seq << 8).is_err() {
            self.owed.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::pm::HeapRegion;

    use super::*;

    #[test]
    fn only_begun_records_with_a_valid_checksum_are_recovered() {
        let r = HeapRegion::new(4096).unwrap();
        let t = IntentTable::new(PmOff(0), 4, 2);
        t.format(&r).unwrap();
        let mut a = t.acquire(&r).unwrap();
        let b = t.acquire(&r).unwrap();
        assert_ne!(a.off, b.off);
        a.begin(7, [1, 2, 3, 4, 5, 6]).unwrap();
        drop(b);
        let mut c = t.acquire(&r).unwrap();
        c.begin(8, [9; FIELDS]).unwrap();
        c.set_kind(9).unwrap();
        let mut m = c.line(1).unwrap();
        m.begin(7, [3; FIELDS]).unwrap();
        let found = t.scan(&r, &[7, 9]).unwrap();
        assert_eq!(found.len(), 3);
        assert!(found.iter().any(|x| x.line == 1 && x.fields == [3; FIELDS]));
        m.finish().unwrap();
        let found = t.scan(&r, &[7, 9]).unwrap();
        assert_eq!(found.len(), 2);
        assert!(
            found
                .iter()
                .any(|x| x.kind == 7 && x.fields == [1, 2, 3, 4, 5, 6])
        );
        assert!(found.iter().any(|x| x.kind == 9 && x.fields == [9; FIELDS]));
        // A torn field breaks the checksum: the record is ignored.
        r.store_u64(a.off + 16, 99).unwrap();
        assert_eq!(t.scan(&r, &[7, 9]).unwrap().len(), 1);
        // A valid record of an unknown kind is corrupt.
        assert!(matches!(t.scan(&r, &[7]), Err(Error::Corrupt { .. })));
        c.finish().unwrap();
        t.reset(&r).unwrap();
        assert!(t.scan(&r, &[7, 9]).unwrap().is_empty());
        drop(a);
        // All four records are free again.
        let held: Vec<_> = (0..4).map(|_| t.acquire(&r).unwrap()).collect();
        assert_eq!(held.len(), 4);
    }
}
