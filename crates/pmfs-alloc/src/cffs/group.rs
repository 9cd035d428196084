//! One CFFS group: 512 huge pages (1 GiB) of the managed range, with the block-level state of
//! its split pages (the 4 KiB-unit groups of 512 blocks).
//!
//! A page of the group is in one of three states, derived from its free-block count:
//! - *whole free*: all 512 blocks free; it belongs to a free chunk of the huge-page level
//!   ([`GroupState::runs`]);
//! - *full*: no block free;
//! - *split*: some blocks free. A split page is a small group of the 4 KiB level: its free
//!   chunks are the zero runs of its 512 bits. Pages at the edges of the managed range are
//!   split pages whose outside blocks are marked allocated for ever.
//!
//! Split pages come in two classes. A *small page* was split for small fixed-size
//! allocations and metadata (the paper's support pages, SP file): it is where such
//! allocations go first. A *fragment page* was split because a fragment allocated at huge-page
//! level starts or ends inside it: its free blocks are the implicit preallocation of that
//! fragment, so other allocations take them only when nothing else is left. The class is a
//! heuristic: it is forgotten when the page becomes whole again, and after a rebuild every
//! split page is a fragment page except the edge pages.
//!
//! All positions here are block offsets relative to the group's first page (`rel`), and page
//! indices relative to the group.

use pmfs_core::traits::Extent;

use super::{PAGE_BLOCKS, bucket};
use crate::runs::RunSet;

/// "Not filed in any bucket list."
pub(super) const NO_BUCKET: u8 = u8::MAX;
/// Page buckets from this value on hold fragment pages (bucket + this value).
pub(super) const FRAGMENT_PAGES: u8 = 10;
const PAGE: u64 = PAGE_BLOCKS;

/// Bitmap helpers over `u64` words, bit `i % 64` of word `i / 64`.
mod bits {
    pub(super) fn get(w: &[u64], i: u64) -> bool {
        w[(i / 64) as usize] >> (i % 64) & 1 == 1
    }

    fn mask(lo: u64, hi: u64) -> u64 {
        // Bits lo..=hi of one word.
        (u64::MAX >> (63 - hi)) & (u64::MAX << lo)
    }

    /// Sets (`v`) or clears bits `[a, b)`.
    pub(super) fn fill(w: &mut [u64], a: u64, b: u64, v: bool) {
        if a >= b {
            return;
        }
        let (w0, w1) = (a / 64, (b - 1) / 64);
        for i in w0..=w1 {
            let lo = if i == w0 { a % 64 } else { 0 };
            let hi = if i == w1 { (b - 1) % 64 } else { 63 };
            let m = mask(lo, hi);
            if v {
                w[i as usize] |= m;
            } else {
                w[i as usize] &= !m;
            }
        }
    }

    /// Whether every bit of `[a, b)` equals `v`.
    pub(super) fn all(w: &[u64], a: u64, b: u64, v: bool) -> bool {
        if a >= b {
            return true;
        }
        let (w0, w1) = (a / 64, (b - 1) / 64);
        (w0..=w1).all(|i| {
            let lo = if i == w0 { a % 64 } else { 0 };
            let hi = if i == w1 { (b - 1) % 64 } else { 63 };
            let m = mask(lo, hi);
            let x = w[i as usize] & m;
            if v { x == m } else { x == 0 }
        })
    }

    /// The first position in `[a, b)` whose bit equals `v`, or `b`.
    pub(super) fn next(w: &[u64], a: u64, b: u64, v: bool) -> u64 {
        let mut i = a;
        while i < b {
            let word = if v {
                w[(i / 64) as usize]
            } else {
                !w[(i / 64) as usize]
            };
            let rest = word >> (i % 64);
            if rest != 0 {
                return (i + u64::from(rest.trailing_zeros())).min(b);
            }
            i = (i / 64 + 1) * 64;
        }
        b
    }

    /// Length of the run of clear bits starting at `a`, looking no further than `b`.
    pub(super) fn zero_run(w: &[u64], a: u64, b: u64) -> u64 {
        next(w, a, b, true) - a
    }

