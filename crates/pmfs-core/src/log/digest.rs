//! Digesting a log: applying its entries, in order and one holder at a time, to the state they
//! describe (the caller's mapping structure and size word), tracked by a cursor word in PM.
//! See the [module docs](super#digest).

use super::chain::Walk;
use super::check_root;
use super::entry::Entry;
use super::format::{ENTRIES_PER_BLOCK, FIRST_SLOT, HeadWord, Slot};
use super::gc::Compaction;
use super::replay::Replay;
use super::{Log, Position, WalkCache};
use crate::error::{Error, Result};
use crate::layout::PmOff;
use crate::pm::Media;
use crate::sync::atomic::Ordering;
use crate::traits::BlockAllocator;

/// Bits of the cursor word holding the LSN of the first entry not yet applied.
pub const CURSOR_LSN_BITS: u32 = 40;
/// Bits of the cursor word holding the holder id (above the LSN; the top bit stays 0).
pub const CURSOR_HOLDER_BITS: u32 = 23;
/// The largest holder id.
pub const MAX_HOLDER: u32 = (1 << CURSOR_HOLDER_BITS) - 1;

const LSN_MASK: u64 = (1 << CURSOR_LSN_BITS) - 1;

/// A decoded cursor word: bits 0..40 the LSN of the first entry not yet applied, bits 40..63
/// the holder applying entries right now (0: nobody), bit 63 zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    lsn: u64,
    holder: u32,
}

impl Cursor {
    fn decode(w: u64, at: PmOff) -> Result<Cursor> {
        if w >> 63 != 0 {
            return Err(Error::Corrupt {
                what: "digest cursor word",
                at,
            });
        }
        Ok(Cursor {
            lsn: w & LSN_MASK,
            holder: (w >> CURSOR_LSN_BITS) as u32,
        })
    }

    fn encode(self) -> u64 {
        debug_assert!(self.lsn <= LSN_MASK && self.holder <= MAX_HOLDER);
        self.lsn | u64::from(self.holder) << CURSOR_LSN_BITS
    }
}

fn load_cursor<M: Media + ?Sized>(media: &M, at: PmOff) -> Result<(u64, Cursor)> {
    let w = media.load_u64(at)?;
    Ok((w, Cursor::decode(w, at)?))
}

/// The applier of [`Log::digest_batched`]: a batch of entries, each with its LSN.
pub type ApplyBatch<'a> = dyn FnMut(&[(u64, Entry)]) -> Result<()> + 'a;

/// The batching rule of [`Log::digest_batched`]: whether a write joins a batch of writes.
pub type JoinsBatch<'a> = dyn Fn(&[(u64, Entry)], &Entry) -> bool + 'a;

/// What [`Log::digest`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digest {
    /// The cursor was taken and every entry up to the tail found was applied: every entry
    /// below LSN `applied` is applied (the cursor said so when this call let it go). Also
    /// when the call went round again for entries that arrived meanwhile and then found the
    /// cursor busy: the new holder applies those.
    Done {
        /// The cursor's LSN when the call let it go.
        applied: u64,
    },
    /// Another live holder (another process, or another thread of this one) holds the cursor,
    /// or took it over from this call. It applies what this call would have.
    Busy,
}

/// Makes the cursor word at `cursor` say "nothing applied, nobody holding" (LSN 0: replay
/// starts at the log's head), durably. For a new file, before anyone digests.
///
/// # Errors
/// [`Error::Unaligned`] / [`Error::OutOfBounds`] for a bad offset; media errors.
pub fn init_cursor<M: Media + ?Sized>(media: &M, cursor: PmOff) -> Result<()> {
    check_root(media, cursor)?;
    media.store_u64_persist(cursor, 0)
}

/// Clears the holder of the cursor word at `cursor`, keeping its LSN, and returns the holder
/// it cleared (`None` if it was free). Run at mount, before anyone digests: a process killed
/// while digesting leaves its holder id behind.
///
/// # Errors
/// [`Error::Corrupt`] for a cursor word with its top bit set; bad offsets; media errors.
pub fn reset_holder<M: Media + ?Sized>(media: &M, cursor: PmOff) -> Result<Option<u32>> {
    check_root(media, cursor)?;
    let (_, c) = load_cursor(media, cursor)?;
    if c.holder == 0 {
        return Ok(None);
    }
    media.store_u64_persist(cursor, Cursor { holder: 0, ..c }.encode())?;
    Ok(Some(c.holder))
}

