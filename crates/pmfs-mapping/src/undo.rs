//! A structure's own meta area — a checksummed header block plus striped undo-log slots — and
//! the undo-log transactions that make multi-word updates of PM structures crash-atomic.
//!
//! # Meta area
//!
//! A mapping structure is given an extent of blocks (`meta`) at format time. Its first block
//! holds an [`AreaHeader`]; the following `slots × slot_blocks` blocks hold undo-log slots.
//! [`format_area`] writes both, [`open_area`] validates the header (magic, versions, crc32c,
//! geometry) and returns the [`UndoLog`] together with the structure's own parameters.
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 8 | `magic` | the structure's magic number |
//! | 8 | 4 | `area_version` | version of this area format ([`AREA_VERSION`]) |
//! | 12 | 4 | `struct_version` | the structure's own format version |
//! | 16 | 8 | `meta_start` | first block of the area (must match where it is found) |
//! | 24 | 8 | `meta_blocks` | length of the area in blocks |
//! | 32 | 4 | `undo_slots` | number of undo-log slots |
//! | 36 | 4 | `undo_slot_blocks` | size of one slot in blocks |
//! | 40 | 64 | `params` | eight structure-defined parameters |
//! | 104 | 4 | `crc` | crc32c of bytes 0..104 |
//! | 108 | 4 | `pad` | zero |
//!
//! # Undo-log slot
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | `gen`: the slot's generation; records are valid only under the current one |
//! | 8 | 56 | reserved, zero |
//! | 64 | … | records, back to back, each 8-byte aligned |
//!
//! A record is a 16-byte header and, for byte records, the old bytes padded to 8:
//!
//! | word | bits | field |
//! |---|---|---|
//! | 0 | 0..64 | `target`: PM offset of the logged range |
//! | 1 | 0..24 | `len`: length of the range in bytes |
//! | 1 | 24..32 | `kind`: 1 = old bytes follow, 2 = the range was all zero (no payload) |
//! | 1 | 32..64 | `crc`: crc32c of `gen`, word 0, word 1 with `crc` = 0, and the payload |
//!
//! # Protocol
//!
//! A [`Tx`] owns one slot (taken from a striped set, so transactions of different files rarely
//! wait for one another). Before a word or byte range of a *reachable* structure is changed in
//! place, [`Tx::write`]/[`Tx::store_words`] append a record holding its old content and make
//! the record durable (write, flush, fence) — only then is the range stored to. Blocks that
//! nothing reachable points to yet (fresh nodes) are written with [`Tx::write_fresh`] and need
//! no record. [`Tx::commit`] flushes every range the transaction wrote, fences, and then
//! advances the slot's generation with one persisted 8-byte store: that store is the commit
//! point, after which no record of the transaction is valid. [`Tx::abort`] (also run when a
//! `Tx` is dropped unfinished) and [`UndoLog::recover`] write the old contents back in reverse
//! record order, persist them, and advance the generation. Rollback is idempotent: a crash
//! during it leaves the records valid, and the next recovery repeats it.
//!
//! A transaction whose whole effect is one 8-byte store needs no record:
//! [`Tx::store_sole_u64`] stores the word (an atomic store: a crash leaves the old or the new
//! value, each a consistent structure) and commit flushes and fences it. It must be the
//! transaction's only change, so it refuses a transaction that has written anything, and
//! every write after it fails; an abort stores the old word back.
//!
//! A record whose crc does not match (torn by a crash while it was written, or left over from
//! an earlier generation) ends the slot's valid records. No in-place store precedes the
//! durability of its record, so nothing after that point needs undoing.
//!
//! Blocks allocated by a transaction that is rolled back by recovery are not referenced by the
//! restored structure; allocators are rebuilt from the structures at mount, so they are free.
//! Blocks a transaction releases must be handed back to the allocator only after commit (else
//! another file could reuse a block that a rollback makes referenced again). A [`Ledger`]
//! keeps both lists for one call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, CACHE_LINE, Le32, Le64, PmOff, Pod, crc32c};
use pmfs_core::pm::{Media, MediaExt};
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent, Run};
use pmfs_core::{Error, Result};

/// Version of the meta-area and undo-log format.
pub const AREA_VERSION: u32 = 1;

/// Bytes at the start of a slot before its first record.
const SLOT_HEADER: u64 = CACHE_LINE;
/// Bytes of a record header.
const RECORD_HEADER: u64 = 16;
/// Largest range one record can hold (24-bit length field).
const MAX_RECORD_LEN: u64 = (1 << 24) - 1;
const KIND_BYTES: u64 = 1;
const KIND_ZERO: u64 = 2;

/// The header block of a structure's meta area. See the module docs for the field table.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct AreaHeader {
    /// The structure's magic number.
    pub magic: Le64,
    /// [`AREA_VERSION`].
    pub area_version: Le32,
    /// The structure's own format version.
    pub struct_version: Le32,
    /// First block of the area.
    pub meta_start: Le64,
    /// Length of the area in blocks.
    pub meta_blocks: Le64,
    /// Number of undo-log slots.
    pub undo_slots: Le32,
    /// Blocks per undo-log slot.
    pub undo_slot_blocks: Le32,
    /// Structure-defined parameters.
    pub params: [Le64; 8],
    /// crc32c of all bytes before this field.
    pub crc: Le32,
    /// Zero.
    pub pad: Le32,
}

