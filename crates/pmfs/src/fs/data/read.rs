//! The read path: optimistic reads against the log tail, and the lookups of a file's blocks
//! through the overlay and the mapping that reads and writes share.

use pmfs_core::layout::BlockNo;
use pmfs_core::traits::Run;

use crate::error::Result;
use crate::fs::Fs;
use crate::mapping::MapFile;
use crate::overlay::{Overlay, Src};

use super::{BS, Node, PIECES, RUNS, Shared, overlay_pieces, overlay_src};

/// How many runs ahead of the one it copies a read hints into the cache (see
/// [`Fs::prefetch_run`]).
const PREFETCH_RUNS: usize = 4;

/// Bytes at the start of a run that a read hints (one block; see [`Fs::prefetch_run`]).
const PREFETCH_BYTES: u64 = 4096;

/// Ranges of at least this many blocks are looked up below the mapping's bound only
/// ([`Fs::runs_in`]); shorter ones, the writes' and most seeks', skip the load of the bound.
const BOUNDED_FROM: u64 = 64;

impl Fs {
    /// Where logical block `lblk` lives now: `None` for a hole.
    pub(super) fn block_at(
        &self,
        ov: Option<&Overlay>,
        f: &MapFile,
        lblk: u64,
    ) -> Result<Option<u64>> {
        let src = ov.map_or(Src::Base, |ov| overlay_src(ov, lblk));
        self.resolve_block(f, lblk, src)
    }

    /// Where logical block `lblk`, which the overlay has as `src` ([`overlay_src`]), lives:
    /// the overlay's block, or the mapping's (see [`resolve_pieces`](Fs::resolve_pieces)).
    pub(super) fn resolve_block(&self, f: &MapFile, lblk: u64, src: Src) -> Result<Option<u64>> {
        match src {
            Src::Mapped(b) => return Ok(Some(b)),
            Src::Hole => return Ok(None),
            Src::Base => {}
        }
        let mut runs = RUNS.take();
        runs.clear();
        let found = self.map.lookup(f, lblk, 1, &mut runs);
        let at = runs.first().map(|r| r.pblk.0 + (lblk - r.lblk));
        RUNS.set(runs);
        found.map(|()| at)
    }

    /// The mapped runs of `[lblk, lblk + len)` of file `ino` through the overlay and the
    /// mapping, in logical order. The mapping is looked up below its
    /// [bound](Fs::mapped_bound) only, for ranges of [`BOUNDED_FROM`] blocks or more: a
    /// `SEEK_DATA` through a terabyte of sparse file looks up the blocks the file may map,
    /// not every block of its size.
    pub(super) fn runs_in(
        &self,
        ino: u32,
        ov: Option<&Overlay>,
        f: &MapFile,
        lblk: u64,
        len: u64,
        out: &mut Vec<Run>,
    ) -> Result<()> {
        let bound = if len >= BOUNDED_FROM {
            self.mapped_bound(ino)?
        } else {
            u64::MAX
        };
        let mut pieces = PIECES.take();
        overlay_pieces(ov, lblk, len, &mut pieces);
        let r = self.resolve_pieces(f, &pieces, bound, out);
        PIECES.set(pieces);
        r
    }

    /// The runs of `pieces` ([`overlay_pieces`]), in logical order: the overlay's blocks as
    /// they are, the mapping's looked up below `bound`. The lookups need no overlay: a digest
    /// that changed the mapping since the pieces were taken applied only entries the overlay
    /// had (whose blocks no piece of the mapping's covers) or later ones, which a caller that
    /// checks the log's tail afterwards sees.
    fn resolve_pieces(
        &self,
        f: &MapFile,
        pieces: &[crate::overlay::Piece],
        bound: u64,
        out: &mut Vec<Run>,
    ) -> Result<()> {
        for &p in pieces {
            match p.src {
                Src::Mapped(b) => out.push(Run {
                    lblk: p.lblk,
                    pblk: BlockNo(b),
                    len: p.len,
                }),
                Src::Hole => {}
                Src::Base => {
                    let len = p.len.min(bound.saturating_sub(p.lblk));
                    if len == 0 {
                        continue;
                    }
                    let from = out.len();
                    self.map.lookup(f, p.lblk, len, out)?;
                    out[from..].sort_unstable_by_key(|r| r.lblk);
                }
            }
        }
        Ok(())
    }

