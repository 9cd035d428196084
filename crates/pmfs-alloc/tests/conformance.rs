//! Every allocator of this crate passes the `BlockAllocator` conformance suite.

use pmfs_alloc::baseline::bitmap_area_size;
use pmfs_alloc::{CacheConfig, CffsAllocator, CffsConfig, FreeExtentAllocator, ThreadCached};
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::Extent;
use pmfs_core::traits::conformance::alloc::run_suite;

#[test]
fn baseline_passes_the_suite() {
    run_suite(|first: BlockNo, count| {
        let region = HeapRegion::new(bitmap_area_size(count) + 64).expect("heap region");
        FreeExtentAllocator::format(region, PmOff(64), Extent::new(first, count)).expect("format")
    });
}

#[test]
fn cffs_passes_the_suite() {
    run_suite(CffsAllocator::new);
}

#[test]
fn cffs_without_lru_passes_the_suite() {
    run_suite(|first, count| {
        CffsAllocator::with_config(first, count, CffsConfig { lru_capacity: 0 })
    });
}

#[test]
fn thread_cached_cffs_passes_the_suite() {
    run_suite(|first, count| ThreadCached::new(CffsAllocator::new(first, count), first));
}

#[test]
fn thread_cached_baseline_with_small_caches_passes_the_suite() {
    run_suite(|first: BlockNo, count| {
        let region = HeapRegion::new(bitmap_area_size(count) + 64).expect("heap region");
        let inner = FreeExtentAllocator::format(region, PmOff(64), Extent::new(first, count))
            .expect("format");
        let cfg = CacheConfig {
            max_cached: 40,
            refill: 16,
        };
        ThreadCached::with_config(inner, first, cfg)
    });
}