const _: () = assert!(size_of::<AreaHeader>() == 112);
const CRC_OFFSET: usize = 104;

// SAFETY: `repr(C)` struct of byte-array wrappers (alignment 1) with no padding (the size
// assertion above equals the sum of the fields), valid for every bit pattern.
unsafe impl Pod for AreaHeader {}

impl AreaHeader {
    fn crc_of(&self) -> u32 {
        crc32c(&self.as_bytes()[..CRC_OFFSET])
    }
}

/// How many undo-log slots an area has and how big each is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UndoGeometry {
    /// Number of slots: how many transactions can run at once without waiting.
    pub slots: u32,
    /// Size of one slot in blocks: bounds the old content one transaction can log.
    pub slot_blocks: u32,
}

impl UndoGeometry {
    /// 8 slots of 64 KiB.
    pub const DEFAULT: UndoGeometry = UndoGeometry {
        slots: 8,
        slot_blocks: 16,
    };

    /// Blocks of a meta area with this geometry: the header block plus the slots.
    pub fn area_blocks(&self) -> u64 {
        1 + u64::from(self.slots) * u64::from(self.slot_blocks)
    }

    fn check(&self) -> Result<()> {
        if self.slots == 0 || self.slots > 4096 || self.slot_blocks == 0 || self.slot_blocks > 4096
        {
            return Err(Error::InvalidArgument("undo geometry out of range"));
        }
        Ok(())
    }
}

impl Default for UndoGeometry {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Identifies a structure's meta area: its magic and format version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AreaKind {
    /// Magic number stored first in the header.
    pub magic: u64,
    /// The structure's format version.
    pub version: u32,
}

fn meta_off(meta: Extent) -> Result<PmOff> {
    meta.start
        .checked_offset()
        .ok_or(Error::InvalidArgument("meta area outside any region"))
}

/// Formats a meta area: writes the header (durably) and empties every undo-log slot.
///
/// `meta` must be at least `geometry.area_blocks()` blocks long and lie inside the region.
pub fn format_area<M: Media + ?Sized>(
    media: &M,
    meta: Extent,
    kind: AreaKind,
    geometry: UndoGeometry,
    params: [u64; 8],
) -> Result<UndoLog> {
    geometry.check()?;
    if meta.len < geometry.area_blocks() {
        return Err(Error::InvalidArgument("meta area too small"));
    }
    let end = meta
        .end()
        .checked_offset()
        .ok_or(Error::InvalidArgument("meta area outside any region"))?;
    if end.0 > media.size() {
        return Err(Error::InvalidArgument("meta area outside the region"));
    }
    let base = meta_off(meta)?;
    let mut h = AreaHeader {
        magic: Le64::new(kind.magic),
        area_version: Le32::new(AREA_VERSION),
        struct_version: Le32::new(kind.version),
        meta_start: Le64::new(meta.start.0),
        meta_blocks: Le64::new(meta.len),
        undo_slots: Le32::new(geometry.slots),
        undo_slot_blocks: Le32::new(geometry.slot_blocks),
        params: params.map(Le64::new),
        crc: Le32::new(0),
        pad: Le32::new(0),
    };
    h.crc = Le32::new(h.crc_of());
    let log = UndoLog::new(base + BLOCK_SIZE, geometry, 1);
    for s in 0..geometry.slots {
        let off = log.slot_off(s);
        media.fill_nt(off, SLOT_HEADER + RECORD_HEADER, 0)?;
        media.fence();
        media.store_u64_persist(off, 1)?;
    }
    media.write_persist(base, h.as_bytes())?;
    Ok(log)
}

