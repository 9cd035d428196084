//! The `FileMapping` conformance suite run against the reference `SimpleMapping` over a
//! `SimpleAllocator`: proves the suite accepts a correct implementation (including the
//! out-of-space path and `insert_at`), rejects broken ones, and exercises its concurrency
//! helpers.

use std::sync::Arc;

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::traits::conformance::mapping::{
    FromAllocator, Op, StressConfig, Subject, SuiteConfig, run_ops, run_suite, stress_files,
    stress_one_writer,
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
    let source = FromAllocator(alloc.clone());
    Subject::new(SimpleMapping::new(alloc), ids)
        .with_free_blocks(move || free.free_blocks())
        .with_block_source(source)
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
fn replayed_insert_at_refusals_and_copy_on_write_overwrites() {
    let s = subject(2, 1024);
    let cfg = SuiteConfig::default();
    let ops = [
        Op::InsertAt {
            file: 0,
            lblk: 4,
            len: 8,
        },
        // Overlaps [4, 12): refused, the blocks go back to the source.
        Op::InsertAt {
            file: 0,
            lblk: 10,
            len: 6,
        },
        Op::Insert {
            file: 1,
            lblk: 0,
            len: 3,
        },
        // Copy-on-write over a partly mapped range of file 0, then inside file 1.
        Op::Overwrite {
            file: 0,
            lblk: 2,
            len: 6,
        },
        Op::Overwrite {
            file: 1,
            lblk: 1,
            len: 1,
        },
        // The same in one call, over a range with a hole.
        Op::Replace {
            file: 0,
            lblk: 6,
            len: 8,
        },
        Op::Lookup {
            file: 0,
            lblk: 0,
            len: 20,
        },
        Op::RemoveFile { file: 0 },
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

/// How [`Broken`] deviates from `SimpleMapping`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Lookups lose the last block of every run longer than one block.
    LoseBlocks,
    /// `owned_blocks` reports nothing.
    NoOwnedBlocks,
    /// `insert_at` silently replaces blocks that are already mapped (and frees them).
    InsertAtOverwrites,
    /// `insert_at` ignores the given blocks and allocates its own.
    InsertAtAllocates,
    /// `replace` reports no blocks freed.
    ReplaceMiscounts,
}

/// A deliberately broken mapping with one [`Flaw`]. The suite must notice each.
struct Broken {
    inner: SimpleMapping<SimpleAllocator>,
    flaw: Flaw,
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
        if self.flaw == Flaw::LoseBlocks {
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
    fn insert_at(&self, f: &Self::File, run: pmfs_core::traits::Run) -> pmfs_core::Result<()> {
        match self.flaw {
            Flaw::InsertAtOverwrites => {
                self.inner.remove(f, run.lblk, run.len)?;
                self.inner.insert_at(f, run)
            }
            Flaw::InsertAtAllocates => self.inner.insert(f, run.lblk, run.len, &mut Vec::new()),
            _ => self.inner.insert_at(f, run),
        }
    }
    fn remove(&self, f: &Self::File, lblk: u64, len: u64) -> pmfs_core::Result<u64> {
        self.inner.remove(f, lblk, len)
    }
    fn replace(&self, f: &Self::File, run: pmfs_core::traits::Run) -> pmfs_core::Result<u64> {
        let freed = self.inner.replace(f, run)?;
        Ok(if self.flaw == Flaw::ReplaceMiscounts {
            0
        } else {
            freed
        })
    }
    fn remove_file(&self, f: &Self::File) -> pmfs_core::Result<()> {
        self.inner.remove_file(f)
    }
    fn owned_blocks(
        &self,
        f: &Self::File,
        visit: &mut dyn FnMut(pmfs_core::traits::Extent),
    ) -> pmfs_core::Result<()> {
        if self.flaw == Flaw::NoOwnedBlocks {
            Ok(())
        } else {
            self.inner.owned_blocks(f, visit)
        }
    }
    fn recover(&self) -> pmfs_core::Result<()> {
        Ok(())
    }
}

fn broken_subject(flaw: Flaw) -> Subject<Broken> {
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(100), 64));
    let free = alloc.clone();
    let source = FromAllocator(alloc.clone());
    let ids = vec![FileId {
        ino: 1,
        root: PmOff(0),
    }];
    let broken = Broken {
        inner: SimpleMapping::new(alloc),
        flaw,
    };
    Subject::new(broken, ids)
        .with_free_blocks(move || free.free_blocks())
        .with_block_source(source)
}

#[test]
fn suite_rejects_lost_blocks_and_missing_owned_blocks() {
    let ops = [Op::Insert {
        file: 0,
        lblk: 3,
        len: 4,
    }];
    for (flaw, expected) in [
        (Flaw::LoseBlocks, "whole-file lookup"),
        (Flaw::NoOwnedBlocks, "missing from owned_blocks"),
    ] {
        let err = run_ops(&broken_subject(flaw), &SuiteConfig::default(), &ops).unwrap_err();
        assert!(
            err.contains(expected),
            "{flaw:?}: unexpected failure: {err}"
        );
    }
}

#[test]
fn suite_rejects_an_insert_at_that_overwrites_or_ignores_the_given_blocks() {
    // The broken behaviours pass a plain insert_at into a hole; only the cases below expose
    // them.
    let into_hole = [Op::InsertAt {
        file: 0,
        lblk: 3,
        len: 4,
    }];
    run_ops(
        &broken_subject(Flaw::InsertAtOverwrites),
        &SuiteConfig::default(),
        &into_hole,
    )
    .unwrap();
    let over_mapped = [
        Op::Insert {
            file: 0,
            lblk: 3,
            len: 4,
        },
        Op::InsertAt {
            file: 0,
            lblk: 5,
            len: 4,
        },
    ];
    let err = run_ops(
        &broken_subject(Flaw::InsertAtOverwrites),
        &SuiteConfig::default(),
        &over_mapped,
    )
    .unwrap_err();
    assert!(
        err.contains("over mapped blocks succeeded"),
        "unexpected failure: {err}"
    );
    let err = run_ops(
        &broken_subject(Flaw::InsertAtAllocates),
        &SuiteConfig::default(),
        &into_hole,
    )
    .unwrap_err();
    assert!(
        err.contains("whole-file lookup"),
        "unexpected failure: {err}"
    );
}

#[test]
fn the_random_suite_finds_an_insert_at_that_overwrites() {
    // Not a replayed sequence: the generated workloads must reach the flaw on their own.
    let cfg = SuiteConfig {
        files: 1,
        max_lblk: 64,
        max_len: 16,
        ..SuiteConfig::default()
    };
    let found = std::panic::catch_unwind(|| {
        run_suite(&cfg, |_| {
            let alloc = Arc::new(SimpleAllocator::new(BlockNo(100), 4096));
            let free = alloc.clone();
            let source = FromAllocator(alloc.clone());
            let broken = Broken {
                inner: SimpleMapping::new(alloc),
                flaw: Flaw::InsertAtOverwrites,
            };
            let ids = vec![FileId {
                ino: 1,
                root: PmOff(0),
            }];
            Subject::new(broken, ids)
                .with_free_blocks(move || free.free_blocks())
                .with_block_source(source)
        })
    });
    let msg = found.expect_err("the suite accepted an insert_at that overwrites mapped blocks");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("insert_at"), "unexpected failure: {msg}");
}

#[test]
fn suite_rejects_a_replace_that_miscounts_the_blocks_it_freed() {
    let into_hole = [Op::Replace {
        file: 0,
        lblk: 3,
        len: 4,
    }];
    let subject = broken_subject(Flaw::ReplaceMiscounts);
    run_ops(&subject, &SuiteConfig::default(), &into_hole).unwrap();
    let over_mapped = [
        Op::Insert {
            file: 0,
            lblk: 3,
            len: 4,
        },
        Op::Replace {
            file: 0,
            lblk: 5,
            len: 4,
        },
    ];
    let err = run_ops(
        &broken_subject(Flaw::ReplaceMiscounts),
        &SuiteConfig::default(),
        &over_mapped,
    )
    .unwrap_err();
    assert!(
        err.contains("reported 0 blocks freed, model had 2"),
        "unexpected failure: {err}"
    );
}
