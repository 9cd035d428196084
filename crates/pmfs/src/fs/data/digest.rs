//! The digest: applying committed log entries to the volume's mapping structure in log
//! order, in batches, and freeing the blocks they replaced.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use pmfs_core::log::{Digest, ENTRIES_PER_BLOCK, Entry};
use pmfs_core::traits::{Run, merge_runs};
use pmfs_mapping::hashfs::{HashFs, HashFsFile};

use crate::error::{Error, Result};
use crate::fs::{Fs, MAX_FILE_SIZE};
use crate::inode::field;
use crate::mapping::{MapFile, handle};
use crate::parts::{Pm, Stager};

use super::{BS, DIGEST_AFTER_ENTRIES, Node, Shared};

impl Fs {
    /// After a write that held the file's lock shared ([`DigestWhen::ByCaller`]): digests the
    /// file's log under the lock taken alone if the batch is full ([`Shared::batch_full`]).
    /// Another writer of the file may have digested it while this one waited for the lock:
    /// then nothing is left to do.
    ///
    /// [`DigestWhen::ByCaller`]: super::DigestWhen::ByCaller
    pub(super) fn digest_if_due(&self, n: &Node) -> Result<()> {
        let Some(s) = self.shared(n, false)? else {
            return Ok(());
        };
        if !s.batch_full() {
            return Ok(());
        }
        let _il = self.tree_write_lock(n.h.ino);
        if !s.batch_full() {
            return Ok(());
        }
        self.digest_committed(n.h.ino, &s, self.node_map(n)?)
    }

