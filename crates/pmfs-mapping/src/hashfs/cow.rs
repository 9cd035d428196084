//! Copy-on-write versions: staging fresh slots for a new version of a key, promoting them to
//! the current version ([`FileMapping::insert_at`](pmfs_core::traits::FileMapping::insert_at)),
//! giving them back, and sweeping the ones whose write never committed. The design is in the
//! [module docs](super).

use std::ops::DerefMut;

use pmfs_core::pm::Media;
use pmfs_core::traits::Run;
use pmfs_core::{Error, Result};
use smallvec::SmallVec;

use super::simd::{BATCH, home_slots};
use super::slot::{Key, Slot, TOMBSTONE};
use super::{HashFs, HashFsFile, HomesAhead, PROMOTING, push_block, range_end};

impl<M: Media> HashFs<M> {
    /// Claims one fresh slot per block of `[lblk, lblk + len)` of `file` for a *new version*
    /// of those keys, and appends the claimed blocks to `out` (a `Vec<Run>`, or the inline
    /// [`Runs`](pmfs_core::traits::Runs) of the data path) as physically contiguous runs in
    /// logical order. The current version of each key (if mapped) stays mapped and visible;
    /// the staged slots are invisible to [`lookup`], [`owned_blocks`] and the translation
    /// cache, survive [`recover`], and become current with [`insert_at`]. Any number of
    /// writers, in any process, may stage the same key at once: each claim is a CAS of a free
    /// slot, so each gets its own slot.
    ///
    /// The claims are durable when this returns. The call is not atomic across a crash: a crash
    /// leaves some of the slots staged, and [`sweep_staged`](Self::sweep_staged) drops them at
    /// the next mount. Without enough free slots it gives back what it claimed and returns
    /// [`Error::NoSpace`], appending nothing.
    ///
    /// [`lookup`]: pmfs_core::traits::FileMapping::lookup
    /// [`owned_blocks`]: pmfs_core::traits::FileMapping::owned_blocks
    /// [`recover`]: pmfs_core::traits::FileMapping::recover
    /// [`insert_at`]: pmfs_core::traits::FileMapping::insert_at
    pub fn stage<V>(&self, file: &HashFsFile, lblk: u64, len: u64, out: &mut V) -> Result<()>
    where
        V: Extend<Run> + DerefMut<Target = [Run]>,
    {
        self.stage_unfenced(file, lblk, len, out)?;
        self.media.fence();
        Ok(())
    }

    /// [`stage`](HashFs::stage) for a caller that fences before anything depends on the
    /// claims (the data path fences its copied data before it commits): the claims are
    /// flushed, and durable after the caller's next fence.
    pub fn stage_unfenced<V>(
        &self,
        file: &HashFsFile,
        lblk: u64,
        len: u64,
        out: &mut V,
    ) -> Result<()>
    where
        V: Extend<Run> + DerefMut<Target = [Run]>,
    {
        if len == 0 {
            return Ok(());
        }
        let end = range_end(lblk, len)?;
        if len > self.slots {
            return Err(Error::NoSpace);
        }
        let mut claimed: SmallVec<[u64; 16]> = SmallVec::with_capacity(len as usize);
        let mut ahead = HomesAhead::new(self, file, lblk, end);
        let mut l = lblk;
        let mut prev = None;
        while l < end {
            let count = BATCH.min((end - l) as usize);
            let homes = ahead.next(self, file, l).unwrap_or_else(|| {
                let homes = home_slots(self.kernel, file.seed, l, self.n32(), self.shift);
                for &h in &homes[..count] {
                    self.media.prefetch(self.slot_off(h));
                }
                homes
            });
            for (j, &h) in homes[..count].iter().enumerate() {
                match self.claim_next(&mut prev, h, Key::new(file.ino, l + j as u64).staged())? {
                    Some(i) => claimed.push(i),
                    None => {
                        self.unclaim(&claimed)?;
                        self.persist_slots(&claimed)?;
                        self.reclaim(&claimed)?;
                        return Err(Error::NoSpace);
                    }
                }
            }
            l += count as u64;
        }
        self.flush_slots(&claimed)?;
        let first = out.len();
        for (j, &i) in claimed.iter().enumerate() {
            push_block(out, first, lblk + j as u64, self.data.start.0 + i);
        }
        Ok(())
    }

