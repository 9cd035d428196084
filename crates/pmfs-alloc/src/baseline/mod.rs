//! The baseline: a classic free-extent allocator over a persistent bitmap.
//!
//! This is the allocator the HashFS paper measured its mappings against (Strata's: "a
//! persistent bitmap, a volatile free-list maintained as a red-black tree, and a mutex", §4),
//! and the stand-in for ext4-DAX in the CFFS tables. Free space lives in DRAM as an ordered map
//! of free extents (start -> length, with a size index); the truth on media is a
//! [`PersistentBitmap`] with one bit per block, from which the map is rebuilt at
//! [`open`](FreeExtentAllocator::open).
//!
//! # Policy
//! 1. *Goal*: if the hint's goal block is free, the allocation starts there and takes as much
//!    of the free extent as wanted (a file append stays contiguous when it can).
//! 2. *Next fit*: else the first free extent of at least `want` blocks at or after the goal (or
//!    the start of the range), wrapping around.
//! 3. *Largest*: else the largest free extent, whole.
//!
//! The hint's kind is ignored: the baseline has no notion of growing or fixed files, which is
//! exactly what the CFFS comparison is about.
//!
//! # Durability
//! An allocation or free updates the bitmap (crash-atomically, see [`bitmap`]) before the DRAM
//! map, under the allocator's mutex, and is durable when the call returns. An owner that
//! rebuilds the allocator after a crash and trusts the bitmap only after a clean close can
//! choose [`Durability::AtSync`] ([`with_durability`](FreeExtentAllocator::with_durability)):
//! calls then only store the bitmap's words, and [`sync`](BlockAllocator::sync) flushes them
//! with one fence, which saves a flush and a fence (three of each for an update spanning
//! several words) per call.

pub mod bitmap;

use std::sync::{Mutex, MutexGuard};

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::Media;
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent};
use pmfs_core::{Error, Result};

pub use bitmap::{Durability, PersistentBitmap, bitmap_area_size};

use crate::runs::RunSet;

#[derive(Debug)]
struct State<M> {
    free: RunSet,
    bitmap: PersistentBitmap<M>,
}

/// The baseline free-extent allocator (see the module documentation).
#[derive(Debug)]
pub struct FreeExtentAllocator<M> {
    first: u64,
    count: u64,
    state: Mutex<State<M>>,
}

impl<M: Media> FreeExtentAllocator<M> {
    /// Formats an empty bitmap for the blocks of `managed` at `area` of `media` (which needs
    /// [`bitmap_area_size`]`(managed.len)` bytes, 64-byte aligned) and returns an allocator
    /// with every block free.
    pub fn format(media: M, area: PmOff, managed: Extent) -> Result<Self> {
        let bitmap = PersistentBitmap::format(media, area, managed.start.0, managed.len)?;
        let mut free = RunSet::new();
        if managed.len > 0 {
            free.insert(managed.start.0, managed.len);
        }
        Ok(Self {
            first: managed.start.0,
            count: managed.len,
            state: Mutex::new(State { free, bitmap }),
        })
    }