    /// `look(overlay, mapping)` on `n`'s overlay caught up to the log's tail, again until the
    /// tail did not move meanwhile (without a live log, once with no overlay): the answer is
    /// the file as it was at that tail.
    fn at_tail<R>(
        &self,
        n: &Node,
        mut look: impl FnMut(Option<&Overlay>, &MapFile) -> Result<R>,
    ) -> Result<R> {
        let f = self.node_map(n)?;
        let Some(s) = self.shared(n, false)? else {
            return look(None, f);
        };
        loop {
            let t0 = s.log.tail()?.lsn();
            let found = {
                let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                self.catch_up(n.h.ino, &s, &mut ov, t0)?;
                look(Some(&ov), f)?
            };
            if s.log.tail()?.lsn() == t0 {
                return Ok(found);
            }
        }
    }

    /// The mapped runs of `n`'s logical blocks `[lblk, lblk + len)`, in order.
    pub fn data_runs(&self, n: &Node, lblk: u64, len: u64) -> Result<Vec<Run>> {
        self.at_tail(n, |ov, f| {
            let mut out = Vec::new();
            self.runs_in(n.h.ino, ov, f, lblk, len, &mut out)?;
            Ok(out)
        })
    }

    /// The first block of `[lblk, lblk + len)` of `n` that holds data (`SEEK_DATA`).
    pub fn first_data(&self, n: &Node, lblk: u64, len: u64) -> Result<Option<u64>> {
        self.at_tail(n, |ov, f| self.first_data_in(n.h.ino, ov, f, lblk, len))
    }

    /// [`first_data`](Fs::first_data) through the overlay `ov`: its pieces in order, each
    /// block the overlay maps as it is, the mapping's below its [bound](Fs::mapped_bound)
    /// found by [`first_mapped`](pmfs_core::traits::FileMapping::first_mapped).
    fn first_data_in(
        &self,
        ino: u32,
        ov: Option<&Overlay>,
        f: &MapFile,
        lblk: u64,
        len: u64,
    ) -> Result<Option<u64>> {
        let bound = self.mapped_bound(ino)?;
        let mut pieces = PIECES.take();
        overlay_pieces(ov, lblk, len, &mut pieces);
        let mut found = Ok(None);
        for p in &pieces {
            found = match p.src {
                Src::Mapped(_) => Ok(Some(p.lblk)),
                Src::Hole => continue,
                Src::Base => match p.len.min(bound.saturating_sub(p.lblk)) {
                    0 => continue,
                    len => self.map.first_mapped(f, p.lblk, len),
                },
            };
            if !matches!(found, Ok(None)) {
                break;
            }
        }
        PIECES.set(pieces);
        found
    }

    /// Reads at `off`; returns the bytes read (0 at or past end of file).
    pub fn read_at(&self, n: &Node, buf: &mut [u8], off: u64) -> Result<usize> {
        let _il = self.tree_read_lock(n.h.ino);
        let f = self.node_map(n)?;
        // The first block's lookup misses on the hash tables: start it before the log work.
        self.map.prefetch(f, off / BS);
        let s = self.shared(n, false)?;
        let (mut runs, mut pieces) = (RUNS.take(), PIECES.take());
        let r = self.read_runs(n, f, s.as_deref(), buf, off, &mut runs, &mut pieces);
        RUNS.set(runs);
        PIECES.set(pieces);
        r
    }

