//! Size and space changes: `set_len`, `fallocate` (allocation, zeroing) and hole punching.

use pmfs_core::layout::BlockNo;
use pmfs_core::log::Entry;
use pmfs_core::traits::Run;

use crate::error::{Error, Result};
use crate::fs::{Fs, MAX_FILE_SIZE};
use crate::inode::field;

use super::{BS, DigestWhen, Fill, Node, Seg, Segs, Update};

impl Fs {
    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, n: &Node, len: u64) -> Result<()> {
        self.resize(n, len, false)
    }

    /// Truncates the file to 0 for an `open` with `O_TRUNC`, then closes this process's
    /// handle of its log unless something else of the process uses it: the opener is most
    /// likely a data-only client (a program under the library) that writes the file itself,
    /// alone with the log once the owner's handle is closed (see
    /// [`close_log_if_unused`](Fs::close_log_if_unused)); if it writes through the kernel
    /// instead, the owner opens the log again at its first write.
    pub fn truncate_at_open(&self, n: &Node) -> Result<()> {
        self.resize(n, 0, true)
    }

    /// [`set_len`](Fs::set_len), then [`close_log_if_unused`](Fs::close_log_if_unused).
    fn resize(&self, n: &Node, len: u64, close_even_alone: bool) -> Result<()> {
        self.writable()?;
        if len > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        self.set_len_locked(n, len)?;
        self.close_log_if_unused(n, close_even_alone)
    }

    fn set_len_locked(&self, n: &Node, len: u64) -> Result<()> {
        let ino = n.h.ino;
        loop {
            let size = self.size_of(n)?;
            if len == size {
                return self.touch_times(ino);
            }
            if len > size {
                break;
            }
            let s = self.shared(n, true)?.ok_or(Error::Corrupt {
                what: "file log",
                at: self.inodes.field(ino, field::LOG),
            })?;
            let _tail = self.lock_tail(n, &s)?;
            if self.size_of(n)? != size {
                continue;
            }
            self.touch_times(ino)?;
            // Each refuses when the mode changed (or the size moved) under it: look again.
            if self.maps(ino)? > 0 {
                if self.shrink_mapped(n, &s, len)? {
                    return Ok(());
                }
            } else if self.commit_unless_mapped(ino, &s, &Entry::Truncate { size: len })? {
                self.reveal_to_kernel(n.h)?;
                self.after_commit(n, &s, self.node_map(n)?, None, DigestWhen::Now)?;
                return self.restore_log_reserve(&s);
            }
        }
        let grow = Update {
            tail_first: true,
            ..Update::NOW
        };
        self.cow_update(n, grow, &mut |fs, ov, f, size| {
            if len <= size {
                return Ok(None);
            }
            if len.div_ceil(BS) > size.div_ceil(BS) {
                fs.mark_holes(n.h.ino)?;
            }
            let segs: Segs<'_> = fs.eof_seg(ov, f, size, u64::MAX)?.into_iter().collect();
            Ok(Some((segs, len)))
        })?;
        Ok(())
    }

    /// Maps zeroed blocks over every hole of `[offset, offset + len)` and, unless `keep_size`,
    /// makes the file at least `offset + len` long: one atomic update.
    pub fn allocate(&self, n: &Node, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        let holes = Fill::Holes { at_most: u64::MAX };
        self.fill(n, offset, len, keep_size, holes, Update::NOW)
    }

    /// Makes `[offset, offset + len)` read as zeros on allocated blocks and, unless
    /// `keep_size`, the file at least `offset + len` long (`FALLOC_FL_ZERO_RANGE`): one atomic
    /// update, a copy-on-write of zeros over the range (the partial edge blocks keep their
    /// bytes outside it), in place in mapped mode, where holes get fresh zeroed blocks.
    pub fn zero_range(&self, n: &Node, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.fill(n, offset, len, keep_size, Fill::Zeros, Update::NOW)?;
        self.touch_times(n.h.ino)
    }

    /// [`allocate`](Fs::allocate) or [`zero_range`](Fs::zero_range), as `what` says, as one
    /// update run as `how` says.
    pub(super) fn fill(
        &self,
        n: &Node,
        offset: u64,
        len: u64,
        keep_size: bool,
        what: Fill,
        how: Update,
    ) -> Result<()> {
        self.writable()?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooLarge)?;
        if len == 0 {
            return Ok(());
        }
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let first = offset / BS;
        let last = end.div_ceil(BS);
        self.cow_update(n, how, &mut |fs, ov, f, size| {
            let mut segs = Segs::new();
            match what {
                Fill::Zeros => segs.push(Seg {
                    lblk: first,
                    len: last - first,
                    from: offset,
                    to: end,
                    data: None,
                }),
                Fill::Holes { at_most } => {
                    let mut runs = Vec::new();
                    fs.runs_in(n.h.ino, ov, f, first, last - first, &mut runs)?;
                    let mut cursor = first;
                    for r in runs.iter().chain([&Run {
                        lblk: last,
                        pblk: BlockNo(0),
                        len: 0,
                    }]) {
                        if r.lblk > cursor {
                            segs.push(Seg {
                                lblk: cursor,
                                len: r.lblk - cursor,
                                from: cursor * BS,
                                to: r.lblk * BS,
                                data: None,
                            });
                        }
                        cursor = cursor.max(r.lblk + r.len);
                    }
                    if segs.iter().map(|s| s.len).sum::<u64>() > at_most {
                        return Err(Error::NoSpace);
                    }
                }
            }
            let grow = !keep_size && end > size;
            if grow && first > size.div_ceil(BS) {
                fs.mark_holes(n.h.ino)?;
            }
            if grow {
                segs.extend(
                    fs.eof_seg(ov, f, size, u64::MAX)?
                        .filter(|e| !segs.iter().any(|s| s.covers(e.lblk))),
                );
            }
            if segs.is_empty() && !grow {
                return Ok(None);
            }
            Ok(Some((segs, if grow { end } else { 0 })))
        })?;
        Ok(())
    }

    /// Deallocates `[offset, offset + len)` clamped to the file: the range reads as zeros,
    /// the size does not change. The partial edge blocks are copied with the range zeroed
    /// (one update), then the whole blocks are punched (a second one).
    pub fn punch_hole(&self, n: &Node, offset: u64, len: u64) -> Result<()> {
        self.writable()?;
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let size = self.size_of(n)?;
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(());
        }
        if self.maps(n.h.ino)? > 0 {
            return self.zero_mapped(n, offset, end);
        }
        let whole_from = offset.div_ceil(BS);
        let whole_to = end / BS;
        if whole_to > whole_from {
            self.mark_holes(n.h.ino)?;
        }
        // With both an edge copy and whole blocks, the punch takes two log updates: a journal
        // cleanup armed before the first finishes the second after a crash between them.
        let mut tx: Option<crate::journal::Tx<'_>> = None;
        let mut arm = |runs: &[Run]| -> Result<()> {
            // The journal's slots are locked in the owner's DRAM: a data-only client does not
            // use them (see `Volume::attach`).
            if whole_to <= whole_from || self.client {
                return Ok(());
            }
            if let Some(old) = tx.take() {
                old.finish(self.m())?;
            }
            let Some(r) = runs.first() else {
                return Ok(());
            };
            let mut t = self.journal.begin()?;
            t.cleanup(crate::journal::Cleanup::PunchIf {
                inode: n.h,
                from: whole_from,
                len: whole_to - whole_from,
                edge: r.lblk,
                pblk: r.pblk.0,
            });
            t.arm(self.m())?;
            tx = Some(t);
            Ok(())
        };
        let edges = self.cow_update_with(
            n,
            Update::NOW,
            &mut |fs, ov, f, _| {
                let mut segs = Segs::new();
                let mut edge = |b: u64| -> Result<()> {
                    let (bs, be) = (b * BS, b * BS + BS);
                    let (a, z) = (offset.max(bs), end.min(be));
                    if a < z && (a > bs || z < be) && fs.block_at(ov, f, b)?.is_some() {
                        segs.push(Seg {
                            lblk: b,
                            len: 1,
                            from: a,
                            to: z,
                            data: None,
                        });
                    }
                    Ok(())
                };
                edge(offset / BS)?;
                if (end - 1) / BS != offset / BS {
                    edge((end - 1) / BS)?;
                }
                Ok((!segs.is_empty()).then_some((segs, 0)))
            },
            &mut arm,
        );
        // The cleanup stays armed until the whole punch is done or failed: retired then.
        let punched = edges.and_then(|_| {
            if whole_to <= whole_from {
                return self.touch_times(n.h.ino);
            }
            let s = self.shared(n, true)?.ok_or(Error::Corrupt {
                what: "file log",
                at: self.inodes.field(n.h.ino, field::LOG),
            })?;
            self.touch_times(n.h.ino)?;
            let punch = Entry::Punch {
                lblk: whole_from,
                len: whole_to - whole_from,
            };
            if self.commit_unless_mapped(n.h.ino, &s, &punch)? {
                self.reveal_to_kernel(n.h)?;
                self.after_commit(n, &s, self.node_map(n)?, None, DigestWhen::Now)?;
                self.restore_log_reserve(&s)
            } else {
                self.zero_mapped(n, whole_from * BS, whole_to * BS)
            }
        });
        let retired = tx.map_or(Ok(()), |t| t.finish(self.m()));
        punched.and(retired)
    }
}