    /// Length of the run of clear bits ending just before `b`, looking no further back than
    /// `a`.
    pub(super) fn zero_run_back(w: &[u64], a: u64, b: u64) -> u64 {
        let mut i = b;
        while i > a {
            let p = i - 1;
            let word = w[(p / 64) as usize];
            let below = word & (u64::MAX >> (63 - p % 64));
            if below != 0 {
                let top = 63 - u64::from(below.leading_zeros());
                let one = (p / 64) * 64 + top;
                return b - (one + 1).max(a);
            }
            i = (p / 64) * 64;
        }
        b - a
    }

    /// The runs of clear bits inside `[a, b)`, as `(start, len)`.
    pub(super) fn zero_runs(w: &[u64], a: u64, b: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut i = a;
        std::iter::from_fn(move || {
            let s = next(w, i, b, false);
            if s >= b {
                return None;
            }
            let e = next(w, s, b, true);
            i = e;
            Some((s, e - s))
        })
    }

    /// The start of the first run of at least `len` clear bits inside `[a, b)` (both multiples
    /// of 64). Up to a word's length, a word and the next at a time: shifting the clear bits
    /// against themselves (doubling the shift, as [`longest_ones`] does) leaves set the
    /// positions where `len` clear bits begin.
    pub(super) fn first_zero_run(w: &[u64], a: u64, b: u64, len: u64) -> Option<u64> {
        if len > 64 {
            return zero_runs(w, a, b).find(|&(_, l)| l >= len).map(|(s, _)| s);
        }
        let (w0, w1) = ((a / 64) as usize, (b / 64) as usize);
        (w0..w1).find_map(|i| {
            let next = if i + 1 < w1 { !w[i + 1] } else { 0 };
            let mut starts = u128::from(!w[i]) | u128::from(next) << 64;
            let mut have = 1;
            while have < len {
                let step = have.min(len - have);
                starts &= starts >> step;
                have += step;
            }
            let here = starts as u64;
            (here != 0).then(|| i as u64 * 64 + u64::from(here.trailing_zeros()))
        })
    }

    /// Length of the longest run of clear bits in `[a, b)` where both are multiples of 64,
    /// a word at a time: runs across word boundaries from the words' trailing and leading
    /// zeros, runs inside a word by shifting it against itself (only for a word whose clear
    /// bits could beat the longest run so far).
    pub(super) fn longest_zero_run(w: &[u64], a: u64, b: u64) -> u64 {
        let mut best = 0;
        let mut open = 0;
        for &x in &w[(a / 64) as usize..(b / 64) as usize] {
            if x == 0 {
                open += 64;
                continue;
            }
            best = best.max(open + u64::from(x.trailing_zeros()));
            if u64::from(x.count_zeros()) > best {
                best = best.max(longest_ones(!x));
            }
            open = u64::from(x.leading_zeros());
        }
        best.max(open)
    }

    /// Length of the longest run of set bits in `y`, in at most twelve steps: `y & y >> k`
    /// keeps the starts of runs at least `k` longer, so doubling `k` brackets the length
    /// and halving it back narrows it down.
    pub(super) fn longest_ones(y: u64) -> u64 {
        if y == 0 {
            return 0;
        }
        // `starts` marks where `len` set bits begin.
        let (mut starts, mut len) = (y, 1);
        while len < 64 {
            let longer = starts & (starts >> len);
            if longer == 0 {
                break;
            }
            starts = longer;
            len *= 2;
        }
        let mut step = len / 2;
        while step > 0 {
            let longer = starts & (starts >> step);
            if longer != 0 {
                starts = longer;
                len += step;
            }
            step /= 2;
        }
        len
    }

    /// Number of set bits in `[a, b)` where both are multiples of 64.
    pub(super) fn count_words(w: &[u64], a: u64, b: u64) -> u64 {
        w[(a / 64) as usize..(b / 64) as usize]
            .iter()
            .map(|x| u64::from(x.count_ones()))
            .sum()
    }
}

