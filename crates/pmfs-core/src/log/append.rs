//! Committing entries: reservation of spans, segment writing, the CAS at the first empty slot,
//! linking new blocks, and the optimistic-concurrency interface.

use std::fmt;

use super::chain::Walk;
use super::entry::Entry;
use super::epoch::Guard;
use super::format::{
    ENTRIES_PER_BLOCK, FIRST_SLOT, Indirect, MAX_SPAN, MIN_SEGMENT_SPAN, NEXT_OFF,
    SEGMENT_HEADER_WORDS, SLOT_BYTES, SLOTS_PER_BLOCK, SegmentHeader, Slot, reserve_word,
    segment_words, slot_off,
};
use super::{Log, Position};
use crate::error::Result;
use crate::layout::{BlockNo, PmOff};
use crate::pm::Media;
use crate::sync::atomic::Ordering;
use crate::traits::{BlockAllocator, Extent};

/// What a placement does when it walks over an entry someone else committed.
enum OnEntry<'v> {
    /// Walk on.
    Skip,
    /// Stop there (the caller's snapshot is stale).
    Stop,
    /// Decode it into the vector and walk on.
    Collect(&'v mut Vec<(Position, Entry)>),
}

/// Where a placement ended.
enum Placement {
    /// The word is at `at`; `span` slots after it are reserved.
    Placed { at: Position, span: u64 },
    /// An entry was found first ([`OnEntry::Stop`]); the walk is at it.
    Stopped,
}

/// An entry ready to commit: its slot word is built and, for an extended entry, its segments
/// are durable. Commit it once with [`try_commit`](Prepared::try_commit) or
/// [`commit`](Prepared::commit); dropping it uncommitted leaves only an unreferenced
/// reservation in the log. An extended entry keeps its thread pinned until it is committed or
/// dropped (its segments must not be reclaimed meanwhile), which holds back reclamation.
pub struct Prepared<'a, M: Media, A: BlockAllocator + ?Sized> {
    log: &'a Log<M, A>,
    word: u64,
    /// Extended entries stay pinned until committed: their segments must not be reclaimed.
    _guard: Option<Guard<'a>>,
}

impl<M: Media, A: BlockAllocator + ?Sized> fmt::Debug for Prepared<'_, M, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("word", &format_args!("{:#018x}", self.word))
            .finish_non_exhaustive()
    }
}

/// The outcome of [`Prepared::try_commit`].
#[derive(Debug)]
pub enum Commit<'a, M: Media, A: BlockAllocator + ?Sized> {
    /// Committed (and durable, with everything before it) at this position.
    Done(Position),
    /// Entries were committed since the snapshot; nothing was committed. Check the entries in
    /// `[since, tail)` (e.g. with [`Log::iter_from`]) and retry with `prepared` and a newer
    /// snapshot.
    Moved {
        /// The entry, still uncommitted.
        prepared: Prepared<'a, M, A>,
        /// The tail when the attempt gave up (everything before it is durable).
        tail: Position,
    },
}

impl<'a, M: Media, A: BlockAllocator + ?Sized> Prepared<'a, M, A> {
    /// Whether the entry fits in its slot (no extended entry was written).
    pub fn is_inline(&self) -> bool {
        self._guard.is_none()
    }

