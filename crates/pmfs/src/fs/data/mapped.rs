//! Mapped mode: files whose blocks a process maps straight from the pool, updated in place
//! while any mapping lives, and the kernel's page cache kept coherent with them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::log::{Commit, Entry, HeadWord, MapPinned};
use pmfs_core::pm::Media;
use pmfs_core::traits::{Run, Runs};

use crate::api::ino::Ino;
use crate::error::{Error, Result};
use crate::fs::{Fs, wall_ns};
use crate::inode::{GID_WORD, Handle, field, flag, flags_in};
use crate::mapping::MapFile;
use crate::overlay::Overlay;
use crate::parts::Pm;

use super::{BS, DigestWhen, Fill, Node, Seg, Segs, Shared, Update};

/// Adds one to (`up`) or takes one from the counter word at `at`, by CAS; `from_nonzero`
/// refuses to raise a zero counter (returns false then). A counter never goes below zero.
fn count_step(m: &Pm, at: PmOff, up: bool, from_nonzero: bool) -> Result<bool> {
    let mut cur = m.load_u64(at)?;
    loop {
        let new = match (up, cur) {
            (true, 0) if from_nonzero => return Ok(false),
            (true, c) => c + 1,
            (false, c) => c.saturating_sub(1),
        };
        match m.cas_u64(at, cur, new)? {
            Ok(_) => return Ok(true),
            Err(seen) => cur = seen,
        }
    }
}

/// The [`MapHold`]s this process holds, on any file of any pool: counted before the hold's
/// step of the `MAPS` count and given back after it, so that a process that read a count
/// including a hold of its own, then looks here, sees it (see
/// [`clear_dead_pins`](Fs::clear_dead_pins)).
static MAP_HOLDS_HERE: AtomicU64 = AtomicU64::new(0);

/// Whether a thread of this process holds a share of some file's mapped mode.
pub(in crate::fs) fn map_holds_here() -> bool {
    MAP_HOLDS_HERE.load(Ordering::SeqCst) != 0
}

/// A writer's share of a file's mapped mode (see the module documentation), taken before its
/// snapshot and given back once its bytes are in place.
pub(super) struct MapHold<'f> {
    fs: &'f Fs,
    ino: u32,
}

impl Drop for MapHold<'_> {
    fn drop(&mut self) {
        // A count left behind only keeps the file in mapped mode until the next mount, or
        // until the owner finds every process that could hold it gone.
        let _ = count_step(
            self.fs.media(),
            self.fs.inodes.field(self.ino, field::MAPS),
            false,
            false,
        );
        MAP_HOLDS_HERE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Keeps a file in mapped mode, and its log pinned (so the owner does not free it when it is
/// unlinked), while a process maps its blocks: see `Fs::map_file`. Dropping it gives both
/// back. It touches nothing but those two words of the pool, so a `fork` child that inherited
/// a mapping can take its own ([`MapPin::inherit`]) and drop it without the parent's state.
pub struct MapPin {
    media: Pm,
    maps: PmOff,
    log: PmOff,
    /// How the log counted this pin.
    pinned: MapPinned,
    times: KernelTimes,
    writable: bool,
    /// The request for the kernel's pages of the file, if the client set a hook.
    kernel_pages: Option<KernelPagesRequest>,
}

/// What a data-only client calls, with the file, after an update of a file whose pages the
/// kernel may cache ([`crate::kernel_pages`]).
pub(crate) type DropKernelPages = Arc<dyn Fn(Ino) + Send + Sync>;

impl std::fmt::Debug for MapPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapPin")
            .field("maps", &self.maps)
            .field("log", &self.log)
            .field("writable", &self.writable)
            .finish()
    }
}

