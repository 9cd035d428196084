//! The HashFS table gives bit-identical results on every hashing kernel: the same random
//! sequence of inserts, lookups, removes and truncates, applied to tables that differ only in
//! the kernel (scalar, AVX2, AVX-512 where the CPU has them), returns the same runs — the same
//! physical blocks — and the same errors, and leaves the same translation-cache contents.

use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{Extent, FileId, FileMapping};
use pmfs_mapping::hashfs::{HashFs, HashFsFile, HashKernel};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const SLOTS: u64 = 700;

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert(usize, u64, u64),
    Lookup(usize, u64, u64),
    Remove(usize, u64, u64),
    Truncate(usize, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0..2usize;
    let lblk = prop_oneof![
        0..64u64,
        0..4000u64,
        (u32::MAX as u64 - 40)..(u32::MAX as u64)
    ];
    prop_oneof![
        4 => (file.clone(), lblk.clone(), 1..=40u64).prop_map(|(f, l, n)| Op::Insert(f, l, n)),
        4 => (file.clone(), lblk.clone(), 1..=60u64).prop_map(|(f, l, n)| Op::Lookup(f, l, n)),
        2 => (file.clone(), lblk.clone(), 1..=30u64).prop_map(|(f, l, n)| Op::Remove(f, l, n)),
        1 => (file, lblk).prop_map(|(f, l)| Op::Truncate(f, l)),
    ]
}

struct Subject {
    table: HashFs<Arc<HeapRegion>>,
    files: Vec<HashFsFile>,
}

fn subject(kernel: HashKernel) -> Subject {
    let meta = Extent::new(BlockNo(1), HashFs::<HeapRegion>::meta_blocks(SLOTS));
    let data = Extent::new(meta.end(), SLOTS);
    let region = Arc::new(HeapRegion::new(data.end().0 * BLOCK_SIZE).unwrap());
    let mut table = HashFs::format_with_salt(region, meta, data, 0x51d).unwrap();
    table.set_kernel(kernel).unwrap();
    let files = [10, 11]
        .iter()
        .map(|&ino| {
            table
                .open_file(FileId {
                    ino,
                    root: PmOff(0),
                })
                .unwrap()
        })
        .collect();
    Subject { table, files }
}

/// Applies `op` and returns everything observable about it, as text.
fn run(s: &Subject, op: Op) -> String {
    let mut out = Vec::new();
    let r = match op {
        Op::Insert(f, l, n) => s.table.insert(&s.files[f], l, n, &mut out).map(|()| 0),
        Op::Lookup(f, l, n) => s.table.lookup(&s.files[f], l, n, &mut out).map(|()| 0),
        Op::Remove(f, l, n) => s.table.remove(&s.files[f], l, n),
        Op::Truncate(f, l) => s.table.remove(&s.files[f], l, u64::MAX - l),
    };
    let cache: Vec<_> = s
        .files
        .iter()
        .map(|f| {
            (0..4000)
                .filter_map(|l| f.cached_slot(l).map(|i| (l, i)))
                .collect::<Vec<_>>()
        })
        .collect();
    format!("{r:?} {out:?} {cache:?}")
}

#[test]
fn every_kernel_gives_the_scalar_results() {
    let kernels: Vec<HashKernel> = [HashKernel::Avx2, HashKernel::Avx512]
        .into_iter()
        .filter(|k| k.is_supported())
        .collect();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1..60), |ops| {
            let scalar = subject(HashKernel::Scalar);
            let others: Vec<Subject> = kernels.iter().map(|&k| subject(k)).collect();
            for (n, &op) in ops.iter().enumerate() {
                let want = run(&scalar, op);
                for (k, s) in kernels.iter().zip(&others) {
                    let got = run(s, op);
                    prop_assert_eq!(&got, &want, "step {} {:?} on {:?}", n, op, k);
                }
            }
            Ok(())
        })
        .unwrap();
}
