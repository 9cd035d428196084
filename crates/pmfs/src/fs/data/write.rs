//! The write path: the file's tail, staging, the copy-on-write update and its commit by CAS
//! on the file's log, and the writes and appends built on them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::log::{Commit, Entry, Position};
use pmfs_core::pm::procs::{self, DevIno};
use pmfs_core::traits::{AllocHint, AllocKind, Extent, Run, Runs};
use pmfs_mapping::hashfs::HashFsFile;

use crate::error::{Error, Result};
use crate::fs::{Fs, MAX_FILE_SIZE};
use crate::hash::FastMap;
use crate::inode::{field, flag};
use crate::mapping::{MapFile, handle};
use crate::overlay::{Overlay, Src, touches, touches_range};
use crate::parts::Stager;

use super::mapped::raise_words;
use super::{BS, DigestWhen, Node, Seg, Segs, Shared, Update, overlay_src};

/// How long a holder found alive counts as alive without looking again: a dead holder
/// misjudged alive is only taken over that much later.
const ALIVE_FOR: Duration = Duration::from_millis(100);

/// Free blocks that staging leaves to the mapping structure's nodes (extent, radix, cuckoo).
const DIGEST_RESERVE: u64 = 8;

/// An update that does not free space leaves at least this many slots in its log's last
/// block, or else holds a spare block for the log's next one ([`Log::keep_a_spare`]), so that
/// an update that frees space (a truncation's or a punch's extended entry takes at most 7
/// slots) can still commit when the volume is full. Else, on HashFS, where log blocks come
/// from the table the data fills, a file grown until nothing is left could not be truncated.
///
/// [`Log::keep_a_spare`]: pmfs_core::log::Log::keep_a_spare
const LOG_RESERVE: u64 = 8;

/// A block of a plan whose old contents must be copied: the bytes outside `[new_from,
/// new_to)` of logical block `lblk`, into physical block `pblk`.
#[derive(Clone, Copy, Debug)]
struct Partial {
    lblk: u64,
    pblk: u64,
    new_from: u64,
    new_to: u64,
}

/// The blocks of `sg` that it writes in part: its first and its last, when the new bytes
/// do not cover them whole.
fn partial_blocks<'s>(sg: &'s Seg<'_>) -> impl Iterator<Item = u64> + 's {
    let last = sg.lblk + sg.len.max(1) - 1;
    [sg.lblk, last]
        .into_iter()
        .take(sg.len.min(2) as usize)
        .filter(|&b| sg.partly_writes(b))
}

/// Plans a copy-on-write update from the overlay, the mapping handle and the current size:
/// the segments and the size to extend to, or `None` for nothing to do.
type Plan<'p, 'b> =
    dyn FnMut(&Fs, Option<&Overlay>, &MapFile, u64) -> Result<Option<(Segs<'b>, u64)>> + 'p;

/// Why a commit attempt gave up and the update must be planned again.
enum Attempt {
    /// Committed at LSN `lsn` by an attempt that checked the log from LSN `from`: only
    /// reservations and padding lie between the two.
    Committed {
        from: u64,
        lsn: u64,
    },
    Replan,
}

/// An update this thread committed, for [`Fs::after_commit`] to fold without reading the log.
pub(super) struct Own<'a> {
    /// The LSN the committing attempt checked from (see [`Attempt::Committed`]).
    from: u64,
    lsn: u64,
    entry: &'a Entry,
}

/// The file's tail held ([`Fs::lock_tail`]): this process's lock of it and the inode's `TAIL`
/// word naming this process. Dropping it frees both.
pub(super) struct TailGuard<'a> {
    fs: &'a Fs,
    tail: LeftTail,
    _local: MutexGuard<'a, ()>,
}

impl Drop for TailGuard<'_> {
    fn drop(&mut self) {
        // A word left naming this live process holds the tail for good: every later taker
        // elsewhere waits for it, and only the next mount clears it. The session stops taking
        // changes; another volume of this process takes the tail over.
        let freed = self.fs.m().store_u64(self.tail.at, 0).map_err(Error::from);
        if freed.is_err() {
            left_tails().push(self.tail);
        }
        let _ = self.fs.or_leave("a held file tail", freed);
    }
}

/// A pool as this process tells pools apart: by its file, or, for a region that maps none (a
/// heap region in tests), by the region that the volumes on it share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolId {
    File(DevIno),
    Region(usize),
}

/// A file's tail: its inode's `TAIL` word, in a pool, while the inode has one generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LeftTail {
    pool: PoolId,
    at: PmOff,
    generation: u32,
}

/// The tails volumes of this process failed to let go ([`TailGuard`]). Their words still name
/// this process: other processes wait for it to exit (or for the next mount, which frees every
/// tail), but another volume of this process, which would wait for itself, takes such a tail
/// over instead. A mount forgets its pool's.
static LEFT_TAILS: Mutex<Vec<LeftTail>> = Mutex::new(Vec::new());