/// Opens a meta area formatted by [`format_area`] with the same `kind`: validates the header
/// and returns the undo log (not yet recovered) and the structure's parameters.
pub fn open_area<M: Media + ?Sized>(
    media: &M,
    meta: Extent,
    kind: AreaKind,
) -> Result<(UndoLog, [u64; 8])> {
    let base = meta_off(meta)?;
    let corrupt = |what| Error::Corrupt { what, at: base };
    let h: AreaHeader = media.read_pod(base)?;
    if h.magic.get() != kind.magic {
        return Err(corrupt("meta area magic"));
    }
    if h.crc.get() != h.crc_of() {
        return Err(corrupt("meta area checksum"));
    }
    if h.area_version.get() != AREA_VERSION || h.struct_version.get() != kind.version {
        return Err(corrupt("meta area version"));
    }
    if h.meta_start.get() != meta.start.0 || h.meta_blocks.get() != meta.len {
        return Err(corrupt("meta area position"));
    }
    let geometry = UndoGeometry {
        slots: h.undo_slots.get(),
        slot_blocks: h.undo_slot_blocks.get(),
    };
    if geometry.check().is_err() || geometry.area_blocks() > meta.len {
        return Err(corrupt("meta area undo geometry"));
    }
    let log = UndoLog::new(base + BLOCK_SIZE, geometry, 0);
    for s in 0..geometry.slots {
        let off = log.slot_off(s);
        let gen_ = media.load_u64(off)?;
        if gen_ == 0 {
            return Err(Error::Corrupt {
                what: "undo slot generation",
                at: off,
            });
        }
        *log.slots[s as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = gen_;
    }
    Ok((log, h.params.map(Le64::get)))
}

/// The undo-log slots of one meta area. Slots are chosen by [`UndoLog::begin`]; each slot's
/// DRAM mutex holds its current generation.
#[derive(Debug)]
pub struct UndoLog {
    first_slot: PmOff,
    geometry: UndoGeometry,
    slots: Vec<Mutex<u64>>,
    /// A transaction failed to commit or roll back: its records await recovery.
    owed: AtomicBool,
}

/// One old content to restore.
#[derive(Debug)]
struct UndoRecord {
    target: PmOff,
    old: Option<Vec<u8>>,
    len: u64,
}

impl UndoLog {
    fn new(first_slot: PmOff, geometry: UndoGeometry, gen_: u64) -> Self {
        Self {
            first_slot,
            geometry,
            slots: (0..geometry.slots).map(|_| Mutex::new(gen_)).collect(),
            owed: AtomicBool::new(false),
        }
    }

    /// Whether a transaction failed to commit or roll back since this log was opened (its
    /// media refused a store): its records then await [`recover`](UndoLog::recover).
    pub fn recovery_owed(&self) -> bool {
        self.owed.load(Ordering::Relaxed)
    }

    /// Notes that a failure outside a transaction left work for recovery (blocks an aborted
    /// operation allocated and could not give back).
    pub(crate) fn owe(&self) {
        self.owed.store(true, Ordering::Relaxed);
    }

    fn slot_bytes(&self) -> u64 {
        u64::from(self.geometry.slot_blocks) * BLOCK_SIZE
    }

    fn slot_off(&self, s: u32) -> PmOff {
        self.first_slot + u64::from(s) * self.slot_bytes()
    }

    /// The byte range of all slots (records must never target it).
    fn span(&self) -> (u64, u64) {
        let start = self.first_slot.0;
        (
            start,
            start + u64::from(self.geometry.slots) * self.slot_bytes(),
        )
    }

    /// The geometry of the slots.
    pub fn geometry(&self) -> UndoGeometry {
        self.geometry
    }

    /// Starts a transaction in a free slot, preferring slot `hint % slots` (e.g. the inode
    /// number) and waiting for that one only if all are busy.
    pub fn begin<'a, M: Media + ?Sized>(&'a self, media: &'a M, hint: u64) -> Tx<'a, M> {
        let n = self.slots.len();
        let home = (hint % n as u64) as usize;
        let mut taken = None;
        for k in 0..n {
            let s = (home + k) % n;
            match self.slots[s].try_lock() {
                Ok(g) => {
                    taken = Some((s, g));
                    break;
                }
                Err(TryLockError::Poisoned(p)) => {
                    taken = Some((s, p.into_inner()));
                    break;
                }
                Err(TryLockError::WouldBlock) => {}
            }
        }
        let (s, guard) = taken.unwrap_or_else(|| {
            (
                home,
                self.slots[home].lock().unwrap_or_else(|e| e.into_inner()),
            )
        });
        let slot = self.slot_off(s as u32);
        Tx {
            media,
            log: self,
            slot,
            gen_: guard,
            next: slot + SLOT_HEADER,
            end: slot + self.slot_bytes(),
            records: Vec::new(),
            dirty: Vec::new(),
            sole: None,
            finished: false,
        }
    }

    /// Rolls back every slot that holds valid records (transactions cut short by a crash).
    /// Returns how many slots were rolled back. Call once after opening, before any
    /// transaction begins.
    pub fn recover<M: Media + ?Sized>(&self, media: &M) -> Result<usize> {
        let mut rolled = 0;
        for s in 0..self.geometry.slots {
            let mut gen_ = self.slots[s as usize]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let slot = self.slot_off(s);
            let on_media = media.load_u64(slot)?;
            if on_media == 0 {
                return Err(Error::Corrupt {
                    what: "undo slot generation",
                    at: slot,
                });
            }
            *gen_ = on_media;
            let records = self.scan(media, slot, on_media)?;
            if records.is_empty() {
                continue;
            }
            restore(media, &records)?;
            *gen_ = on_media.wrapping_add(1).max(1);
            media.store_u64_persist(slot, *gen_)?;
            rolled += 1;
        }
        Ok(rolled)
    }

    /// Reads the valid records of a slot under generation `gen_`.
    fn scan<M: Media + ?Sized>(
        &self,
        media: &M,
        slot: PmOff,
        gen_: u64,
    ) -> Result<Vec<UndoRecord>> {
        let end = slot.0 + self.slot_bytes();
        let (span_start, span_end) = self.span();
        let mut at = slot.0 + SLOT_HEADER;
        let mut out = Vec::new();
        while at + RECORD_HEADER <= end {
            let w0 = media.load_u64(PmOff(at))?;
            let w1 = media.load_u64(PmOff(at + 8))?;
            let len = w1 & MAX_RECORD_LEN;
            let kind = (w1 >> 24) & 0xff;
            let crc = (w1 >> 32) as u32;
            let payload = if kind == KIND_BYTES { pad8(len) } else { 0 };
            if (kind != KIND_BYTES && kind != KIND_ZERO)
                || at + RECORD_HEADER + payload > end
                || len == 0
            {
                break;
            }
            let mut data = vec![0u8; payload as usize];
            media.read(PmOff(at + RECORD_HEADER), &mut data)?;
            if record_crc(gen_, w0, w1 & 0xffff_ffff, &data) != crc {
                break;
            }
            let target_end = w0.checked_add(len).ok_or(Error::Corrupt {
                what: "undo record target",
                at: PmOff(at),
            })?;
            if target_end > media.size() || (w0 < span_end && target_end > span_start) {
                return Err(Error::Corrupt {
                    what: "undo record target",
                    at: PmOff(at),
                });
            }
            data.truncate(len as usize);
            out.push(UndoRecord {
                target: PmOff(w0),
                old: (kind == KIND_BYTES).then_some(data),
                len,
            });
            at += RECORD_HEADER + payload;
        }
        Ok(out)
    }
}

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

fn record_crc(gen_: u64, w0: u64, w1_without_crc: u64, payload: &[u8]) -> u32 {
    let mut head = [0u8; 24];
    head[..8].copy_from_slice(&gen_.to_le_bytes());
    head[8..16].copy_from_slice(&w0.to_le_bytes());
    head[16..].copy_from_slice(&w1_without_crc.to_le_bytes());
    pmfs_core::layout::crc32c_append(crc32c(&head), payload)
}

/// Writes old contents back in reverse order and makes them durable.
fn restore<M: Media + ?Sized>(media: &M, records: &[UndoRecord]) -> Result<()> {
    for r in records.iter().rev() {
        match &r.old {
            Some(bytes) => media.write(r.target, bytes)?,
            None => media.write(r.target, &vec![0u8; r.len as usize])?,
        }
        media.flush(r.target, r.len)?;
    }
    media.fence();
    Ok(())
}

/// An undo-log transaction over one slot. See the module docs for the protocol.
///
/// Dropping a `Tx` that was neither committed nor aborted aborts it (errors during that
/// rollback are lost; call [`Tx::abort`] to see them).
pub struct Tx<'a, M: Media + ?Sized> {
    media: &'a M,
    log: &'a UndoLog,
    slot: PmOff,
    gen_: MutexGuard<'a, u64>,
    next: PmOff,
    end: PmOff,
    records: Vec<UndoRecord>,
    dirty: Vec<(u64, u64)>,
    /// The word [`store_sole_u64`](Tx::store_sole_u64) changed and its old value.
    sole: Option<(PmOff, u64)>,
    finished: bool,
}

