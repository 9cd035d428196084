//! CFFS contiguity-first allocation (CFFS §IV): a greedy buddy system over groups of huge
//! pages, implicit preallocation by fragment extension, and NMRU placement.
//!
//! # Structure
//!
//! The managed range is cut into 2 MiB *pages* (512 blocks, aligned on block numbers that are
//! multiples of 512) and the pages into *groups* of 512 pages (1 GiB, aligned likewise; the
//! groups at the ends of the range may be smaller). Two levels share that space:
//!
//! - the **huge-page level**: the free chunks of a group are its runs of wholly free pages;
//!   groups sit in 11 buddy lists keyed by their largest such chunk (1, 2, 3–4, …, 257–511,
//!   512 pages), as in CFFS Fig. 7;
//! - the **4 KiB level**: a page that is partly used is a *split page*, a small group of 512
//!   blocks whose free chunks are the runs of free blocks; split pages sit in 10 buddy lists
//!   keyed by their largest chunk. A page split for small fixed-size allocations or metadata
//!   is a *small page* (the paper's support pages, SP file); a page split because a fragment
//!   of the huge-page level starts or ends in it is a *fragment page*, whose free blocks are
//!   that fragment's reserve; each class has its own 10 lists. Pages at the ends of the range
//!   that are only partly managed are small pages for good.
//!
//! # Policy
//!
//! An allocation first tries **fragment extension**: if the hint's goal (the block right after
//! the file's last fragment) is free, the allocation starts there and runs through the free
//! chunk right of the fragment — the chunk CFFS *implicitly preallocates* to the fragment on
//! its left — as far as wanted, across pages, up to the end of the group. The allocator keeps
//! no per-file record: "the chunk right of a fragment is reserved for it" is realised by where
//! the other allocators place new fragments, and the reservation yields under space pressure
//! simply because every free block stays allocatable.
//!
//! Otherwise a new fragment is placed:
//! - [`AllocKind::Growing`]: the **growing-size greedy allocator** takes the first group of
//!   the highest non-empty buddy list that is not in the extension LRU, and in it the largest
//!   chunk. The whole chunk if `want` covers it; else `want` blocks from a page boundary (2 MiB
//!   alignment relative to block 0, so the file can be mapped with huge pages when the region
//!   is mapped 2 MiB-aligned): left-aligned at the head of the
//!   group or right of a fixed-size fragment, else *centre-aligned*, so that the fragment on
//!   the left keeps as much reserve as the new one. Without any whole free page outside the
//!   LRU it tries the LRU groups (least recently extended first), then the largest chunk of
//!   the highest small page, then of the highest fragment page, with the same alignment rules
//!   at block granularity.
//! - [`AllocKind::Fixed`] and [`AllocKind::Metadata`]: the **fixed-size greedy allocator**
//!   takes the lowest buddy list that can hold the request, the smallest chunk there that
//!   fits, and allocates its *right* end, leaving the remainder with the fragment on the left.
//!   Requests below one page go to small pages first and split a new small page (the last
//!   page of the smallest chunk of the lowest group) only when no small page can hold them;
//!   larger ones go to the huge-page level. Fragment pages are used only when nothing else is
//!   left.
//!
//! Fixed-size allocations mark the fragment they end as *fixed* (a per-block bit), so the
//! growing allocator left-aligns next to it instead of sharing the chunk.
//!
//! **NMRU** (three levels, as in §IV-C.6): a centre-aligned allocation halves the group's
//! largest chunk and so moves the group to a lower buddy list; every group or page picked by a
//! buddy allocator moves to its list's tail; and a group in which a growing fragment was just
//! extended enters the *extension LRU list* (capacity [`CffsConfig::lru_capacity`]) and is out
//! of reach of the buddy allocators until it is the least recently extended of a full list.
//!
//! When no list offers anything, a sweep over all groups takes any free block, so `NoSpace`
//! means that no block is free.
//!
//! # Volatile state
//!
//! Everything here is DRAM state, as in CFFS: [`rebuild`](BlockAllocator::rebuild) recreates
//! it from the extents the caller reports in use (the file system's mappings, logs and its own
//! metadata). The fixed-fragment marks, the class of split pages (small or fragment page) and
//! the LRU are heuristics: they start afresh after a rebuild (no marks, every split page a
//! fragment page except at the range's edges, an empty LRU). Everything else is a function of
//! the used set ([`CffsAllocator::summary`]).
//!
//! # Locking
//!
//! Each group has its own mutex guarding its bitmaps, page counts and chunks. The buddy
//! structure (buddy lists and LRU) has one mutex, held only for O(1) list operations. Lock
//! order is *group(s) in ascending order, then index*; the allocators pick a candidate under
//! the index lock, release it, then lock the candidate group and re-check (a stale pick is
//! retried).
//! A group's filing in the index is updated before its lock is released, and only when a
//! bucket actually changes or a different group was extended last, so fragment extension — the
//! common case for appends — usually takes the group's lock alone.

