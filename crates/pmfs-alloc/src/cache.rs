//! Per-thread free-block caches in front of any allocator (MadFS §4.2, "thread-local free
//! list").
//!
//! [`ThreadCached`] wraps a [`BlockAllocator`]. Each thread that uses it gets a private cache
//! of free blocks, so that overwrite-heavy threads (copy-on-write data, log blocks) recycle
//! their own blocks without touching the shared allocator:
//!
//! - a **free** puts the blocks into the calling thread's cache instead of returning them;
//! - an **allocation** is served from the thread's cache when the hint's goal lies in it (a
//!   file re-growing into blocks it just released), or, for [`AllocKind::Fixed`] and
//!   [`AllocKind::Metadata`] requests, when a cached run holds the whole request. Growing
//!   files without a goal hit go to the shared allocator, whose placement policy (CFFS) is
//!   what keeps them contiguous. A metadata request that misses refills the cache with a
//!   batch of [`CacheConfig::refill`] blocks;
//! - a cache above [`CacheConfig::max_cached`] blocks gives the excess back;
//! - [`flush_caches`](BlockAllocator::flush_caches) returns every thread's cache to the shared
//!   allocator (the engine calls it when a file is closed);
//! - when the shared allocator runs out of space, the caller's cache is used whatever the
//!   request, and then the other threads' caches are drained, so
//!   [`Error::NoSpace`] still means that no block is free.
//!
//! Cached blocks are allocated as far as the shared allocator (and its persistent state, if
//! any) knows. After a crash they are simply not among the used extents the file system
//! reports, so the next [`rebuild`](BlockAllocator::rebuild) frees them: a crash leaks
//! nothing for good.
//!
//! The wrapper keeps one bit per managed block for the blocks its clients hold, so double
//! frees are refused even though freed blocks no longer reach the shared allocator.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pmfs_core::layout::BlockNo;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use pmfs_core::{Error, Result};

use crate::runs::RunSet;

/// Tunables of [`ThreadCached`].
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Most blocks one thread's cache keeps; a free beyond it returns the excess (down to half
    /// of it) to the shared allocator.
    pub max_cached: u64,
    /// Blocks fetched at once for a metadata request that the cache cannot serve (0: fetch
    /// only what is wanted).
    pub refill: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_cached: 4096,
            refill: 64,
        }
    }
}

/// One thread's cache.
#[derive(Debug, Default)]
struct LocalCache {
    runs: RunSet,
}

type CacheRef = Arc<Mutex<LocalCache>>;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The calling thread's caches, one per live [`ThreadCached`] it has used (by id).
    static LOCAL: RefCell<Vec<(u64, CacheRef)>> = const { RefCell::new(Vec::new()) };
}

fn lock(c: &CacheRef) -> MutexGuard<'_, LocalCache> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// A [`BlockAllocator`] with per-thread free-block caches in front of `A` (see the module
/// documentation).
#[derive(Debug)]
pub struct ThreadCached<A> {
    inner: A,
    id: u64,
    first: u64,
    count: u64,
    cfg: CacheConfig,
    /// One bit per managed block: held by a client.
    held: Vec<AtomicU64>,
    /// Every thread's cache; an entry only this list references belongs to a finished thread.
    caches: Mutex<Vec<CacheRef>>,
    /// Blocks in all caches.
    cached: AtomicU64,
}

impl<A: BlockAllocator> ThreadCached<A> {
    /// Wraps `inner`, which manages `[first, first + inner.total_blocks())` and must have
    /// every block free (or be [`rebuild`](BlockAllocator::rebuild) through the wrapper).
    pub fn new(inner: A, first: BlockNo) -> Self {
        Self::with_config(inner, first, CacheConfig::default())
    }

    /// [`new`](Self::new) with explicit tunables.
    pub fn with_config(inner: A, first: BlockNo, cfg: CacheConfig) -> Self {
        let count = inner.total_blocks();
        Self {
            inner,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            first: first.0,
            count,
            cfg,
            held: (0..count.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            caches: Mutex::new(Vec::new()),
            cached: AtomicU64::new(0),
        }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Blocks currently held in all threads' caches.
    pub fn cached_blocks(&self) -> u64 {
        self.cached.load(Ordering::SeqCst)
    }

    fn registry(&self) -> MutexGuard<'_, Vec<CacheRef>> {
        self.caches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread's cache, created and registered on first use.
    fn local(&self) -> CacheRef {
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            // Caches of dropped allocators are referenced from here only.
            l.retain(|(_, c)| Arc::strong_count(c) > 1);
            if let Some((_, c)) = l.iter().find(|(id, _)| *id == self.id) {
                return c.clone();
            }
            let c = CacheRef::default();
            {
                let mut reg = self.registry();
                // Return the caches of finished threads while we are here.
                let mut i = 0;
                while i < reg.len() {
                    if Arc::strong_count(&reg[i]) == 1 {
                        let dead = reg.swap_remove(i);
                        self.drain(&mut lock(&dead));
                    } else {
                        i += 1;
                    }
                }
                reg.push(c.clone());
            }
            l.push((self.id, c.clone()));
            c
        })
    }

