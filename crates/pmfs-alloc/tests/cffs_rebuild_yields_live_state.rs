//! CFFS keeps its state in DRAM only: rebuilding it from the used extents, after any sequence
//! of operations, yields the live state — the same allocated blocks, the same chunks of whole
//! pages, the same split pages with the same free counts and largest chunks, consistently
//! filed in the buddy lists.

use std::collections::BTreeMap;

use pmfs_alloc::CffsAllocator;
use pmfs_alloc::cffs::GROUP_BLOCKS;
use pmfs_core::layout::BlockNo;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc { want: u64, kind: u8, append: bool },
    Free { pick: usize, head: bool },
    RebuildInPlace,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            prop_oneof![1..=4u64, 1..=700u64, 1..=3000u64],
            0..3u8,
            any::<bool>()
        )
            .prop_map(|(want, kind, append)| Op::Alloc { want, kind, append }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, head)| Op::Free { pick, head }),
        1 => Just(Op::RebuildInPlace),
    ]
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        (0..1024u64, 1..6000u64),
        (0..3000u64, 1..8000u64).prop_map(|(back, c)| (GROUP_BLOCKS - back, c)),
    ]
}

fn used(model: &BTreeMap<u64, u64>) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for (&s, &l) in model {
        match out.last_mut() {
            Some(last) if last.end().0 == s => last.len += l,
            _ => out.push(Extent::new(BlockNo(s), l)),
        }
    }
    out
}

fn same_state(live: &CffsAllocator, rebuilt: &CffsAllocator) -> Result<(), TestCaseError> {
    rebuilt.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(live.used_extents(), rebuilt.used_extents());
    prop_assert_eq!(live.summary(), rebuilt.summary());
    prop_assert_eq!(live.free_blocks(), rebuilt.free_blocks());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(48),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn rebuild_after_any_sequence_yields_the_live_state(
        (first, count) in range(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let a = CffsAllocator::new(BlockNo(first), count);
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut last: Option<Extent> = None;
        for op in ops {
            match op {
                Op::Alloc { want, kind, append } => {
                    let kind = [AllocKind::Growing, AllocKind::Fixed, AllocKind::Metadata]
                        [kind as usize];
                    let goal = last.filter(|_| append).map(|e| e.end());
                    if let Ok(e) = a.alloc(want, AllocHint { kind, goal }) {
                        model.insert(e.start.0, e.len);
                        last = Some(e);
                    }
                }
                Op::Free { pick, head } => {
                    if model.is_empty() {
                        continue;
                    }
                    let (&s, &l) = model.iter().nth(pick % model.len()).unwrap();
                    let k = if head { l.div_ceil(2) } else { l };
                    a.free(Extent::new(BlockNo(s), k)).unwrap();
                    model.remove(&s);
                    if k < l {
                        model.insert(s + k, l - k);
                    }
                }
                Op::RebuildInPlace => {
                    let before = a.summary();
                    a.rebuild(&mut used(&model).into_iter()).unwrap();
                    prop_assert_eq!(before, a.summary());
                }
            }
            a.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(a.used_extents(), used(&model));
            let rebuilt = CffsAllocator::new(BlockNo(first), count);
            rebuilt.rebuild(&mut used(&model).into_iter()).unwrap();
            same_state(&a, &rebuilt)?;
        }
    }
}