mod group;
mod index;

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, HUGE_PAGE};
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use pmfs_core::{Error, Result};

pub use group::GroupSummary;
use group::{Delta, GroupState, NO_BUCKET};
use index::{GROUP_BUCKETS, Index, PAGE_BUCKETS};

/// Blocks per huge page.
pub const PAGE_BLOCKS: u64 = HUGE_PAGE / BLOCK_SIZE;
/// Huge pages per group.
pub const GROUP_PAGES: u64 = 512;
/// Blocks per group.
pub const GROUP_BLOCKS: u64 = PAGE_BLOCKS * GROUP_PAGES;

/// How many stale candidates one allocation retries before it falls back to the sweep.
const RETRIES: usize = 64;

/// The buddy list a chunk of `n` units (pages or blocks, `1..=512`) belongs to: list 0 holds
/// 1, list 1 holds 2, list `k` holds `2^(k-1)+1 ..= 2^k`, except that list 9 ends at 511 and
/// list 10 holds exactly 512 (a wholly free group or page), as in CFFS Fig. 7.
fn bucket(n: u64) -> u8 {
    debug_assert!((1..=512).contains(&n));
    if n >= 512 {
        10
    } else if n <= 1 {
        0
    } else {
        (64 - (n - 1).leading_zeros()) as u8
    }
}

/// Tunables of [`CffsAllocator`].
#[derive(Clone, Debug)]
pub struct CffsConfig {
    /// Capacity of the extension LRU list, in groups. The effective capacity is at most the
    /// number of groups minus one, so some group always stays available to the buddy
    /// allocators. 0 disables the list.
    pub lru_capacity: usize,
}

impl Default for CffsConfig {
    fn default() -> Self {
        Self { lru_capacity: 8 }
    }
}

/// The CFFS allocator (see the module documentation).
#[derive(Debug)]
pub struct CffsAllocator {
    first: u64,
    count: u64,
    /// Absolute number of the first group (block number / [`GROUP_BLOCKS`]).
    group0: u64,
    /// Absolute number of the first page.
    page0: u64,
    /// For each group, the index of its first page among all pages.
    page_base: Vec<u32>,
    groups: Vec<Mutex<GroupState>>,
    index: Mutex<Index>,
    free: AtomicU64,
    /// The group whose fragment was extended last (`u32::MAX`: none).
    last_extended: AtomicU32,
}

impl CffsAllocator {
    /// Manages blocks `[first, first + count)`, all free, with the default configuration.
    ///
    /// # Panics
    /// If the range does not fit in the block-number space or has more than 2^32 pages.
    pub fn new(first: BlockNo, count: u64) -> Self {
        Self::with_config(first, count, CffsConfig::default())
    }

