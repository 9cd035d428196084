//! `HashFs::apply_writes` (the data path's batched digest of copy-on-write writes) under the
//! crash simulator. A file has mapped blocks; several overlapping staged runs (a later one wins
//! a shared logical block) are applied as one batch. At every crash point, after recovery:
//!
//! - no logical block is current in two slots, and each maps its block from before the batch,
//!   or a slot of the batch, or nothing (between the two fences);
//! - applying the same batch again, or a longer one that starts with it (what the log's digest
//!   does after a crash or a dead holder), reaches exactly the mapping the longer batch gives
//!   on a clean table, and dropping the losing slots it returns leaves nothing staged.

use std::collections::BTreeMap;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{Extent, FileId, FileMapping, Run};
use pmfs_mapping::hashfs::{HashFs, HashFsFile, LBLK_LIMIT};

const SLOTS: u64 = 64;
const SALT: u64 = 0x0ba7_c4ed;
const INO: u64 = 3;

fn meta() -> Extent {
    Extent::new(BlockNo(0), HashFs::<HeapRegion>::meta_blocks(SLOTS))
}

fn data() -> Extent {
    Extent::new(meta().end(), SLOTS)
}

fn file<M: Media>(t: &HashFs<M>) -> HashFsFile {
    t.open_file(FileId {
        ino: INO,
        root: PmOff(0),
    })
    .expect("open_file")
}

fn mapped<M: Media>(t: &HashFs<M>) -> Result<BTreeMap<u64, u64>, String> {
    let mut runs = Vec::new();
    t.lookup(&file(t), 0, LBLK_LIMIT, &mut runs)
        .map_err(|e| format!("lookup: {e}"))?;
    Ok(runs
        .iter()
        .flat_map(|r| (0..r.len).map(move |k| (r.lblk + k, r.pblk.0 + k)))
        .collect())
}

/// The mapping a batch gives on top of `base`: the last run naming a block wins.
fn expected(base: &BTreeMap<u64, u64>, runs: &[Run]) -> BTreeMap<u64, u64> {
    let mut m = base.clone();
    for r in runs {
        for k in 0..r.len {
            m.insert(r.lblk + k, r.pblk.0 + k);
        }
    }
    m
}

/// A table with blocks 0..10 mapped and the staged runs of five overlapping writes (the last
/// one is only in the longer batch).
fn setup<M: Media>(t: &HashFs<M>) -> (BTreeMap<u64, u64>, Vec<Run>) {
    let f = file(t);
    let mut base = Vec::new();
    t.insert(&f, 0, 10, &mut base).expect("insert");
    let mut runs = Vec::new();
    for (lblk, len) in [(2, 3), (3, 4), (0, 1), (3, 1), (4, 3)] {
        t.stage(&f, lblk, len, &mut runs).expect("stage");
    }
    (mapped(t).expect("base mapping"), runs)
}

fn check_image(
    image: &[u8],
    base: &BTreeMap<u64, u64>,
    short: &[Run],
    long: &[Run],
) -> Result<(), String> {
    let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
    let t = HashFs::open(&region, meta(), data()).map_err(|e| format!("open: {e}"))?;
    t.recover().map_err(|e| format!("recover: {e}"))?;
    let now = mapped(&t)?;
    let occ = t.occupancy().map_err(|e| e.to_string())?;
    if occ.committed != now.len() as u64 {
        return Err(format!(
            "a block is current twice: {} committed slots, {} mapped blocks",
            occ.committed,
            now.len()
        ));
    }
    let batch_slot = |l: u64, p: u64| {
        short
            .iter()
            .any(|r| (r.lblk..r.lblk + r.len).contains(&l) && p == r.pblk.0 + (l - r.lblk))
    };
    for (&l, &p) in &now {
        if base.get(&l) != Some(&p) && !batch_slot(l, p) {
            return Err(format!(
                "block {l} maps {p}, neither its old block nor the batch's"
            ));
        }
    }
    for again in [short, long] {
        let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
        let t = HashFs::open(&region, meta(), data()).map_err(|e| format!("open: {e}"))?;
        t.recover().map_err(|e| format!("recover: {e}"))?;
        let f = file(&t);
        let losers = t
            .apply_writes(&f, again)
            .map_err(|e| format!("re-apply: {e}"))?;
        t.drop_superseded(&f, &losers)
            .map_err(|e| format!("drop: {e}"))?;
        let got = mapped(&t)?;
        let want = expected(base, again);
        if got != want {
            return Err(format!(
                "re-apply of {} runs: {got:?}\nwant {want:?}",
                again.len()
            ));
        }
        let occ = t.occupancy().map_err(|e| e.to_string())?;
        // The runs only the longer batch applies stay staged.
        let staged_outside: u64 = long[again.len()..].iter().map(|r| r.len).sum();
        if occ.staged != staged_outside || occ.committed != got.len() as u64 {
            return Err(format!("after re-apply and drop: {occ:?}"));
        }
    }
    Ok(())
}

#[test]
fn a_batch_is_never_half_visible_and_resumes_to_the_same_mapping() {
    let region = SimRegion::new(data().end().0 * BLOCK_SIZE).expect("sim region");
    let (base, long) = {
        let t = HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
        setup(&t)
    };
    region.persist_all();
    let short = &long[..long.len() - 1];
    // The setup really overlaps: some blocks lose within the batch.
    let blocks: u64 = short.iter().map(|r| r.len).sum();
    assert!(blocks > expected(&BTreeMap::new(), short).len() as u64);
    let result = Explorer::new(7).store_prefixes(true).run(
        &region,
        |pm| {
            let t = HashFs::open(pm, meta(), data()).expect("open");
            let f = file(&t);
            let losers = t.apply_writes(&f, short).expect("apply_writes");
            t.drop_superseded(&f, &losers).expect("drop_superseded");
        },
        |cp| check_image(cp.image, &base, short, &long),
    );
    if let Err(f) = result {
        panic!("{f}");
    }
}

#[test]
fn a_block_not_staged_for_its_key_is_refused() {
    let region = HeapRegion::new(data().end().0 * BLOCK_SIZE).expect("heap region");
    let t = HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
    let (_, runs) = setup(&t);
    let f = file(&t);
    let shifted = Run {
        lblk: runs[0].lblk + 1,
        ..runs[0]
    };
    assert!(t.apply_writes(&f, &[shifted]).is_err());
    let outside = Run {
        pblk: BlockNo(data().end().0),
        ..runs[0]
    };
    assert!(t.apply_writes(&f, &[outside]).is_err());
}