    /// Returns every block of `cache` to the shared allocator.
    fn drain(&self, cache: &mut LocalCache) {
        let runs: Vec<(u64, u64)> = cache.runs.iter().collect();
        for (s, l) in runs {
            self.give_back(cache, s, l);
        }
    }

    /// Moves `[s, s + l)` from `cache` to the shared allocator.
    fn give_back(&self, cache: &mut LocalCache, s: u64, l: u64) {
        if cache.runs.remove(s, l) {
            self.cached.fetch_sub(l, Ordering::SeqCst);
            // The blocks are allocated in `inner` (it handed them out), so this cannot fail
            // unless `inner` breaks its own contract; the blocks would then stay allocated
            // there until the next rebuild, which is the crash-leak path anyway.
            let _ = self.inner.free(Extent::new(BlockNo(s), l));
        }
    }

    /// Takes `[s, s + l)` out of `cache` (it must be there).
    fn take_cached(&self, cache: &mut LocalCache, s: u64, l: u64) -> Extent {
        let removed = cache.runs.remove(s, l);
        debug_assert!(removed);
        self.cached.fetch_sub(l, Ordering::SeqCst);
        Extent::new(BlockNo(s), l)
    }

    fn put_cached(&self, cache: &mut LocalCache, s: u64, l: u64) {
        let inserted = cache.runs.insert(s, l);
        debug_assert!(inserted, "a block cached twice");
        self.cached.fetch_add(l, Ordering::SeqCst);
    }

    /// Marks an extent handed to a client.
    fn claim(&self, e: Extent) {
        self.update_held(e, true);
    }

    /// Sets or clears the held bits of `e`. Clearing checks that every bit was set; if not,
    /// restores what it cleared and returns false.
    fn update_held(&self, e: Extent, set: bool) -> bool {
        let rel = e.start.0 - self.first;
        let (w0, w1) = (rel / 64, (rel + e.len - 1) / 64);
        for w in w0..=w1 {
            let lo = if w == w0 { rel % 64 } else { 0 };
            let hi = if w == w1 { (rel + e.len - 1) % 64 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            let word = &self.held[w as usize];
            if set {
                let old = word.fetch_or(mask, Ordering::SeqCst);
                debug_assert_eq!(
                    old & mask,
                    0,
                    "the shared allocator handed out a held block"
                );
            } else {
                let old = word.fetch_and(!mask, Ordering::SeqCst);
                if old & mask != mask {
                    word.fetch_or(old & mask, Ordering::SeqCst);
                    for v in w0..w {
                        let lo = if v == w0 { rel % 64 } else { 0 };
                        self.held[v as usize].fetch_or(u64::MAX << lo, Ordering::SeqCst);
                    }
                    return false;
                }
            }
        }
        true
    }

    /// Serves a request from `cache`, if the policy allows.
    fn serve_cached(&self, cache: &mut LocalCache, want: u64, hint: AllocHint) -> Option<Extent> {
        if let Some(g) = hint.goal
            && let Some((s, l)) = cache.runs.containing(g.0)
        {
            return Some(self.take_cached(cache, g.0, want.min(s + l - g.0)));
        }
        if hint.kind != AllocKind::Growing
            && let Some((s, _)) = cache.runs.best_fit(want)
        {
            return Some(self.take_cached(cache, s, want));
        }
        None
    }

    /// Allocates from the shared allocator; a metadata request that misses refills the cache.
    fn take_shared(&self, cache: &mut LocalCache, want: u64, hint: AllocHint) -> Result<Extent> {
        let batch = if hint.kind == AllocKind::Metadata && self.cfg.refill > want {
            self.cfg.refill
        } else {
            want
        };
        let e = self.inner.alloc(batch, hint)?;
        if e.len > want {
            self.put_cached(cache, e.start.0 + want, e.len - want);
            return Ok(Extent::new(e.start, want));
        }
        Ok(e)
    }

    /// Drains every thread's cache into the shared allocator.
    fn drain_all(&self) {
        let reg: Vec<CacheRef> = self.registry().clone();
        for c in reg {
            self.drain(&mut lock(&c));
        }
    }
}

impl<A: BlockAllocator> BlockAllocator for ThreadCached<A> {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        if want == 0 {
            return Err(Error::InvalidArgument("allocation of zero blocks"));
        }
        let local = self.local();
        let mut cache = lock(&local);
        let e = match self.serve_cached(&mut cache, want, hint) {
            Some(e) => e,
            None => match self.take_shared(&mut cache, want, hint) {
                Ok(e) => e,
                Err(Error::NoSpace) => {
                    // Out of shared space: anything in our cache, then the other caches.
                    match cache.runs.largest() {
                        Some((s, l)) => self.take_cached(&mut cache, s, want.min(l)),
                        None => {
                            drop(cache);
                            self.drain_all();
                            self.inner.alloc(want, hint)?
                        }
                    }
                }
                Err(e) => return Err(e),
            },
        };
        self.claim(e);
        Ok(e)
    }