    /// Gives staged slots back (they become tombstones): the runs of a write that will not
    /// commit. Every block of `runs` must be staged for the logical block the run gives it,
    /// else [`Error::InvalidArgument`] and nothing changes. Durable when it returns; not
    /// atomic across a crash (a slot left staged is swept at the next mount).
    pub fn unstage(&self, runs: &[Run]) -> Result<()> {
        let mut slots = Vec::new();
        for r in runs {
            for k in 0..r.len {
                let i = self.staged_slot(r, k)?;
                slots.push((i, self.media.load_u64(self.slot_off(i))?));
            }
        }
        let mut freed = Vec::with_capacity(slots.len());
        let mut raced = false;
        for &(i, w) in &slots {
            if self.media.cas_u64(self.slot_off(i), w, TOMBSTONE)?.is_ok() {
                freed.push(i);
            } else {
                raced = true;
            }
        }
        self.settle_freed(&freed)?;
        if raced {
            return Err(Error::InvalidArgument(
                "staged slot changed by someone else during unstage",
            ));
        }
        Ok(())
    }

    /// Slot index of block `k` of `run`, which must be staged for logical block
    /// `run.lblk + k` (of any file).
    fn staged_slot(&self, run: &Run, k: u64) -> Result<u64> {
        let i = self.run_slot(run, k)?;
        match self.load(i)?.1 {
            Slot::Staged(key) if key.lblk == run.lblk + k => Ok(i),
            _ => Err(Error::InvalidArgument("block is not staged for that key")),
        }
    }

    /// Slot index of block `k` of `run`, checked to lie in the table.
    pub(super) fn run_slot(&self, run: &Run, k: u64) -> Result<u64> {
        run.pblk
            .0
            .checked_sub(self.data.start.0)
            .and_then(|i| i.checked_add(k))
            .filter(|&i| i < self.slots)
            .ok_or(Error::InvalidArgument(
                "block outside the hashfs data region",
            ))
    }

    /// Tombstones every staged slot of the table and returns how many there were. At mount,
    /// after the data path has replayed (and so promoted) every committed write: what is still
    /// staged belongs to writes that never committed. Crash-safe at any point (each slot is one
    /// CAS); run it again after a crash.
    pub fn sweep_staged(&self) -> Result<u64> {
        self.tombstone_where(|_, s| matches!(s, Slot::Staged(_)))
    }

    /// How many slots are staged: what [`sweep_staged`](Self::sweep_staged) would tombstone.
    /// On a volume closed cleanly, the writes of data-only clients that were killed before
    /// they committed (or gave their staged blocks back). Reads only.
    pub fn count_staged(&self) -> Result<u64> {
        let mut n = 0;
        self.for_each_slot(false, |_, _, s| {
            n += u64::from(matches!(s, Slot::Staged(_)));
            Ok(())
        })?;
        Ok(n)
    }

