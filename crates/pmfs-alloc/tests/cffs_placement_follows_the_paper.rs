//! CFFS placement scenarios from §IV of the paper: growing files keep one fragment when
//! appends interleave, new fragments are 2 MiB aligned and centre-aligned beside growing ones,
//! fixed-size allocations pack into split pages away from growing files, the extension LRU
//! keeps new fragments out of recently extended groups, and an extension that outgrows its
//! reserve continues elsewhere (Fig. 8(c)).

use pmfs_alloc::aging::blocks_and_fragments;
use pmfs_alloc::baseline::bitmap_area_size;
use pmfs_alloc::cffs::{GROUP_BLOCKS, PAGE_BLOCKS};
use pmfs_alloc::{CffsAllocator, FreeExtentAllocator};
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};

fn growing(goal: Option<BlockNo>) -> AllocHint {
    AllocHint {
        kind: AllocKind::Growing,
        goal,
    }
}

fn fixed() -> AllocHint {
    AllocHint {
        kind: AllocKind::Fixed,
        goal: None,
    }
}

/// Appends `step` blocks at a time to each file in turn until each has `blocks` blocks.
fn round_robin(a: &dyn BlockAllocator, files: usize, blocks: u64, step: u64) -> Vec<Vec<Extent>> {
    let mut out: Vec<Vec<Extent>> = vec![Vec::new(); files];
    let mut size = vec![0u64; files];
    while size.iter().any(|&s| s < blocks) {
        for f in 0..files {
            let mut left = step.min(blocks - size[f]);
            while left > 0 {
                let goal = out[f].last().map(Extent::end);
                let e = a.alloc(left, growing(goal)).expect("room");
                left -= e.len;
                size[f] += e.len;
                out[f].push(e);
            }
        }
    }
    out
}

#[test]
fn interleaved_appends_keep_each_file_in_one_aligned_fragment() {
    let cffs = CffsAllocator::new(BlockNo(0), 2 * GROUP_BLOCKS);
    let files = round_robin(&cffs, 4, 8192, 4);
    for (i, f) in files.iter().enumerate() {
        let (_, k) = blocks_and_fragments(f);
        assert_eq!(k, 1, "file {i} has {k} fragments");
        assert_eq!(f[0].start.0 % PAGE_BLOCKS, 0, "file {i} starts unaligned");
    }
    // The baseline interleaves the files block group by block group.
    let region = HeapRegion::new(bitmap_area_size(2 * GROUP_BLOCKS)).unwrap();
    let base =
        FreeExtentAllocator::format(region, PmOff(0), Extent::new(BlockNo(0), 2 * GROUP_BLOCKS))
            .unwrap();
    let files = round_robin(&base, 4, 8192, 4);
    for f in &files {
        assert_eq!(blocks_and_fragments(f).1, 8192 / 4);
    }
}

#[test]
fn a_new_growing_fragment_is_centred_beside_a_growing_one() {
    let a = CffsAllocator::new(BlockNo(0), GROUP_BLOCKS);
    let first = a.alloc(1, growing(None)).unwrap();
    assert_eq!(first.start.0, 0, "head of the group: left-aligned");
    let second = a.alloc(1, growing(None)).unwrap();
    assert_eq!(second.start.0, 256 * PAGE_BLOCKS, "centre of pages 1..512");
    let third = a.alloc(1, growing(None)).unwrap();
    assert_eq!(third.start.0 % PAGE_BLOCKS, 0, "2 MiB aligned");
    assert!(
        third.start.0 == 128 * PAGE_BLOCKS || third.start.0 == 384 * PAGE_BLOCKS,
        "centre of one of the two halves, got {:?}",
        third
    );
}

#[test]
fn growing_beside_a_fixed_fragment_is_left_aligned() {
    let a = CffsAllocator::new(BlockNo(0), 8 * PAGE_BLOCKS);
    // A fixed 2-page fragment is right-aligned in the group: pages 6..8.
    let f = a.alloc(2 * PAGE_BLOCKS, fixed()).unwrap();
    assert_eq!(f.start.0, 6 * PAGE_BLOCKS);
    a.free(f).unwrap();
    // Fill pages 0..2 with a fixed fragment; the next growing fragment starts right after it.
    let g = a
        .alloc(
            2 * PAGE_BLOCKS,
            AllocHint {
                kind: AllocKind::Fixed,
                goal: Some(BlockNo(0)),
            },
        )
        .unwrap();
    assert_eq!(g, Extent::new(BlockNo(0), 2 * PAGE_BLOCKS));
    let h = a.alloc(1, growing(None)).unwrap();
    assert_eq!(h.start.0, 2 * PAGE_BLOCKS);
}