    /// Manages blocks `[first, first + count)`, all free.
    ///
    /// # Panics
    /// If the range does not fit in the block-number space or has more than 2^32 pages.
    pub fn with_config(first: BlockNo, count: u64, cfg: CffsConfig) -> Self {
        let end = first.0.checked_add(count).expect("managed range overflows");
        let group0 = first.0 / GROUP_BLOCKS;
        let page0 = first.0 / PAGE_BLOCKS;
        let mut groups = Vec::new();
        let mut page_base = Vec::new();
        let mut pages_total: u64 = 0;
        if count > 0 {
            for g in group0..=(end - 1) / GROUP_BLOCKS {
                let gs = g * GROUP_BLOCKS;
                let lo = first.0.max(gs);
                let hi = end.min(gs + GROUP_BLOCKS);
                let p_lo = lo / PAGE_BLOCKS;
                let p_hi = (hi - 1) / PAGE_BLOCKS + 1;
                let base = p_lo * PAGE_BLOCKS;
                page_base.push(u32::try_from(pages_total).expect("too many pages"));
                pages_total += p_hi - p_lo;
                groups.push(Mutex::new(GroupState::new(
                    base,
                    (p_hi - p_lo) as u32,
                    lo - base,
                    hi - base,
                )));
            }
        }
        let pages = usize::try_from(pages_total).expect("too many pages");
        let lru = cfg.lru_capacity.min(groups.len().saturating_sub(1));
        let a = Self {
            first: first.0,
            count,
            group0,
            page0,
            page_base,
            index: Mutex::new(Index::new(groups.len(), pages, lru)),
            groups,
            free: AtomicU64::new(0),
            last_extended: AtomicU32::new(u32::MAX),
        };
        a.refile_all();
        a
    }