impl MapPin {
    /// One more pin on the same file, for a process that inherited the mapping (a `fork`
    /// child).
    ///
    /// # Errors
    /// Media errors, or [`Error::Unsupported`] if the file's log has the most pins it can hold.
    pub fn inherit(&self) -> Result<MapPin> {
        let pinned = pmfs_core::log::pin_mapping(&*self.media, self.log)?;
        count_step(&self.media, self.maps, true, false)?;
        Ok(MapPin {
            media: self.media.clone(),
            maps: self.maps,
            log: self.log,
            pinned,
            times: self.times,
            writable: self.writable,
            kernel_pages: self.kernel_pages.clone(),
        })
    }

    /// This pin, for a mapping that may store into the file (a mapping of a description open
    /// for writing): see [`stored`](Self::stored).
    #[must_use]
    pub fn writable(mut self) -> MapPin {
        self.writable = true;
        self
    }

    /// After stores through a [writable](Self::writable) mapping may have changed the file
    /// (`msync`; dropping the pin does it too): raises its mtime and ctime, as a store into a
    /// mapping raises them on a kernel file system (at its page fault), so that programs that
    /// look for changes by mtime (`make`, `rsync`) see it, and the kernel drops the pages it
    /// may cache of the file, which the stores bypassed (at its next attribute fetch, or
    /// at once through the client's [`on_kernel_pages`](crate::Client::on_kernel_pages)).
    /// Nothing for a pin of a read-only mapping.
    ///
    /// # Errors
    /// Media errors.
    pub fn stored(&self) -> Result<()> {
        if let Some(request) = self.stored_later()? {
            request.send();
        }
        Ok(())
    }

    /// [`stored`](Self::stored), leaving the request that the kernel drop its pages to the
    /// caller, who sends it once it holds no lock (it waits for the owner's answer).
    ///
    /// # Errors
    /// Media errors.
    pub fn stored_later(&self) -> Result<Option<KernelPagesRequest>> {
        if !self.writable {
            return Ok(None);
        }
        self.times.raise(&*self.media, wall_ns())?;
        Ok(match &self.kernel_pages {
            Some(request) if self.times.kernel_cached(&*self.media)? => Some(request.clone()),
            _ => None,
        })
    }
}

/// A request that the kernel drop its pages of a file stores went to
/// ([`MapPin::stored_later`]).
#[derive(Clone)]
pub struct KernelPagesRequest {
    file: Ino,
    drop_pages: DropKernelPages,
}

impl KernelPagesRequest {
    /// Calls the client's [`on_kernel_pages`](crate::Client::on_kernel_pages) hook with the
    /// file.
    pub fn send(self) {
        (self.drop_pages)(self.file);
    }
}

impl std::fmt::Debug for KernelPagesRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelPagesRequest")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl Drop for MapPin {
    fn drop(&mut self) {
        let _ = self.stored();
        // Leftovers only keep the file in mapped mode (and an unlinked one allocated) until
        // the owner's next mount.
        let _ = count_step(&self.media, self.maps, false, false);
        let _ = pmfs_core::log::unpin_mapping(&*self.media, self.log, self.pinned);
    }
}

/// The words of an inode that tell a kernel reader its data changed: the flags, whose
/// [`flag::KERNEL_CACHED`] says the kernel may hold pages of the file (the owner sets it
/// before it reads the file for the kernel), and the mtime and ctime. The kernel keeps its
/// pages while the mtime and size it fetches stay as they were (`FUSE_AUTO_INVAL_DATA`), so
/// an update that bypassed it raises the mtime strictly above the stored one.
#[derive(Clone, Copy, Debug)]
struct KernelTimes {
    flags: PmOff,
    mtime: PmOff,
    ctime: PmOff,
}

impl KernelTimes {
    fn of(fs: &Fs, ino: u32) -> KernelTimes {
        KernelTimes {
            flags: fs.inodes.field(ino, GID_WORD),
            mtime: fs.inodes.field(ino, field::MTIME),
            ctime: fs.inodes.field(ino, field::CTIME),
        }
    }

    /// If the kernel may cache pages of the file, raises mtime and ctime to `now`, or above
    /// the stored mtime if that is not earlier: either the owner's read for the kernel saw
    /// the update, or this sees its flag.
    fn reveal(&self, m: &dyn Media, now: impl FnOnce() -> i64) -> Result<bool> {
        if !self.kernel_cached(m)? {
            return Ok(false);
        }
        self.raise(m, now())?;
        Ok(true)
    }