    fn free(&self, ext: Extent) -> Result<()> {
        let in_range = ext.len > 0
            && ext.start.0 >= self.first
            && ext
                .start
                .0
                .checked_add(ext.len)
                .is_some_and(|e| e <= self.first + self.count);
        if !in_range {
            return Err(Error::InvalidArgument(
                "free of blocks outside the managed range",
            ));
        }
        if !self.update_held(ext, false) {
            return Err(Error::InvalidArgument(
                "free of blocks that are not allocated",
            ));
        }
        let local = self.local();
        let mut cache = lock(&local);
        self.put_cached(&mut cache, ext.start.0, ext.len);
        if cache.runs.total() > self.cfg.max_cached {
            let target = self.cfg.max_cached / 2;
            let runs: Vec<(u64, u64)> = cache.runs.iter().collect();
            for (s, l) in runs {
                if cache.runs.total() <= target {
                    break;
                }
                self.give_back(&mut cache, s, l);
            }
        }
        Ok(())
    }

    fn free_blocks(&self) -> u64 {
        self.inner.free_blocks() + self.cached.load(Ordering::SeqCst)
    }

    fn total_blocks(&self) -> u64 {
        self.count
    }

    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        let sorted: Vec<Extent> = {
            let mut v: Vec<Extent> = used.collect();
            v.sort();
            v
        };
        // Cached blocks are free once the shared allocator is rebuilt: forget them.
        let reg = self.registry();
        let mut guards: Vec<MutexGuard<'_, LocalCache>> = reg.iter().map(lock).collect();
        self.inner.rebuild(&mut sorted.iter().copied())?;
        for g in guards.iter_mut() {
            let n = g.runs.total();
            g.runs = RunSet::new();
            self.cached.fetch_sub(n, Ordering::SeqCst);
        }
        for w in &self.held {
            w.store(0, Ordering::SeqCst);
        }
        for e in sorted {
            self.claim(e);
        }
        Ok(())
    }

    fn flush_caches(&self) {
        self.drain_all();
        self.inner.flush_caches();
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::traits::SimpleAllocator;

    use super::*;

    #[test]
    fn frees_are_recycled_by_the_same_thread_and_flushed_back() {
        let a = ThreadCached::new(SimpleAllocator::new(BlockNo(0), 1000), BlockNo(0));
        let e = a.alloc(10, AllocHint::default()).unwrap();
        a.free(e).unwrap();
        assert_eq!(a.cached_blocks(), 10);
        assert_eq!(a.inner().free_blocks(), 990);
        assert_eq!(a.free_blocks(), 1000);
        let f = a.alloc(4, AllocHint::metadata()).unwrap();
        assert!(
            e.contains(f.start),
            "a metadata request reuses cached blocks"
        );
        assert!(
            matches!(a.free(e), Err(Error::InvalidArgument(_))),
            "partly cached"
        );
        a.flush_caches();
        assert_eq!(a.cached_blocks(), 0);
        assert_eq!(a.inner().free_blocks(), 996);
    }

    #[test]
    fn a_metadata_miss_refills_and_an_overfull_cache_spills() {
        let cfg = CacheConfig {
            max_cached: 100,
            refill: 64,
        };
        let a = ThreadCached::with_config(SimpleAllocator::new(BlockNo(0), 1000), BlockNo(0), cfg);
        let m = a.alloc(1, AllocHint::metadata()).unwrap();
        assert_eq!(m.len, 1);
        assert_eq!(a.cached_blocks(), 63);
        let big = a.alloc(200, AllocHint::default()).unwrap();
        a.free(big).unwrap();
        assert!(a.cached_blocks() <= 50, "spilled down to half the limit");
        assert_eq!(a.free_blocks(), 999);
    }

    #[test]
    fn blocks_cached_at_a_crash_come_back_at_the_rebuild() {
        let a = ThreadCached::new(SimpleAllocator::new(BlockNo(100), 200), BlockNo(100));
        let keep = a.alloc(50, AllocHint::default()).unwrap();
        let lost = a.alloc(30, AllocHint::metadata()).unwrap();
        a.free(lost).unwrap();
        assert!(a.cached_blocks() >= 30);
        // After a crash the file system reports only what it still uses.
        a.rebuild(&mut std::iter::once(keep)).unwrap();
        assert_eq!(a.cached_blocks(), 0);
        assert_eq!(a.free_blocks(), 150);
        assert_eq!(a.inner().free_blocks(), 150);
        assert!(matches!(a.free(lost), Err(Error::InvalidArgument(_))));
        a.free(keep).unwrap();
        assert_eq!(a.free_blocks(), 200);
    }

    #[test]
    fn other_threads_caches_are_drained_before_no_space() {
        let a = ThreadCached::new(SimpleAllocator::new(BlockNo(0), 64), BlockNo(0));
        let e = a.alloc(64, AllocHint::default()).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| a.free(e).unwrap());
        });
        assert_eq!(a.inner().free_blocks(), 0);
        let f = a.alloc(64, AllocHint::default()).unwrap();
        assert_eq!(f.len, 64);
    }
}