/// The LSN stored in the cursor word at `cursor`, read from the media alone (for checkers):
/// every entry below it is applied.
///
/// # Errors
/// [`Error::Corrupt`] for a cursor word with its top bit set; bad offsets; media errors.
pub fn cursor_lsn<M: Media + ?Sized>(media: &M, cursor: PmOff) -> Result<u64> {
    check_root(media, cursor)?;
    Ok(load_cursor(media, cursor)?.1.lsn)
}

/// Moves the cursor word at `cursor` back to `tail`, durably, when damage cost the log the
/// entries between them (the cursor says they were applied, so the mapping holds them; but the
/// next commit lands at `tail` and must be digested). Returns the LSN it replaced, `None` when
/// the cursor was not beyond `tail`. For repair, with nobody using the log.
///
/// # Errors
/// As [`cursor_lsn`].
pub fn clamp_cursor<M: Media + ?Sized>(media: &M, cursor: PmOff, tail: u64) -> Result<Option<u64>> {
    check_root(media, cursor)?;
    let (_, c) = load_cursor(media, cursor)?;
    if c.lsn <= tail {
        return Ok(None);
    }
    media.store_u64_persist(
        cursor,
        Cursor {
            lsn: tail,
            holder: 0,
        }
        .encode(),
    )?;
    Ok(Some(c.lsn))
}

/// The cursor while one [`Log::digest`] call holds it; lets it go on drop (error or unwind)
/// at the LSN reached, unless someone took it over.
struct Held<'m, M: Media> {
    media: &'m M,
    at: PmOff,
    holder: u32,
    lsn: u64,
    released: bool,
}

impl<M: Media> Held<'_, M> {
    fn word(&self) -> u64 {
        Cursor {
            lsn: self.lsn,
            holder: self.holder,
        }
        .encode()
    }

    /// Moves the cursor to `lsn` (keeping it, or releasing it with `release`) and persists it.
    /// Returns `false` if the cursor was taken over meanwhile (then nothing changed, and the
    /// cursor is no longer ours).
    fn advance(&mut self, lsn: u64, release: bool) -> Result<bool> {
        if lsn > LSN_MASK {
            return Err(Error::Unsupported("log sequence numbers beyond 2^40"));
        }
        let new = Cursor {
            lsn,
            holder: if release { 0 } else { self.holder },
        };
        match self.media.cas_u64(self.at, self.word(), new.encode())? {
            Ok(_) => {
                let moved = lsn != self.lsn;
                self.lsn = lsn;
                self.released = release;
                if release || moved {
                    self.media.persist(self.at, 8)?;
                }
                Ok(true)
            }
            Err(_) => {
                self.released = true;
                Ok(false)
            }
        }
    }

    /// Lets the cursor go at the LSN reached after `e` stopped the digest, and returns the
    /// error to report: `e`, or [`Error::DigestCursorHeld`] when letting go failed too.
    fn let_go_after(mut self, e: Error) -> Error {
        if !self.released {
            // Only a failed swap leaves the word naming the holder: after a failed persist
            // this session sees it released, and the next mount resets whatever holder the
            // media kept.
            let _ = self.advance(self.lsn, true);
        }
        if self.released {
            return e;
        }
        // The drop would only try again.
        self.released = true;
        Error::DigestCursorHeld {
            at: self.at,
            cause: Box::new(e),
        }
    }
}

