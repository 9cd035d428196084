//! The simplest correct [`FileMapping`]: a volatile `BTreeMap` from (inode, logical block) to
//! physical block, taking data blocks from a [`BlockAllocator`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{AllocHint, BlockAllocator, Extent, FileId, FileMapping, MappingKind, Run};
use crate::error::{Error, Result};

/// A DRAM-only mapping for tests of the parts above the mapping layer.
///
/// It is not persistent: [`recover`](FileMapping::recover) has nothing to do and a new
/// instance starts empty. It reports [`MappingKind::Extent`] as its kind because it behaves
/// like a per-file structure that draws blocks from an allocator.
#[derive(Debug)]
pub struct SimpleMapping<A> {
    alloc: Arc<A>,
    map: Mutex<BTreeMap<(u64, u64), u64>>,
}

/// The DRAM handle of a file in a [`SimpleMapping`].
#[derive(Debug, Clone, Copy)]
pub struct SimpleFile {
    ino: u64,
}

impl<A: BlockAllocator> SimpleMapping<A> {
    /// An empty mapping drawing blocks from `alloc`.
    pub fn new(alloc: Arc<A>) -> Self {
        Self {
            alloc,
            map: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, u64), u64>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn push_block(out: &mut Vec<Run>, lblk: u64, pblk: u64) {
    if let Some(last) = out.last_mut()
        && last.lblk + last.len == lblk
        && last.pblk.0 + last.len == pblk
    {
        last.len += 1;
        return;
    }
    out.push(Run {
        lblk,
        pblk: crate::layout::BlockNo(pblk),
        len: 1,
    });
}

/// Refuses a range of `ino` that has a mapped block.
fn check_unmapped(map: &BTreeMap<(u64, u64), u64>, ino: u64, lblk: u64, end: u64) -> Result<()> {
    if map.range((ino, lblk)..(ino, end)).next().is_some() {
        return Err(Error::InvalidArgument("insert over mapped blocks"));
    }
    Ok(())
}

/// Maps every block of `run` for `ino` (the range was checked to be unmapped).
fn map_run(map: &mut BTreeMap<(u64, u64), u64>, ino: u64, run: Run) {
    for i in 0..run.len {
        map.insert((ino, run.lblk + i), run.pblk.0 + i);
    }
}

impl<A: BlockAllocator> FileMapping for SimpleMapping<A> {
    type File = SimpleFile;

    fn kind(&self) -> MappingKind {
        MappingKind::Extent
    }

    fn open_file(&self, id: FileId) -> Result<SimpleFile> {
        Ok(SimpleFile { ino: id.ino })
    }

    fn lookup(&self, file: &SimpleFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let end = lblk.saturating_add(len);
        let first = out.len();
        for (&(_, l), &p) in self.lock().range((file.ino, lblk)..(file.ino, end)) {
            if out.len() == first {
                out.push(Run {
                    lblk: l,
                    pblk: crate::layout::BlockNo(p),
                    len: 1,
                });
            } else {
                push_block(out, l, p);
            }
        }
        Ok(())
    }

    fn insert(&self, file: &SimpleFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let end = lblk
            .checked_add(len)
            .ok_or(Error::InvalidArgument("logical range overflows"))?;
        let mut map = self.lock();
        check_unmapped(&map, file.ino, lblk, end)?;
        let mut runs: Vec<Run> = Vec::new();
        let mut done = 0;
        while done < len {
            let hint = AllocHint {
                goal: runs.last().map(|r| r.extent().end()),
                ..AllocHint::default()
            };
            match self.alloc.alloc(len - done, hint) {
                Ok(e) => {
                    runs.push(Run {
                        lblk: lblk + done,
                        pblk: e.start,
                        len: e.len,
                    });
                    done += e.len;
                }
                Err(err) => {
                    for r in runs {
                        self.alloc.free(r.extent())?;
                    }
                    return Err(err);
                }
            }
        }
        for r in runs {
            map_run(&mut map, file.ino, r);
            out.push(r);
        }
        Ok(())
    }

    fn insert_at(&self, file: &SimpleFile, run: Run) -> Result<()> {
        let end = run
            .lblk
            .checked_add(run.len)
            .ok_or(Error::InvalidArgument("logical range overflows"))?;
        if run.len == 0 {
            return Ok(());
        }
        if run.pblk.0.checked_add(run.len).is_none() {
            return Err(Error::InvalidArgument("physical range overflows"));
        }
        let mut map = self.lock();
        check_unmapped(&map, file.ino, run.lblk, end)?;
        map_run(&mut map, file.ino, run);
        Ok(())
    }

    fn remove(&self, file: &SimpleFile, lblk: u64, len: u64) -> Result<u64> {
        let end = lblk.saturating_add(len);
        let mut map = self.lock();
        let keys: Vec<(u64, u64)> = map
            .range((file.ino, lblk)..(file.ino, end))
            .map(|(&k, _)| k)
            .collect();
        for k in &keys {
            if let Some(p) = map.remove(k) {
                self.alloc.free(Extent::new(crate::layout::BlockNo(p), 1))?;
            }
        }
        Ok(keys.len() as u64)
    }

    fn remove_file(&self, file: &SimpleFile) -> Result<()> {
        self.remove(file, 0, u64::MAX).map(drop)
    }

    fn owned_blocks(&self, file: &SimpleFile, visit: &mut dyn FnMut(Extent)) -> Result<()> {
        let mut runs = Vec::new();
        self.lookup(file, 0, u64::MAX, &mut runs)?;
        runs.iter().for_each(|r| visit(r.extent()));
        Ok(())
    }

    fn recover(&self) -> Result<()> {
        Ok(())
    }
}