    /// [`FileMapping::insert_at`]: makes the staged slots of `run` the current version of
    /// `(file, run.lblk + k)`.
    ///
    /// [`FileMapping::insert_at`]: pmfs_core::traits::FileMapping::insert_at
    pub(super) fn promote(&self, file: &HashFsFile, run: Run) -> Result<()> {
        if run.len == 0 {
            return Err(Error::InvalidArgument("insert_at of an empty run"));
        }
        let end = range_end(run.lblk, run.len)?;
        self.run_slot(&run, run.len - 1)?;
        let first = self.run_slot(&run, 0)?;
        // Each slot must be staged for its key, or already be its current version (a
        // re-application after a crash).
        let mut todo = Vec::with_capacity(run.len as usize);
        for k in 0..run.len {
            let key = Key::new(file.ino, run.lblk + k);
            let w = self.media.load_u64(self.slot_off(first + k))?;
            if w == key.staged() {
                todo.push(first + k);
            } else if w != key.committed() {
                return Err(Error::InvalidArgument(
                    "insert_at of a block not staged for that key",
                ));
            }
        }
        let mut mapped = Vec::new();
        self.lookup_range(file, run.lblk, end, &mut mapped, false)?;
        for m in &mapped {
            for k in 0..m.len {
                if m.pblk.0 + k != run.pblk.0 + (m.lblk + k - run.lblk) {
                    return Err(Error::InvalidArgument("insert_at over mapped blocks"));
                }
            }
        }
        // Each flip is a CAS from the staged word: a failure means someone else gave the
        // slot back meanwhile (a caller bug), which is reported rather than repaired.
        let mut raced = false;
        let mut flip = |i: u64| -> Result<()> {
            let key = Key::new(file.ino, run.lblk + (i - first));
            raced |= self
                .media
                .cas_u64(self.slot_off(i), key.staged(), key.committed())?
                .is_err();
            Ok(())
        };
        if let [i] = todo[..] {
            flip(i)?;
            self.media.persist(self.slot_off(i), 8)?;
        } else if !todo.is_empty() {
            let mut intent = self.intents.acquire(&self.media)?;
            intent.begin(PROMOTING, [file.ino, run.lblk, end, first, 0, 0])?;
            todo.iter().try_for_each(|&i| flip(i))?;
            self.persist_slots(&todo)?;
            intent.finish()?;
        }
        if raced {
            return Err(Error::InvalidArgument(
                "staged slot changed by someone else during insert_at",
            ));
        }
        for k in 0..run.len {
            file.cache.put(run.lblk + k, first + k);
        }
        Ok(())
    }
}

