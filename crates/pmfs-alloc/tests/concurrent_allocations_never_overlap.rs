//! Many threads appending to files, allocating metadata and small fixed files, truncating and
//! freeing at once: no block is ever handed out twice, and when everything is freed the
//! allocators are consistent and whole again. The range spans three CFFS groups, so group
//! boundaries, the shared buddy structure and the per-thread caches are all under contention.

use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_alloc::baseline::bitmap_area_size;
use pmfs_alloc::cffs::GROUP_BLOCKS;
use pmfs_alloc::{CffsAllocator, FreeExtentAllocator, ThreadCached};
use pmfs_core::Error;
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const FIRST: u64 = GROUP_BLOCKS - 5000;
const COUNT: u64 = GROUP_BLOCKS + 20_000;
const THREADS: usize = 8;
const OPS: usize = 3000;

struct Claims(Vec<AtomicU64>);

impl Claims {
    fn new() -> Self {
        Self((0..COUNT.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    fn claim(&self, e: Extent) {
        assert!(
            e.len >= 1 && e.start.0 >= FIRST && e.end().0 <= FIRST + COUNT,
            "{e:?}"
        );
        for b in e.start.0..e.end().0 {
            let i = b - FIRST;
            let bit = 1u64 << (i % 64);
            let old = self.0[(i / 64) as usize].fetch_or(bit, Ordering::SeqCst);
            assert_eq!(old & bit, 0, "block {b} handed out twice (in {e:?})");
        }
    }

    fn release(&self, e: Extent) {
        for b in e.start.0..e.end().0 {
            let i = b - FIRST;
            self.0[(i / 64) as usize].fetch_and(!(1u64 << (i % 64)), Ordering::SeqCst);
        }
    }
}

fn worker(a: &dyn BlockAllocator, claims: &Claims, t: usize) {
    let mut rng = SmallRng::seed_from_u64(0x5eed ^ t as u64);
    let mut files: Vec<Vec<Extent>> = vec![Vec::new(); 3];
    let mut small: Vec<Extent> = Vec::new();
    let free = |e: Extent| {
        claims.release(e);
        a.free(e).expect("free of held blocks");
    };
    for _ in 0..OPS {
        let r = rng.gen_range(0..100);
        let result = if r < 55 {
            let f = rng.gen_range(0..files.len());
            let goal = files[f].last().map(Extent::end);
            let want = if rng.gen_bool(0.9) { 4 } else { 512 };
            a.alloc(
                want,
                AllocHint {
                    kind: AllocKind::Growing,
                    goal,
                },
            )
            .map(|e| files[f].push(e))
            .map(|()| *files[f].last().expect("just pushed"))
        } else if r < 75 {
            let kind = if rng.gen_bool(0.5) {
                AllocKind::Fixed
            } else {
                AllocKind::Metadata
            };
            a.alloc(rng.gen_range(1..=8), AllocHint { kind, goal: None })
                .inspect(|&e| small.push(e))
        } else if r < 90 {
            if let Some(i) = (!small.is_empty()).then(|| rng.gen_range(0..small.len())) {
                free(small.swap_remove(i));
            }
            continue;
        } else {
            let f = rng.gen_range(0..files.len());
            for e in files[f].drain(..) {
                free(e);
            }
            continue;
        };
        match result {
            Ok(e) => claims.claim(e),
            Err(Error::NoSpace) => {}
            Err(e) => panic!("thread {t}: {e}"),
        }
    }
    for e in files.into_iter().flatten().chain(small) {
        free(e);
    }
}

fn stress(a: &(dyn BlockAllocator + Sync)) {
    let claims = Claims::new();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let claims = &claims;
            s.spawn(move || worker(a, claims, t));
        }
    });
    a.flush_caches();
    assert_eq!(a.free_blocks(), COUNT, "blocks leaked");
}

#[test]
fn cffs_under_contention() {
    let a = CffsAllocator::new(BlockNo(FIRST), COUNT);
    stress(&a);
    a.check_invariants().unwrap();
    assert!(a.used_extents().is_empty());
}

#[test]
fn thread_cached_cffs_under_contention() {
    let a = ThreadCached::new(CffsAllocator::new(BlockNo(FIRST), COUNT), BlockNo(FIRST));
    stress(&a);
    a.inner().check_invariants().unwrap();
    assert!(a.inner().used_extents().is_empty());
}

#[test]
fn baseline_under_contention() {
    let region = HeapRegion::new(bitmap_area_size(COUNT)).unwrap();
    let a =
        FreeExtentAllocator::format(region, PmOff(0), Extent::new(BlockNo(FIRST), COUNT)).unwrap();
    stress(&a);
    assert!(a.used_extents().is_empty());
}
