//! The `FileMapping` conformance suite run against the reference `SimpleMapping` over a
//! `SimpleAllocator`: proves the suite accepts a correct implementation (including the
//! out-of-space path) and exercises its concurrency helpers.

use std::sync::Arc;

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::traits::conformance::mapping::{
    Op, StressConfig, Subject, SuiteConfig, run_ops, run_suite, stress_files, stress_one_writer,
};
use pmfs_core::traits::{BlockAllocator, FileId, SimpleAllocator, SimpleMapping};

fn subject(files: usize, blocks: u64) -> Subject<SimpleMapping<SimpleAllocator>> {
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(100), blocks));
    let free = alloc.clone();
    let ids = (0..files)
        .map(|i| FileId {
            ino: i as u64 + 1,
            root: PmOff(8 * i as u64),
        })
        .collect();
    Subject::new(SimpleMapping::new(alloc), ids).with_free_blocks(move || free.free_blocks())
}

#[test]
fn simple_mapping_passes_the_suite() {
    run_suite(&SuiteConfig::default(), |files| subject(files, 1 << 16));
}

#[test]
fn simple_mapping_passes_the_suite_when_space_runs_out() {
    let cfg = SuiteConfig {
        max_lblk: 2048,
        ..SuiteConfig::default()
    };
    run_suite(&cfg, |files| subject(files, 200));
}

#[test]
fn replayed_sequence_with_overlap_truncate_and_remove_file() {
    let s = subject(2, 1024);
    let cfg = SuiteConfig::default();
    let ops = [
        Op::Insert {
            file: 0,
            lblk: 10,
            len: 5,
        },
        Op::Insert {
            file: 0,
            lblk: 12,
            len: 5,
        },
        Op::Append { file: 0, len: 3 },
        Op::Insert {
            file: 1,
            lblk: 0,
            len: 4,
        },
        Op::Remove {
            file: 0,
            lblk: 11,
            len: 2,
        },
        Op::Lookup {
            file: 0,
            lblk: 0,
            len: 100,
        },
        Op::Truncate {
            file: 0,
            lblk: 14,
            huge: true,
        },
        Op::Reopen { file: 1 },
        Op::RemoveFile { file: 1 },
    ];
    run_ops(&s, &cfg, &ops).unwrap();
}

#[test]
fn simple_mapping_survives_concurrent_files() {
    stress_files(&subject(4, 1 << 16), &StressConfig::default());
}

#[test]
fn simple_mapping_survives_readers_with_one_writer() {
    stress_one_writer(&subject(1, 1 << 16), 2, &StressConfig::default());
}

/// A deliberately broken mapping: its lookups lose the last block of every run longer than
/// one block, and it reports no owned blocks. The suite must notice both.
struct Broken {
    inner: SimpleMapping<SimpleAllocator>,
    lose_blocks: bool,
}

impl pmfs_core::traits::FileMapping for Broken {
    type File = <SimpleMapping<SimpleAllocator> as pmfs_core::traits::FileMapping>::File;
    fn kind(&self) -> pmfs_core::traits::MappingKind {
        self.inner.kind()
    }
    fn open_file(&self, id: FileId) -> pmfs_core::Result<Self::File> {
        self.inner.open_file(id)
    }
    fn lookup(
        &self,
        f: &Self::File,
        lblk: u64,
        len: u64,
        out: &mut Vec<pmfs_core::traits::Run>,
    ) -> pmfs_core::Result<()> {
        let first = out.len();
        self.inner.lookup(f, lblk, len, out)?;
        if self.lose_blocks {
            for r in out[first..].iter_mut().filter(|r| r.len > 1) {
                r.len -= 1;
            }
        }
        Ok(())
    }
    fn insert(
        &self,
        f: &Self::File,
        lblk: u64,
        len: u64,
        out: &mut Vec<pmfs_core::traits::Run>,
    ) -> pmfs_core::Result<()> {
        self.inner.insert(f, lblk, len, out)
    }
    fn remove(&self, f: &Self::File, lblk: u64, len: u64) -> pmfs_core::Result<u64> {
        self.inner.remove(f, lblk, len)
    }
    fn remove_file(&self, f: &Self::File) -> pmfs_core::Result<()> {
        self.inner.remove_file(f)
    }
    fn owned_blocks(
        &self,
        f: &Self::File,
        visit: &mut dyn FnMut(pmfs_core::traits::Extent),
    ) -> pmfs_core::Result<()> {
        if self.lose_blocks {
            self.inner.owned_blocks(f, visit)
        } else {
            Ok(())
        }
    }
    fn recover(&self) -> pmfs_core::Result<()> {
        Ok(())
    }
}

#[test]
fn suite_rejects_lost_blocks_and_missing_owned_blocks() {
    let ops = [Op::Insert {
        file: 0,
        lblk: 3,
        len: 4,
    }];
    for lose_blocks in [true, false] {
        let s = subject(1, 64);
        let broken = Subject::new(
            Broken {
                inner: s.mapping,
                lose_blocks,
            },
            s.files,
        );
        let err = run_ops(&broken, &SuiteConfig::default(), &ops).unwrap_err();
        let expected = if lose_blocks {
            "whole-file lookup"
        } else {
            "missing from owned_blocks"
        };
        assert!(err.contains(expected), "unexpected failure: {err}");
    }
}
