//! HashFS passes the shared `FileMapping` conformance suite on every hashing kernel this CPU
//! has (scalar, AVX2, AVX-512), also when the table runs full, and survives the suite's
//! concurrency stress (writers on different files; one writer and readers on one file). The
//! suite's `insert_at` operations (and copy-on-write overwrites) get their blocks from
//! `HashFs::stage`, and give refused runs back with `HashFs::unstage`.

use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::conformance::mapping::{
    BlockSource, StressConfig, Subject, SuiteConfig, run_suite, stress_files, stress_one_writer,
};
use pmfs_core::traits::{Extent, FileId, Run};
use pmfs_mapping::hashfs::{HashFs, HashFsFile, HashKernel, LBLK_LIMIT};

type Table = HashFs<Arc<HeapRegion>>;

/// HashFS is its own allocator: blocks for `insert_at` are slots staged for the keys.
struct Staging;

impl BlockSource<Table> for Staging {
    fn obtain(
        &self,
        mapping: &Table,
        file: &HashFsFile,
        lblk: u64,
        len: u64,
        out: &mut Vec<Run>,
    ) -> pmfs_core::Result<()> {
        mapping.stage(file, lblk, len, out)
    }

    fn release(&self, mapping: &Table, runs: &[Run]) -> pmfs_core::Result<()> {
        mapping.unstage(runs)
    }
}

fn kernels() -> Vec<HashKernel> {
    [HashKernel::Scalar, HashKernel::Avx2, HashKernel::Avx512]
        .into_iter()
        .filter(|k| k.is_supported())
        .collect()
}

/// A table of `slots` data blocks; the free count is the table's own (a second handle on the
/// same region scans it).
fn subject(files: usize, slots: u64, kernel: HashKernel) -> Subject<Table> {
    let meta = Extent::new(BlockNo(1), Table::meta_blocks(slots));
    let data = Extent::new(meta.end(), slots);
    let region = Arc::new(HeapRegion::new(data.end().0 * BLOCK_SIZE).unwrap());
    let mut table = HashFs::format(region.clone(), meta, data).unwrap();
    table.set_kernel(kernel).unwrap();
    let counter = HashFs::open(region, meta, data).unwrap();
    let ids = (0..files)
        .map(|i| FileId {
            ino: i as u64 + 1,
            root: PmOff(0),
        })
        .collect();
    Subject::new(table, ids)
        .with_free_blocks(move || counter.free_blocks().expect("scan of the slot table"))
        .with_block_source(Staging)
}

fn config() -> SuiteConfig {
    SuiteConfig {
        max_lblk: LBLK_LIMIT,
        ..SuiteConfig::default()
    }
}

#[test]
fn hashfs_passes_the_suite_on_every_kernel() {
    for kernel in kernels() {
        run_suite(&config(), |files| subject(files, 4096, kernel));
    }
}

#[test]
fn hashfs_passes_the_suite_when_the_table_runs_full() {
    let cfg = SuiteConfig {
        max_lblk: 2048,
        ..SuiteConfig::default()
    };
    for kernel in kernels() {
        run_suite(&cfg, |files| subject(files, 150, kernel));
    }
}

#[test]
fn hashfs_survives_concurrent_writers_on_different_files() {
    let s = subject(4, 1 << 15, HashKernel::detect());
    stress_files(&s, &StressConfig::default());
}

#[test]
fn hashfs_survives_readers_beside_a_writer_on_one_file() {
    let s = subject(1, 1 << 14, HashKernel::detect());
    stress_one_writer(&s, 2, &StressConfig::default());
}

#[test]
fn hashfs_survives_concurrent_writers_in_a_nearly_full_table() {
    // 4 threads x up to 4096 blocks over 3000 slots: inserts hit NoSpace, probe chains are
    // long and cross each other's files.
    let s = subject(4, 3000, HashKernel::detect());
    stress_files(&s, &StressConfig::default());
}

#[test]
fn hashfs_readers_that_scan_the_table_beside_a_writer_see_consistent_blocks() {
    // 150 slots: reader lookups of more than 37 blocks scan the whole table while the writer
    // inserts and removes.
    let s = subject(1, 150, HashKernel::detect());
    stress_one_writer(&s, 2, &StressConfig::default());
}