impl<M: Media + ?Sized> std::fmt::Debug for Tx<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("slot", &self.slot)
            .field("gen", &*self.gen_)
            .field("records", &self.records.len())
            .finish_non_exhaustive()
    }
}

impl<'a, M: Media + ?Sized> Tx<'a, M> {
    /// The media the transaction writes to.
    pub fn media(&self) -> &'a M {
        self.media
    }

    /// Whether a record already holds the original content of all of `[off, off + len)`.
    fn covered(&self, off: u64, len: u64) -> bool {
        self.records
            .iter()
            .any(|r| r.target.0 <= off && off + len <= r.target.0 + r.len)
    }

    /// Appends a durable record of the current content of `[off, off + len)`, unless an
    /// earlier record of this transaction already covers it.
    pub fn log(&mut self, off: PmOff, len: u64) -> Result<()> {
        self.check_not_sole()?;
        if len == 0 || self.covered(off.0, len) {
            return Ok(());
        }
        if len > MAX_RECORD_LEN {
            return Err(Error::InvalidArgument("undo record too long"));
        }
        let (span_start, span_end) = self.log.span();
        if off.0 < span_end && off.0 + len > span_start {
            return Err(Error::InvalidArgument("undo record targets the undo log"));
        }
        let mut old = vec![0u8; len as usize];
        self.media.read(off, &mut old)?;
        let zero = old.iter().all(|&b| b == 0);
        let (kind, payload_len) = if zero {
            (KIND_ZERO, 0)
        } else {
            (KIND_BYTES, pad8(len))
        };
        let total = RECORD_HEADER + payload_len;
        if self.next.0 + total > self.end.0 {
            return Err(Error::NoSpace);
        }
        let w1 = len | (kind << 24);
        let mut rec = Vec::with_capacity(total as usize);
        rec.extend_from_slice(&off.0.to_le_bytes());
        let payload: &[u8] = if zero { &[] } else { &old };
        let mut padded = payload.to_vec();
        padded.resize(payload_len as usize, 0);
        let crc = record_crc(*self.gen_, off.0, w1, &padded);
        rec.extend_from_slice(&(w1 | (u64::from(crc) << 32)).to_le_bytes());
        rec.extend_from_slice(&padded);
        self.media.write_persist(self.next, &rec)?;
        self.next = self.next + total;
        self.records.push(UndoRecord {
            target: off,
            old: (!zero).then_some(old),
            len,
        });
        Ok(())
    }

    /// Logs `[off, off + src.len())`, then stores `src` there (cached stores).
    pub fn write(&mut self, off: PmOff, src: &[u8]) -> Result<()> {
        self.log(off, src.len() as u64)?;
        self.media.write(off, src)?;
        self.dirty.push((off.0, src.len() as u64));
        Ok(())
    }

    /// Logs the words `[off, off + 8 * words.len())` in one record, then stores each with an
    /// 8-byte atomic store.
    pub fn store_words(&mut self, off: PmOff, words: &[u64]) -> Result<()> {
        let len = 8 * words.len() as u64;
        self.log(off, len)?;
        for (i, &w) in words.iter().enumerate() {
            self.media.store_u64(off + 8 * i as u64, w)?;
        }
        self.dirty.push((off.0, len));
        Ok(())
    }

    /// Logs the word at `off`, then stores `val` with an 8-byte atomic store.
    pub fn store_u64(&mut self, off: PmOff, val: u64) -> Result<()> {
        self.store_words(off, &[val])
    }

    /// Stores `src` at `off` without logging: only for ranges nothing reachable depends on
    /// before commit (fresh blocks, or dead space of a node whose live bound is logged). The
    /// range is made durable at commit.
    pub fn write_fresh(&mut self, off: PmOff, src: &[u8]) -> Result<()> {
        self.check_not_sole()?;
        self.media.write(off, src)?;
        self.dirty.push((off.0, src.len() as u64));
        Ok(())
    }

    /// [`write_fresh`](Tx::write_fresh) of one word with an 8-byte atomic store.
    pub fn store_fresh_u64(&mut self, off: PmOff, val: u64) -> Result<()> {
        self.check_not_sole()?;
        self.media.store_u64(off, val)?;
        self.dirty.push((off.0, 8));
        Ok(())
    }

    /// Zeroes a fresh block without logging (made durable at commit).
    pub fn zero_fresh_block(&mut self, b: BlockNo) -> Result<()> {
        self.check_not_sole()?;
        let off = b.checked_offset().ok_or(Error::InvalidArgument("block"))?;
        self.media.fill_nt(off, BLOCK_SIZE, 0)
    }

    /// Stores `val` at `off` (8-byte aligned) with one atomic store and no record: the whole
    /// change of this transaction, taking the structure from its state before the call to its
    /// state after (see the module docs). Made durable at commit.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the transaction has written anything; every later write
    /// of the transaction fails the same way.
    pub fn store_sole_u64(&mut self, off: PmOff, val: u64) -> Result<()> {
        if !self.is_untouched() {
            return Err(Error::InvalidArgument(
                "a sole store in a transaction that has written",
            ));
        }
        let old = self.media.load_u64(off)?;
        self.media.store_u64(off, val)?;
        self.sole = Some((off, old));
        self.dirty.push((off.0, 8));
        Ok(())
    }

    fn check_not_sole(&self) -> Result<()> {
        match self.sole {
            Some(_) => Err(Error::InvalidArgument(
                "a write after a transaction's sole store",
            )),
            None => Ok(()),
        }
    }

    /// Whether the transaction has written nothing yet.
    pub fn is_untouched(&self) -> bool {
        self.records.is_empty() && self.dirty.is_empty() && self.sole.is_none()
    }

    /// Number of records written so far.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Bytes of the slot still free for records.
    pub fn room(&self) -> u64 {
        self.end.0 - self.next.0
    }

    fn flush_dirty(&mut self) -> Result<()> {
        self.dirty.sort_unstable();
        let mut cur: Option<(u64, u64)> = None;
        for &(off, len) in &self.dirty {
            match cur {
                Some((s, e)) if off <= e => cur = Some((s, e.max(off + len))),
                Some((s, e)) => {
                    self.media.flush(PmOff(s), e - s)?;
                    cur = Some((off, off + len));
                }
                None => cur = Some((off, off + len)),
            }
        }
        if let Some((s, e)) = cur {
            self.media.flush(PmOff(s), e - s)?;
        }
        self.media.fence();
        self.dirty.clear();
        Ok(())
    }

    fn advance_generation(&mut self) -> Result<()> {
        let next = self.gen_.wrapping_add(1).max(1);
        self.media.store_u64_persist(self.slot, next)?;
        *self.gen_ = next;
        Ok(())
    }

    /// Makes every write of the transaction durable, then invalidates its records: the
    /// transaction's effects survive any later crash.
    pub fn commit(mut self) -> Result<()> {
        self.finished = true;
        let done = self.flush_dirty().and_then(|()| {
            if self.records.is_empty() {
                Ok(())
            } else {
                self.advance_generation()
            }
        });
        self.owe_on(done)
    }

    /// Restores every logged range to its content before the transaction and invalidates the
    /// records. Fresh blocks the transaction wrote are left as they are (the caller frees
    /// them).
    pub fn abort(mut self) -> Result<()> {
        self.finished = true;
        let done = self.rollback();
        self.owe_on(done)
    }

    /// Passes `r` on, noting in the log when it failed: the records stay for recovery.
    fn owe_on(&self, r: Result<()>) -> Result<()> {
        if r.is_err() {
            self.log.owe();
        }
        r
    }

    fn rollback(&mut self) -> Result<()> {
        self.dirty.clear();
        if let Some((off, old)) = self.sole.take() {
            return self.media.store_u64_persist(off, old);
        }
        if self.records.is_empty() {
            return Ok(());
        }
        restore(self.media, &self.records)?;
        self.advance_generation()
    }
}