/// What a change did to the group's standing in the buddy structure.
#[derive(Debug, Default)]
pub(super) struct Delta {
    /// The group's new bucket, if it changed.
    pub(super) group: Option<u8>,
    /// Pages (relative) whose bucket changed, with the new bucket.
    pub(super) pages: Vec<(u32, u8)>,
    /// The allocation extended a growing fragment (the group goes to the extension LRU).
    pub(super) extended: bool,
}

impl Delta {
    pub(super) fn is_empty(&self) -> bool {
        self.group.is_none() && self.pages.is_empty() && !self.extended
    }
}

/// The state of one group, behind the group's mutex.
#[derive(Debug)]
pub(super) struct GroupState {
    /// Absolute number of the group's first block (page aligned).
    pub(super) base: u64,
    /// Pages the group spans.
    pub(super) pages: u32,
    /// Managed blocks of the group, relative: `[lo, hi)`.
    pub(super) lo: u64,
    pub(super) hi: u64,
    /// One bit per block: set when allocated or outside the managed range.
    bits: Vec<u64>,
    /// One bit per block position `p`: the fragment ending at `p` (its last block is `p - 1`)
    /// is fixed-size, so the free chunk starting at `p` is not reserved for it.
    fixed: Vec<u64>,
    /// Free blocks per page.
    page_free: Vec<u16>,
    /// Largest free chunk per page, in blocks.
    page_largest: Vec<u16>,
    /// The bucket each page is filed under in the index ([`NO_BUCKET`] if it is not split):
    /// the bucket of its largest chunk, plus [`FRAGMENT_PAGES`] for fragment pages.
    pub(super) page_bucket: Vec<u8>,
    /// Whether each page is a small page (split for small allocations) rather than a fragment
    /// page; meaningful for split pages only.
    small: Vec<bool>,
    /// Free chunks of the huge-page level: runs of whole free pages.
    pub(super) runs: RunSet,
    /// The bucket the group is filed under in the index.
    pub(super) bucket: u8,
    /// Free blocks in the group.
    pub(super) free: u64,
    /// Pages touched since the last [`take_delta`](Self::take_delta).
    dirty: Vec<u32>,
    /// Whether a growing fragment was extended since the last `take_delta`.
    extended: bool,
    /// The page list of a delta given back by [`recycle`](Self::recycle), for the next one.
    spare_pages: Vec<(u32, u8)>,
}

impl GroupState {
    /// A group of `pages` pages starting at block `base`, managing blocks `[base + lo, base +
    /// hi)`, all free.
    pub(super) fn new(base: u64, pages: u32, lo: u64, hi: u64) -> Self {
        let blocks = u64::from(pages) * PAGE;
        let mut g = Self {
            base,
            pages,
            lo,
            hi,
            bits: vec![0; (blocks / 64) as usize],
            fixed: vec![0; (blocks / 64) as usize],
            page_free: vec![0; pages as usize],
            page_largest: vec![0; pages as usize],
            page_bucket: vec![NO_BUCKET; pages as usize],
            small: vec![false; pages as usize],
            runs: RunSet::new(),
            bucket: NO_BUCKET,
            free: 0,
            dirty: Vec::new(),
            extended: false,
            spare_pages: Vec::new(),
        };
        g.reset(std::iter::empty());
        g
    }

    fn blocks(&self) -> u64 {
        u64::from(self.pages) * PAGE
    }

    /// Makes exactly `used` (relative `(start, len)` pairs inside `[lo, hi)`) allocated and
    /// recomputes everything; forgets the fixed-fragment marks.
    pub(super) fn reset(&mut self, used: impl Iterator<Item = (u64, u64)>) {
        let blocks = self.blocks();
        self.bits.fill(0);
        self.fixed.fill(0);
        bits::fill(&mut self.bits, 0, self.lo, true);
        bits::fill(&mut self.bits, self.hi, blocks, true);
        for (s, l) in used {
            bits::fill(&mut self.bits, s, s + l, true);
        }
        self.runs = RunSet::new();
        self.free = 0;
        for p in 0..self.pages {
            let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
            self.small[p as usize] = a < self.lo || b > self.hi;
            self.recount(p);
            self.free += u64::from(self.page_free[p as usize]);
            if u64::from(self.page_free[p as usize]) == PAGE {
                self.runs.insert(u64::from(p), 1);
            }
        }
        self.dirty = (0..self.pages).collect();
        self.extended = false;
    }