    fn lock_index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_group(&self, g: usize) -> MutexGuard<'_, GroupState> {
        self.groups[g].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Files every group and page afresh and recounts the free blocks (construction and
    /// rebuild), with every group locked by the caller or not yet shared.
    fn refile_all(&self) {
        let mut guards: Vec<MutexGuard<'_, GroupState>> =
            (0..self.groups.len()).map(|g| self.lock_group(g)).collect();
        let mut ix = self.lock_index();
        ix.clear();
        let mut free = 0;
        for (g, st) in guards.iter_mut().enumerate() {
            free += st.free;
            st.bucket = NO_BUCKET;
            st.page_bucket.fill(NO_BUCKET);
            let d = st.take_delta();
            self.apply_delta(&mut ix, g, &d);
        }
        self.free.store(free, Ordering::SeqCst);
        self.last_extended.store(u32::MAX, Ordering::SeqCst);
    }

    fn apply_delta(&self, ix: &mut Index, g: usize, d: &Delta) {
        if let Some(b) = d.group {
            ix.file_group(g as u32, b);
        }
        for &(p, b) in &d.pages {
            ix.file_page(self.page_base[g] + p, b);
        }
        if d.extended {
            ix.touch(g as u32);
            self.last_extended.store(g as u32, Ordering::Relaxed);
        }
    }

    /// Files the group's changes in the index; called with the group's lock held.
    fn publish(&self, g: usize, st: &mut GroupState) {
        let mut d = st.take_delta();
        if d.extended && self.last_extended.load(Ordering::Relaxed) == g as u32 {
            // Already the most recently extended group: the LRU order would not change.
            d.extended = false;
        }
        if !d.is_empty() {
            self.apply_delta(&mut self.lock_index(), g, &d);
        }
        st.recycle(d);
    }

    /// Runs `f` on group `g` under its lock, then files the changes and counts the blocks.
    fn with_group(
        &self,
        g: usize,
        f: impl FnOnce(&mut GroupState) -> Option<Extent>,
    ) -> Option<Extent> {
        let mut st = self.lock_group(g);
        let r = f(&mut st);
        if let Some(e) = r {
            self.free.fetch_sub(e.len, Ordering::SeqCst);
        }
        self.publish(g, &mut st);
        r
    }

    /// The group holding absolute block `b` (which must be managed).
    fn group_of(&self, b: u64) -> usize {
        (b / GROUP_BLOCKS - self.group0) as usize
    }

    /// The group and relative page of a page index from the page lists.
    fn locate_page(&self, p: u32) -> (usize, u32) {
        let g = self.page_base.partition_point(|&base| base <= p) - 1;
        (g, p - self.page_base[g])
    }

    fn managed(&self, b: u64) -> bool {
        b >= self.first && b - self.first < self.count
    }

    /// Fragment extension from `goal`.
    fn extend(&self, goal: u64, want: u64, growing: bool) -> Option<Extent> {
        if !self.managed(goal) {
            return None;
        }
        let g = self.group_of(goal);
        self.with_group(g, |st| {
            let base = st.base;
            st.extend(goal - base, want, growing)
        })
    }

    /// Tries groups from the buddy lists (`pick` under the index lock), then the LRU groups.
    fn try_groups(
        &self,
        mut pick: impl FnMut(&mut Index) -> Option<u32>,
        mut f: impl FnMut(&mut GroupState) -> Option<Extent>,
        lru_too: bool,
    ) -> Option<Extent> {
        for _ in 0..RETRIES {
            let Some(g) = pick(&mut self.lock_index()) else {
                break;
            };
            if let Some(e) = self.with_group(g as usize, &mut f) {
                return Some(e);
            }
        }
        if lru_too {
            let lru = self.lock_index().lru();
            for g in lru {
                if let Some(e) = self.with_group(g as usize, &mut f) {
                    return Some(e);
                }
            }
        }
        None
    }

    /// Tries split pages from the page lists.
    fn try_pages(
        &self,
        mut pick: impl FnMut(&mut Index) -> Option<u32>,
        mut f: impl FnMut(&mut GroupState, u32) -> Option<Extent>,
    ) -> Option<Extent> {
        for _ in 0..RETRIES {
            let p = pick(&mut self.lock_index())?;
            let (g, rel) = self.locate_page(p);
            if let Some(e) = self.with_group(g, |st| f(st, rel)) {
                return Some(e);
            }
        }
        None
    }

    fn growing(&self, want: u64) -> Option<Extent> {
        self.try_groups(Index::pick_group_highest, |st| st.grow_huge(want), true)
            .or_else(|| {
                // Small pages first; the reserves of fragment pages last.
                [false, true].into_iter().find_map(|fragment| {
                    self.try_pages(
                        |ix| ix.pick_page_highest(fragment),
                        |st, p| st.grow_small(p, want),
                    )
                })
            })
    }

    fn fixed(&self, want: u64) -> Option<Extent> {
        if want < PAGE_BLOCKS {
            // A split page that holds the request, lowest bucket first. A page picked from
            // bucket `b` may still be too small (buckets are ranges); higher buckets always fit.
            let min = Cell::new(bucket(want));
            let small = self.try_pages(
                |ix| {
                    let (p, b) = ix.pick_page_lowest(min.get())?;
                    min.set(b);
                    Some(p)
                },
                |st, p| {
                    let r = st.fixed_small(p, want, true);
                    if r.is_none() && st.page_largest(p) < want {
                        min.set(min.get() + 1);
                    }
                    r
                },
            );
            if small.is_some() {
                return small;
            }
        }
        // A fitting chunk of whole pages, lowest group bucket first (for small requests this
        // splits a new page).
        let min = Cell::new(bucket(want.div_ceil(PAGE_BLOCKS).min(GROUP_PAGES)));
        let fit = self.try_groups(
            |ix| {
                let (g, b) = ix.pick_group_lowest(min.get())?;
                min.set(b);
                Some(g)
            },
            |st| {
                let r = st.fixed_huge(want, true);
                if r.is_none() {
                    min.set((min.get() + 1).min(GROUP_BUCKETS));
                }
                r
            },
            true,
        );
        // Nothing fits: the largest piece anywhere, right-aligned.
        fit.or_else(|| {
            self.try_groups(
                Index::pick_group_highest,
                |st| st.fixed_huge(want, false),
                true,
            )
        })
        .or_else(|| {
            [false, true].into_iter().find_map(|fragment| {
                self.try_pages(
                    |ix| ix.pick_page_highest(fragment),
                    |st, p| st.fixed_small(p, want, false),
                )
            })
        })
    }

    /// Last resort: any free block of any group.
    fn sweep(&self, want: u64) -> Option<Extent> {
        (0..self.groups.len()).find_map(|g| self.with_group(g, |st| st.any(want)))
    }

    /// The allocated extents (maximal runs of allocated blocks), in address order.
    pub fn used_extents(&self) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        for g in 0..self.groups.len() {
            let mut runs = Vec::new();
            self.lock_group(g).used_runs(&mut runs);
            for e in runs {
                match out.last_mut() {
                    Some(last) if last.end() == e.start => last.len += e.len,
                    _ => out.push(e),
                }
            }
        }
        out
    }

