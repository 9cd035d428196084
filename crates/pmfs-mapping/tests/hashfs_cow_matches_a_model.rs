//! HashFS copy-on-write operations against a model: random sequences of `stage`, `insert_at`
//! (bare, and as the data path's remove-then-insert_at), `unstage`, `insert`, `remove`,
//! `sweep_staged` and `recover` leave exactly the mapping and the staged slots the model
//! predicts, and lookups never return a staged block. Threads staging the same keys at once
//! get distinct slots, while a reader keeps seeing the current version only.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use pmfs_core::Error;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{Extent, FileId, FileMapping, Run};
use pmfs_mapping::hashfs::{HashFs, HashFsFile, LBLK_LIMIT};
use proptest::prelude::*;

const INOS: [u64; 3] = [4, 5, 6];

fn table(slots: u64) -> HashFs<HeapRegion> {
    let meta = Extent::new(BlockNo(0), HashFs::<HeapRegion>::meta_blocks(slots));
    let data = Extent::new(meta.end(), slots);
    let r = HeapRegion::new(data.end().0 * BLOCK_SIZE).expect("region");
    HashFs::format_with_salt(r, meta, data, 0xab).expect("format")
}

fn open(t: &HashFs<HeapRegion>, ino: u64) -> HashFsFile {
    t.open_file(FileId {
        ino,
        root: PmOff(0),
    })
    .expect("open_file")
}

fn blocks(runs: &[Run]) -> Vec<(u64, u64)> {
    runs.iter()
        .flat_map(|r| (0..r.len).map(move |k| (r.lblk + k, r.pblk.0 + k)))
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Stage(usize, u64, u64),
    InsertAt(usize, usize),
    Apply(usize, usize),
    Unstage(usize, usize),
    UnstageShifted(usize, usize),
    Insert(usize, u64, u64),
    Remove(usize, u64, u64),
    Sweep,
    Recover,
}

fn op() -> impl Strategy<Value = Op> {
    let f = 0..INOS.len();
    prop_oneof![
        4 => (f.clone(), 0..40u64, 1..8u64).prop_map(|(f, l, n)| Op::Stage(f, l, n)),
        2 => (f.clone(), any::<usize>()).prop_map(|(f, i)| Op::InsertAt(f, i)),
        4 => (f.clone(), any::<usize>()).prop_map(|(f, i)| Op::Apply(f, i)),
        2 => (f.clone(), any::<usize>()).prop_map(|(f, i)| Op::Unstage(f, i)),
        1 => (f.clone(), any::<usize>()).prop_map(|(f, i)| Op::UnstageShifted(f, i)),
        2 => (f.clone(), 0..40u64, 1..6u64).prop_map(|(f, l, n)| Op::Insert(f, l, n)),
        2 => (f, 0..48u64, 1..10u64).prop_map(|(f, l, n)| Op::Remove(f, l, n)),
        1 => Just(Op::Sweep),
        1 => Just(Op::Recover),
    ]
}

#[derive(Default)]
struct Model {
    /// (file, lblk) -> pblk
    mapped: BTreeMap<(usize, u64), u64>,
    /// pblk -> (file, lblk)
    staged: BTreeMap<u64, (usize, u64)>,
    /// Staged runs per file, as `stage` returned them.
    pending: [Vec<Run>; INOS.len()],
}

impl Model {
    fn used(&self) -> usize {
        self.mapped.len() + self.staged.len()
    }

    fn mapped_in(&self, f: usize, lblk: u64, end: u64) -> Vec<u64> {
        self.mapped
            .range((f, lblk)..(f, end))
            .map(|(&(_, l), _)| l)
            .collect()
    }
}