impl<M: Media> HashFs<M> {
    /// Makes a batch of committed copy-on-write writes of `file` current: `runs` are their
    /// staged blocks in log order, and a later run wins a logical block it shares with an
    /// earlier one. Does with two fences what [`remove`] plus [`insert_at`] per run do with
    /// several each:
    ///
    /// 1. the current version of every logical block the batch writes is tombstoned, unless
    ///    it is the batch's own winning slot; a losing slot of the batch that is current (a
    ///    crashed earlier application of this batch promoted it) too; fence;
    /// 2. every winning slot is promoted (staged → current); fence.
    ///
    /// A logical block is never current in two slots (step 1's fence comes before any
    /// promote), and the call is idempotent over any state a crash during it left, also when
    /// it is repeated with more runs appended (what [`Log::digest_batched`] asks of a batch):
    /// it never touches a winning slot in step 1, and a slot that loses in the longer batch is
    /// tombstoned by step 1 whether it is still staged or was promoted. Readers of the mapping
    /// may find a block unmapped between the two fences; the file's log still holds the
    /// batch then, and readers of the data path see its blocks through their overlay.
    ///
    /// Returns the losing slots that are still staged, as `(lblk, slot)`: they belong to
    /// nobody, but must stay staged until the log's digest cursor has moved past the batch
    /// (a repeated application finds them staged and loses them again); then
    /// [`drop_superseded`](HashFs::drop_superseded) gives them back. A crash before that
    /// leaves them to [`sweep_staged`](HashFs::sweep_staged) at the next mount.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a block outside the table or a winning slot that is
    /// neither staged nor current for its key (nothing of step 2 is done for it then).
    ///
    /// [`remove`]: pmfs_core::traits::FileMapping::remove
    /// [`insert_at`]: pmfs_core::traits::FileMapping::insert_at
    /// [`Log::digest_batched`]: pmfs_core::log::Log::digest_batched
    pub fn apply_writes(&self, file: &HashFsFile, runs: &[Run]) -> Result<Vec<(u64, u64)>> {
        let mut all: Vec<(u64, u64)> =
            Vec::with_capacity(runs.iter().map(|r| r.len as usize).sum());
        for r in runs {
            if r.len == 0 {
                continue;
            }
            range_end(r.lblk, r.len)?;
            self.run_slot(r, r.len - 1)?;
            for k in 0..r.len {
                all.push((r.lblk + k, self.run_slot(r, k)?));
            }
        }
        // A stable sort keeps each block's writes in log order: the last one wins, the
        // others lose their slots.
        all.sort_by_key(|&(lblk, _)| lblk);
        let mut wins: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        let mut losers = Vec::new();
        for (lblk, i) in all {
            match wins.last_mut() {
                Some((l, w)) if *l == lblk => {
                    if *w != i {
                        losers.push((lblk, *w));
                    }
                    *w = i;
                }
                _ => wins.push((lblk, i)),
            }
        }
        // The lines step 1 probes and step 2 flips, fetched together rather than one miss
        // after another.
        for &(lblk, win) in &wins {
            self.media
                .prefetch(self.slot_off(self.home(file.seed, lblk)));
            self.media.prefetch(self.slot_off(win));
        }
        // Step 1.
        let mut gone = Vec::new();
        let mut staged = Vec::new();
        for &(lblk, i) in &losers {
            let key = Key::new(file.ino, lblk);
            let w = self.media.load_u64(self.slot_off(i))?;
            if w == key.staged() {
                staged.push((lblk, i));
            } else if w == key.committed()
                && self.media.cas_u64(self.slot_off(i), w, TOMBSTONE)?.is_ok()
            {
                gone.push(i);
            }
        }
        let mut current = wins
            .iter()
            .map(|&(lblk, _)| self.cached(file, lblk))
            .collect::<Result<Vec<_>>>()?;
        let mut k = 0;
        while k < wins.len() {
            let mut end = k + 1;
            while end < wins.len() && end - k < BATCH && wins[end].0 == wins[end - 1].0 + 1 {
                end += 1;
            }
            if current[k..end].iter().any(Option::is_none) {
                let homes = home_slots(self.kernel, file.seed, wins[k].0, self.n32(), self.shift);
                self.probe_misses(file, wins[k].0, &homes[..end - k], &mut current[k..end])?;
            }
            k = end;
        }
        for (&(lblk, win), current) in wins.iter().zip(current) {
            let key = Key::new(file.ino, lblk);
            if let Some(i) = current
                && i != win
                && self
                    .media
                    .cas_u64(self.slot_off(i), key.committed(), TOMBSTONE)?
                    .is_ok()
            {
                gone.push(i);
            }
            file.cache.invalidate(lblk, lblk + 1);
        }
        self.settle_freed(&gone)?;
        // Step 2.
        let mut flipped = Vec::with_capacity(wins.len());
        let mut bad = false;
        for &(lblk, i) in &wins {
            let key = Key::new(file.ino, lblk);
            let w = self.media.load_u64(self.slot_off(i))?;
            if w == key.staged()
                && self
                    .media
                    .cas_u64(self.slot_off(i), w, key.committed())?
                    .is_ok()
            {
                flipped.push(i);
            } else if w != key.committed() {
                bad = true;
                continue;
            }
            file.cache.put(lblk, i);
        }
        self.persist_slots(&flipped)?;
        if bad {
            return Err(Error::InvalidArgument(
                "a written block is not staged for its key",
            ));
        }
        Ok(staged)
    }

    /// Gives back the losing slots [`apply_writes`](HashFs::apply_writes) returned, once the
    /// batch can no longer be applied again. A slot no longer staged for its key is left
    /// alone. Durable when it returns.
    pub fn drop_superseded(&self, file: &HashFsFile, slots: &[(u64, u64)]) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let mut gone = Vec::with_capacity(slots.len());
        for &(lblk, i) in slots {
            if i < self.slots
                && self
                    .media
                    .cas_u64(
                        self.slot_off(i),
                        Key::new(file.ino, lblk).staged(),
                        TOMBSTONE,
                    )?
                    .is_ok()
            {
                gone.push(i);
            }
        }
        self.settle_freed(&gone)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
    use pmfs_core::pm::HeapRegion;
    use pmfs_core::traits::{Extent, FileId, FileMapping};