fn left_tails() -> MutexGuard<'static, Vec<LeftTail>> {
    LEFT_TAILS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bytes of an update that go in place into the partial last block (see
/// [`tail_in_place`]): zeros over `[size, from)`, then `data` at `from`, or zeros up to `to`.
#[derive(Clone, Copy, Debug)]
struct InPlace<'b> {
    lblk: u64,
    size: u64,
    from: u64,
    to: u64,
    data: Option<&'b [u8]>,
}

/// Takes out of `segs` the part that writes at or past the old end `size` of the file inside
/// its partial last block, to be written in place (see the module documentation): what a
/// write starting there puts into that block, or the zeros a file growing past it needs. The
/// rest of the segment, from the next block on, stays. `None` when no segment does that
/// (the end is block-aligned, or a segment writes below it in that block).
fn tail_in_place<'b>(segs: &mut Segs<'b>, size: u64) -> Option<InPlace<'b>> {
    if size.is_multiple_of(BS) {
        return None;
    }
    let t = size / BS;
    let end = t * BS + BS;
    let i = segs.iter().position(|sg| sg.covers(t))?;
    let sg = segs[i];
    if sg.from < size {
        return None;
    }
    // A growth past the old end without new bytes in the block (`eof_seg`) zeroes the rest
    // of the block; a segment of zeros or bytes covers its range.
    let to = if sg.from == sg.to {
        end
    } else {
        sg.to.min(end)
    };
    let piece = InPlace {
        lblk: t,
        size,
        from: sg.from,
        to,
        data: sg.data.map(|d| &d[..(to - sg.from) as usize]),
    };
    if sg.to > end {
        segs[i] = Seg {
            lblk: t + 1,
            len: sg.lblk + sg.len - (t + 1),
            from: end,
            to: sg.to,
            data: sg.data.map(|d| &d[(end - sg.from) as usize..]),
        };
    } else {
        segs.remove(i);
    }
    Some(piece)
}

/// How the blocks of segment `sg` of an update are placed: its allocation kind, and where
/// to look for its goal, the successor of the block before the segment, which the allocator
/// extends into if it is free (the overlay's block, or the mapping's; `None`: no goal).
/// `size` is the file's size, `ov` its overlay; `dense`: the file never had a hole
/// ([`flag::HOLES`]), so it maps every block below its size; `next`: the block after this
/// process's latest write of the file.
///
/// A segment that may grow the file or fill its holes, or that continues the latest write
/// (a sequential rewrite) or the overlay's blocks before it, is `Growing`: the fragment it
/// extends is where the file goes on. Any other segment inside a dense file replaces blocks
/// that stay where they are in the file (a random overwrite): it is a `Fixed` allocation
/// without a goal. The allocator then packs such blocks into the free space that earlier
/// replacements left, instead of taking a new growing fragment out of the largest free chunk
/// for each (which cut the free space of a 1 GiB volume so that a 512 MiB file written after
/// 49,152 random 4 KiB overwrites of a 64 MiB one lay in 4,181 runs, not 73). Such a segment
/// needs no lookup of its goal either: on a file laid out contiguously the successor of its
/// predecessor is its own old block, taken until the digest frees it.
pub(super) fn placement(
    ov: &Overlay,
    sg: &Seg<'_>,
    size: u64,
    dense: bool,
    next: u64,
) -> (AllocKind, Option<Src>) {
    let src = sg.lblk.checked_sub(1).map(|prev| overlay_src(ov, prev));
    let inside = dense && (sg.lblk + sg.len) * BS <= size;
    let continues = sg.lblk == next || matches!(src, None | Some(Src::Mapped(_)));
    if inside && !continues {
        (AllocKind::Fixed, None)
    } else {
        (AllocKind::Growing, src)
    }
}