fn run_ops(ops: &[Op]) -> Result<(), TestCaseError> {
    const SLOTS: u64 = 96;
    let t = table(SLOTS);
    let files: Vec<_> = INOS.iter().map(|&i| open(&t, i)).collect();
    let mut m = Model::default();
    for op in ops {
        match *op {
            Op::Stage(f, l, n) => {
                let mut out = Vec::new();
                match t.stage(&files[f], l, n, &mut out) {
                    Ok(()) => {
                        let got = blocks(&out);
                        prop_assert_eq!(
                            got.iter().map(|b| b.0).collect::<Vec<_>>(),
                            (l..l + n).collect::<Vec<_>>()
                        );
                        for &(lblk, p) in &got {
                            prop_assert!(!m.staged.contains_key(&p), "{p} staged twice");
                            prop_assert!(!m.mapped.values().any(|&q| q == p), "{p} is mapped");
                            m.staged.insert(p, (f, lblk));
                        }
                        m.pending[f].extend(out);
                    }
                    Err(Error::NoSpace) => {
                        prop_assert!(m.used() as u64 + n > SLOTS);
                        prop_assert!(out.is_empty());
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("stage: {e}"))),
                }
            }
            Op::InsertAt(f, i) | Op::Apply(f, i) => {
                if m.pending[f].is_empty() {
                    continue;
                }
                let run = m.pending[f][i % m.pending[f].len()];
                let end = run.lblk + run.len;
                if let Op::Apply(..) = op {
                    let freed = t.remove(&files[f], run.lblk, run.len).expect("remove");
                    let old = m.mapped_in(f, run.lblk, end);
                    prop_assert_eq!(freed, old.len() as u64);
                    for l in old {
                        m.mapped.remove(&(f, l));
                    }
                }
                let r = t.insert_at(&files[f], run);
                if m.mapped_in(f, run.lblk, end).is_empty() {
                    prop_assert!(r.is_ok(), "insert_at: {:?}", r);
                    for (l, p) in blocks(&[run]) {
                        prop_assert_eq!(m.staged.remove(&p), Some((f, l)));
                        m.mapped.insert((f, l), p);
                    }
                    m.pending[f].retain(|&x| x != run);
                    // A second application is a no-op.
                    prop_assert!(t.insert_at(&files[f], run).is_ok());
                } else {
                    prop_assert!(matches!(r, Err(Error::InvalidArgument(_))), "{:?}", r);
                }
            }
            Op::Unstage(f, i) => {
                if m.pending[f].is_empty() {
                    continue;
                }
                let run = m.pending[f].remove(i % m.pending[f].len());
                t.unstage(&[run]).expect("unstage");
                for (_, p) in blocks(&[run]) {
                    m.staged.remove(&p);
                }
            }
            Op::UnstageShifted(f, i) => {
                if m.pending[f].is_empty() {
                    continue;
                }
                let run = m.pending[f][i % m.pending[f].len()];
                let wrong = Run {
                    lblk: run.lblk + 1,
                    ..run
                };
                prop_assert!(matches!(
                    t.unstage(&[wrong]),
                    Err(Error::InvalidArgument(_))
                ));
            }
            Op::Insert(f, l, n) => {
                let mut out = Vec::new();
                let r = t.insert(&files[f], l, n, &mut out);
                if !m.mapped_in(f, l, l + n).is_empty() {
                    prop_assert!(matches!(r, Err(Error::InvalidArgument(_))));
                } else if m.used() as u64 + n > SLOTS {
                    prop_assert!(matches!(r, Err(Error::NoSpace)));
                } else {
                    prop_assert!(r.is_ok());
                    for (lblk, p) in blocks(&out) {
                        prop_assert!(!m.staged.contains_key(&p));
                        m.mapped.insert((f, lblk), p);
                    }
                }
            }
            Op::Remove(f, l, n) => {
                let old = m.mapped_in(f, l, l + n);
                prop_assert_eq!(t.remove(&files[f], l, n).expect("remove"), old.len() as u64);
                for l in old {
                    m.mapped.remove(&(f, l));
                }
            }
            Op::Sweep => {
                prop_assert_eq!(t.sweep_staged().expect("sweep"), m.staged.len() as u64);
                m.staged.clear();
                m.pending = Default::default();
            }
            Op::Recover => t.recover().expect("recover"),
        }
        let occ = t.occupancy().expect("occupancy");
        prop_assert_eq!(occ.staged, m.staged.len() as u64);
        prop_assert_eq!(occ.committed, m.mapped.len() as u64);
        prop_assert_eq!(occ.tentative, 0);
        for (f, file) in files.iter().enumerate() {
            let want: Vec<_> = m
                .mapped
                .range((f, 0)..(f, u64::MAX))
                .map(|(&(_, l), &p)| (l, p))
                .collect();
            // Per-block walks (through the translation cache) and a whole-table scan.
            let mut runs = Vec::new();
            t.lookup(file, 0, 48, &mut runs).expect("lookup");
            prop_assert_eq!(blocks(&runs), want.clone());
            runs.clear();
            t.lookup(&open(&t, INOS[f]), 0, LBLK_LIMIT, &mut runs)
                .expect("lookup");
            prop_assert_eq!(blocks(&runs), want);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn cow_operations_match_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run_ops(&ops)?;
    }
}

#[test]
fn threads_staging_the_same_keys_get_distinct_slots_and_readers_see_the_old_version() {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 25;
    const LEN: u64 = 8;
    let t = table(1024);
    let f = open(&t, 9);
    let mut old = Vec::new();
    t.insert(&f, 0, LEN, &mut old).expect("insert");
    let old = blocks(&old);
    let done = AtomicBool::new(false);
    let staged: Vec<Vec<Run>> = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let r = open(&t, 9);
            let mut reads = 0u64;
            while !done.load(Ordering::Relaxed) || reads == 0 {
                let mut runs = Vec::new();
                t.lookup(&r, 0, LEN, &mut runs).expect("lookup");
                assert_eq!(blocks(&runs), old, "a reader saw a staged block");
                runs.clear();
                t.lookup(&r, 0, LBLK_LIMIT, &mut runs).expect("scan");
                assert_eq!(blocks(&runs), old, "a table scan saw a staged block");
                reads += 1;
            }
        });
        let writers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let w = open(&t, 9);
                    let mut all = Vec::new();
                    for _ in 0..ROUNDS {
                        t.stage(&w, 0, LEN, &mut all).expect("stage");
                    }
                    all
                })
            })
            .collect();
        let out = writers.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        out
    });
    let mut seen = BTreeSet::new();
    for (_, p) in staged.iter().flat_map(|runs| blocks(runs)) {
        assert!(seen.insert(p), "block {p} staged twice");
        assert!(!old.iter().any(|b| b.1 == p));
    }
    assert_eq!(seen.len() as u64, THREADS * ROUNDS * LEN);
    assert_eq!(
        t.occupancy().expect("occupancy").staged,
        THREADS * ROUNDS * LEN
    );
    // The last writer's last version wins; the rest is swept.
    let last = &staged[THREADS as usize - 1];
    let newest: Vec<Run> = {
        let mut v = Vec::new();
        let mut covered = 0;
        for r in last.iter().rev() {
            if covered == LEN {
                break;
            }
            covered += r.len;
            v.push(*r);
        }
        v
    };
    t.remove(&f, 0, LEN).expect("remove");
    for r in &newest {
        t.insert_at(&f, *r).expect("insert_at");
    }
    assert_eq!(
        t.sweep_staged().expect("sweep"),
        THREADS * ROUNDS * LEN - LEN
    );
    let mut runs = Vec::new();
    t.lookup(&f, 0, LEN, &mut runs).expect("lookup");
    let mut want = blocks(&newest);
    want.sort();
    assert_eq!(blocks(&runs), want);
}