    /// Whether the kernel may hold pages of the file.
    fn kernel_cached(&self, m: &dyn Media) -> Result<bool> {
        Ok(flags_in(m.load_u64(self.flags)?) & flag::KERNEL_CACHED != 0)
    }

    /// Raises mtime and ctime to `now`, or above the stored mtime if that is not earlier.
    fn raise(&self, m: &dyn Media, now: i64) -> Result<()> {
        let stored = m.load_u64(self.mtime)?;
        raise_words(m, &[self.mtime, self.ctime], (now as u64).max(stored + 1))
    }
}

/// Raises the time words at `words` to `now` by CAS, never backwards (writers of a file race
/// here); durable after the next fence.
pub(super) fn raise_words(m: &dyn Media, words: &[PmOff], now: u64) -> Result<()> {
    for &at in words {
        let mut cur = m.load_u64(at)?;
        while cur < now {
            match m.cas_u64(at, cur, now)? {
                Ok(_) => {
                    m.flush(at, 8)?;
                    break;
                }
                Err(seen) => cur = seen,
            }
        }
    }
    Ok(())
}

impl Fs {
    /// The file's mapped-mode count.
    pub(super) fn maps(&self, ino: u32) -> Result<u64> {
        self.inodes.load(self.m(), ino, field::MAPS)
    }

    /// Whether the log of file `ino` (head word `hw`) is pinned or the file is in mapped mode.
    /// Asked when this process has the file closed, or its log (see
    /// [`look_for_dead_pins`](Fs::look_for_dead_pins)), it tells whether other processes hold
    /// it; what dead ones hold, [`clear_dead_pins`](Fs::clear_dead_pins) clears.
    pub(crate) fn held_by_others(&self, ino: u32, hw: HeadWord) -> Result<bool> {
        Ok(hw.pins() != 0 || self.maps(ino)? != 0)
    }

    /// Joins the file's mapped mode if it is in it (a count taken only from a nonzero one).
    /// The hold exists only once the count was taken: dropping one gives a share back.
    pub(super) fn map_hold(&self, ino: u32) -> Result<Option<MapHold<'_>>> {
        let at = self.inodes.field(ino, field::MAPS);
        MAP_HOLDS_HERE.fetch_add(1, Ordering::SeqCst);
        let held = count_step(self.media(), at, true, true);
        if !matches!(held, Ok(true)) {
            MAP_HOLDS_HERE.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(held?.then(|| MapHold { fs: self, ino }))
    }