#[test]
fn fixed_small_allocations_pack_into_split_pages_away_from_growing_files() {
    let a = CffsAllocator::new(BlockNo(0), GROUP_BLOCKS);
    let file = a.alloc(1, growing(None)).unwrap();
    let small: Vec<Extent> = (0..300).map(|_| a.alloc(1, fixed()).unwrap()).collect();
    let page = small[0].start.0 / PAGE_BLOCKS;
    assert_ne!(page, file.start.0 / PAGE_BLOCKS);
    assert!(
        small.iter().all(|e| e.start.0 / PAGE_BLOCKS == page),
        "one split page"
    );
    assert_eq!(
        small[0].start.0 % PAGE_BLOCKS,
        PAGE_BLOCKS - 1,
        "right-aligned"
    );
    // Metadata goes to the same split page while it has room.
    let m = a.alloc(8, AllocHint::metadata()).unwrap();
    assert_eq!(m.start.0 / PAGE_BLOCKS, page);
    // The growing file extends undisturbed through its reserve.
    let ext = a.alloc(GROUP_BLOCKS, growing(Some(file.end()))).unwrap();
    assert_eq!(ext.start, file.end());
    let lowest_small = small.iter().chain([&m]).map(|e| e.start).min().unwrap();
    assert_eq!(ext.end(), lowest_small, "up to the packed blocks");
}

#[test]
fn the_extension_lru_keeps_new_fragments_out_of_recently_extended_groups() {
    let a = CffsAllocator::new(BlockNo(0), 2 * GROUP_BLOCKS);
    let fa = a.alloc(1, growing(None)).unwrap();
    let fb = a.alloc(1, growing(None)).unwrap();
    assert_eq!(fa.start.0 / GROUP_BLOCKS, 0);
    assert_eq!(fb.start.0 / GROUP_BLOCKS, 1);
    // Both groups now have 511 free pages; A extends, so its group enters the LRU list.
    a.alloc(3, growing(Some(fa.end()))).unwrap();
    let c = a.alloc(1, growing(None)).unwrap();
    assert_eq!(c.start.0 / GROUP_BLOCKS, 1, "group 0 was just extended");
    // B extends: group 1 enters the list and group 0 (the oldest) leaves it.
    a.alloc(3, growing(Some(fb.end()))).unwrap();
    let d = a.alloc(1, growing(None)).unwrap();
    assert_eq!(d.start.0 / GROUP_BLOCKS, 0, "group 1 was just extended");
    assert_eq!(a.lru_len(), 1);
}

#[test]
fn an_extension_beyond_its_reserve_continues_in_a_new_fragment() {
    let a = CffsAllocator::new(BlockNo(0), GROUP_BLOCKS);
    let fa = a.alloc(1, growing(None)).unwrap();
    let fb = a.alloc(1, growing(None)).unwrap();
    // A's reserve ends where B starts.
    let ext = a.alloc(GROUP_BLOCKS, growing(Some(fa.end()))).unwrap();
    assert_eq!(ext.end(), fb.start);
    // The next append cannot extend: a new 2 MiB aligned fragment elsewhere.
    let next = a.alloc(10, growing(Some(ext.end()))).unwrap();
    assert_ne!(next.start, ext.end());
    assert_eq!(next.start.0 % PAGE_BLOCKS, 0);
}

#[test]
fn huge_page_requests_are_page_aligned_and_whole() {
    let a = CffsAllocator::new(BlockNo(100), 3 * GROUP_BLOCKS);
    for _ in 0..64 {
        let e = a.alloc(PAGE_BLOCKS, growing(None)).unwrap();
        assert_eq!(e.len, PAGE_BLOCKS);
        assert_eq!(e.start.0 % PAGE_BLOCKS, 0);
    }
    a.check_invariants().unwrap();
}
