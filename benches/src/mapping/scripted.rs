//! An allocator that can hand out a planned layout: how an aged layout from
//! [`pmfs_alloc::aging`] becomes the layout of files built through the
//! [`FileMapping`](pmfs_core::traits::FileMapping) contract, which allocates by itself.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use pmfs_core::layout::BlockNo;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use pmfs_core::{Error, Result};

/// Wraps an allocator. While a script is loaded ([`load`](Scripted::load)), data allocations
/// (any hint but [`AllocKind::Metadata`]) are served from the script's extents, in order;
/// metadata allocations and everything after [`finish`](Scripted::finish) go to the inner
/// allocator. Outside scripting the wrapper costs one relaxed atomic load per allocation.
#[derive(Debug)]
pub struct Scripted<A> {
    inner: A,
    active: AtomicBool,
    script: Mutex<VecDeque<Extent>>,
}

impl<A: BlockAllocator> Scripted<A> {
    /// Wraps `inner`, with no script loaded.
    pub fn new(inner: A) -> Self {
        Self {
            inner,
            active: AtomicBool::new(false),
            script: Mutex::new(VecDeque::new()),
        }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Extent>> {
        self.script.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `plan` (extents in the order data allocations will ask for them) the next data
    /// allocations. The inner allocator is rebuilt so that exactly `used` and the plan are
    /// allocated; it must hold nothing else.
    pub fn load(&self, plan: &[Extent], used: &[Extent]) -> Result<()> {
        let mut all: Vec<Extent> = plan.iter().chain(used).copied().collect();
        self.inner.rebuild(&mut all.drain(..))?;
        *self.queue() = plan.iter().copied().collect();
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Ends scripting. Fails with [`Error::InvalidArgument`] if planned blocks were not
    /// handed out (they are freed first, so the allocator stays consistent).
    pub fn finish(&self) -> Result<()> {
        self.active.store(false, Ordering::Release);
        let left: Vec<Extent> = self.queue().drain(..).collect();
        for e in &left {
            self.inner.free(*e)?;
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument("planned layout not fully allocated"))
        }
    }

    /// Takes up to `want` blocks from the front of the script.
    fn take_planned(&self, want: u64) -> Option<Extent> {
        let mut q = self.queue();
        let front = q.front_mut()?;
        let take = want.min(front.len);
        let got = Extent::new(front.start, take);
        *front = Extent::new(BlockNo(front.start.0 + take), front.len - take);
        if front.len == 0 {
            q.pop_front();
        }
        Some(got)
    }
}

impl<A: BlockAllocator> BlockAllocator for Scripted<A> {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        if want == 0 {
            return Err(Error::InvalidArgument("allocation of zero blocks"));
        }
        if self.active.load(Ordering::Relaxed)
            && hint.kind != AllocKind::Metadata
            && let Some(e) = self.take_planned(want)
        {
            return Ok(e);
        }
        self.inner.alloc(want, hint)
    }

    fn free(&self, ext: Extent) -> Result<()> {
        self.inner.free(ext)
    }

    fn free_blocks(&self) -> u64 {
        self.inner.free_blocks() + self.queue().iter().map(|e| e.len).sum::<u64>()
    }

    fn total_blocks(&self) -> u64 {
        self.inner.total_blocks()
    }

    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        self.active.store(false, Ordering::Release);
        self.queue().clear();
        self.inner.rebuild(used)
    }

    fn flush_caches(&self) {
        self.inner.flush_caches()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::traits::SimpleAllocator;

    fn ext(s: u64, l: u64) -> Extent {
        Extent::new(BlockNo(s), l)
    }

    #[test]
    fn data_allocations_follow_the_script_and_metadata_does_not() {
        let a = Scripted::new(SimpleAllocator::new(BlockNo(0), 100));
        a.load(&[ext(50, 3), ext(10, 2)], &[ext(0, 5)]).unwrap();
        assert_eq!(a.free_blocks(), 100 - 5);
        assert_eq!(a.alloc(2, AllocHint::default()).unwrap(), ext(50, 2));
        assert_eq!(a.alloc(1, AllocHint::metadata()).unwrap(), ext(5, 1));
        assert_eq!(a.alloc(5, AllocHint::default()).unwrap(), ext(52, 1));
        assert_eq!(a.alloc(5, AllocHint::default()).unwrap(), ext(10, 2));
        a.finish().unwrap();
        assert_eq!(a.alloc(1, AllocHint::default()).unwrap(), ext(6, 1));
        a.free(ext(50, 3)).unwrap();
        assert_eq!(a.free_blocks(), 100 - 5 - 1 - 2 - 1);
    }

    #[test]
    fn unfinished_scripts_are_released() {
        let a = Scripted::new(SimpleAllocator::new(BlockNo(0), 100));
        a.load(&[ext(50, 3)], &[]).unwrap();
        assert!(a.finish().is_err());
        assert_eq!(a.free_blocks(), 100);
        assert!(a.alloc(0, AllocHint::default()).is_err());
    }
}
