//! The reference `SimpleAllocator` passes the `BlockAllocator` conformance suite, and the suite
//! catches allocators that break the contract.

use std::sync::Mutex;

use pmfs_core::Result;
use pmfs_core::layout::BlockNo;
use pmfs_core::traits::conformance::alloc::{SuiteConfig, check_model, run_suite};
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent, SimpleAllocator};

#[test]
fn simple_allocator_passes_the_block_allocator_suite() {
    run_suite(SimpleAllocator::new);
}

/// How a [`Broken`] allocator breaks the contract.
#[derive(Clone, Copy, Debug)]
enum Flaw {
    /// Frees of single blocks are acknowledged but the block never comes back.
    LeaksSingleFrees,
    /// The first block freed is handed out again on every later allocation.
    ReusesFreedBlock,
    /// Rebuild ignores its input and keeps the old state.
    IgnoresRebuild,
}

#[derive(Debug)]
struct Broken {
    inner: SimpleAllocator,
    flaw: Flaw,
    stash: Mutex<Option<Extent>>,
}

impl BlockAllocator for Broken {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        if let Flaw::ReusesFreedBlock = self.flaw
            && let Some(e) = *self.stash.lock().unwrap()
        {
            return Ok(Extent::new(e.start, 1));
        }
        self.inner.alloc(want, hint)
    }
    fn free(&self, ext: Extent) -> Result<()> {
        match self.flaw {
            Flaw::LeaksSingleFrees if ext.len == 1 => Ok(()),
            Flaw::ReusesFreedBlock => {
                self.inner.free(ext)?;
                self.stash.lock().unwrap().get_or_insert(ext);
                Ok(())
            }
            _ => self.inner.free(ext),
        }
    }
    fn free_blocks(&self) -> u64 {
        self.inner.free_blocks()
    }
    fn total_blocks(&self) -> u64 {
        self.inner.total_blocks()
    }
    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        match self.flaw {
            Flaw::IgnoresRebuild => {
                used.for_each(drop);
                Ok(())
            }
            _ => self.inner.rebuild(used),
        }
    }
}

fn model_check_of(flaw: Flaw) {
    check_model(&SuiteConfig::default(), |first: BlockNo, count| Broken {
        inner: SimpleAllocator::new(first, count),
        flaw,
        stash: Mutex::new(None),
    });
}

#[test]
#[should_panic(expected = "BlockAllocator conformance")]
fn suite_catches_a_leaking_free() {
    model_check_of(Flaw::LeaksSingleFrees);
}

#[test]
#[should_panic(expected = "BlockAllocator conformance")]
fn suite_catches_a_block_handed_out_twice() {
    model_check_of(Flaw::ReusesFreedBlock);
}

#[test]
#[should_panic(expected = "BlockAllocator conformance")]
fn suite_catches_an_ignored_rebuild() {
    model_check_of(Flaw::IgnoresRebuild);
}
