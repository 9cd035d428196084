//! Compacting a file's log is safe under a crash at any fence, on every mapping kind: a file
//! gets over a thousand small overwrites (each inside one block, one log slot each), enough
//! to fill log blocks and make the engine compact the applied prefix, and stays equal to a
//! byte model. A dry run on a heap region locates where the volume's used block count
//! first grows (a log block linked) and first shrinks (a compaction gave blocks back; the
//! test fails if none does); crash sweeps cover a dozen writes around each: every crash
//! image recovers with fsck clean and shows the file exactly as after the last returned
//! write or the one in progress. The log must also stay bounded: at no point does the file
//! use more blocks than after the first write plus a few log blocks and the blocks of one
//! digest batch (writes are digested in batches of up to [`DIGEST_BATCH`]; until then the
//! blocks they replaced stay allocated). It stays bounded too when the file is opened and
//! closed around every write, as a database's journal is.

mod data_common;

use std::sync::Arc;

use pmfs::{OpenNode, Volume};
use pmfs_core::pm::{HeapRegion, Media};

use data_common::model::Model;
use data_common::rng::Rng;
use data_common::{BS, Config, Sampling, Step, check_steps, create, kinds_only, sim_options};

/// Blocks of the file.
const BLOCKS: u64 = 16;
/// Writes of the dry run.
const DRY: usize = 1200;
/// Slots of a log block.
const SLOTS: usize = 504;
/// Writes the crash sweep covers.
const WINDOW: usize = 12;
/// The engine's digest batch (`DIGEST_AFTER_ENTRIES` in `fs/data/mod.rs`): writes a process
/// commits before it digests them.
const DIGEST_BATCH: u64 = 128;

/// One explored write.
type WriteStep = dyn Fn(&Volume, &mut OpenNode) -> pmfs::Result<()>;

/// The `i`th small write: offset and bytes, inside one block.
fn small_write(i: usize) -> (u64, Vec<u8>) {
    let mut rng = Rng::new(0xD1CE ^ i as u64);
    let len = rng.range(1, 200);
    let blk = rng.range(0, BLOCKS - 1);
    let within = rng.range(0, BS - len);
    let byte = (i % 251) as u8 | 1;
    (blk * BS + within, vec![byte; len as usize])
}

fn initial() -> Vec<u8> {
    (0..BLOCKS * BS).map(|i| (i % 7) as u8 + 1).collect()
}

/// Creates `/f` with its initial content and runs the first `n` small writes.
fn setup(vol: &Volume, n: usize) -> OpenNode {
    let f = create(vol, "f");
    f.write_at(&initial(), 0).unwrap();
    for i in 0..n {
        let (off, buf) = small_write(i);
        f.write_at(&buf, off).unwrap();
    }
    f
}

/// Used blocks of the volume after each of the dry run's writes.
fn dry_run(cfg: Config) -> Vec<u64> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(data_common::SIM_SIZE).unwrap());
    let vol = Volume::format(media.clone(), &sim_options(cfg)).unwrap();
    let f = setup(&vol, 0);
    let mut model = Model(initial());
    let mut used = Vec::with_capacity(DRY);
    for i in 0..DRY {
        let (off, buf) = small_write(i);
        f.write_at(&buf, off).unwrap();
        model.write(&buf, off);
        let st = vol.statfs().unwrap();
        used.push(st.total_blocks - st.free_blocks);
    }
    let got = data_common::image_of(&f).unwrap().data;
    assert!(got == model.0, "{cfg:?}: contents differ from the model");
    drop(f);
    vol.close().unwrap();
    data_common::fsck_clean(media).unwrap();
    used
}

#[test]
fn log_compaction_is_safe_under_crash_and_bounded() {
    for (k, cfg) in kinds_only().into_iter().enumerate() {
        let used = dry_run(cfg);
        let most = used.iter().copied().max().unwrap_or(0);
        assert!(
            most <= used[0] + 4 + DIGEST_BATCH,
            "{cfg:?}: the file's log grows without bound: {} blocks used after the first \
             write, up to {most} after {DRY}",
            used[0],
        );
        // The write that first linked a log block, and the one that first gave blocks
        // back (a compaction).
        let grew = (1..DRY).find(|&i| used[i] > used[i - 1]);
        let shrank = (1..DRY).find(|&i| used[i] < used[i - 1]);
        let Some(shrank) = shrank else {
            panic!("{cfg:?}: {DRY} small writes never compacted the log (blocks used {used:?})")
        };
        for (w, centre) in [grew.unwrap_or(SLOTS), shrank].into_iter().enumerate() {
            sweep(
                cfg,
                900 + 10 * k as u64 + w as u64,
                centre.saturating_sub(WINDOW / 3),
            );
        }
    }
}

#[test]
fn a_file_reopened_for_every_write_keeps_a_short_log() {
    // Six log blocks' worth of writes, each in an open of its own.
    const WRITES: usize = 6 * SLOTS;
    for cfg in kinds_only() {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(data_common::SIM_SIZE).unwrap());
        let vol = Volume::format(media.clone(), &sim_options(cfg)).unwrap();
        drop(setup(&vol, 0));
        let mut model = Model(initial());
        let used = || {
            let st = vol.statfs().unwrap();
            st.total_blocks - st.free_blocks
        };
        let first = used();
        let mut most = first;
        for i in 0..WRITES {
            let (off, buf) = small_write(i);
            let f = data_common::open(&vol, "f").unwrap();
            f.write_at(&buf, off).unwrap();
            drop(f);
            model.write(&buf, off);
            most = most.max(used());
        }
        // The last close digested everything: what grows is the log alone.
        assert!(
            most <= first + 3,
            "{cfg:?}: the log of a file reopened for each write grows: {first} blocks used \
             after the first close, up to {most} after {WRITES} writes"
        );
        let f = data_common::open(&vol, "f").unwrap();
        assert!(
            data_common::image_of(&f).unwrap().data == model.0,
            "{cfg:?}: contents differ from the model"
        );
        drop(f);
        vol.close().unwrap();
        data_common::fsck_clean(media).unwrap();
    }
}

/// Sweeps crashes over writes `[start, start + WINDOW)`.
fn sweep(cfg: Config, seed: u64, start: usize) {
    let mut model = Model(initial());
    for i in 0..start {
        let (off, buf) = small_write(i);
        model.write(&buf, off);
    }
    let mut expected = vec![model.0.clone()];
    for i in start..start + WINDOW {
        let (off, buf) = small_write(i);
        model.write(&buf, off);
        expected.push(model.0.clone());
    }
    let writes: Vec<Box<WriteStep>> = (start..start + WINDOW)
        .map(|i| {
            let (off, buf) = small_write(i);
            Box::new(move |_: &Volume, f: &mut OpenNode| f.write_at(&buf, off).map(drop))
                as Box<WriteStep>
        })
        .collect();
    let steps: Vec<Step<'_, OpenNode>> = writes.iter().map(|w| &**w as Step<'_, _>).collect();
    check_steps(
        cfg,
        Sampling {
            seed,
            samples: 4,
            exhaustive: 8,
        },
        &|vol| setup(vol, start),
        &steps,
        &|states| {
            for (i, (s, want)) in states.iter().zip(&expected).enumerate() {
                assert!(
                    s["f"].data == *want,
                    "{cfg:?}: after {} writes the file differs from the model",
                    start + i
                );
            }
        },
    );
}