    /// Commits at the first empty slot if no entry was committed at or after `since` (the
    /// caller's snapshot of the tail); else hands the entry back with the current tail.
    /// Reservations and padding since `since` do not count.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a position that is no longer
    /// [current](Log::is_current); media, allocation and corruption errors.
    pub fn try_commit(self, since: Position) -> Result<Commit<'a, M, A>> {
        let log = self.log;
        let (_g, era) = log.pin();
        let mut walk = log.walk_from(since)?;
        let word = self.word;
        match log.place(&mut walk, era, &mut OnEntry::Stop, |_| Some((word, 0)))? {
            Placement::Placed { at, .. } => Ok(Commit::Done(at)),
            Placement::Stopped => {
                log.chain().to_tail(&mut walk)?;
                let end = walk.slot;
                log.make_durable(&mut walk, end)?;
                Ok(Commit::Moved {
                    tail: log.position(&walk, era),
                    prepared: self,
                })
            }
        }
    }

    /// Commits at the first empty slot, whatever was committed before it.
    pub fn commit(self) -> Result<Position> {
        let log = self.log;
        let (_g, era) = log.pin();
        let mut walk = log.walk_from_hint()?;
        let word = self.word;
        match log.place(&mut walk, era, &mut OnEntry::Skip, |_| Some((word, 0)))? {
            Placement::Placed { at, .. } => Ok(at),
            Placement::Stopped => unreachable!("skipping placements never stop"),
        }
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Log<M, A> {
    /// Encodes `entry` for commit: an inline slot word if it fits one, else an extended entry
    /// whose segments are reserved in the log, written and made durable here.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an entry outside the
    /// encodings' limits (run longer than [`MAX_RUN_LEN`](super::MAX_RUN_LEN), blocks outside
    /// the region, an empty punch, more runs than 65535 segments hold).
    pub fn prepare(&self, entry: &Entry) -> Result<Prepared<'_, M, A>> {
        entry.validate(self.blocks)?;
        if let Some(word) = entry.inline_word() {
            return Ok(Prepared {
                log: self,
                word,
                _guard: None,
            });
        }
        let words = entry.record_words();
        let total = words.len() as u32;
        let (guard, era) = self.pin();
        let mut walk = self.walk_from_hint()?;
        // Reserve one span per segment, each as large as the room at the tail allows.
        let mut segs: Vec<(PmOff, usize)> = Vec::new();
        let mut left = words.len() as u64;
        while left > 0 {
            let want = SEGMENT_HEADER_WORDS + left.min(MAX_SPAN - SEGMENT_HEADER_WORDS);
            let choose = |room: u64| (room >= MIN_SEGMENT_SPAN).then(|| room.min(want));
            let placed = self.place(&mut walk, era, &mut OnEntry::Skip, |room| {
                choose(room).map(|n| (reserve_word(n), n))
            })?;
            let Placement::Placed { at, span } = placed else {
                unreachable!("skipping placements never stop")
            };
            let payload = span - SEGMENT_HEADER_WORDS;
            segs.push((slot_off(at.block, at.slot + 1), payload as usize));
            left -= payload;
        }
        let mut done = 0;
        let mut check = 0;
        for (k, &(off, n)) in segs.iter().enumerate() {
            let next = segs.get(k + 1).map_or(PmOff(0), |s| s.0);
            let sw = segment_words(self.root.0, k as u16, next, total, &words[done..done + n]);
            if k == 0 {
                check = Indirect::check_of(SegmentHeader::from_words(&sw).crc.get());
            }
            let bytes: Vec<u8> = sw.iter().flat_map(|w| w.to_le_bytes()).collect();
            self.media.write_nt(off, &bytes)?;
            done += n;
        }
        self.media.fence();
        Ok(Prepared {
            log: self,
            word: Indirect {
                off: segs[0].0,
                check,
            }
            .encode(),
            _guard: Some(guard),
        })
    }

    /// Commits `entry` at the first empty slot and returns where; when it returns, the entry
    /// and everything before it are durable.
    pub fn append(&self, entry: &Entry) -> Result<Position> {
        self.prepare(entry)?.commit()
    }

    /// Like [`append`](Log::append), and pushes to `won` every entry committed at or after
    /// `since` before this one (the winners an optimistic writer checks for conflicts).
    pub fn append_since(
        &self,
        entry: &Entry,
        since: Position,
        won: &mut Vec<(Position, Entry)>,
    ) -> Result<Position> {
        let p = self.prepare(entry)?;
        let (_g, era) = self.pin();
        let mut walk = self.walk_from(since)?;
        let word = p.word;
        match self.place(&mut walk, era, &mut OnEntry::Collect(won), |_| {
            Some((word, 0))
        })? {
            Placement::Placed { at, .. } => Ok(at),
            Placement::Stopped => unreachable!("collecting placements never stop"),
        }
    }

    /// Puts a word at the first empty boundary slot from `walk` and makes it durable.
    ///
    /// `choose(room)` picks the word for a slot with `room` slots after it in its block:
    /// `Some((word, span))` to place `word` reserving the `span` slots after it, `None` to pad
    /// the rest of the block and go on in the next one. It must accept a fresh block's room
    /// (`MAX_SPAN`).
    fn place(
        &self,
        walk: &mut Walk,
        era: u64,
        on_entry: &mut OnEntry<'_>,
        choose: impl Fn(u64) -> Option<(u64, u64)>,
    ) -> Result<Placement> {
        let chain = self.chain();
        loop {
            if walk.at_end() {
                if walk.step(&chain)? {
                    continue;
                }
                let Some((word, span)) = choose(MAX_SPAN) else {
                    unreachable!("every word fits a fresh block")
                };
                if self.link(walk, word)? {
                    let at = self.position(walk, era);
                    let end = walk.slot + 1 + span;
                    self.make_durable(walk, end)?;
                    walk.slot = end;
                    return Ok(Placement::Placed { at, span });
                }
                continue;
            }
            let off = slot_off(walk.block, walk.slot);
            let mut w = chain.word(walk.block, walk.slot)?;
            if w == 0 {
                let room = SLOTS_PER_BLOCK - walk.slot - 1;
                let (word, span, pad) = match choose(room) {
                    Some((word, span)) => (word, span, false),
                    None => (reserve_word(room), room, true),
                };
                match self.media.cas_u64(off, 0, word)? {
                    Ok(_) if pad => {
                        walk.slot += 1 + span;
                        continue;
                    }
                    Ok(_) => {
                        let at = self.position(walk, era);
                        let end = walk.slot + 1 + span;
                        self.make_durable(walk, end)?;
                        walk.slot = end;
                        return Ok(Placement::Placed { at, span });
                    }
                    Err(actual) => w = actual,
                }
            }
            let s = Slot::decode(w, walk.slot, off)?;
            if s.is_entry() {
                match on_entry {
                    OnEntry::Skip => {}
                    OnEntry::Stop => return Ok(Placement::Stopped),
                    OnEntry::Collect(v) => v.push((self.position(walk, era), chain.entry(s, off)?)),
                }
            }
            walk.slot += s.width();
        }
    }

    /// Links a new block after the walk's full block, with `word` in its first slot. Returns
    /// whether this call won the link (the walk is then in the new block); a loser keeps its
    /// block as the spare.
    fn link(&self, walk: &mut Walk, word: u64) -> Result<bool> {
        let _flight = self.blocks_in_flight();
        let spare = self.spare.swap(0, Ordering::AcqRel);
        let new = if spare != 0 {
            BlockNo(spare)
        } else {
            self.alloc_block()?
        };
        let base = walk.base + ENTRIES_PER_BLOCK;
        let linked = self.write_block(new, base, 0, &[word], 0).and_then(|()| {
            // The full block's body is durable before anything can follow its link.
            if self.media.needs_flush() {
                self.flush_slots(walk.block, FIRST_SLOT, SLOTS_PER_BLOCK)?;
            }
            self.media.fence();
            self.media.cas_u64(walk.block.offset() + NEXT_OFF, 0, new.0)
        });
        match linked {
            Ok(Ok(_)) => {
                walk.enter(&self.chain(), new)?;
                Ok(true)
            }
            Ok(Err(_)) => {
                self.keep_spare(new)?;
                Ok(false)
            }
            Err(e) => {
                self.keep_spare(new)?;
                Err(e)
            }
        }
    }

    /// Holds a spare block for this handle's next link, allocating one now if it holds none:
    /// a caller that must still be able to commit later, when the region may have no block
    /// left (an update that frees space), reserves it while there is space. The spare goes
    /// back to the allocator when the handle closes.
    ///
    /// # Errors
    /// The allocator's ([`Error::NoSpace`](crate::Error::NoSpace) when it has no block left).
    pub fn keep_a_spare(&self) -> Result<()> {
        if self.spare.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        let _flight = self.blocks_in_flight();
        let b = self.alloc_block()?;
        self.keep_spare(b)
    }

    fn keep_spare(&self, b: BlockNo) -> Result<()> {
        if self
            .spare
            .compare_exchange(0, b.0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.alloc.free(Extent::new(b, 1))?;
        }
        Ok(())
    }
}

const _: () = assert!(MIN_SEGMENT_SPAN <= MAX_SPAN);
const _: () = assert!(SLOT_BYTES == 8);