    /// Recomputes a page's free count and largest chunk from its bits.
    fn recount(&mut self, p: u32) {
        let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
        let used = bits::count_words(&self.bits, a, b);
        self.page_free[p as usize] = (PAGE - used) as u16;
        let largest = if used == 0 {
            PAGE
        } else if used == PAGE {
            0
        } else {
            bits::longest_zero_run(&self.bits, a, b)
        };
        self.page_largest[p as usize] = largest as u16;
    }

    /// Length of the free chunk of the page `[a, b)` that holds the free block `at`.
    fn chunk_at(&self, a: u64, b: u64, at: u64) -> u64 {
        bits::zero_run_back(&self.bits, a, at) + bits::zero_run(&self.bits, at, b)
    }

    /// The bucket a page belongs in: split pages by their largest chunk and class, others
    /// nowhere.
    fn page_bucket_now(&self, p: u32) -> u8 {
        let free = u64::from(self.page_free[p as usize]);
        if free == 0 || free == PAGE {
            NO_BUCKET
        } else if self.small[p as usize] {
            bucket(u64::from(self.page_largest[p as usize]))
        } else {
            FRAGMENT_PAGES + bucket(u64::from(self.page_largest[p as usize]))
        }
    }

    /// The bucket the group belongs in: by its largest chunk of whole free pages.
    fn group_bucket_now(&self) -> u8 {
        self.runs.largest().map_or(NO_BUCKET, |(_, n)| bucket(n))
    }