    /// The free space of every group: chunks of whole pages and split pages. Two allocators
    /// with the same used set have equal summaries.
    pub fn summary(&self) -> Vec<GroupSummary> {
        (0..self.groups.len())
            .map(|g| self.lock_group(g).summary())
            .collect()
    }

    /// Number of groups in the extension LRU list.
    pub fn lru_len(&self) -> usize {
        self.lock_index().lru_len()
    }

    /// Verifies every derived structure (page counts, chunks, buddy lists, free count) against
    /// the block bitmaps; for tests. Needs a quiescent allocator.
    ///
    /// # Errors
    /// A description of the first inconsistency.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let guards: Vec<MutexGuard<'_, GroupState>> =
            (0..self.groups.len()).map(|g| self.lock_group(g)).collect();
        let ix = self.lock_index();
        let mut free = 0;
        for (g, st) in guards.iter().enumerate() {
            st.check()?;
            free += st.free;
            let (b, _) = ix.group_filing(g as u32);
            if b != st.bucket {
                return Err(format!(
                    "group {g} filed under {b}, belongs in {}",
                    st.bucket
                ));
            }
            for p in 0..st.pages {
                let filed = ix.page_filing(self.page_base[g] + p);
                if filed != st.page_bucket[p as usize] {
                    return Err(format!("page {p} of group {g} filed under {filed}"));
                }
                debug_assert!(filed == NO_BUCKET || filed < PAGE_BUCKETS);
            }
        }
        if free != self.free.load(Ordering::SeqCst) {
            return Err(format!(
                "free counter {} but groups hold {free}",
                self.free.load(Ordering::SeqCst)
            ));
        }
        Ok(())
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

    /// The group that holds all of `ext`, if it is managed and lies in one.
    fn only_group(&self, ext: Extent) -> Option<usize> {
        if !self.in_range(ext) {
            return None;
        }
        let g = self.group_of(ext.start.0);
        (self.group_of(ext.end().0 - 1) == g).then_some(g)
    }

    /// Splits `[s, s + l)` at group boundaries into `(group, start relative to the group's
    /// first page, len)`.
    fn pieces(&self, s: u64, l: u64) -> Vec<(usize, u64, u64)> {
        let mut out = Vec::new();
        let mut at = s;
        while at < s + l {
            let g = self.group_of(at);
            let e = (s + l).min((at / GROUP_BLOCKS + 1) * GROUP_BLOCKS);
            out.push((g, at - self.group_base(g), e - at));
            at = e;
        }
        out
    }

    /// Absolute number of group `g`'s first block (the start of its first page).
    fn group_base(&self, g: usize) -> u64 {
        (self.page0 + u64::from(self.page_base[g])) * PAGE_BLOCKS
    }

    /// Frees `extents`, all inside group `g`, under one taking of its lock. An extent that is
    /// not wholly allocated is left as it is; the others are freed, and the result reports
    /// the first such extent.
    fn free_in_group(&self, g: usize, extents: &[Extent]) -> Result<()> {
        let base = self.group_base(g);
        let mut st = self.lock_group(g);
        let mut r = Ok(());
        let mut freed = 0;
        for e in extents {
            let s = e.start.0 - base;
            if st.all_allocated(s, e.len) {
                st.give(s, e.len);
                freed += e.len;
            } else if r.is_ok() {
                r = Err(Error::InvalidArgument(
                    "free of blocks that are not allocated",
                ));
            }
        }
        if freed > 0 {
            self.free.fetch_add(freed, Ordering::SeqCst);
            self.publish(g, &mut st);
        }
        r
    }
}