/// The blocks one mutating call takes from and gives back to its allocator, kept so that the
/// protocol above holds: blocks the call allocated go back to the allocator if it fails (after
/// [`Tx::abort`]), blocks it gives up go back only after [`Tx::commit`].
#[derive(Debug, Default)]
pub struct Ledger {
    allocated: Vec<Extent>,
    nodes: Vec<BlockNo>,
    released: Vec<Extent>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocates exactly `len` blocks, in as many extents as `alloc` hands out, asking each
    /// time to continue where the previous extent ended (`goal` for the first). All or
    /// nothing. An extent for which `inside` is false (an allocator handing out blocks the
    /// structure must not use) is given back and fails the call.
    pub fn alloc_data<A: BlockAllocator + ?Sized>(
        &mut self,
        alloc: &A,
        len: u64,
        goal: Option<BlockNo>,
        inside: impl Fn(Extent) -> bool,
    ) -> Result<Vec<Extent>> {
        let mut got: Vec<Extent> = Vec::new();
        let mut done = 0;
        while done < len {
            let hint = AllocHint {
                kind: AllocKind::Growing,
                goal: got.last().map(Extent::end).or(goal),
            };
            let r = alloc.alloc(len - done, hint).and_then(|e| {
                if e.len == 0 || e.len > len - done || !inside(e) {
                    let _ = alloc.free(e);
                    Err(Error::InvalidArgument(
                        "allocator returned blocks outside the data area",
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
                    let _ = free_merged(alloc, got);
                    return Err(err);
                }
            }
        }
        self.allocated.extend_from_slice(&got);
        Ok(got)
    }

    /// Allocates one metadata block for a new node; it counts as fresh until the call ends.
    pub fn alloc_node<A: BlockAllocator + ?Sized>(
        &mut self,
        alloc: &A,
        inside: impl Fn(Extent) -> bool,
    ) -> Result<BlockNo> {
        let e = alloc.alloc(1, AllocHint::metadata())?;
        if e.len != 1 || !inside(e) {
            let _ = alloc.free(e);
            return Err(Error::InvalidArgument(
                "allocator returned a block outside the data area",
            ));
        }
        self.allocated.push(e);
        self.nodes.push(e.start);
        Ok(e.start)
    }

    /// Whether `b` is a node this call allocated (nothing reachable pointed to it before).
    pub fn is_fresh_node(&self, b: BlockNo) -> bool {
        self.nodes.contains(&b)
    }

    /// Records blocks the call gives up, to be freed after commit.
    pub fn release(&mut self, e: Extent) {
        self.released.push(e);
    }

    /// How many blocks the call gave up so far.
    pub fn released_blocks(&self) -> u64 {
        self.released.iter().map(|e| e.len).sum()
    }

    /// After a commit: frees the given-up blocks. Reports the first failure.
    pub fn finish_committed<A: BlockAllocator + ?Sized>(self, alloc: &A) -> Result<()> {
        free_merged(alloc, self.released)
    }

    /// After an abort: frees the blocks the call allocated. Reports the first failure.
    pub fn finish_aborted<A: BlockAllocator + ?Sized>(self, alloc: &A) -> Result<()> {
        free_merged(alloc, self.allocated)
    }
}

/// The `replace_many` of the trees: `in_place` stores, under the file lock, the runs it can
/// overwrite word by word (flushed, their old blocks released to the ledger) and hands back
/// the others; one fence makes the stores durable before their old blocks are freed (also
/// when `in_place` failed partway); then `replace_rest` replaces the others, in order, with
/// the contract of `replace_many`. Returns the blocks freed.
pub(crate) fn replace_many_in_place<M: Media + ?Sized, A: BlockAllocator + ?Sized>(
    media: &M,
    alloc: &A,
    in_place: impl FnOnce(&mut Ledger, &mut Vec<Run>) -> Result<()>,
    replace_rest: impl FnOnce(&[Run]) -> Result<u64>,
) -> Result<u64> {
    let mut ledger = Ledger::new();
    let mut rest = Vec::new();
    let stored = in_place(&mut ledger, &mut rest);
    media.fence();
    let freed = ledger.released_blocks();
    ledger.finish_committed(alloc)?;
    stored?;
    Ok(freed + replace_rest(&rest)?)
}

/// Frees extents, merging neighbours first; reports the first failure after trying all.
fn free_merged<A: BlockAllocator + ?Sized>(alloc: &A, mut extents: Vec<Extent>) -> Result<()> {
    extents.sort();
    let mut merged: Vec<Extent> = Vec::with_capacity(extents.len());
    for e in extents {
        match merged.last_mut() {
            Some(last) if last.end() == e.start => last.len += e.len,
            _ => merged.push(e),
        }
    }
    alloc.free_many(&merged)
}

impl<M: Media + ?Sized> Drop for Tx<'_, M> {
    fn drop(&mut self) {
        if !self.finished {
            // An error here means the media failed; recovery repeats the rollback from the
            // still-valid records.
            let done = self.rollback();
            let _ = self.owe_on(done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::pm::HeapRegion;
    use pmfs_core::sim::{Explorer, SimRegion};

    const KIND: AreaKind = AreaKind {
        magic: 0x7465_7374_6172_6561,
        version: 3,
    };

    fn setup() -> (HeapRegion, Extent, UndoLog) {
        let r = HeapRegion::new(64 * BLOCK_SIZE).unwrap();
        let meta = Extent::new(BlockNo(2), 9);
        let geom = UndoGeometry {
            slots: 2,
            slot_blocks: 4,
        };
        let log = format_area(&r, meta, KIND, geom, [7, 0, 0, 0, 0, 0, 0, 9]).unwrap();
        (r, meta, log)
    }

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let (r, meta, _) = setup();
        let (log, params) = open_area(&r, meta, KIND).unwrap();
        assert_eq!(params[0], 7);
        assert_eq!(params[7], 9);
        assert_eq!(log.geometry().slots, 2);
        let wrong = AreaKind { version: 4, ..KIND };
        assert!(matches!(
            open_area(&r, meta, wrong),
            Err(Error::Corrupt { .. })
        ));
        // Flip a parameter byte: the checksum no longer matches.
        let off = meta.start.offset() + 40;
        r.write(off, &[1]).unwrap();
        assert!(matches!(
            open_area(&r, meta, KIND),
            Err(Error::Corrupt {
                what: "meta area checksum",
                ..
            })
        ));
    }

    #[test]
    fn abort_and_recover_restore_old_content() {
        let (r, meta, log) = setup();
        let target = PmOff(40 * BLOCK_SIZE);
        r.write(target, b"original bytes!!").unwrap();
        let mut tx = log.begin(&r, 0);
        tx.write(target, b"changed").unwrap();
        tx.store_u64(target + 64, 42).unwrap();
        tx.abort().unwrap();
        let mut buf = [0u8; 16];
        r.read(target, &mut buf).unwrap();
        assert_eq!(&buf, b"original bytes!!");
        assert_eq!(r.load_u64(target + 64).unwrap(), 0);

        // Simulate a crash: an unfinished transaction's records stay valid in PM.
        let mut tx = log.begin(&r, 0);
        tx.write(target, b"crashed").unwrap();
        tx.store_u64(target + 64, 5).unwrap();
        std::mem::forget(tx);
        let image = HeapRegion::from_image(&{
            let mut v = vec![0u8; r.size() as usize];
            r.read(PmOff(0), &mut v).unwrap();
            v
        })
        .unwrap();
        let (log2, _) = open_area(&image, meta, KIND).unwrap();
        assert_eq!(log2.recover(&image).unwrap(), 1);
        image.read(target, &mut buf).unwrap();
        assert_eq!(&buf, b"original bytes!!");
        assert_eq!(image.load_u64(target + 64).unwrap(), 0);
        // A second recovery finds nothing to do.
        assert_eq!(log2.recover(&image).unwrap(), 0);
    }

    #[test]
    fn committed_records_are_not_rolled_back() {
        let (r, meta, log) = setup();
        let target = PmOff(40 * BLOCK_SIZE);
        let mut tx = log.begin(&r, 1);
        tx.store_u64(target, 11).unwrap();
        tx.commit().unwrap();
        let (log2, _) = open_area(&r, meta, KIND).unwrap();
        assert_eq!(log2.recover(&r).unwrap(), 0);
        assert_eq!(r.load_u64(target).unwrap(), 11);
    }

    #[test]
    fn a_sole_store_commits_without_records_and_aborts_back() {
        let (r, meta, log) = setup();
        let target = PmOff(40 * BLOCK_SIZE);
        r.store_u64(target, 3).unwrap();

        // It must be the first write, and nothing may follow it.
        let mut tx = log.begin(&r, 0);
        tx.store_u64(target + 8, 1).unwrap();
        assert!(matches!(
            tx.store_sole_u64(target, 4),
            Err(Error::InvalidArgument(_))
        ));
        tx.abort().unwrap();
        let mut tx = log.begin(&r, 0);
        assert!(tx.is_untouched());
        tx.store_sole_u64(target, 4).unwrap();
        assert!(!tx.is_untouched());
        assert!(matches!(
            tx.store_u64(target + 8, 2),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            tx.write_fresh(target + 16, b"x"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            tx.store_sole_u64(target + 8, 2),
            Err(Error::InvalidArgument(_))
        ));
        // An abort stores the old word back.
        tx.abort().unwrap();
        assert_eq!(r.load_u64(target).unwrap(), 3);
        assert_eq!(r.load_u64(target + 8).unwrap(), 0);

        // A commit keeps the word, and leaves no record for recovery.
        let mut tx = log.begin(&r, 1);
        tx.store_sole_u64(target, 5).unwrap();
        assert_eq!(tx.records(), 0);
        tx.commit().unwrap();
        let (log2, _) = open_area(&r, meta, KIND).unwrap();
        assert_eq!(log2.recover(&r).unwrap(), 0);
        assert_eq!(r.load_u64(target).unwrap(), 5);
    }

    /// The word at `off` of a crash image.
    fn word(image: &[u8], off: PmOff) -> u64 {
        u64::from_le_bytes(image[off.0 as usize..][..8].try_into().unwrap())
    }

    #[test]
    fn an_aborted_sole_store_is_durable_on_return() {
        let r = SimRegion::new(64 * BLOCK_SIZE).unwrap();
        let meta = Extent::new(BlockNo(2), 9);
        let geom = UndoGeometry {
            slots: 1,
            slot_blocks: 4,
        };
        let log = format_area(&r, meta, KIND, geom, [0; 8]).unwrap();
        let target = PmOff(40 * BLOCK_SIZE);
        r.store_u64(target, 3).unwrap();
        r.persist_all();
        // Store prefixes: the line may have been written back between the sole store and the
        // abort.
        Explorer::new(1)
            .store_prefixes(true)
            .run(
                &r,
                |pm| {
                    let mut tx = log.begin(pm, 0);
                    tx.store_sole_u64(target, 4).unwrap();
                    tx.abort().unwrap();
                },
                |cp| match word(cp.image, target) {
                    3 => Ok(()),
                    4 if !cp.end => Ok(()),
                    w => Err(format!("the word is {w} after the abort")),
                },
            )
            .unwrap_or_else(|f| panic!("{f}"));
    }

    #[test]
    fn a_format_over_garbage_is_durable_on_return() {
        let r = SimRegion::new(64 * BLOCK_SIZE).unwrap();
        r.write(PmOff(0), &vec![0xa5; 64 * BLOCK_SIZE as usize])
            .unwrap();
        r.persist_all();
        let meta = Extent::new(BlockNo(2), 9);
        let geom = UndoGeometry {
            slots: 2,
            slot_blocks: 4,
        };
        let params = [7, 0, 0, 0, 0, 0, 0, 9];
        Explorer::new(2)
            .run(
                &r,
                |pm| {
                    format_area(pm, meta, KIND, geom, params).unwrap();
                },
                |cp| {
                    if !cp.end {
                        return Ok(());
                    }
                    let img = HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?;
                    let (log, got) = open_area(&img, meta, KIND).map_err(|e| e.to_string())?;
                    match log.recover(&img) {
                        Ok(0) if got == params => Ok(()),
                        r => Err(format!(
                            "recovery after the format: {r:?}, parameters {got:?}"
                        )),
                    }
                },
            )
            .unwrap_or_else(|f| panic!("{f}"));
    }

    #[test]
    fn slot_overflow_is_reported_and_records_over_the_log_refused() {
        let (r, _, log) = setup();
        let mut tx = log.begin(&r, 0);
        let big = vec![0xabu8; 3 * BLOCK_SIZE as usize];
        r.write(PmOff(40 * BLOCK_SIZE), &big).unwrap();
        tx.log(PmOff(40 * BLOCK_SIZE), big.len() as u64).unwrap();
        r.write(PmOff(44 * BLOCK_SIZE), &big[..2 * BLOCK_SIZE as usize])
            .unwrap();
        assert!(matches!(
            tx.log(PmOff(44 * BLOCK_SIZE), 2 * BLOCK_SIZE),
            Err(Error::NoSpace)
        ));
        assert!(matches!(
            tx.log(PmOff(3 * BLOCK_SIZE), 8),
            Err(Error::InvalidArgument(_))
        ));
        tx.abort().unwrap();
    }

    #[test]
    fn ledger_allocates_all_or_nothing_and_frees_by_outcome() {
        use pmfs_core::traits::SimpleAllocator;
        let alloc = SimpleAllocator::new(BlockNo(100), 10);
        let inside = |e: Extent| e.end().0 <= 110;
        // Too much: nothing stays allocated.
        let mut l = Ledger::new();
        assert!(matches!(
            l.alloc_data(&alloc, 11, None, inside),
            Err(Error::NoSpace)
        ));
        assert_eq!(alloc.free_blocks(), 10);
        // An aborted call gives back what it allocated, data and nodes.
        let data = l.alloc_data(&alloc, 4, None, inside).unwrap();
        assert_eq!(data.iter().map(|e| e.len).sum::<u64>(), 4);
        let node = l.alloc_node(&alloc, inside).unwrap();
        assert!(l.is_fresh_node(node) && !l.is_fresh_node(data[0].start));
        l.finish_aborted(&alloc).unwrap();
        assert_eq!(alloc.free_blocks(), 10);
        // A committed call gives back only what it released.
        let mut l = Ledger::new();
        let data = l.alloc_data(&alloc, 3, None, inside).unwrap();
        l.release(Extent::new(data[0].start, 1));
        l.finish_committed(&alloc).unwrap();
        assert_eq!(alloc.free_blocks(), 8);
        // Blocks outside the structure's area are refused and handed back.
        let mut l = Ledger::new();
        assert!(matches!(
            l.alloc_node(&alloc, |_| false),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(alloc.free_blocks(), 8);
    }

    #[test]
    fn torn_record_ends_the_log() {
        let (r, meta, log) = setup();
        let target = PmOff(40 * BLOCK_SIZE);
        r.store_u64(target, 1).unwrap();
        r.store_u64(target + 8, 2).unwrap();
        let mut tx = log.begin(&r, 0);
        tx.store_u64(target, 10).unwrap();
        tx.store_u64(target + 8, 20).unwrap();
        let slot = tx.slot;
        std::mem::forget(tx);
        // Damage the second record's payload: only the first is rolled back.
        let second_payload = slot + SLOT_HEADER + RECORD_HEADER + 8 + RECORD_HEADER;
        r.store_u64(second_payload, 99).unwrap();
        let (log2, _) = open_area(&r, meta, KIND).unwrap();
        assert_eq!(log2.recover(&r).unwrap(), 1);
        assert_eq!(r.load_u64(target).unwrap(), 1);
        assert_eq!(r.load_u64(target + 8).unwrap(), 20);
    }
}