    /// [`read_at`](Fs::read_at) with `runs` for the runs it reads and `pieces` for the
    /// overlay's pieces of them. The overlay's lock covers the catch-up, the size and the
    /// pieces, not the mapping's lookups: two readers of a file, or a reader and a writer,
    /// look up its tree side by side.
    #[allow(clippy::too_many_arguments)]
    fn read_runs(
        &self,
        n: &Node,
        f: &MapFile,
        s: Option<&Shared>,
        buf: &mut [u8],
        off: u64,
        runs: &mut Vec<Run>,
        pieces: &mut Vec<crate::overlay::Piece>,
    ) -> Result<usize> {
        loop {
            let t0 = match &s {
                Some(s) => Some(s.log.tail()?.lsn()),
                None => None,
            };
            runs.clear();
            let size = {
                let mut guard = match &s {
                    Some(s) => {
                        let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                        self.catch_up(n.h.ino, s, &mut ov, t0.unwrap_or(u64::MAX))?;
                        Some(ov)
                    }
                    None => None,
                };
                let ov = guard.as_deref_mut().map(|o| &*o);
                let size = match ov {
                    Some(o) => o.size(self.digested_size(n.h.ino)?),
                    None => self.digested_size(n.h.ino)?,
                };
                if off < size && !buf.is_empty() {
                    let end = off + (buf.len() as u64).min(size - off);
                    let first = off / BS;
                    let last = (end - 1) / BS;
                    overlay_pieces(ov, first, last - first + 1, pieces);
                }
                size
            };
            if off >= size || buf.is_empty() {
                return Ok(0);
            }
            self.resolve_pieces(f, pieces, u64::MAX, runs)?;
            let len = (buf.len() as u64).min(size - off);
            let end = off + len;
            let out = &mut buf[..len as usize];
            // Holes read as zeros: only the bytes no run covers are zeroed.
            let mut filled = off;
            for ahead in runs.iter().take(PREFETCH_RUNS) {
                self.prefetch_run(ahead, off, end);
            }
            for (i, r) in runs.iter().enumerate() {
                if let Some(ahead) = runs.get(i + PREFETCH_RUNS) {
                    self.prefetch_run(ahead, off, end);
                }
                let rs = r.lblk * BS;
                let re = (r.lblk + r.len) * BS;
                let a = rs.max(off);
                let e = re.min(end);
                if a < e {
                    if a > filled {
                        out[(filled - off) as usize..(a - off) as usize].fill(0);
                    }
                    let phys = r.pblk.offset() + (a - rs);
                    self.m()
                        .read(phys, &mut out[(a - off) as usize..(e - off) as usize])?;
                    filled = filled.max(e);
                }
            }
            out[(filled - off) as usize..].fill(0);
            match (&s, t0) {
                (Some(s), Some(t0)) if s.log.tail()?.lsn() != t0 => continue,
                _ => return Ok(len as usize),
            }
        }
    }

    /// Hints the first [`PREFETCH_BYTES`] of `r` that a read of `[off, end)` copies: the runs
    /// of a HashFS file lie anywhere in the pool, and the hardware prefetcher does not follow
    /// a copy from one block into another. A read hints its first [`PREFETCH_RUNS`] runs,
    /// then, before copying run `i`, run `i + PREFETCH_RUNS`: each run once, four runs
    /// ahead. Hinting every run again before each copy (each so three times) filled the
    /// core's queue of misses with hints that were already in flight, and so did hinting
    /// whole blocks that way; hinted once, a whole block is best. 1 MiB HashFS reads in
    /// `data_fig6`, three alternated rounds on huge pages: 106-116 µs hinting the first 512
    /// bytes of the next three runs before every copy, 92-98 µs hinting 512 bytes once,
    /// 75-85 µs hinting the whole block once (four runs ahead each time).
    fn prefetch_run(&self, r: &Run, off: u64, end: u64) {
        let a = (r.lblk * BS).max(off);
        let e = ((r.lblk + r.len) * BS).min(end).min(a + PREFETCH_BYTES);
        if a < e {
            self.m()
                .prefetch_range(r.pblk.offset() + (a - r.lblk * BS), e - a);
        }
    }
}