    use super::super::LBLK_LIMIT;
    use super::super::intent::FIELDS;
    use super::*;

    fn table(slots: u64) -> HashFs<Arc<HeapRegion>> {
        let meta = Extent::new(BlockNo(1), HashFs::<HeapRegion>::meta_blocks(slots));
        let data = Extent::new(meta.end(), slots);
        let r = Arc::new(HeapRegion::new(data.end().0 * BLOCK_SIZE).unwrap());
        HashFs::format_with_salt(r, meta, data, 5).unwrap()
    }

    fn file(t: &HashFs<Arc<HeapRegion>>, ino: u64) -> HashFsFile {
        t.open_file(FileId {
            ino,
            root: PmOff(0),
        })
        .unwrap()
    }

    fn mapped(t: &HashFs<Arc<HeapRegion>>, f: &HashFsFile, lblk: u64, len: u64) -> Vec<Run> {
        let mut runs = Vec::new();
        t.lookup(f, lblk, len, &mut runs).unwrap();
        runs
    }

    fn blocks(runs: &[Run]) -> Vec<(u64, u64)> {
        runs.iter()
            .flat_map(|r| (0..r.len).map(move |k| (r.lblk + k, r.pblk.0 + k)))
            .collect()
    }

    #[test]
    fn staged_slots_are_invisible_until_promoted() {
        let t = table(128);
        let f = file(&t, 3);
        let mut old = Vec::new();
        t.insert(&f, 0, 8, &mut old).unwrap();
        let mut new = Vec::new();
        t.stage(&f, 2, 4, &mut new).unwrap();
        assert_eq!(
            blocks(&new).iter().map(|b| b.0).collect::<Vec<_>>(),
            [2, 3, 4, 5]
        );
        // Lookups (batched, scanned, through a fresh handle) and owned_blocks see the old
        // version only.
        assert_eq!(mapped(&t, &f, 0, 8), old);
        assert_eq!(
            blocks(&mapped(&t, &file(&t, 3), 0, LBLK_LIMIT)),
            blocks(&old)
        );
        let mut owned = Vec::new();
        t.owned_blocks(&f, &mut |e| owned.push(e)).unwrap();
        assert_eq!(owned.iter().map(|e| e.len).sum::<u64>(), 8);
        assert_eq!(t.occupancy().unwrap().staged, 4);
        // Over the mapped old version, insert_at is refused and changes nothing.
        for r in &new {
            assert!(matches!(
                t.insert_at(&f, *r),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert_eq!(t.occupancy().unwrap().staged, 4);
        assert_eq!(t.remove(&f, 2, 4).unwrap(), 4);
        for r in &new {
            t.insert_at(&f, *r).unwrap();
            // A re-application is a no-op.
            t.insert_at(&f, *r).unwrap();
        }
        let want: Vec<_> = blocks(&old)[..2]
            .iter()
            .chain(&blocks(&new))
            .chain(&blocks(&old)[6..])
            .copied()
            .collect();
        assert_eq!(blocks(&mapped(&t, &f, 0, 8)), want);
        assert_eq!(blocks(&mapped(&t, &file(&t, 3), 0, LBLK_LIMIT)), want);
        let occ = t.occupancy().unwrap();
        assert_eq!((occ.staged, occ.committed), (0, 8));
    }

    #[test]
    fn insert_at_checks_the_key_of_every_slot() {
        let t = table(64);
        let (a, b) = (file(&t, 1), file(&t, 2));
        let mut runs = Vec::new();
        t.stage(&a, 10, 1, &mut runs).unwrap();
        let r = runs[0];
        let shifted = Run { lblk: 11, ..r };
        assert!(matches!(
            t.insert_at(&a, shifted),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(t.insert_at(&b, r), Err(Error::InvalidArgument(_))));
        let longer = Run { len: 2, ..r };
        assert!(matches!(
            t.insert_at(&a, longer),
            Err(Error::InvalidArgument(_))
        ));
        let outside = Run {
            pblk: BlockNo(t.data().end().0),
            ..r
        };
        assert!(matches!(
            t.insert_at(&a, outside),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            t.unstage(&[shifted]),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(t.occupancy().unwrap().staged, 1);
        t.unstage(&[r]).unwrap();
        assert!(matches!(t.insert_at(&a, r), Err(Error::InvalidArgument(_))));
        // The given-back slot is emptied again: nothing lies after it.
        let occ = t.occupancy().unwrap();
        assert_eq!((occ.staged, occ.committed, occ.empty), (0, 0, 64));
    }

    #[test]
    fn the_same_key_staged_twice_gets_two_slots_and_only_one_is_promoted() {
        let t = table(64);
        let f = file(&t, 4);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        t.stage(&f, 0, 3, &mut x).unwrap();
        t.stage(&f, 0, 3, &mut y).unwrap();
        let (bx, by) = (blocks(&x), blocks(&y));
        assert!(bx.iter().all(|b| !by.iter().any(|c| c.1 == b.1)));
        for r in &y {
            t.insert_at(&f, *r).unwrap();
        }
        assert_eq!(blocks(&mapped(&t, &f, 0, 3)), by);
        assert_eq!(t.count_staged().unwrap(), 3);
        assert_eq!(t.sweep_staged().unwrap(), 3);
        assert_eq!(t.count_staged().unwrap(), 0);
        assert_eq!(blocks(&mapped(&t, &f, 0, 3)), by);
        assert_eq!(t.occupancy().unwrap().staged, 0);
    }

    #[test]
    fn recovery_keeps_staged_slots_and_rolls_a_promote_forward_at_its_slots_only() {
        let t = table(64);
        let f = file(&t, 6);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        t.stage(&f, 20, 3, &mut x).unwrap();
        t.stage(&f, 20, 3, &mut y).unwrap();
        // A promote of `y`'s first run that crashed after its record and one flip.
        let r = y[0];
        let first = r.pblk.0 - t.data().start.0;
        let mut rec = t.intents.acquire(&t.media).unwrap();
        let mut fields = [0; FIELDS];
        fields[..4].copy_from_slice(&[6, r.lblk, r.lblk + r.len, first]);
        rec.begin(PROMOTING, fields).unwrap();
        let k0 = Key::new(6, r.lblk);
        t.media
            .cas_u64(t.slot_off(first), k0.staged(), k0.committed())
            .unwrap()
            .unwrap();
        std::mem::forget(rec);
        t.recover().unwrap();
        assert_eq!(mapped(&t, &f, 20, 3), [r]);
        assert_eq!(t.occupancy().unwrap().staged, 6 - r.len);
        // A record naming slots outside the table is corrupt.
        let mut rec = t.intents.acquire(&t.media).unwrap();
        fields[3] = t.slots;
        rec.begin(PROMOTING, fields).unwrap();
        std::mem::forget(rec);
        assert!(matches!(t.recover(), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn stage_without_room_gives_everything_back() {
        let t = table(16);
        let f = file(&t, 1);
        let mut out = Vec::new();
        t.insert(&f, 0, 10, &mut out).unwrap();
        out.clear();
        assert!(matches!(t.stage(&f, 0, 7, &mut out), Err(Error::NoSpace)));
        assert!(out.is_empty());
        let occ = t.occupancy().unwrap();
        assert_eq!((occ.staged, occ.free()), (0, 6));
        assert!(matches!(t.stage(&f, 0, 17, &mut out), Err(Error::NoSpace)));
        assert!(matches!(
            t.stage(&f, LBLK_LIMIT - 1, 2, &mut out),
            Err(Error::InvalidArgument(_))
        ));
    }
}