    /// Splits the segments of a mapped-mode update: the blocks the file maps now become
    /// `(run, segment)` pairs to write in place (their runs map them to themselves); the holes
    /// stay segments to stage fresh blocks for, unless `holes` is false (then they are left).
    #[allow(clippy::type_complexity)]
    pub(super) fn split_mapped<'b>(
        &self,
        ino: u32,
        ov: Option<&Overlay>,
        f: &MapFile,
        segs: &[Seg<'b>],
        holes: bool,
    ) -> Result<(Segs<'b>, Vec<(Run, Seg<'b>)>)> {
        let sub = |sg: &Seg<'b>, lblk: u64, len: u64| {
            let (lo, hi) = (lblk * BS, (lblk + len) * BS);
            let from = sg.from.clamp(lo, hi);
            let to = sg.to.clamp(from, hi);
            Seg {
                lblk,
                len,
                from,
                to,
                data: sg
                    .data
                    .filter(|_| to > from)
                    .map(|d| &d[(from - sg.from) as usize..(to - sg.from) as usize]),
            }
        };
        let (mut cow, mut own) = (Segs::new(), Vec::new());
        let mut runs = Vec::new();
        for sg in segs {
            runs.clear();
            self.runs_in(ino, ov, f, sg.lblk, sg.len, &mut runs)?;
            let end = sg.lblk + sg.len;
            let mut at = sg.lblk;
            for r in &runs {
                let Some(run) = r.within(at, end) else {
                    continue;
                };
                if run.lblk > at && holes {
                    cow.push(sub(sg, at, run.lblk - at));
                }
                own.push((run, sub(sg, run.lblk, run.len)));
                at = run.lblk + run.len;
            }
            if end > at && holes {
                cow.push(sub(sg, at, end - at));
            }
        }
        Ok((cow, own))
    }

    /// Writes the in-place part of a committed mapped-mode update: each segment's new bytes,
    /// and zeros over the bytes of its blocks at or after `size` (the size it was planned at)
    /// that it does not write. Durable on return.
    pub(super) fn write_in_place(&self, own: &[(Run, Seg<'_>)], size: u64) -> Result<()> {
        let m = self.m();
        for (r, sg) in own {
            let (rs, re) = (r.lblk * BS, (r.lblk + r.len) * BS);
            let at = |o: u64| r.pblk.offset() + (o - rs);
            if sg.from < sg.to {
                match sg.data {
                    Some(d) => m.write_nt(at(sg.from), d)?,
                    None => m.fill_nt(at(sg.from), sg.to - sg.from, 0)?,
                }
            }
            for (a, b) in [(rs, sg.from), (sg.to, re)] {
                let a = a.max(size);
                if a < b {
                    m.fill_nt(at(a), b - a, 0)?;
                }
            }
        }
        m.fence();
        Ok(())
    }

    /// Commits `e` (a truncation or a punch, which unmap blocks) at the tail unless the file
    /// is in mapped mode, checked after the tail was seen; returns whether it committed.
    pub(super) fn commit_unless_mapped(&self, ino: u32, s: &Shared, e: &Entry) -> Result<bool> {
        let mut prepared = s.log.prepare(e)?;
        let mut since = s.log.tail()?;
        loop {
            if self.maps(ino)? > 0 {
                return Ok(false);
            }
            match prepared.try_commit(since)? {
                Commit::Done(_) => return Ok(true),
                Commit::Moved { prepared: p, tail } => {
                    prepared = p;
                    since = tail;
                }
            }
        }
    }

    /// Puts `n`'s file in mapped mode and returns the runs backing its logical blocks
    /// `[lblk, lblk + len)`, with the pin that keeps them the file's: while any pin lives,
    /// every update of the file in any process leaves its mapped blocks where they are (see
    /// the module documentation). With `fill_at_most`, blocks are staged first for every hole
    /// among them (zeroed, the file's times left as they were), and holes that need more than
    /// that many blocks fail the call with [`Error::NoSpace`] before any is filled; without
    /// it, the holes stay holes and have no run (for a mapping that never stores: a write
    /// there later gives the hole a block of its own, in mapped mode as out of it).
    pub fn map_file(
        &self,
        n: &Node,
        lblk: u64,
        len: u64,
        fill_at_most: Option<u64>,
    ) -> Result<(MapPin, Vec<Run>)> {
        self.writable()?;
        let ino = n.h.ino;
        let s = self.shared(n, true)?.ok_or(Error::Corrupt {
            what: "file log",
            at: self.inodes.field(ino, field::LOG),
        })?;
        let maps = self.inodes.field(ino, field::MAPS);
        let root = self.inodes.field(ino, field::LOG);
        let pinned = pmfs_core::log::pin_mapping(self.m(), root)?;
        let pin = MapPin {
            media: self.media().clone(),
            maps,
            log: root,
            pinned,
            times: KernelTimes::of(self, ino),
            writable: false,
            kernel_pages: self.kernel_pages.get().map(|hook| KernelPagesRequest {
                file: Ino::from_raw(n.h.word()),
                drop_pages: hook.clone(),
            }),
        };
        count_step(self.media(), maps, true, false)?;
        // The barrier: every update committed after it saw the count, and so leaves mapped
        // blocks in place; every one before it is in the view below.
        let barrier = Entry::Write {
            runs: Runs::new(),
            extend_to: 0,
        };
        s.log.prepare(&barrier)?.commit()?;
        self.after_commit(n, &s, self.node_map(n)?, None, DigestWhen::Now)?;
        self.zero_past_end(n, &s)?;
        let Some(at_most) = fill_at_most else {
            return Ok((pin, self.data_runs(n, lblk, len)?));
        };
        if len > 0 {
            let holes = Fill::Holes { at_most };
            let quiet = Update {
                times: false,
                ..Update::NOW
            };
            self.fill(n, lblk * BS, len * BS, true, holes, quiet)?;
        }
        let runs = self.data_runs(n, lblk, len)?;
        // Nothing unmaps a block of a file in mapped mode: a hole here is a bug.
        let covered = runs
            .iter()
            .try_fold(lblk, |at, r| (r.lblk == at).then_some(at + r.len));
        if covered != Some(lblk + len) {
            return Err(Error::Corrupt {
                what: "a hole left in a mapped range",
                at: root,
            });
        }
        Ok((pin, runs))
    }

    /// Zeros the bytes past the end of file in its partial last block, for a file just put in
    /// mapped mode. Out of mapped mode nothing reads them (reads stop at the end, growing the
    /// file zeros them) and a truncation leaves them as they were; a mapping shows them, and
    /// must show zeros there, as the kernel's partial last page of a file does. Under the
    /// file's tail, which every update that moves the end or writes that block holds; in
    /// mapped mode updates keep the bytes zero (`write_in_place`, `shrink_mapped`).
    fn zero_past_end(&self, n: &Node, s: &Shared) -> Result<()> {
        let _tail = self.lock_tail(n, s)?;
        let size = self.folded_size(n.h.ino, s)?;
        if size.is_multiple_of(BS) {
            return Ok(());
        }
        // The overlay is caught up to the size's tail; under the tail, in mapped mode, no
        // entry since can have moved the last block.
        let last = {
            let ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.block_at(Some(&ov), self.node_map(n)?, size / BS)?
        };
        if let Some(pblk) = last {
            let m = self.m();
            let tail = size % BS;
            m.fill_nt(BlockNo(pblk).offset() + tail, BS - tail, 0)?;
            m.fence();
        }
        Ok(())
    }

    /// After a data-only client's update of `h` committed (its bytes in place): if the
    /// kernel may hold pages of the file ([`flag::KERNEL_CACHED`]), raises mtime and ctime to
    /// a fine-grained time strictly above the stored mtime, then has the owner make the
    /// kernel drop the pages ([`crate::kernel_pages`]), if the client can reach it. The update
    /// bypassed the kernel, which keeps its pages while the mtime and size it fetches stay as
    /// they were (`FUSE_AUTO_INVAL_DATA`): with the coarse clock of writes, for the rest of a
    /// clock tick, so a process reading through the kernel got the old bytes back, and a
    /// kernel mapping, which fetches nothing, kept them. The owner sets the flag before it
    /// reads for the kernel, and this looks after the commit: either that read saw the
    /// update, or this sees the flag. Nothing for the owner, whose updates go through the
    /// kernel.
    pub(super) fn reveal_to_kernel(&self, h: Handle) -> Result<()> {
        if !self.client || !KernelTimes::of(self, h.ino).reveal(self.m(), || self.now())? {
            return Ok(());
        }
        if let Some(drop_pages) = self.kernel_pages.get() {
            drop_pages(Ino::from_raw(h.word()));
        }
        Ok(())
    }

    /// Before the kernel reads regular file `h` for a process (a copy inside the kernel):
    /// if some process maps it ([`map_file`](Fs::map_file)), stores through the mapping may
    /// have bypassed the kernel's pages: [revealed](Fs::reveal_to_kernel) as an update.
    pub fn reveal_mapped(&self, h: Handle) -> Result<()> {
        if self.maps(h.ino)? == 0 {
            return Ok(());
        }
        self.reveal_to_kernel(h)
    }

    /// The owner's side of [`crate::kernel_pages`]: before it has the kernel drop its pages
    /// of `h`, notes that the kernel caches none ([`flag::KERNEL_CACHED`] cleared). A kernel
    /// read after this sets the flag again, so a client's update after that read asks
    /// again; a read before it ends before the pages are dropped (the kernel locks the pages
    /// it reads into). Nothing for a file that is gone.
    pub fn forget_kernel_pages(&self, h: Handle) -> Result<()> {
        if self.client || self.read_only {
            return Err(Error::Unsupported(
                "dropping kernel pages outside the owner",
            ));
        }
        let _il = self.ilock(h.ino).read().unwrap_or_else(|e| e.into_inner());
        if self.inodes.load(self.m(), h.ino, field::STATE)? != h.live_state() {
            return Ok(());
        }
        self.inodes
            .clear_flags(self.m(), h.ino, flag::KERNEL_CACHED)
    }

    /// Notes that the kernel may cache pages of `ino` ([`flag::KERNEL_CACHED`]): called by the
    /// owner before it reads the file for the kernel.
    pub fn note_kernel_cached(&self, ino: u32) -> Result<()> {
        // Nobody writes a read-only volume's files, so the kernel's pages never go stale.
        if self.client
            || self.read_only
            || self.inodes.flags(self.m(), ino)? & flag::KERNEL_CACHED != 0
        {
            return Ok(());
        }
        // A change of group stores the flags' word whole, under the inode's lock.
        let _il = self.ilock(ino).read().unwrap_or_else(|e| e.into_inner());
        self.inodes.set_flags(self.m(), ino, flag::KERNEL_CACHED)
    }

    /// Shrinks a file in mapped mode to `len` bytes: a `Resize` (the blocks stay), committed at
    /// the tail the size was read at, then zeros in place from `len` to the end of the old last
    /// block, so that growing the file again reads zeros there. Returns false, having done
    /// nothing, if the file left mapped mode, is not longer than `len` or the tail moved.
    pub(super) fn shrink_mapped(&self, n: &Node, s: &Shared, len: u64) -> Result<bool> {
        let ino = n.h.ino;
        let Some(hold) = self.map_hold(ino)? else {
            return Ok(false);
        };
        let f = self.node_map(n)?;
        let since = s.log.tail()?;
        let mut runs = Vec::new();
        let size = {
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.catch_up(ino, s, &mut ov, since.lsn())?;
            let size = ov.size(self.digested_size(ino)?);
            if len < size {
                let first = len / BS;
                self.runs_in(
                    ino,
                    Some(&ov),
                    f,
                    first,
                    size.div_ceil(BS) - first,
                    &mut runs,
                )?;
            }
            size
        };
        if len >= size {
            return Ok(false);
        }
        match s
            .log
            .prepare(&Entry::Resize { size: len })?
            .try_commit(since)?
        {
            Commit::Done(_) => {}
            Commit::Moved { .. } => return Ok(false),
        }
        let m = self.m();
        for r in &runs {
            let (rs, re) = (r.lblk * BS, (r.lblk + r.len) * BS);
            let a = rs.max(len);
            if a < re {
                m.fill_nt(r.pblk.offset() + (a - rs), re - a, 0)?;
            }
        }
        m.fence();
        drop(hold);
        self.reveal_to_kernel(n.h)?;
        self.after_commit(n, s, f, None, DigestWhen::Now)?;
        Ok(true)
    }

    /// A hole punch in mapped mode: `[offset, end)` is zeroed in place, and no block is
    /// unmapped (holes stay holes).
    pub(super) fn zero_mapped(&self, n: &Node, offset: u64, end: u64) -> Result<()> {
        let how = Update {
            holes: false,
            ..Update::NOW
        };
        self.cow_update(n, how, &mut |_, _, _, _| {
            let first = offset / BS;
            Ok(Some((
                smallvec::smallvec![Seg {
                    lblk: first,
                    len: (end - 1) / BS - first + 1,
                    from: offset,
                    to: end,
                    data: None,
                }],
                0,
            )))
        })?;
        self.touch_times(n.h.ino)
    }
}