    /// Collects the changes of the group's and its pages' buckets since the last call and
    /// records the new buckets as filed (the caller files them in the index before it releases
    /// the group's lock).
    pub(super) fn take_delta(&mut self) -> Delta {
        let mut d = Delta {
            extended: std::mem::take(&mut self.extended),
            pages: std::mem::take(&mut self.spare_pages),
            ..Delta::default()
        };
        let gb = self.group_bucket_now();
        if gb != self.bucket {
            self.bucket = gb;
            d.group = Some(gb);
        }
        // Reuse the list's allocation: this runs on every allocation.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &p in &dirty {
            let b = self.page_bucket_now(p);
            if b != self.page_bucket[p as usize] {
                self.page_bucket[p as usize] = b;
                d.pages.push((p, b));
            }
        }
        dirty.clear();
        self.dirty = dirty;
        d
    }

    /// Takes back a delta's page list once it is filed, so that the next delta reuses it.
    pub(super) fn recycle(&mut self, d: Delta) {
        let mut pages = d.pages;
        pages.clear();
        self.spare_pages = pages;
    }

    fn is_free(&self, rel: u64) -> bool {
        rel >= self.lo && rel < self.hi && !bits::get(&self.bits, rel)
    }

    /// Whether every block of `[s, s + l)` (relative, inside the group) is allocated and
    /// managed.
    pub(super) fn all_allocated(&self, s: u64, l: u64) -> bool {
        s >= self.lo && s + l <= self.hi && bits::all(&self.bits, s, s + l, true)
    }

    fn set_fixed(&mut self, pos: u64, v: bool) {
        if pos < self.blocks() {
            bits::fill(&mut self.fixed, pos, pos + 1, v);
        }
    }

    fn is_fixed(&self, pos: u64) -> bool {
        pos < self.blocks() && bits::get(&self.fixed, pos)
    }

    /// Marks `[s, s + l)` (all free) allocated. `extends` says the blocks extend the fragment
    /// ending at `s`; `fixed_end` marks the fragment ending at `s + l` as fixed-size; `small`
    /// makes the whole pages this splits small pages (else fragment pages).
    fn take(&mut self, s: u64, l: u64, extends: bool, fixed_end: bool, small: bool) -> Extent {
        debug_assert!(l > 0 && bits::all(&self.bits, s, s + l, false));
        let (p0, p1) = ((s / PAGE) as u32, ((s + l - 1) / PAGE) as u32);
        let is_whole = |p: &u32| u64::from(self.page_free[*p as usize]) == PAGE;
        let first_whole = (p0..=p1).find(is_whole);
        let last_whole = (p0..=p1).rev().find(is_whole);
        if let (Some(a), Some(b)) = (first_whole, last_whole) {
            let removed = self.runs.remove(u64::from(a), u64::from(b - a + 1));
            debug_assert!(removed, "whole free pages of one free range form one run");
            for p in a..=b {
                self.small[p as usize] = small;
            }
        }
        for p in p0..=p1 {
            let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
            let (cs, ce) = (s.max(a), (s + l).min(b));
            let whole = ce - cs == PAGE;
            // The page's largest chunk stays unless the blocks came from one of its length.
            let from_largest =
                !whole && self.chunk_at(a, b, cs) >= u64::from(self.page_largest[p as usize]);
            bits::fill(&mut self.bits, cs, ce, true);
            self.page_free[p as usize] -= (ce - cs) as u16;
            if whole {
                self.page_largest[p as usize] = 0;
            } else if from_largest {
                self.recount(p);
            }
            self.dirty.push(p);
        }
        if extends {
            self.set_fixed(s, false);
        }
        self.set_fixed(s + l, fixed_end);
        self.free -= l;
        Extent::new(pmfs_core::layout::BlockNo(self.base + s), l)
    }

    /// Marks `[s, s + l)` (all allocated and managed) free.
    pub(super) fn give(&mut self, s: u64, l: u64) {
        debug_assert!(self.all_allocated(s, l));
        bits::fill(&mut self.bits, s, s + l, false);
        // Fragments that ended inside the freed range are gone.
        let top = (s + l + 1).min(self.blocks());
        if s + 1 < top {
            bits::fill(&mut self.fixed, s + 1, top, false);
        }
        let (p0, p1) = ((s / PAGE) as u32, ((s + l - 1) / PAGE) as u32);
        for p in p0..=p1 {
            let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
            let (cs, ce) = (s.max(a), (s + l).min(b));
            // Freeing only joins chunks: the one holding the freed blocks now is the only
            // candidate for a new largest.
            let chunk = if ce - cs == PAGE {
                PAGE
            } else {
                self.chunk_at(a, b, cs)
            };
            self.page_free[p as usize] += (ce - cs) as u16;
            let largest = &mut self.page_largest[p as usize];
            *largest = (*largest).max(chunk as u16);
            self.dirty.push(p);
            if u64::from(self.page_free[p as usize]) == PAGE {
                self.runs.insert(u64::from(p), 1);
            }
        }
        self.free += l;
    }

    /// Whether a new growing fragment placed at the start of the free region beginning at
    /// `q` would sit right of a fragment that may still grow (then the chunk is shared by
    /// centre alignment). At the head of the group, or right of a fixed-size fragment, the
    /// new fragment is left-aligned instead.
    fn left_may_grow(&self, q: u64) -> bool {
        q > self.lo && !self.is_fixed(q)
    }

    /// Fragment extension: allocates up to `want` free blocks starting at `goal` (relative),
    /// if `goal` is free. The extension reaches as far as the free chunk right of the fragment
    /// does (the implicit preallocation), across pages, up to the end of the group.
    pub(super) fn extend(&mut self, goal: u64, want: u64, growing: bool) -> Option<Extent> {
        if !self.is_free(goal) {
            return None;
        }
        let l = bits::zero_run(&self.bits, goal, self.hi.min(goal.saturating_add(want)));
        if growing {
            self.extended = true;
        }
        Some(self.take(goal, l, true, !growing, false))
    }

    /// The growing-size greedy allocator at huge-page level: the largest chunk of whole free
    /// pages; the whole chunk if `want` covers it, else `want` blocks from a page boundary —
    /// left-aligned at the group head or right of a fixed-size fragment, else centre-aligned
    /// so the fragment on the left keeps as much reserve as the new one.
    pub(super) fn grow_huge(&mut self, want: u64) -> Option<Extent> {
        let (a, n) = self.runs.largest()?;
        let k = want.div_ceil(PAGE);
        if want >= n * PAGE {
            return Some(self.take(a * PAGE, n * PAGE, false, false, false));
        }
        let start = a * PAGE;
        let q = if a > 0 {
            start - bits::zero_run_back(&self.bits, (a - 1) * PAGE, start)
        } else {
            start
        };
        let page = if k < n && self.left_may_grow(q) {
            a + (n - k) / 2
        } else {
            a
        };
        Some(self.take(page * PAGE, want, false, false, false))
    }

    /// The growing-size greedy allocator inside a split page: its largest chunk, with the same
    /// alignment rules as [`grow_huge`](Self::grow_huge) at block granularity.
    pub(super) fn grow_small(&mut self, p: u32, want: u64) -> Option<Extent> {
        let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
        // The first of the page's largest chunks (its length is known).
        let largest = u64::from(self.page_largest[p as usize]);
        let s = bits::first_zero_run(&self.bits, a, b, largest)?;
        let l = largest;
        if want >= l {
            return Some(self.take(s, l, false, false, false));
        }
        let at = if self.left_may_grow(s) {
            s + (l - want) / 2
        } else {
            s
        };
        Some(self.take(at, want, false, false, false))
    }

    /// The fixed-size greedy allocator inside a split page: the smallest chunk that holds
    /// `want` (if `need_fit`; else, failing that, the largest), right-aligned so that the free
    /// remainder stays with the fragment on the chunk's left.
    pub(super) fn fixed_small(&mut self, p: u32, want: u64, need_fit: bool) -> Option<Extent> {
        let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
        let runs = || bits::zero_runs(&self.bits, a, b);
        let fit = runs()
            .filter(|&(_, l)| l >= want)
            .min_by_key(|&(s, l)| (l, s));
        let (s, l) = match fit {
            Some(r) => r,
            None if need_fit => return None,
            None => runs().max_by_key(|&(s, l)| (l, u64::MAX - s))?,
        };
        let t = want.min(l);
        Some(self.take(s + l - t, t, false, true, false))
    }

    /// The fixed-size greedy allocator at huge-page level: the smallest chunk of whole free
    /// pages that holds `want` blocks, right-aligned (for `want` below a page this splits the
    /// chunk's last page into a new small page). Without a fitting chunk: nothing if
    /// `need_fit`, else the largest chunk whole.
    pub(super) fn fixed_huge(&mut self, want: u64, need_fit: bool) -> Option<Extent> {
        let k = want.div_ceil(PAGE);
        if let Some((a, n)) = self.runs.best_fit(k) {
            let end = (a + n) * PAGE;
            return Some(self.take(end - want, want, false, true, want < PAGE));
        }
        if need_fit {
            return None;
        }
        let (a, n) = self.runs.largest()?;
        Some(self.take(a * PAGE, n * PAGE, false, true, false))
    }

    /// Any free blocks at all: the largest whole-page chunk, else the largest chunk of any
    /// split page (the last resort before `NoSpace`).
    pub(super) fn any(&mut self, want: u64) -> Option<Extent> {
        if let Some(e) = self.grow_huge(want) {
            return Some(e);
        }
        let p = (0..self.pages)
            .filter(|&p| self.page_free[p as usize] > 0)
            .max_by_key(|&p| self.page_largest[p as usize])?;
        self.fixed_small(p, want, false)
    }

    /// The largest chunk of a split page, in blocks.
    pub(super) fn page_largest(&self, p: u32) -> u64 {
        u64::from(self.page_largest[p as usize])
    }

    /// Allocated runs of managed blocks, absolute, in address order.
    pub(super) fn used_runs(&self, out: &mut Vec<Extent>) {
        let mut i = self.lo;
        while i < self.hi {
            let s = bits::next(&self.bits, i, self.hi, true);
            if s >= self.hi {
                break;
            }
            let e = bits::next(&self.bits, s, self.hi, false);
            out.push(Extent::new(
                pmfs_core::layout::BlockNo(self.base + s),
                e - s,
            ));
            i = e;
        }
    }

    /// Free chunks of split pages and of the huge level, for inspection.
    pub(super) fn summary(&self) -> GroupSummary {
        GroupSummary {
            free: self.free,
            page_runs: self.runs.iter().collect(),
            split_pages: (0..self.pages)
                .filter(|&p| self.page_bucket_now(p) != NO_BUCKET)
                .map(|p| {
                    (
                        p,
                        u64::from(self.page_free[p as usize]),
                        u64::from(self.page_largest[p as usize]),
                    )
                })
                .collect(),
        }
    }

    /// Checks every derived field against the bits.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut free = 0;
        let mut whole = RunSet::new();
        for p in 0..self.pages {
            let (a, b) = (u64::from(p) * PAGE, u64::from(p + 1) * PAGE);
            let runs: Vec<(u64, u64)> = bits::zero_runs(&self.bits, a, b).collect();
            let pf: u64 = runs.iter().map(|r| r.1).sum();
            let pl = runs.iter().map(|r| r.1).max().unwrap_or(0);
            if pf != u64::from(self.page_free[p as usize])
                || pl != u64::from(self.page_largest[p as usize])
            {
                return Err(format!(
                    "page {p} of group at {}: counts {}/{} but bits say {pf}/{pl}",
                    self.base, self.page_free[p as usize], self.page_largest[p as usize]
                ));
            }
            if self.page_bucket[p as usize] != self.page_bucket_now(p) {
                return Err(format!("page {p} of group at {} filed wrongly", self.base));
            }
            if pf == PAGE {
                whole.insert(u64::from(p), 1);
            }
            free += pf;
        }
        if free != self.free {
            return Err(format!(
                "group at {}: free {} but bits say {free}",
                self.base, self.free
            ));
        }
        if !whole.iter().eq(self.runs.iter()) {
            return Err(format!("group at {}: huge-page runs disagree", self.base));
        }
        if self.bucket != self.group_bucket_now() {
            return Err(format!("group at {} filed wrongly", self.base));
        }
        if !bits::all(&self.bits, 0, self.lo, true)
            || !bits::all(&self.bits, self.hi, self.blocks(), true)
        {
            return Err(format!(
                "group at {}: unmanaged blocks marked free",
                self.base
            ));
        }
        Ok(())
    }
}