impl BlockAllocator for CffsAllocator {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        if want == 0 {
            return Err(Error::InvalidArgument("allocation of zero blocks"));
        }
        if self.free.load(Ordering::SeqCst) == 0 {
            return Err(Error::NoSpace);
        }
        let growing = hint.kind == AllocKind::Growing;
        if let Some(goal) = hint.goal
            && let Some(e) = self.extend(goal.0, want, growing)
        {
            return Ok(e);
        }
        let placed = if growing {
            self.growing(want)
        } else {
            self.fixed(want)
        };
        placed.or_else(|| self.sweep(want)).ok_or(Error::NoSpace)
    }

    fn free(&self, ext: Extent) -> Result<()> {
        if let Some(g) = self.only_group(ext) {
            return self.free_in_group(g, &[ext]);
        }
        if !self.in_range(ext) {
            return Err(Error::InvalidArgument(
                "free of blocks outside the managed range",
            ));
        }
        // An extent across groups is freed whole or not at all: every group it touches is
        // locked and checked before any gives.
        let pieces = self.pieces(ext.start.0, ext.len);
        let mut guards: Vec<MutexGuard<'_, GroupState>> =
            pieces.iter().map(|&(g, _, _)| self.lock_group(g)).collect();
        let all = pieces
            .iter()
            .zip(&guards)
            .all(|(&(_, s, l), st)| st.all_allocated(s, l));
        if !all {
            return Err(Error::InvalidArgument(
                "free of blocks that are not allocated",
            ));
        }
        for (&(g, s, l), st) in pieces.iter().zip(guards.iter_mut()) {
            st.give(s, l);
            self.free.fetch_add(l, Ordering::SeqCst);
            self.publish(g, st);
        }
        Ok(())
    }

    /// Frees neighbours in the list that lie in one group under one taking of its lock (the
    /// digest of a batch of copy-on-write writes frees its replaced blocks so, in address
    /// order), the others one by one.
    fn free_many(&self, extents: &[Extent]) -> Result<()> {
        let mut first = Ok(());
        let mut rest = extents;
        while let Some(&e) = rest.first() {
            let (r, taken) = match self.only_group(e) {
                Some(g) => {
                    let taken = rest
                        .iter()
                        .take_while(|&&e| self.only_group(e) == Some(g))
                        .count();
                    (self.free_in_group(g, &rest[..taken]), taken)
                }
                None => (self.free(e), 1),
            };
            if first.is_ok() {
                first = r;
            }
            rest = &rest[taken..];
        }
        first
    }

    fn free_blocks(&self) -> u64 {
        self.free.load(Ordering::SeqCst)
    }

    fn total_blocks(&self) -> u64 {
        self.count
    }

    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        let mut sorted: Vec<Extent> = used.collect();
        sorted.sort();
        let mut cursor = self.first;
        let mut per_group: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.groups.len()];
        for e in &sorted {
            if !self.in_range(*e) || e.start.0 < cursor {
                return Err(Error::Corrupt {
                    what: "used extent list",
                    at: e.start.checked_offset().unwrap_or_default(),
                });
            }
            for (g, s, l) in self.pieces(e.start.0, e.len) {
                per_group[g].push((s, l));
            }
            cursor = e.end().0;
        }
        for (g, used) in per_group.into_iter().enumerate() {
            self.lock_group(g).reset(used.into_iter());
        }
        self.refile_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_fig7() {
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 1);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(4), 2);
        assert_eq!(bucket(5), 3);
        assert_eq!(bucket(256), 8);
        assert_eq!(bucket(257), 9);
        assert_eq!(bucket(511), 9);
        assert_eq!(bucket(512), 10);
    }

    #[test]
    fn groups_and_pages_cover_unaligned_ranges() {
        let a = CffsAllocator::new(BlockNo(GROUP_BLOCKS - 700), 2000);
        assert_eq!(a.groups.len(), 2);
        assert_eq!(a.free_blocks(), 2000);
        a.check_invariants().unwrap();
        let s = a.summary();
        // Group 0: a partial page (188 blocks) and one whole page; group 1: two whole pages and
        // a partial one.
        assert_eq!(s[0].page_runs, vec![(1, 1)]);
        assert_eq!(s[0].split_pages, vec![(0, 188, 188)]);
        assert_eq!(s[1].page_runs, vec![(0, 2)]);
        assert_eq!(s[1].split_pages, vec![(2, 276, 276)]);
    }
}