    /// Opens the bitmap at `area` (recovering from a crash in the middle of an update) and
    /// rebuilds the free-extent map from it.
    ///
    /// Returns [`Error::Corrupt`] if the bitmap is damaged.
    pub fn open(media: M, area: PmOff) -> Result<Self> {
        let (bitmap, words) = PersistentBitmap::open(media, area)?;
        let (first, count) = (bitmap.first(), bitmap.count());
        let mut free = RunSet::new();
        let mut run_start = None;
        for i in 0..count {
            let used = words[(i / 64) as usize] >> (i % 64) & 1 == 1;
            match (used, run_start) {
                (false, None) => run_start = Some(i),
                (true, Some(s)) => {
                    free.insert(first + s, i - s);
                    run_start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = run_start {
            free.insert(first + s, count - s);
        }
        Ok(Self {
            first,
            count,
            state: Mutex::new(State { free, bitmap }),
        })
    }

    /// The allocator with its changes reaching the media as `durability` says; leaving
    /// [`Durability::AtSync`] syncs first.
    pub fn with_durability(mut self, durability: Durability) -> Result<Self> {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        st.bitmap.set_durability(durability)?;
        Ok(self)
    }

    /// The managed range.
    pub fn managed(&self) -> Extent {
        Extent::new(BlockNo(self.first), self.count)
    }

    /// The allocated extents (maximal runs of allocated blocks), in address order.
    pub fn used_extents(&self) -> Vec<Extent> {
        let st = self.lock();
        let mut out = Vec::new();
        let mut cursor = self.first;
        for (s, l) in st.free.iter() {
            if s > cursor {
                out.push(Extent::new(BlockNo(cursor), s - cursor));
            }
            cursor = s + l;
        }
        if cursor < self.first + self.count {
            out.push(Extent::new(
                BlockNo(cursor),
                self.first + self.count - cursor,
            ));
        }
        out
    }

    /// Number of free extents (the free-space fragmentation the allocator sees).
    pub fn free_extent_count(&self) -> usize {
        self.lock().free.count()
    }

    fn lock(&self) -> MutexGuard<'_, State<M>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn in_range(&self, ext: Extent) -> bool {
        ext.len > 0
            && ext.start.0 >= self.first
            && ext
                .start
                .0
                .checked_add(ext.len)
                .is_some_and(|e| e <= self.first + self.count)
    }
}

/// Picks `[start, start + len)` from `free` by the baseline policy.
fn choose(free: &RunSet, first: u64, want: u64, hint: AllocHint) -> Option<(u64, u64)> {
    if let Some(g) = hint.goal
        && let Some((s, l)) = free.containing(g.0)
    {
        return Some((g.0, want.min(s + l - g.0)));
    }
    let from = hint.goal.map_or(first, |g| g.0);
    if let Some((s, _)) = free.next_fit(from, want) {
        return Some((s, want));
    }
    free.largest()
}

impl<M: Media> BlockAllocator for FreeExtentAllocator<M> {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        if want == 0 {
            return Err(Error::InvalidArgument("allocation of zero blocks"));
        }
        let mut st = self.lock();
        let (s, l) = choose(&st.free, self.first, want, hint).ok_or(Error::NoSpace)?;
        st.bitmap.set_range(s, l, true)?;
        st.free.remove(s, l);
        Ok(Extent::new(BlockNo(s), l))
    }

    fn free(&self, ext: Extent) -> Result<()> {
        if !self.in_range(ext) {
            return Err(Error::InvalidArgument(
                "free of blocks outside the managed range",
            ));
        }
        let mut st = self.lock();
        if st.free.overlaps(ext.start.0, ext.len) {
            return Err(Error::InvalidArgument(
                "free of blocks that are not allocated",
            ));
        }
        st.bitmap.set_range(ext.start.0, ext.len, false)?;
        st.free.insert(ext.start.0, ext.len);
        Ok(())
    }

    fn free_blocks(&self) -> u64 {
        self.lock().free.total()
    }

    fn total_blocks(&self) -> u64 {
        self.count
    }

    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        let mut sorted: Vec<Extent> = used.collect();
        sorted.sort();
        let end = self.first + self.count;
        let mut words = vec![0u64; self.count.div_ceil(64) as usize];
        let mut free = RunSet::new();
        let mut cursor = self.first;
        for e in &sorted {
            if !self.in_range(*e) || e.start.0 < cursor {
                return Err(Error::Corrupt {
                    what: "used extent list",
                    at: e.start.checked_offset().unwrap_or_default(),
                });
            }
            if e.start.0 > cursor {
                free.insert(cursor, e.start.0 - cursor);
            }
            for b in e.start.0 - self.first..e.end().0 - self.first {
                words[(b / 64) as usize] |= 1 << (b % 64);
            }
            cursor = e.end().0;
        }
        if cursor < end {
            free.insert(cursor, end - cursor);
        }
        let mut st = self.lock();
        st.bitmap.rewrite(&words)?;
        st.free = free;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.lock().bitmap.sync()
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::pm::HeapRegion;

    use super::*;

    fn fresh(first: u64, count: u64) -> FreeExtentAllocator<HeapRegion> {
        let region = HeapRegion::new(bitmap_area_size(count).max(64)).unwrap();
        FreeExtentAllocator::format(region, PmOff(0), Extent::new(BlockNo(first), count)).unwrap()
    }

    #[test]
    fn goal_then_next_fit_then_largest() {
        let a = fresh(0, 100);
        let x = a.alloc(10, AllocHint::default()).unwrap();
        assert_eq!(x, Extent::new(BlockNo(0), 10));
        let hint = AllocHint {
            goal: Some(x.end()),
            ..AllocHint::default()
        };
        assert_eq!(a.alloc(5, hint).unwrap(), Extent::new(BlockNo(10), 5));
        // The goal is taken: next fit from it.
        let y = a.alloc(
            5,
            AllocHint {
                goal: Some(BlockNo(12)),
                ..AllocHint::default()
            },
        );
        assert_eq!(y.unwrap(), Extent::new(BlockNo(15), 5));
        a.free(Extent::new(BlockNo(2), 3)).unwrap();
        // Nothing of 200 blocks: the largest free extent, whole.
        assert_eq!(
            a.alloc(200, AllocHint::default()).unwrap(),
            Extent::new(BlockNo(20), 80)
        );
        assert_eq!(
            a.alloc(9, AllocHint::default()).unwrap(),
            Extent::new(BlockNo(2), 3)
        );
        assert!(matches!(
            a.alloc(1, AllocHint::default()),
            Err(Error::NoSpace)
        ));
    }

    #[test]
    fn reopen_rebuilds_the_map_from_the_bitmap() {
        let region = HeapRegion::new(4096).unwrap();
        let managed = Extent::new(BlockNo(500), 1000);
        let a = FreeExtentAllocator::format(&region, PmOff(64), managed).unwrap();
        let e1 = a.alloc(300, AllocHint::default()).unwrap();
        let e2 = a.alloc(7, AllocHint::metadata()).unwrap();
        a.free(Extent::new(BlockNo(e1.start.0 + 100), 50)).unwrap();
        let before = a.used_extents();
        drop(a);
        let b = FreeExtentAllocator::open(&region, PmOff(64)).unwrap();
        assert_eq!(b.managed(), managed);
        assert_eq!(b.used_extents(), before);
        assert_eq!(b.free_blocks(), 1000 - 250 - e2.len);
        assert_eq!(b.free_extent_count(), 2);
    }
}