impl<M: Media> Drop for Held<'_, M> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.advance(self.lsn, true);
        }
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Log<M, A> {
    /// The LSN stored in the cursor word at `cursor`: every entry below it is applied.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a cursor word with its top bit set; bad offsets; media errors.
    pub fn digested(&self, cursor: PmOff) -> Result<u64> {
        cursor_lsn(&self.media, cursor)
    }

    /// Replays from the first entry whose LSN is at least `lsn` (from the head when `lsn` lies
    /// below it, an exhausted replay at the tail when `lsn` lies beyond it).
    ///
    /// Walks from the head, reading one header per block up to the block holding `lsn`.
    pub fn iter_from_lsn(&self, lsn: u64) -> Result<Replay<'_, M, A>> {
        let (guard, era) = self.pin();
        let walk = self.walk_to_lsn(lsn)?;
        Ok(self.replay(guard, era, walk))
    }

    /// A walk at the first boundary slot at or after `lsn` (clamped to the head and the tail).
    /// The caller holds a pin.
    fn walk_to_lsn(&self, lsn: u64) -> Result<Walk> {
        let chain = self.chain();
        let era = self.era.load(Ordering::SeqCst);
        let named = HeadWord(self.media.load_u64(self.root)?).head();
        let cached = self
            .walk_cache
            .try_lock()
            .ok()
            .and_then(|c| *c)
            .filter(|c| {
                Some(c.head) == named && c.era == era && c.base + (c.slot - FIRST_SLOT) <= lsn
            });
        // On a hit the head block was validated when the cached walk started there (a block
        // header never changes but for its link).
        let (head, mut walk) = match cached {
            Some(c) => (c.head, Walk::new(c.block, c.base, c.slot, self.blocks)),
            None => {
                let (head, h) = self.head()?;
                (head, Walk::new(head, h.base.get(), FIRST_SLOT, self.blocks))
            }
        };
        while lsn >= walk.base.saturating_add(ENTRIES_PER_BLOCK) {
            let Some(next) = chain.next(walk.block)? else {
                break;
            };
            walk.enter(&chain, next)?;
        }
        while !walk.at_end() && walk.lsn() < lsn {
            match chain.slot(walk.block, walk.slot)? {
                Slot::Empty => break,
                s => walk.slot += s.width(),
            }
        }
        if let Ok(mut c) = self.walk_cache.try_lock() {
            *c = Some(WalkCache {
                head,
                era,
                block: walk.block,
                base: walk.base,
                slot: walk.slot,
            });
        }
        Ok(walk)
    }

    /// Applies the entries the cursor word at `cursor` has not applied yet, in LSN order, one
    /// holder at a time across threads and processes (see the [module docs](super#digest)).
    ///
    /// `holder` names the caller's process (nonzero, at most [`MAX_HOLDER`], the same for all
    /// its threads). The cursor is taken by CAS when free; when another holder has it, the call
    /// returns [`Digest::Busy`] at once if `alive(holder)` says that holder still runs, and
    /// takes the cursor over if not. A thread that finds its own id in the cursor gets `Busy`.
    ///
    /// `apply(lsn, entry)` must make the entry's effect durable before it returns, and must be
    /// idempotent: an entry whose holder died before moving the cursor is applied again. After
    /// each entry the cursor moves past it (durably). On return the cursor is free again; the
    /// call then looks at the tail once more and goes on if entries arrived meanwhile (their
    /// committers may have found the cursor busy), so once every digest call has returned,
    /// every entry committed before the last of them started is applied.
    ///
    /// `apply` runs under no lock, with the calling thread pinned (which holds back the
    /// reclamation of compacted blocks in this process while it runs). A digest of the same
    /// cursor from inside `apply` gets `Busy`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a holder id out of range; the first error of `apply`
    /// (the cursor then stays before that entry, and is released); [`Error::Corrupt`] for a
    /// damaged cursor word or one beyond the log's tail; media and log errors. The cursor is
    /// released on every error and on unwinding; when releasing it fails too, the error is
    /// [`Error::DigestCursorHeld`] with the first one as its cause.
    pub fn digest(
        &self,
        cursor: PmOff,
        holder: u32,
        alive: &dyn Fn(u32) -> bool,
        apply: &mut dyn FnMut(u64, &Entry) -> Result<()>,
    ) -> Result<Digest> {
        self.digest_batched(cursor, holder, alive, &|_, _| false, &mut |batch| {
            batch.iter().try_for_each(|(lsn, e)| apply(*lsn, e))
        })
    }

    /// [`digest`](Log::digest) in batches: `apply` gets consecutive [`Entry::Write`]s at
    /// once, or one entry of another kind, each with its LSN, and the cursor moves past each
    /// batch once (durably), not past each entry. A write joins the batch of writes before it
    /// when `joins(batch, write)` says so; the rule must depend on the entries alone.
    ///
    /// A crash, or a holder that died, can so leave a batch partly applied, and the next
    /// holder applies the entries from the first of that batch again, maybe in a longer batch
    /// (entries committed meanwhile join it). `apply` must make its batch durable before it
    /// returns and be idempotent in that sense: applying a batch to a state that any prefix of
    /// the work on a batch starting at the same entry left must give the state that batch
    /// alone gives. An entry of another kind is always applied alone, with the cursor moved up
    /// to it first, so no batch spans a truncation or a punch.
    ///
    /// # Errors
    /// As [`digest`](Log::digest).
    pub fn digest_batched(
        &self,
        cursor: PmOff,
        holder: u32,
        alive: &dyn Fn(u32) -> bool,
        joins: &JoinsBatch<'_>,
        apply: &mut ApplyBatch<'_>,
    ) -> Result<Digest> {
        if holder == 0 || holder > MAX_HOLDER {
            return Err(Error::InvalidArgument("digest holder id out of range"));
        }
        check_root(&self.media, cursor)?;
        let mut done = None;
        loop {
            let Some(mut held) = self.take_cursor(cursor, holder, alive)? else {
                return Ok(done.map_or(Digest::Busy, |applied| Digest::Done { applied }));
            };
            let end = match self.apply_held(&mut held, cursor, joins, apply) {
                Ok(Some(end)) => end,
                Ok(None) => return Ok(Digest::Busy),
                Err(e) => return Err(held.let_go_after(e)),
            };
            done = Some(end);
            if self.tail()?.lsn() <= end {
                return Ok(Digest::Done { applied: end });
            }
        }
    }

    /// The work of [`digest_batched`](Log::digest_batched) while `held` holds the cursor: applies
    /// the entries from the cursor's LSN to the tail and lets the cursor go there. Returns the
    /// LSN reached, `None` when the cursor was taken over.
    fn apply_held(
        &self,
        held: &mut Held<'_, M>,
        cursor: PmOff,
        joins: &JoinsBatch<'_>,
        apply: &mut ApplyBatch<'_>,
    ) -> Result<Option<u64>> {
        let is_write = |e: &Entry| matches!(e, Entry::Write { .. });
        let mut batch: Vec<(u64, Entry)> = Vec::new();
        let mut replay = self.iter_from_lsn(held.lsn)?;
        let mut next = replay.next();
        while let Some(item) = next {
            let (pos, entry) = item?;
            let write = is_write(&entry);
            batch.push((pos.lsn(), entry));
            next = replay.next();
            let last = next.is_none();
            if matches!(&next, Some(Ok((_, e))) if write && is_write(e) && joins(&batch, e)) {
                continue;
            }
            apply(&batch)?;
            batch.clear();
            // After the last entry the cursor moves to the replay's end and is released in
            // one step (the same word the separate release would write).
            let to = if last {
                replay.position().lsn()
            } else {
                pos.lsn() + 1
            };
            if !held.advance(to, last)? {
                return Ok(None);
            }
        }
        let end = replay.position().lsn();
        drop(replay);
        if end < held.lsn {
            return Err(Error::Corrupt {
                what: "digest cursor beyond the log tail",
                at: cursor,
            });
        }
        if !held.released && !held.advance(end, true)? {
            return Ok(None);
        }
        Ok(Some(end))
    }

    /// Takes the cursor for `holder`: when free, or from a holder `alive` says is dead.
    /// `None` when a live holder (or `holder` itself, on another thread) has it.
    fn take_cursor(
        &self,
        cursor: PmOff,
        holder: u32,
        alive: &dyn Fn(u32) -> bool,
    ) -> Result<Option<Held<'_, M>>> {
        let (mut w, mut c) = load_cursor(&self.media, cursor)?;
        loop {
            let busy = c.holder == holder || (c.holder != 0 && alive(c.holder));
            // When busy, the word is still swapped for itself: a read-modify-write joins the
            // word's modification order, so the holder's release that follows it sees every
            // entry this caller committed before (and goes on to apply them).
            let new = if busy {
                w
            } else {
                Cursor { holder, ..c }.encode()
            };
            match self.media.cas_u64(cursor, w, new)? {
                Ok(_) if busy => return Ok(None),
                Ok(_) => {
                    return Ok(Some(Held {
                        media: &self.media,
                        at: cursor,
                        holder,
                        lsn: c.lsn,
                        released: false,
                    }));
                }
                Err(actual) => {
                    w = actual;
                    c = Cursor::decode(w, cursor)?;
                }
            }
        }
    }

    /// Drops the blocks whose entries the cursor word at `cursor` has all applied: compacts
    /// with no live entries up to the start of the block holding the cursor's LSN, which
    /// becomes the head. [`Compaction::NotSmaller`] when that block is the head already.
    ///
    /// The cursor word is persisted first, so a crash never leaves it below the new head.
    /// Entries at or after the cursor keep their LSNs.
    ///
    /// # Errors
    /// As [`compact`](Log::compact), and [`Error::Corrupt`] for a damaged cursor word.
    pub fn compact_applied(&self, cursor: PmOff) -> Result<Compaction> {
        let applied = self.digested(cursor)?;
        self.media.persist(cursor, 8)?;
        let (guard, era) = self.pin();
        let walk = self.walk_to_lsn(applied)?;
        let (head, _) = self.head()?;
        if walk.block == head {
            return Ok(Compaction::NotSmaller);
        }
        let point = Position {
            block: walk.block,
            slot: FIRST_SLOT,
            lsn: walk.base,
            era,
        };
        self.compact_pinned(guard, point, &[])
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::layout::{BLOCK_SIZE, BlockNo};
    use crate::pm::{HeapRegion, Tap, Tapped};
    use crate::traits::{Run, SimpleAllocator};

    const BLOCKS: u64 = 256;
    const ROOT: PmOff = PmOff(64);
    const CURSOR: PmOff = PmOff(72);

    type TestLog = Log<Arc<HeapRegion>, SimpleAllocator>;

    fn setup() -> (Arc<HeapRegion>, Arc<SimpleAllocator>, TestLog) {
        let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
        let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
        let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
        init_cursor(&*r, CURSOR).unwrap();
        (r, a, log)
    }

    /// Inline entries, with an extended one (reservation slots between entries) every fifth.
    fn entry(i: u64) -> Entry {
        if i % 5 == 4 {
            Entry::Write {
                runs: smallvec::smallvec![
                    Run {
                        lblk: i,
                        pblk: BlockNo(3),
                        len: 1,
                    },
                    Run {
                        lblk: i + 100,
                        pblk: BlockNo(4),
                        len: 1,
                    },
                ],
                extend_to: i * BLOCK_SIZE + 1,
            }
        } else {
            Entry::write(i, BlockNo(2), 1, 0)
        }
    }

    fn fill(log: &TestLog, from: u64, to: u64) -> Vec<Entry> {
        (from..to)
            .map(|i| {
                let e = entry(i);
                log.append(&e).unwrap();
                e
            })
            .collect()
    }

    fn entries(log: &TestLog) -> Vec<(u64, Entry)> {
        log.iter()
            .unwrap()
            .map(|r| r.map(|(p, e)| (p.lsn(), e)).unwrap())
            .collect()
    }

    fn nobody_alive(_: u32) -> bool {
        false
    }

    fn everybody_alive(_: u32) -> bool {
        true
    }

    /// Digests as `holder`, recording what it applies.
    fn digest_into(
        log: &TestLog,
        holder: u32,
        alive: &dyn Fn(u32) -> bool,
        out: &mut Vec<(u64, Entry)>,
    ) -> Result<Digest> {
        log.digest(CURSOR, holder, alive, &mut |lsn, e| {
            out.push((lsn, e.clone()));
            Ok(())
        })
    }

    fn set_cursor(r: &HeapRegion, lsn: u64, holder: u32) {
        r.store_u64(CURSOR, Cursor { lsn, holder }.encode())
            .unwrap();
    }

    fn cursor(r: &HeapRegion) -> Cursor {
        Cursor::decode(r.load_u64(CURSOR).unwrap(), CURSOR).unwrap()
    }

    #[test]
    fn digest_applies_every_entry_once_in_order() {
        let (r, _a, log) = setup();
        let n = 2 * ENTRIES_PER_BLOCK + 7;
        fill(&log, 0, n);
        let mut got = Vec::new();
        let d = digest_into(&log, 5, &nobody_alive, &mut got).unwrap();
        let tail = log.tail().unwrap().lsn();
        assert_eq!(d, Digest::Done { applied: tail });
        assert_eq!(got, entries(&log));
        assert_eq!(
            cursor(&r),
            Cursor {
                lsn: tail,
                holder: 0
            }
        );
        assert_eq!(log.digested(CURSOR).unwrap(), tail);

        // Nothing new: nothing applied.
        got.clear();
        assert_eq!(
            digest_into(&log, 5, &nobody_alive, &mut got).unwrap(),
            Digest::Done { applied: tail }
        );
        assert!(got.is_empty());

        // Only the new entries, with their LSNs.
        fill(&log, n, n + 9);
        let d = digest_into(&log, 6, &nobody_alive, &mut got).unwrap();
        let all = entries(&log);
        let cut = all.iter().position(|(l, _)| *l >= tail).unwrap();
        assert_eq!(got, all[cut..]);
        assert_eq!(
            d,
            Digest::Done {
                applied: log.tail().unwrap().lsn()
            }
        );
    }

    #[test]
    fn a_live_holder_makes_others_busy_and_its_own_threads_too() {
        let (r, _a, log) = setup();
        fill(&log, 0, 10);
        set_cursor(&r, 0, 7);
        let mut got = Vec::new();
        assert_eq!(
            digest_into(&log, 5, &everybody_alive, &mut got).unwrap(),
            Digest::Busy
        );
        // The holder's own id, even when its liveness oracle would say it is dead.
        assert_eq!(
            digest_into(&log, 7, &nobody_alive, &mut got).unwrap(),
            Digest::Busy
        );
        assert!(got.is_empty());
        assert_eq!(cursor(&r), Cursor { lsn: 0, holder: 7 });
    }

    #[test]
    fn a_dead_holder_is_taken_over_from_its_cursor() {
        let (r, _a, log) = setup();
        fill(&log, 0, ENTRIES_PER_BLOCK + 3);
        let all = entries(&log);
        // Holder 7 applied three entries and died while applying the fourth.
        set_cursor(&r, all[3].0, 7);
        let mut got = Vec::new();
        let alive = |h: u32| h != 7;
        let d = digest_into(&log, 5, &alive, &mut got).unwrap();
        assert_eq!(got, all[3..]);
        assert_eq!(
            d,
            Digest::Done {
                applied: log.tail().unwrap().lsn()
            }
        );
        assert_eq!(cursor(&r).holder, 0);
    }

    #[test]
    fn an_apply_error_releases_the_cursor_before_the_failed_entry() {
        let (r, _a, log) = setup();
        fill(&log, 0, 12);
        let all = entries(&log);
        let mut seen = 0;
        let err = log
            .digest(CURSOR, 5, &nobody_alive, &mut |_, _| {
                seen += 1;
                if seen == 5 {
                    Err(Error::NoSpace)
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
        assert!(matches!(err, Error::NoSpace), "{err:?}");
        // Past the fourth entry (the reservation of the fifth is not an entry).
        assert_eq!(
            cursor(&r),
            Cursor {
                lsn: all[3].0 + 1,
                holder: 0
            }
        );
        assert!(all[4].0 > all[3].0 + 1);
        let mut got = Vec::new();
        digest_into(&log, 5, &nobody_alive, &mut got).unwrap();
        assert_eq!(got, all[4..]);
    }

    #[test]
    fn a_panic_in_apply_releases_the_cursor() {
        let (r, _a, log) = setup();
        fill(&log, 0, 6);
        let all = entries(&log);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut n = 0;
            log.digest(CURSOR, 5, &nobody_alive, &mut |_, _| {
                n += 1;
                assert!(n < 3, "apply failed");
                Ok(())
            })
        }));
        assert!(caught.is_err());
        assert_eq!(
            cursor(&r),
            Cursor {
                lsn: all[2].0,
                holder: 0
            }
        );
    }

    #[test]
    fn a_holder_taken_over_midway_stops_and_leaves_the_cursor_alone() {
        let (r, _a, log) = setup();
        fill(&log, 0, 8);
        let all = entries(&log);
        let mut got = Vec::new();
        let d = log
            .digest(CURSOR, 5, &nobody_alive, &mut |lsn, e| {
                got.push((lsn, e.clone()));
                if got.len() == 2 {
                    // Another process judged holder 5 dead and took the cursor.
                    set_cursor(&r, all[1].0, 9);
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(d, Digest::Busy);
        assert_eq!(got, all[..2]);
        assert_eq!(
            cursor(&r),
            Cursor {
                lsn: all[1].0,
                holder: 9
            }
        );
    }

    #[test]
    fn bad_holders_and_cursor_words_are_refused() {
        let (r, _a, log) = setup();
        fill(&log, 0, 3);
        let mut got = Vec::new();
        for h in [0, MAX_HOLDER + 1] {
            assert!(matches!(
                digest_into(&log, h, &nobody_alive, &mut got),
                Err(Error::InvalidArgument(_))
            ));
        }
        r.store_u64(CURSOR, 1 << 63).unwrap();
        assert!(matches!(
            digest_into(&log, 5, &nobody_alive, &mut got),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(log.digested(CURSOR), Err(Error::Corrupt { .. })));
        // A cursor past the tail would skip entries committed below it.
        set_cursor(&r, 100, 0);
        assert!(matches!(
            digest_into(&log, 5, &nobody_alive, &mut got),
            Err(Error::Corrupt { .. })
        ));
        assert_eq!(
            cursor(&r),
            Cursor {
                lsn: 100,
                holder: 0
            }
        );
        assert!(got.is_empty());
        assert!(matches!(log.digested(PmOff(73)), Err(Error::Unaligned(_))));
    }

    #[test]
    fn reset_holder_keeps_the_lsn() {
        let (r, _a, _log) = setup();
        assert_eq!(reset_holder(&*r, CURSOR).unwrap(), None);
        set_cursor(&r, 42, MAX_HOLDER);
        assert_eq!(reset_holder(&*r, CURSOR).unwrap(), Some(MAX_HOLDER));
        assert_eq!(cursor(&r), Cursor { lsn: 42, holder: 0 });
        init_cursor(&*r, CURSOR).unwrap();
        assert_eq!(cursor(&r), Cursor { lsn: 0, holder: 0 });
    }

    #[test]
    fn iter_from_lsn_starts_at_the_first_entry_at_or_after_it() {
        let (_r, _a, log) = setup();
        fill(&log, 0, 2 * ENTRIES_PER_BLOCK + 4);
        let all = entries(&log);
        let from = |lsn| -> Vec<(u64, Entry)> {
            log.iter_from_lsn(lsn)
                .unwrap()
                .map(|r| r.map(|(p, e)| (p.lsn(), e)).unwrap())
                .collect()
        };
        assert_eq!(from(0), all);
        for k in [1, 4, 5, 40, all.len() - 1] {
            assert_eq!(from(all[k].0), all[k..], "from entry {k}");
            // An LSN inside the reservation before an extended entry, or just after an
            // entry: the next entry.
            assert_eq!(from(all[k - 1].0 + 1), all[k..], "after entry {}", k - 1);
        }
        let tail = log.tail().unwrap().lsn();
        assert!(from(tail).is_empty());
        assert!(from(tail + 3 * ENTRIES_PER_BLOCK).is_empty());
        assert_eq!(log.iter_from_lsn(u64::MAX).unwrap().position().lsn(), tail);
    }

    #[test]
    fn compact_applied_drops_only_fully_applied_blocks() {
        let (_r, _a, log) = setup();
        fill(&log, 0, 3 * ENTRIES_PER_BLOCK + 2);
        let all = entries(&log);
        assert_eq!(log.compact_applied(CURSOR).unwrap(), Compaction::NotSmaller);

        // Apply into the second block: only the first block goes.
        let second = all
            .iter()
            .position(|(l, _)| *l >= ENTRIES_PER_BLOCK)
            .unwrap();
        let mut k = 0;
        let stop = second + 2;
        let _ = log.digest(CURSOR, 5, &nobody_alive, &mut |_, _| {
            k += 1;
            if k > stop {
                Err(Error::NoSpace)
            } else {
                Ok(())
            }
        });
        assert_eq!(log.digested(CURSOR).unwrap(), all[stop - 1].0 + 1);
        assert_eq!(
            log.compact_applied(CURSOR).unwrap(),
            Compaction::Compacted {
                written: 0,
                retired: 1
            }
        );
        assert_eq!(log.start().unwrap().lsn(), ENTRIES_PER_BLOCK);
        assert_eq!(entries(&log), all[second..]);

        // The rest: everything but the tail block goes; the unapplied suffix replays exactly.
        let mut got = Vec::new();
        digest_into(&log, 5, &nobody_alive, &mut got).unwrap();
        assert_eq!(got, all[stop..]);
        let last = log.tail().unwrap().lsn() / ENTRIES_PER_BLOCK;
        assert!(last > 2);
        assert_eq!(
            log.compact_applied(CURSOR).unwrap(),
            Compaction::Compacted {
                written: 0,
                retired: last - 1
            }
        );
        assert_eq!(log.start().unwrap().lsn(), last * ENTRIES_PER_BLOCK);
        let kept = all
            .iter()
            .position(|(l, _)| *l >= last * ENTRIES_PER_BLOCK)
            .unwrap();
        assert_eq!(entries(&log), all[kept..]);
        assert_eq!(log.compact_applied(CURSOR).unwrap(), Compaction::NotSmaller);

        // Appends go on with their LSNs; digest applies only them.
        let more = fill(&log, 1000, 1005);
        got.clear();
        digest_into(&log, 5, &nobody_alive, &mut got).unwrap();
        assert_eq!(got.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(), more);
        assert!(got[0].0 > all.last().unwrap().0);
    }

    #[test]
    fn compaction_with_nothing_live_also_works_through_compact() {
        let (_r, a, log) = setup();
        for i in 0..2 * ENTRIES_PER_BLOCK + 1 {
            log.append(&Entry::write(i, BlockNo(2), 1, 0)).unwrap();
        }
        let free = a.free_blocks();
        let point = log.compaction_point().unwrap().unwrap();
        let c = log.compact(point, &[]).unwrap();
        assert_eq!(
            c,
            Compaction::Compacted {
                written: 0,
                retired: 2
            }
        );
        assert_eq!(a.free_blocks(), free + 2);
        assert_eq!(entries(&log).len(), 1);
        assert_eq!(log.start().unwrap(), point);
        fill(&log, 7, 9);
        assert_eq!(entries(&log).len(), 3);
    }

    /// Fails the compare-and-swaps of the cursor word once armed, as a region refuses one out
    /// of its bounds.
    #[derive(Default)]
    struct CursorCasFails {
        armed: std::sync::atomic::AtomicBool,
    }

    impl Tap for CursorCasFails {
        fn cas(&self, off: PmOff, _current: u64) -> Result<()> {
            if off == CURSOR && self.armed.load(Ordering::Relaxed) {
                return Err(Error::OutOfBounds {
                    off,
                    len: 8,
                    size: BLOCKS * BLOCK_SIZE,
                });
            }
            Ok(())
        }
    }

    #[test]
    fn a_digest_that_cannot_let_its_cursor_go_says_so() {
        let r = Arc::new(Tapped::new(
            HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap(),
            CursorCasFails::default(),
        ));
        let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
        let log = Log::create(r.clone(), ROOT, a).unwrap();
        init_cursor(&*r, CURSOR).unwrap();
        for i in 0..4 {
            log.append(&entry(i)).unwrap();
        }
        let lsns: Vec<u64> = log.iter().unwrap().map(|e| e.unwrap().0.lsn()).collect();
        let word = |r: &Tapped<HeapRegion, CursorCasFails>| {
            Cursor::decode(r.load_u64(CURSOR).unwrap(), CURSOR).unwrap()
        };
        let second = lsns[1];
        let fail_at = |arm: bool| {
            let r = r.clone();
            move |lsn: u64, _: &Entry| {
                if lsn < second {
                    return Ok(());
                }
                r.tap().armed.store(arm, Ordering::Relaxed);
                Err(Error::InvalidArgument("apply failed"))
            }
        };

        // The release works: the error is the apply's, the cursor is free before the entry.
        let e = log.digest(CURSOR, 5, &nobody_alive, &mut fail_at(false));
        assert!(
            matches!(e, Err(Error::InvalidArgument("apply failed"))),
            "{e:?}"
        );
        let at_second = Cursor {
            lsn: second,
            holder: 0,
        };
        assert_eq!(word(&r), at_second);

        // The release fails too: the cursor still names the holder, and the error says so.
        let e = log.digest(CURSOR, 5, &nobody_alive, &mut fail_at(true));
        match e {
            Err(Error::DigestCursorHeld { at, cause }) => {
                assert_eq!(at, CURSOR);
                assert!(matches!(*cause, Error::InvalidArgument("apply failed")));
            }
            e => panic!("{e:?}"),
        }
        r.tap().armed.store(false, Ordering::Relaxed);
        assert_eq!(
            word(&r),
            Cursor {
                holder: 5,
                ..at_second
            }
        );
        // No digest of that holder gets past it until the holder is reset.
        let mut ok = |_: u64, _: &Entry| Ok(());
        assert_eq!(
            log.digest(CURSOR, 5, &everybody_alive, &mut ok).unwrap(),
            Digest::Busy
        );
        assert_eq!(reset_holder(&*r, CURSOR).unwrap(), Some(5));
        let end = log.tail().unwrap().lsn();
        assert_eq!(
            log.digest(CURSOR, 5, &everybody_alive, &mut ok).unwrap(),
            Digest::Done { applied: end }
        );
    }
}