/// The free space of one group, for comparisons in tests and for statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSummary {
    /// Free blocks.
    pub free: u64,
    /// Chunks of whole free pages, `(first page, pages)`, relative to the group.
    pub page_runs: Vec<(u64, u64)>,
    /// Split pages: `(page, free blocks, largest free chunk)`.
    pub split_pages: Vec<(u32, u64, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bit_helpers_agree_with_a_naive_scan() {
        let mut w = vec![0u64; 4];
        bits::fill(&mut w, 3, 70, true);
        bits::fill(&mut w, 100, 101, true);
        bits::fill(&mut w, 20, 30, false);
        let naive: Vec<bool> = (0..256).map(|i| bits::get(&w, i)).collect();
        let expect = |i: u64| (3..20).contains(&i) || (30..70).contains(&i) || i == 100;
        for i in 0..256u64 {
            assert_eq!(naive[i as usize], expect(i), "bit {i}");
        }
        let runs: Vec<(u64, u64)> = bits::zero_runs(&w, 0, 256).collect();
        assert_eq!(runs, vec![(0, 3), (20, 10), (70, 30), (101, 155)]);
        assert_eq!(bits::zero_run(&w, 70, 256), 30);
        assert_eq!(bits::zero_run(&w, 70, 80), 10);
        assert_eq!(bits::zero_run_back(&w, 0, 100), 30);
        assert_eq!(bits::zero_run_back(&w, 90, 100), 10);
        assert_eq!(bits::zero_run_back(&w, 0, 3), 3);
        assert_eq!(bits::zero_run_back(&w, 0, 20), 0);
        assert!(bits::all(&w, 30, 70, true));
        assert!(!bits::all(&w, 29, 70, true));
        assert_eq!(bits::count_words(&w, 0, 128), 17 + 40 + 1);
        assert_eq!(bits::longest_zero_run(&w, 0, 256), 155);
        assert_eq!(bits::longest_zero_run(&w, 0, 128), 30);
        assert_eq!(bits::longest_zero_run(&w, 128, 256), 128);
    }

    /// Bitmaps of up to ten words: empty, full, random, and words with two bits set or two
    /// clear (long runs with short interruptions).
    fn bitmap_words() -> impl Strategy<Value = Vec<u64>> {
        let two = (0..64u32, 0..64u32).prop_map(|(a, b)| 1u64 << a | 1u64 << b);
        proptest::collection::vec(
            prop_oneof![
                Just(0u64),
                Just(u64::MAX),
                any::<u64>(),
                two.clone(),
                two.prop_map(|w| !w),
            ],
            1..10,
        )
    }

    proptest! {
        #[test]
        fn longest_zero_run_is_the_longest_of_the_runs(
            words in bitmap_words()
        ) {
            let end = 64 * words.len() as u64;
            let naive = bits::zero_runs(&words, 0, end).map(|(_, l)| l).max().unwrap_or(0);
            prop_assert_eq!(bits::longest_zero_run(&words, 0, end), naive);
        }

        #[test]
        fn first_zero_run_is_the_first_run_long_enough(
            words in bitmap_words(),
            len in 1..80u64,
        ) {
            let end = 64 * words.len() as u64;
            let naive = bits::zero_runs(&words, 0, end).find(|&(_, l)| l >= len).map(|(s, _)| s);
            prop_assert_eq!(bits::first_zero_run(&words, 0, end, len), naive);
        }

        #[test]
        fn longest_ones_counts_the_longest_run(y in any::<u64>(), run in 0..=64u32, at in 0..64u32) {
            // Plant a run of `run` ones at `at` (clipped at the top bit) into a random word.
            let planted = if run == 0 { 0 } else { (u64::MAX >> (64 - run)) << at };
            for w in [y, planted, y | planted, y & !planted] {
                let naive = bits::zero_runs(&[!w], 0, 64).map(|(_, l)| l).max().unwrap_or(0);
                prop_assert_eq!(bits::longest_ones(w), naive, "{:#x}", w);
            }
        }
    }

    #[test]
    fn growing_allocation_is_centre_aligned_beside_a_growing_fragment() {
        let mut g = GroupState::new(0, 512, 0, 512 * PAGE);
        let a = g.grow_huge(1).unwrap();
        assert_eq!(a.start.0, 0, "head of the group: left-aligned");
        // Largest chunk: pages 1..512 (511 pages) right of a growing fragment.
        let b = g.grow_huge(1).unwrap();
        assert_eq!(
            b.start.0,
            (1 + 255) * PAGE,
            "centre of the chunk, page aligned"
        );
        // A fixed fragment ending at a chunk start makes the next one left-aligned.
        let mut h = GroupState::new(0, 8, 0, 8 * PAGE);
        let f = h.fixed_huge(PAGE, true).unwrap();
        assert_eq!(f.start.0, 7 * PAGE, "fixed allocations are right-aligned");
        h.give(7 * PAGE, PAGE);
        let x = h.take(0, 2 * PAGE, false, true, false);
        assert_eq!(x.len, 2 * PAGE);
        let y = h.grow_huge(1).unwrap();
        assert_eq!(
            y.start.0,
            2 * PAGE,
            "right of a fixed fragment: left-aligned"
        );
        h.take_delta();
        h.check().unwrap();
    }

    #[test]
    fn extension_runs_through_the_reserved_chunk_across_pages() {
        let mut g = GroupState::new(0, 4, 0, 4 * PAGE);
        let a = g.grow_huge(10).unwrap();
        let e = g.extend(a.end().0, 2000, true).unwrap();
        assert_eq!(e, Extent::new(pmfs_core::layout::BlockNo(10), 2000));
        assert!(g.extend(5, 1, true).is_none(), "allocated goal");
        let rest = g.extend(2010, 5000, true).unwrap();
        assert_eq!(rest.end().0, 4 * PAGE, "stops at the end of the group");
        g.take_delta();
        g.check().unwrap();
        assert_eq!(g.free, 0);
    }
}