    /// [`digest`](Fs::digest) after a committed update: the update is durable, and a digest
    /// that cannot get the blocks its mapping structure needs leaves the entry to the overlay
    /// and to the next digest.
    pub(super) fn digest_committed(&self, ino: u32, s: &Shared, f: &MapFile) -> Result<()> {
        match self.digest(ino, s, f) {
            Err(Error::NoSpace) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Applies the undigested entries of `s`'s log to the mapping (unless another live process
    /// is doing it) and compacts the log once a block of applied entries has accumulated.
    pub fn digest(&self, ino: u32, s: &Shared, f: &MapFile) -> Result<()> {
        let cursor = self.inodes.field(ino, field::DIGEST);
        let me = self.holder;
        let mut failed = None;
        let mut note = |r: Result<()>| {
            r.map_err(|err| {
                failed = Some(err);
                pmfs_core::Error::InvalidArgument("applying a log entry failed")
            })
        };
        // HashFS applies batches of writes with two fences (`HashFs::apply_writes`); the other
        // structures batches of writes to disjoint blocks (`apply_disjoint`).
        let mut superseded = Vec::new();
        let disjoint = Disjoint::default();
        let alive = |pid| self.holder_alive(pid);
        let r = match &self.stage {
            Stager::Hash(t) => {
                let hf = handle::<HashFsFile>(f)?;
                s.log.digest_batched(
                    cursor,
                    me,
                    &alive,
                    &|batch, _| batch.len() < DIGEST_AFTER_ENTRIES as usize,
                    &mut |batch| note(self.apply_batch(ino, f, t, hf, batch, &mut superseded)),
                )
            }
            Stager::Alloc(_) => s.log.digest_batched(
                cursor,
                me,
                &alive,
                &|batch, e| batch.len() < DIGEST_AFTER_ENTRIES as usize && disjoint.joins(batch, e),
                &mut |batch| note(self.apply_disjoint(ino, f, batch)),
            ),
        };
        let r = match r {
            // Every later digest of this process would find the cursor busy and leave the
            // file's entries unapplied: only the next mount, which resets the holder, gets
            // past it.
            Err(e @ pmfs_core::Error::DigestCursorHeld { .. }) => {
                self.or_leave("a held digest cursor", Err(e.into()))
            }
            r => r.map_err(Error::from),
        };
        if let Some(err) = failed {
            return Err(err);
        }
        let r = r?;
        if let (Digest::Done { .. }, Stager::Hash(t)) = (r, &self.stage) {
            t.drop_superseded(handle::<HashFsFile>(f)?, &superseded)?;
        }
        // Done: applied; Busy: the live holder applies them.
        s.pending_entries.store(0, Ordering::Relaxed);
        s.pending_blocks.store(0, Ordering::Relaxed);
        if let Digest::Done { applied } = r {
            s.ov.lock()
                .unwrap_or_else(|e| e.into_inner())
                .prune(applied);
            if applied >= s.gc_at.load(Ordering::Relaxed) + ENTRIES_PER_BLOCK {
                s.gc_at.store(applied, Ordering::Relaxed);
                s.log.compact_applied(cursor)?;
            }
        }
        Ok(())
    }

    /// Digests the logs of the other files this process has written and not digested yet:
    /// the blocks their overwrites replaced go back to the allocator only then, and a write
    /// that ran out of space retries after this. A file whose lock is taken (possibly by the
    /// caller: locks are striped) is left alone. The lock also keeps the file's last close
    /// out, which closes the log only when it holds the last reference to it.
    pub(super) fn digest_others(&self, own: u32) -> Result<()> {
        let pending: Vec<u32> = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|&(&ino, s)| ino != own && s.pending_entries.load(Ordering::Relaxed) > 0)
            .map(|(&ino, _)| ino)
            .collect();
        for ino in pending {
            let Ok(_lock) = self.ilock(ino).try_write() else {
                continue;
            };
            let Some(s) = self.registered_log(ino) else {
                continue;
            };
            let f = self.map.open_file(self.file_id(ino))?;
            match self.digest(ino, &s, &f) {
                Ok(()) | Err(Error::NoSpace) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Applies a batch of [`Log::digest_batched`] on a HashFS volume: an entry of another kind
    /// alone through [`apply`](Fs::apply), writes together through
    /// [`HashFs::apply_writes`], whose losing slots are added to `superseded`. The size words
    /// are stored first (idempotent maxima): the first fence of `apply_writes` makes them
    /// durable before any block is promoted.
    ///
    /// [`Log::digest_batched`]: pmfs_core::log::Log::digest_batched
    fn apply_batch(
        &self,
        ino: u32,
        f: &MapFile,
        t: &HashFs<Pm>,
        hf: &HashFsFile,
        batch: &[(u64, Entry)],
        superseded: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let m = self.m();
        let Some((runs, size)) = batch_writes(batch)? else {
            return self.apply(ino, f, &batch[0].1);
        };
        let hi = runs.iter().map(|r| r.lblk + r.len).max().unwrap_or(0);
        if hi > self.inodes.load(m, ino, field::MAPPED_END)? {
            self.inodes.store(m, ino, field::MAPPED_END, hi)?;
        }
        if size > self.inodes.load(m, ino, field::SIZE)? {
            self.inodes.store(m, ino, field::SIZE, size)?;
        }
        superseded.extend(t.apply_writes(hf, &runs)?);
        Ok(())
    }

    /// Applies a batch of [`Log::digest_batched`] on a structure other than HashFS: writes
    /// to disjoint blocks (see [`Disjoint`]), or one entry of another kind alone through
    /// [`apply`](Fs::apply). Their runs are applied in block order, those that continue each
    /// other on both sides as one (appends become one mapping update per batch); a run the
    /// mapping already maps exactly is skipped. With no block written twice, applying again a
    /// batch that a crash cut short, or a longer one from the same entry, maps every block to
    /// the same place: no write can undo a later one.
    ///
    /// [`Log::digest_batched`]: pmfs_core::log::Log::digest_batched
    fn apply_disjoint(&self, ino: u32, f: &MapFile, batch: &[(u64, Entry)]) -> Result<()> {
        let m = self.m();
        let Some((mut runs, size)) = batch_writes(batch)? else {
            return self.apply(ino, f, &batch[0].1);
        };
        runs.sort_unstable_by_key(|r| r.lblk);
        let merged = merge_runs(&runs);
        let hi = merged.last().map_or(0, |r| r.lblk + r.len);
        if hi > self.inodes.load(m, ino, field::MAPPED_END)? {
            self.inodes.store(m, ino, field::MAPPED_END, hi)?;
            m.fence();
        }
        self.map.replace_many(f, &merged)?;
        if size > self.inodes.load(m, ino, field::SIZE)? {
            self.inodes.store(m, ino, field::SIZE, size)?;
        }
        m.fence();
        Ok(())
    }

    /// Applies one entry to the mapping and the size word, idempotently (see the module
    /// documentation). Durable when it returns.
    pub fn apply(&self, ino: u32, f: &MapFile, e: &Entry) -> Result<()> {
        let m = self.m();
        match e {
            Entry::Write { runs, extend_to } => {
                let hi = runs.iter().map(|r| r.lblk + r.len).max().unwrap_or(0);
                if hi > self.inodes.load(m, ino, field::MAPPED_END)? {
                    self.inodes.store(m, ino, field::MAPPED_END, hi)?;
                    m.fence();
                }
                self.map.replace_many(f, runs)?;
                if *extend_to > self.inodes.load(m, ino, field::SIZE)? {
                    self.inodes.store(m, ino, field::SIZE, *extend_to)?;
                }
            }
            Entry::Truncate { size } => {
                // Read before the size word moves (the bound of an older volume is its size).
                let bound = self.mapped_bound(ino)?;
                let upto = bound.min(MAX_FILE_SIZE / BS);
                self.inodes.store(m, ino, field::SIZE, *size)?;
                m.fence();
                let from = size.div_ceil(BS);
                if upto > from {
                    self.map.remove(f, from, upto - from)?;
                }
                // Lowered, never raised: a truncation to a size past the mapped blocks keeps
                // the bound where they end.
                self.inodes
                    .store(m, ino, field::MAPPED_END, from.min(bound))?;
            }
            Entry::Resize { size } => self.inodes.store(m, ino, field::SIZE, *size)?,
            Entry::Punch { lblk, len } => {
                self.map.remove(f, *lblk, *len)?;
            }
        }
        m.fence();
        Ok(())
    }
}

/// The runs of a digest batch of writes and the largest size they extend the file to; `None`
/// for a batch of one entry of another kind (which is applied alone).
fn batch_writes(batch: &[(u64, Entry)]) -> Result<Option<(Vec<Run>, u64)>> {
    let mut runs: Vec<Run> = Vec::new();
    let mut size = 0;
    for (_, e) in batch {
        let Entry::Write { runs: r, extend_to } = e else {
            return match batch {
                [_] => Ok(None),
                _ => Err(Error::InvalidArgument("a digest batch mixes entry kinds")),
            };
        };
        size = size.max(*extend_to);
        runs.extend_from_slice(r);
    }
    Ok(Some((runs, size)))
}

/// The batching rule of the structures other than HashFS: a write joins a batch of writes
/// when it writes none of the blocks they write (see [`Fs::apply_disjoint`]). Keeps the
/// blocks of the batch being built as disjoint intervals (start → end): the log asks about
/// each next write once, with the batch so far.
#[derive(Default)]
struct Disjoint(RefCell<BTreeMap<u64, u64>>);

impl Disjoint {
    fn joins(&self, batch: &[(u64, Entry)], e: &Entry) -> bool {
        let Entry::Write { runs, .. } = e else {
            return false;
        };
        let mut taken = self.0.borrow_mut();
        if let [(_, first)] = batch {
            taken.clear();
            if let Entry::Write { runs, .. } = first {
                for r in runs {
                    taken.insert(r.lblk, r.lblk + r.len);
                }
            }
        }
        let free = |r: &Run| {
            taken
                .range(..r.lblk + r.len)
                .next_back()
                .is_none_or(|(_, &end)| end <= r.lblk)
        };
        if !runs.iter().all(free) {
            return false;
        }
        for r in runs {
            taken.insert(r.lblk, r.lblk + r.len);
        }
        true
    }
}