/// Whether an update of `segs` that extends the file to `extend_to` (0: it does not) needs
/// the file's tail: it changes the size or writes the partial last block.
fn needs_tail(segs: &[Seg<'_>], extend_to: u64, size: u64) -> bool {
    if extend_to > size {
        return true;
    }
    let t = size / BS;
    !size.is_multiple_of(BS) && segs.iter().any(|sg| sg.covers(t))
}

impl Fs {
    /// Writes an [`InPlace`] piece into block `pblk`, its partial last block: streaming
    /// stores, or cached ones flushed for short pieces, durable at the caller's fence (before
    /// it commits).
    fn write_in_tail(&self, p: &InPlace<'_>, pblk: u64) -> Result<()> {
        let m = self.m();
        let at = |x: u64| BlockNo(pblk).offset() + (x - p.lblk * BS);
        let zero_to = if p.data.is_some() { p.from } else { p.to };
        if zero_to > p.size {
            m.fill_nt(at(p.size), zero_to - p.size, 0)?;
        }
        if let Some(d) = p.data {
            m.write_nt(at(p.from), d)?;
        }
        Ok(())
    }

    /// After an update that gave blocks back: holds a spare log block again if the log's last
    /// block is short of room ([`LOG_RESERVE`]) and a block is free (the update may have
    /// used the spare).
    pub(super) fn restore_log_reserve(&self, s: &Shared) -> Result<()> {
        if s.log.tail()?.room() < LOG_RESERVE {
            match s.log.keep_a_spare() {
                Ok(()) | Err(pmfs_core::Error::NoSpace) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether process `pid`, found holding a word of this pool (a log's digest cursor, a
    /// file's tail), may still use it: it runs and, where this process may read its mappings,
    /// maps the pool file ([`procs::maps_file`]). A holder killed long ago whose pid the
    /// kernel has since given to another program so reads as dead; a live holder never does.
    pub(super) fn holder_alive(&self, pid: u32) -> bool {
        let now = Instant::now();
        let fresh = |seen: &Instant| now.duration_since(*seen) < ALIVE_FOR;
        if self.alive_seen().get(&pid).is_some_and(fresh) {
            return true;
        }
        let alive = self
            .m()
            .file_id()
            .and_then(|id| procs::maps_file(pid, id))
            .unwrap_or_else(|| procs::exists(pid));
        let mut seen = self.alive_seen();
        seen.retain(|_, t| fresh(t));
        if alive {
            seen.insert(pid, now);
        }
        alive
    }

    fn alive_seen(&self) -> MutexGuard<'_, FastMap<u32, Instant>> {
        self.alive_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This volume's pool, as [`LEFT_TAILS`] names it.
    fn pool_id(&self) -> PoolId {
        match self.m().file_id() {
            Some(id) => PoolId::File(id),
            None => PoolId::Region(Arc::as_ptr(self.media()).cast::<()>() as usize),
        }
    }

    /// Forgets the tails this process failed to let go on this volume's pool: a mount has
    /// freed them.
    pub(in crate::fs) fn forget_left_tails(&self) {
        let pool = self.pool_id();
        left_tails().retain(|t| t.pool != pool);
    }

    /// Takes the tail of file `n` ([`TailGuard`]): waits for a live holder, replaces a dead
    /// one, and takes over one that another volume of this process failed to let go. Every
    /// update that changes the size or writes the partial last block holds it from its plan
    /// to its commit; it lets the holder write past the end of file in place. Taken under the
    /// inode's lock (shared or alone), never the other way round.
    pub(super) fn lock_tail<'a>(&'a self, n: &Node, s: &'a Shared) -> Result<TailGuard<'a>> {
        let local = s.tail.lock().unwrap_or_else(|e| e.into_inner());
        let m = self.m();
        let tail = LeftTail {
            pool: self.pool_id(),
            at: self.inodes.field(n.h.ino, field::TAIL),
            generation: n.h.generation,
        };
        let guard = |local| TailGuard {
            fs: self,
            tail,
            _local: local,
        };
        let me = u64::from(self.holder);
        let mut tries = 0u32;
        loop {
            let cur = m.load_u64(tail.at)?;
            // Another volume of this process may hold it too (the same id): wait for that.
            let dead =
                || cur != me && u32::try_from(cur).map_or(true, |pid| !self.holder_alive(pid));
            if (cur == 0 || (tries % 256 == 255 && dead())) && m.cas_u64(tail.at, cur, me)?.is_ok()
            {
                return Ok(guard(local));
            }
            if tries % 256 == 255 {
                // A tail this volume failed to let go is never freed in this session; one
                // another volume of this process failed to let go is this one's to take.
                self.writable()?;
                if cur == me {
                    let mut left = left_tails();
                    if let Some(i) = left.iter().position(|t| *t == tail) {
                        left.swap_remove(i);
                        return Ok(guard(local));
                    }
                }
            }
            tries = tries.wrapping_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Stages fresh blocks for `[lblk, lblk + len)`, appending runs to `out`.
    fn stage(
        &self,
        f: &MapFile,
        lblk: u64,
        len: u64,
        hint: AllocHint,
        out: &mut Runs,
    ) -> Result<()> {
        match &self.stage {
            Stager::Alloc(a) => {
                // Leave the mapping structure room for the nodes a digest may need: an
                // update whose digest could not run would keep its blocks in the log only.
                if a.free_blocks() < len.saturating_add(DIGEST_RESERVE) {
                    return Err(Error::NoSpace);
                }
                let first = out.len();
                let mut at = lblk;
                let mut hint = hint;
                while at < lblk + len {
                    match a.alloc(lblk + len - at, hint) {
                        Ok(e) => {
                            out.push(Run {
                                lblk: at,
                                pblk: e.start,
                                len: e.len,
                            });
                            hint.goal = Some(e.start + e.len);
                            at += e.len;
                        }
                        Err(e) => {
                            let got: Vec<Run> = out.drain(first..).collect();
                            self.unstage(&got)?;
                            return Err(e.into());
                        }
                    }
                }
                Ok(())
            }
            // The fence after the copies makes the claims durable before the commit.
            Stager::Hash(t) => Ok(t.stage_unfenced(handle::<HashFsFile>(f)?, lblk, len, out)?),
        }
    }

    /// Gives staged blocks back.
    fn unstage(&self, runs: &[Run]) -> Result<()> {
        match &self.stage {
            Stager::Alloc(a) => {
                for r in runs {
                    a.free(Extent::new(r.pblk, r.len))?;
                }
                Ok(())
            }
            Stager::Hash(t) => Ok(t.unstage(runs)?),
        }
    }

    /// Copies the old contents of a partial block outside its new bytes: from `src`, where
    /// the block lives now (zeros for a hole), zeros at and after `size`.
    fn copy_old(&self, src: Option<u64>, p: &Partial, size: u64) -> Result<()> {
        let m = self.m();
        let bs = p.lblk * BS;
        for (a, b) in [(bs, p.new_from), (p.new_to, bs + BS)] {
            if a >= b {
                continue;
            }
            let keep = b.min(size.max(a));
            let dst = PmOff(p.pblk * BS);
            if let Some(sp) = src
                && keep > a
            {
                m.copy_within_nt(PmOff(sp * BS) + (a - bs), dst + (a - bs), keep - a)?;
            } else if keep > a {
                m.fill_nt(dst + (a - bs), keep - a, 0)?;
            }
            if b > keep {
                m.fill_nt(dst + (keep - bs), b - keep, 0)?;
            }
        }
        Ok(())
    }

    /// Commits one copy-on-write update of `n` (see the module documentation): `plan` gives
    /// the segments and the size to extend to from the current size (`None`: nothing to do).
    /// In mapped mode the segments' mapped blocks are written in place instead.
    pub(super) fn cow_update<'b>(
        &self,
        n: &Node,
        how: Update,
        plan: &mut Plan<'_, 'b>,
    ) -> Result<Option<u64>> {
        self.cow_update_with(n, how, plan, &mut |_| Ok(()))
    }

    /// [`cow_update`](Fs::cow_update), calling `before_commit` with the staged runs right before
    /// each commit attempt.
    pub(super) fn cow_update_with<'b>(
        &self,
        n: &Node,
        how: Update,
        plan: &mut Plan<'_, 'b>,
        before_commit: &mut dyn FnMut(&[Run]) -> Result<()>,
    ) -> Result<Option<u64>> {
        let s = self.shared(n, true)?.ok_or(Error::Corrupt {
            what: "file log",
            at: self.inodes.field(n.h.ino, field::LOG),
        })?;
        let f = self.node_map(n)?;
        // Staging may find no space while blocks that undigested writes replaced are still
        // allocated: digest them and try once more.
        let mut digested = false;
        let mut tail = if how.tail_first {
            Some(self.lock_tail(n, &s)?)
        } else {
            None
        };
        loop {
            let since = s.log.tail()?;
            // Mapped mode: joined before the commit, left once the bytes are in place. Read
            // after the tail was seen, the count also serves the first commit attempt.
            let hold = self.map_hold(n.h.ino)?;
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.catch_up(n.h.ino, &s, &mut ov, since.lsn())?;
            let size = ov.size(self.digested_size(n.h.ino)?);
            let Some((mut segs, extend_to)) = plan(self, Some(&ov), f, size)? else {
                return Ok(None);
            };
            let tail_held = tail.is_some();
            if !tail_held && needs_tail(&segs, extend_to, size) {
                drop(ov);
                drop(hold);
                tail = Some(self.lock_tail(n, &s)?);
                continue;
            }
            // Holding the tail, and out of mapped mode, the bytes past the end of file in its
            // partial last block are nobody's: they go there in place.
            let in_place = match hold {
                None if tail_held && !size.is_multiple_of(BS) => {
                    match self.block_at(Some(&ov), f, size / BS)? {
                        Some(pblk) => tail_in_place(&mut segs, size).map(|p| (p, pblk)),
                        None => None,
                    }
                }
                _ => None,
            };
            let (segs, own) = match hold {
                Some(_) => self.split_mapped(n.h.ino, Some(&ov), f, &segs, how.holes)?,
                None => (segs, Vec::new()),
            };
            if segs.is_empty() && own.is_empty() && in_place.is_none() && extend_to == 0 {
                return Ok(None);
            }
            // What the overlay has for the blocks to be written in part, and how each
            // segment's blocks are placed (HashFS places blocks by hash: only the allocator
            // takes a kind and a goal, see `placement`).
            let old_src: Vec<(u64, Src)> = segs
                .iter()
                .flat_map(partial_blocks)
                .map(|b| (b, overlay_src(&ov, b)))
                .collect();
            let placements: Vec<(AllocKind, Option<Src>)> = match &self.stage {
                Stager::Alloc(_) => {
                    let dense = self.inodes.flags(self.m(), n.h.ino)? & flag::HOLES == 0;
                    let next = s.written_to.load(Ordering::Relaxed);
                    segs.iter()
                        .map(|sg| placement(&ov, sg, size, dense, next))
                        .collect()
                }
                Stager::Hash(_) => Vec::new(),
            };
            // The overlay has every entry below this LSN, and nothing below needs it: the
            // mapping's lookups and the copies run without its lock, so that readers and other
            // writers of the file are not held up by them (see `resolve_pieces`). A block they
            // copy from that a newer entry replaced (and a digest may have freed) is caught by
            // the commit's check of the entries from here on, as for a writer in another
            // process.
            let folded = ov.next_lsn();
            drop(ov);
            // Where the blocks to be written in part live now, looked up and hinted before
            // the staging, so that their copies find them in the cache.
            let mut old: Vec<(u64, Option<u64>)> = Vec::with_capacity(old_src.len());
            for (b, src) in old_src {
                let at = self.resolve_block(f, b, src)?;
                if let Some(pblk) = at {
                    self.m().prefetch_range(PmOff(pblk * BS), BS);
                }
                old.push((b, at));
            }
            let mut hints = Vec::with_capacity(placements.len());
            for (sg, (kind, src)) in segs.iter().zip(placements) {
                let goal = match src {
                    Some(src) => self.resolve_block(f, sg.lblk - 1, src)?.map(|p| p + 1),
                    None => None,
                };
                hints.push(AllocHint {
                    kind,
                    goal: goal.map(BlockNo),
                });
            }
            let mut runs = Runs::new();
            let mut partials: Vec<Partial> = Vec::new();
            let mut stale = false;
            let staged = (|| -> Result<()> {
                // The times go with the data: the fence after the copies makes both durable
                // before the commit.
                if how.times {
                    self.stamp_write_times(n.h.ino, &s)?;
                }
                for (i, sg) in segs.iter().enumerate() {
                    let hint = hints.get(i).copied().unwrap_or_default();
                    let first = runs.len();
                    self.stage(f, sg.lblk, sg.len, hint, &mut runs)?;
                    for r in &runs[first..] {
                        for k in 0..r.len {
                            let b = r.lblk + k;
                            let (bs, be) = (b * BS, b * BS + BS);
                            let nf = sg.from.max(bs).min(be);
                            let nt = sg.to.min(be).max(nf);
                            if sg.partly_writes(b) {
                                partials.push(Partial {
                                    lblk: b,
                                    pblk: r.pblk.0 + k,
                                    new_from: nf,
                                    new_to: nt,
                                });
                            }
                        }
                        // The new bytes of this run.
                        let (rs, re) = (r.lblk * BS, (r.lblk + r.len) * BS);
                        let (a, b) = (sg.from.max(rs), sg.to.min(re));
                        if a < b {
                            let dst = r.pblk.offset() + (a - rs);
                            match sg.data {
                                Some(d) => self.m().write_nt(
                                    dst,
                                    &d[(a - sg.from) as usize..(b - sg.from) as usize],
                                )?,
                                None => self.m().fill_nt(dst, b - a, 0)?,
                            }
                        }
                    }
                }
                for p in &partials {
                    let src = match old.iter().find(|o| o.0 == p.lblk) {
                        Some(&(_, at)) => at,
                        // Not expected (one predicate, `Seg::partly_writes`, picks both), but a
                        // lookup is right too: one at a later LSN than `folded` is only
                        // checked against more entries than it needs.
                        None => {
                            let ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                            self.block_at(Some(&ov), f, p.lblk)?
                        }
                    };
                    // The block the view holds the old bytes in was freed since (another
                    // process's write replaced it, and its digest released it) and staged
                    // again here: the view is stale, plan again.
                    if src == Some(p.pblk) {
                        stale = true;
                        return Ok(());
                    }
                    self.copy_old(src, p, size)?;
                }
                if let Some((p, pblk)) = in_place {
                    self.write_in_tail(&p, pblk)?;
                }
                Ok(())
            })();
            if stale {
                self.unstage(&runs)?;
                continue;
            }
            let entry = Entry::Write {
                runs: runs
                    .iter()
                    .chain(own.iter().map(|(r, _)| r))
                    .copied()
                    .collect(),
                extend_to,
            };
            let staged = staged.and_then(|()| {
                if since.room() < LOG_RESERVE + entry.slots() {
                    s.log.keep_a_spare()?;
                }
                Ok(())
            });
            if let Err(e) = staged {
                self.unstage(&runs)?;
                if matches!(e, Error::NoSpace) && !digested && !how.shared {
                    digested = true;
                    self.digest(n.h.ino, &s, f)?;
                    self.digest_others(n.h.ino)?;
                    self.release_deferred()?;
                    continue;
                }
                return Err(e);
            }
            self.m().fence();
            if let Err(e) = before_commit(&runs) {
                self.unstage(&runs)?;
                return Err(e);
            }
            match self.commit_cow(
                n,
                &s,
                f,
                since,
                folded,
                &entry,
                &partials,
                size,
                how.append,
                hold.is_some(),
            ) {
                Ok(Attempt::Committed { from, lsn }) => {
                    drop(tail.take());
                    if let Some(end) = segs.iter().map(|sg| sg.lblk + sg.len).max() {
                        s.written_to.store(end, Ordering::Relaxed);
                    }
                    if hold.is_some() {
                        self.write_in_place(&own, size)?;
                    }
                    drop(hold);
                    self.reveal_to_kernel(n.h)?;
                    let blocks = runs.iter().map(|r| r.len).sum();
                    let own = Own {
                        from,
                        lsn,
                        entry: &entry,
                    };
                    let when = match (how.lazy, how.shared) {
                        (false, _) => DigestWhen::Now,
                        (true, false) => DigestWhen::Batched(blocks),
                        (true, true) => DigestWhen::ByCaller(blocks),
                    };
                    self.after_commit(n, &s, f, Some(own), when)?;
                    return Ok(Some(size));
                }
                Ok(Attempt::Replan) => {
                    self.unstage(&runs)?;
                    continue;
                }
                Err(e) => {
                    // Nothing was committed: the staged blocks are nobody's.
                    self.unstage(&runs)?;
                    return Err(e);
                }
            }
        }
    }

    /// The commit loop of [`cow_update`](Fs::cow_update). `mapped`: the update was planned in
    /// mapped mode, and must plan again if any newer entry touches one of its blocks; else it
    /// must plan again (in mapped mode) once the file is in mapped mode.
    #[allow(clippy::too_many_arguments)]
    fn commit_cow(
        &self,
        n: &Node,
        s: &Shared,
        f: &MapFile,
        mut since: Position,
        mut folded: u64,
        entry: &Entry,
        partials: &[Partial],
        planned_size: u64,
        append: bool,
        mapped: bool,
    ) -> Result<Attempt> {
        let mut prepared = s.log.prepare(entry)?;
        let Entry::Write { runs: mine, .. } = entry else {
            return Err(Error::InvalidArgument(
                "a copy-on-write commit of a non-write",
            ));
        };
        let mut first = true;
        loop {
            // After the tail was seen (by the caller for the first attempt): a mapper raised
            // the count before committing its barrier entry, which every later commit has seen.
            if !mapped && !std::mem::take(&mut first) && self.maps(n.h.ino)? > 0 {
                return Ok(Attempt::Replan);
            }
            let attempt = match prepared.try_commit(since) {
                Ok(a) => a,
                // Another thread's compaction reclaimed the log blocks `since` points into.
                Err(_) if !s.log.is_current(since) => return Ok(Attempt::Replan),
                Err(e) => return Err(e.into()),
            };
            match attempt {
                Commit::Done(at) => {
                    return Ok(Attempt::Committed {
                        from: since.lsn(),
                        lsn: at.lsn(),
                    });
                }
                Commit::Moved { prepared: p, tail } => {
                    // The entries committed since our copies' view, read from the log: other
                    // threads may have folded the overlay past them meanwhile.
                    let mut truncated = false;
                    let mut clash = false;
                    let mut dirty = vec![false; partials.len()];
                    let mut newer = s.log.iter_from_lsn(folded)?;
                    // Entries compacted away unseen may have changed a partial block or
                    // truncated the file: plan again.
                    if newer.position().lsn() > folded {
                        return Ok(Attempt::Replan);
                    }
                    for item in newer.by_ref() {
                        let (_, e) = item?;
                        truncated |= matches!(e, Entry::Truncate { .. } | Entry::Resize { .. });
                        clash |= mapped && mine.iter().any(|r| touches_range(&e, r.lblk, r.len));
                        for (d, p) in dirty.iter_mut().zip(partials) {
                            *d |= touches(&e, p.lblk);
                        }
                    }
                    if clash {
                        return Ok(Attempt::Replan);
                    }
                    let checked = newer.position().lsn();
                    let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                    // At or past `checked`: the re-copies see at least what was checked.
                    self.catch_up(n.h.ino, s, &mut ov, u64::MAX)?;
                    let size = ov.size(self.digested_size(n.h.ino)?);
                    if truncated || (append && size != planned_size) {
                        return Ok(Attempt::Replan);
                    }
                    for (p, d) in partials.iter().zip(dirty) {
                        if d {
                            self.copy_old(self.block_at(Some(&ov), f, p.lblk)?, p, size)?;
                        }
                    }
                    // Entries after `checked` that the overlay folded are in the copies too,
                    // but were not checked: the next round checks from here.
                    folded = checked;
                    drop(ov);
                    self.m().fence();
                    prepared = p;
                    since = tail;
                }
            }
        }
    }

    /// After a commit: fold it, then digest (as `when` says), maybe compact the log.
    /// `own`: the committed entry, folded without reading the log when the overlay has folded
    /// everything before the log position its commit checked from (an extended entry's
    /// reservation, or padding, may lie between that position and the entry: no entry does).
    pub(super) fn after_commit(
        &self,
        n: &Node,
        s: &Shared,
        f: &MapFile,
        own: Option<Own<'_>>,
        when: DigestWhen,
    ) -> Result<()> {
        {
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            match own {
                Some(o) if ov.next_lsn() >= o.from => ov.apply(o.lsn, o.entry),
                _ => {
                    self.catch_up(n.h.ino, s, &mut ov, u64::MAX)?;
                }
            }
        }
        match when {
            DigestWhen::Now => {}
            DigestWhen::Batched(blocks) | DigestWhen::ByCaller(blocks) => {
                s.pending_entries.fetch_add(1, Ordering::Relaxed);
                s.pending_blocks.fetch_add(blocks, Ordering::Relaxed);
                if matches!(when, DigestWhen::ByCaller(_)) || !s.batch_full() {
                    return Ok(());
                }
            }
        }
        self.digest_committed(n.h.ino, s, f)
    }

    /// Raises mtime and ctime to `now` (never backwards, by CAS: writers of a file race here),
    /// durable after the next fence.
    fn stamp_times(&self, ino: u32, now: u64) -> Result<()> {
        self.raise_times(ino, &[field::MTIME, field::CTIME], now)
    }

    /// Raises the time words `fields` of `ino` to `now` by CAS, never backwards; durable after
    /// the next fence.
    fn raise_times(&self, ino: u32, fields: &[u64], now: u64) -> Result<()> {
        for &f in fields {
            raise_words(self.m(), &[self.inodes.field(ino, f)], now)?;
        }
        Ok(())
    }

    /// [`stamp_times`](Fs::stamp_times) for a write through `s`, with the coarse clock.
    fn stamp_write_times(&self, ino: u32, s: &Shared) -> Result<()> {
        let now = self.now_coarse() as u64;
        if now <= s.stamped.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.stamp_times(ino, now)?;
        s.stamped.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// Stores mtime and ctime durably.
    pub(super) fn touch_times(&self, ino: u32) -> Result<()> {
        self.stamp_times(ino, self.now() as u64)?;
        self.m().fence();
        Ok(())
    }

    /// Raises the ctime of `ino` to now, durably: a change of status that changed nothing
    /// else (see [`Client::chown_unchanged`](crate::Client::chown_unchanged)).
    pub(crate) fn touch_ctime(&self, ino: u32) -> Result<()> {
        self.raise_times(ino, &[field::CTIME], self.now() as u64)?;
        self.m().fence();
        Ok(())
    }

    /// Writes `buf` at `off` (see the module documentation).
    pub fn write_at(&self, n: &Node, buf: &[u8], off: u64) -> Result<usize> {
        self.write_inner(n, buf, Some(off)).map(|_| buf.len())
    }

    /// Appends `buf` at end of file as one atomic update; returns the offset it landed at.
    pub fn append(&self, n: &Node, buf: &[u8]) -> Result<u64> {
        self.write_inner(n, buf, None)
    }

    /// A write ([`write_at`](Fs::write_at), or an append with `at` `None`). On a structure
    /// other than HashFS it holds the file's lock shared, as readers do: writers of a file
    /// stage, copy and commit side by side (as on HashFS, racing on the log's tail and taking
    /// the file's tail to write past the end of file), and only a digest, which changes the
    /// tree, waits for the lock alone. So the digest of a full batch follows the write, under
    /// the lock taken alone ([`digest_if_due`](Fs::digest_if_due)), and a write that finds no
    /// space runs again holding the lock alone, which lets it digest to free the blocks that
    /// undigested writes replaced.
    fn write_inner(&self, n: &Node, buf: &[u8], at: Option<u64>) -> Result<u64> {
        self.writable()?;
        if let Some(off) = at {
            // On the hash tables, the line of the first block is read by the staging (cuckoo's
            // goal lookup, HashFS's slot claim) and the digest: start its miss before the log
            // work (the trees do nothing with the hint).
            self.map.prefetch(self.node_map(n)?, off / BS);
        }
        let shared = self.tree_read_lock(n.h.ino);
        if shared.is_none() {
            return self.write_locked(n, buf, at, false);
        }
        let r = self.write_locked(n, buf, at, true);
        drop(shared);
        match r {
            Err(Error::NoSpace) => {
                let _il = self.tree_write_lock(n.h.ino);
                self.write_locked(n, buf, at, false)
            }
            Ok(landed) => {
                self.digest_if_due(n)?;
                Ok(landed)
            }
            Err(e) => Err(e),
        }
    }

    /// [`write_inner`](Fs::write_inner) under the file's lock, held `shared` (see
    /// [`Update::shared`]) or alone (or, on HashFS, not at all).
    fn write_locked(&self, n: &Node, buf: &[u8], at: Option<u64>, shared: bool) -> Result<u64> {
        if buf.is_empty() {
            return match at {
                Some(o) => Ok(o),
                None => self.size_of(n),
            };
        }
        let len = buf.len() as u64;
        let mut landed = 0;
        // A write that reaches the last block the digested size knows of (an append, most
        // likely) takes the file's tail before it plans: see `Update::tail_first`.
        let tail_first = match at {
            None => true,
            Some(o) => o.saturating_add(len) > self.digested_size(n.h.ino)? / BS * BS,
        };
        let how = Update {
            append: at.is_none(),
            shared,
            tail_first,
            ..Update::WRITE
        };
        self.cow_update(n, how, &mut |fs, ov, f, size| {
            let off = at.unwrap_or(size);
            let end = off
                .checked_add(len)
                .filter(|&e| e <= MAX_FILE_SIZE)
                .ok_or(Error::FileTooLarge)?;
            landed = off;
            let first = off / BS;
            let last = (end - 1) / BS;
            if first > size.div_ceil(BS) {
                fs.mark_holes(n.h.ino)?;
            }
            let mut segs: Segs<'_> = smallvec::smallvec![Seg {
                lblk: first,
                len: last - first + 1,
                from: off,
                to: end,
                data: Some(buf),
            }];
            segs.extend(fs.eof_seg(ov, f, size, first)?);
            Ok(Some((segs, if end > size { end } else { 0 })))
        })?;
        Ok(landed)
    }

    /// The copy of the old last block when the file grows past an unaligned end of file and
    /// the update does not cover that block itself (`cover_from`: its first logical block).
    pub(super) fn eof_seg(
        &self,
        ov: Option<&Overlay>,
        f: &MapFile,
        size: u64,
        cover_from: u64,
    ) -> Result<Option<Seg<'static>>> {
        let eb = size / BS;
        if size.is_multiple_of(BS) || eb >= cover_from || self.block_at(ov, f, eb)?.is_none() {
            return Ok(None);
        }
        Ok(Some(Seg {
            lblk: eb,
            len: 1,
            from: size,
            to: size,
            data: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::layout::BlockNo;
    use pmfs_core::log::Entry;
    use pmfs_core::traits::Run;

    use super::*;

    /// A segment of whole blocks `[lblk, lblk + len)`.
    fn seg(lblk: u64, len: u64) -> Seg<'static> {
        Seg {
            lblk,
            len,
            from: lblk * BS,
            to: (lblk + len) * BS,
            data: None,
        }
    }

    /// An overlay that has logical block 4 at block 900, over a 16-block file.
    fn overlay() -> Overlay {
        let mut ov = Overlay::new(0);
        let runs = [Run {
            lblk: 4,
            pblk: BlockNo(900),
            len: 1,
        }];
        ov.apply(
            0,
            &Entry::Write {
                runs: runs.into_iter().collect(),
                extend_to: 0,
            },
        );
        ov
    }

    const SIZE: u64 = 16 * BS;

    /// No write of this process yet.
    const NONE: u64 = 0;

    #[test]
    fn a_random_overwrite_of_a_dense_file_is_fixed_and_looks_nothing_up() {
        let ov = overlay();
        assert_eq!(
            placement(&ov, &seg(9, 1), SIZE, true, NONE),
            (AllocKind::Fixed, None)
        );
        assert_eq!(
            placement(&ov, &seg(15, 1), SIZE, true, 3),
            (AllocKind::Fixed, None)
        );
    }

    #[test]
    fn an_overwrite_that_continues_a_write_grows_its_fragment() {
        let ov = overlay();
        let after_overlay = placement(&ov, &seg(5, 2), SIZE, true, NONE);
        assert_eq!(after_overlay, (AllocKind::Growing, Some(Src::Mapped(900))));
        let after_latest = placement(&ov, &seg(9, 2), SIZE, true, 9);
        assert_eq!(after_latest, (AllocKind::Growing, Some(Src::Base)));
        let from_start = placement(&ov, &seg(0, 4), SIZE, true, NONE);
        assert_eq!(from_start, (AllocKind::Growing, None));
    }

    #[test]
    fn a_file_with_holes_grows_and_looks_the_block_before_up() {
        let ov = overlay();
        let hole = placement(&ov, &seg(9, 1), SIZE, false, NONE);
        assert_eq!(hole, (AllocKind::Growing, Some(Src::Base)));
    }

    #[test]
    fn a_segment_past_the_end_of_file_grows_and_looks_the_block_before_up() {
        let ov = overlay();
        for (sg, size) in [
            (seg(16, 1), SIZE),
            (seg(15, 2), SIZE),
            (seg(15, 1), SIZE - 1),
        ] {
            let p = placement(&ov, &sg, size, true, NONE);
            assert_eq!(p, (AllocKind::Growing, Some(Src::Base)), "{sg:?} of {size}");
        }
    }
}
