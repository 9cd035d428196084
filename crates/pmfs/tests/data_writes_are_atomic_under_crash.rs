//! Every write is atomic and durable under a crash at any fence, on every mapping kind and
//! on several allocators: each post-crash image recovers with fsck clean and shows the file
//! either entirely as before the write or entirely as after it (size, every byte, and the
//! SEEK_DATA/SEEK_HOLE map), and only "after" once the write returned. Covered: aligned and
//! unaligned overwrites, appends past an unaligned end of file, a write of 70 blocks, writes
//! into the partial last block (in place) and a sparse write past end of file over stale
//! bytes a truncate left, an `O_APPEND` write through the path API, and the first write to a
//! file that had no log (the open creates it; the file stays open). Crash points with at
//! most 8 images are enumerated, others sampled (4; with `PMFS_CRASH_SAMPLES` that many, and
//! points of up to 256 images enumerated). Recovery of a crashed write survives crashes of
//! its own, and so does the digest of a mix of writes (appends, overwrites of blocks written
//! earlier in the same batch, partial blocks).

mod data_common;

use std::sync::Arc;

use pmfs::{NodeKind, OpenNode, OpenOptions, Owner, Volume};
use pmfs_core::pm::Media;
use pmfs_core::sim::SimRegion;

use data_common::model::Model;
use data_common::{
    BS, Config, Sampling, check_op, configs, create, open, pattern, recover_and_image,
};

/// Creates `/f` holding `initial` (and an untouched neighbour `/g`), open for the write.
fn setup_with(initial: &[u8]) -> impl Fn(&Volume) -> OpenNode + '_ {
    move |vol| {
        let g = create(vol, "g");
        g.write_at(&pattern(200, 5000), 0).unwrap();
        let f = create(vol, "f");
        f.write_at(initial, 0).unwrap();
        f
    }
}

/// Checks the write of `data` at `off` into a file holding `initial`.
fn check_write(cfg: Config, seed: u64, initial: &[u8], data: &[u8], off: u64) {
    let before = Model(initial.to_vec());
    let mut after = before.clone();
    after.write(data, off);
    check_op(
        cfg,
        Sampling::new(seed),
        &setup_with(initial),
        &|_, f: &mut OpenNode| f.write_at(data, off).map(drop),
        "f",
        &before,
        &after,
    );
}

#[test]
fn aligned_overwrite_is_atomic() {
    let initial = pattern(1, 8 * BS as usize);
    let data = pattern(2, 3 * BS as usize);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_write(cfg, 100 + i as u64, &initial, &data, 2 * BS);
    }
}

#[test]
fn unaligned_overwrite_is_atomic() {
    let initial = pattern(3, 8 * BS as usize);
    // Head and tail inside blocks; also a write inside a single block.
    let data = pattern(4, 3 * BS as usize);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_write(cfg, 200 + i as u64, &initial, &data, 2 * BS + 100);
        check_write(cfg, 210 + i as u64, &initial, &data[..700], 5 * BS + 3000);
    }
}

#[test]
fn append_past_an_unaligned_end_is_atomic() {
    let initial = pattern(5, 3 * BS as usize + 1000);
    let data = pattern(6, 2 * BS as usize + 500);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_write(cfg, 300 + i as u64, &initial, &data, initial.len() as u64);
        // A small append that stays inside the end-of-file block.
        check_write(
            cfg,
            310 + i as u64,
            &initial,
            &data[..64],
            initial.len() as u64,
        );
    }
}

#[test]
fn write_of_many_blocks_is_atomic() {
    // 70 blocks at an unaligned offset: more runs and blocks than an inline log entry holds.
    let initial = pattern(7, 10 * BS as usize);
    let data = pattern(8, 70 * BS as usize);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_write(cfg, 400 + i as u64, &initial, &data, BS + 7);
    }
}

#[test]
fn writes_into_a_partial_last_block_over_stale_bytes_are_atomic() {
    // A truncation leaves the old bytes past the new end on media. Writes that start at or
    // past the end inside that block go there in place: the gap they open and the rest of
    // the block when the file grows past it must read as zeros.
    let full = pattern(13, 3 * BS as usize);
    let size = 2 * BS + 300;
    let mut before = Model(full.clone());
    before.set_len(size);
    let setup = |vol: &Volume| {
        let f = setup_with(&full)(vol);
        f.set_len(size).unwrap();
        f
    };
    let data = pattern(14, 100);
    let cases: [(u64, &[u8]); 4] = [
        // Right at the end, then past it with a gap, inside the block.
        (size, &data),
        (size + 200, &data),
        // From inside the block into the next two.
        (size + 10, &pattern(15, 2 * BS as usize)),
        // In a later block: the block of the end is zeroed past it.
        (5 * BS + 7, &data),
    ];
    for (i, cfg) in configs().into_iter().enumerate() {
        for (k, &(off, bytes)) in cases.iter().enumerate() {
            let mut after = before.clone();
            after.write(bytes, off);
            check_op(
                cfg,
                Sampling::new(900 + 10 * i as u64 + k as u64),
                &setup,
                &|_, f: &mut OpenNode| f.write_at(bytes, off).map(drop),
                "f",
                &before,
                &after,
            );
        }
        // Growing the file inside the block.
        let mut after = before.clone();
        after.set_len(size + 1000);
        check_op(
            cfg,
            Sampling::new(950 + i as u64),
            &setup,
            &|_, f: &mut OpenNode| f.set_len(size + 1000),
            "f",
            &before,
            &after,
        );
    }
}

#[test]
fn sparse_write_past_a_truncated_end_is_atomic() {
    // The end-of-file block keeps the truncated bytes on media; the gap the write opens
    // must read as zeros, whole blocks of it as holes.
    let full = pattern(9, 3 * BS as usize);
    let size = 2 * BS + 300;
    let data = pattern(10, 1000);
    let off = 9 * BS + 50;
    let mut before = Model(full.clone());
    before.set_len(size);
    let mut after = before.clone();
    after.write(&data, off);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_op(
            cfg,
            Sampling::new(500 + i as u64),
            &|vol| {
                let f = setup_with(&full)(vol);
                f.set_len(size).unwrap();
                f
            },
            &|_, f: &mut OpenNode| f.write_at(&data, off).map(drop),
            "f",
            &before,
            &after,
        );
    }
}

#[test]
fn append_mode_write_through_the_path_api_is_atomic() {
    let initial = pattern(11, BS as usize + 10);
    let data = pattern(12, BS as usize + 20);
    let before = Model(initial.clone());
    let mut after = before.clone();
    after.write(&data, initial.len() as u64);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_op(
            cfg,
            Sampling::new(600 + i as u64),
            &|vol| {
                drop(setup_with(&initial)(vol));
                OpenOptions::new().append(true).open(vol, "/f").unwrap()
            },
            // The offset is ignored in append mode.
            &|_, f: &mut pmfs::File| f.write_at(&data, 0).map(drop),
            "f",
            &before,
            &after,
        );
    }
}

/// Writes left undigested before the digest under test: whole-block appends that continue
/// each other, blocks written twice and three times, partial blocks, a run across several.
const MIX: &[(u64, usize, u8)] = &[
    (8 * BS, 3 * BS as usize, 20),
    (2 * BS, BS as usize, 21),
    (11 * BS, BS as usize, 22),
    (2 * BS, BS as usize, 23),
    (5 * BS + 100, 300, 24),
    (12 * BS, 2 * BS as usize, 25),
    (BS, 3 * BS as usize, 26),
    (5 * BS + 1000, 50, 27),
    (14 * BS, BS as usize, 28),
    (2 * BS + 10, 20, 29),
];

#[test]
fn digesting_a_mix_of_writes_is_safe_under_crash() {
    // The writes commit in setup; the truncation digests them all (in batches), then
    // shrinks the file: a crash anywhere shows every write, and the truncation whole or not.
    let initial = pattern(19, 8 * BS as usize);
    let mut before = Model(initial.clone());
    for &(off, len, tag) in MIX {
        before.write(&pattern(tag, len), off);
    }
    let size = before.0.len() as u64 - 100;
    let mut after = before.clone();
    after.set_len(size);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_op(
            cfg,
            Sampling::new(800 + i as u64),
            &|vol| {
                let f = setup_with(&initial)(vol);
                for &(off, len, tag) in MIX {
                    f.write_at(&pattern(tag, len), off).unwrap();
                }
                f
            },
            &|_, f: &mut OpenNode| f.set_len(size),
            "f",
            &before,
            &after,
        );
    }
}

#[test]
fn recovery_of_a_write_survives_crashes() {
    // For crash images taken during an unaligned overwrite that also extends the file, a
    // crash at any fence of the recovery itself, followed by another recovery, ends in the
    // state one uninterrupted recovery gives. By default the durable image of about four
    // crash points spread over the write is explored; with `PMFS_CRASH_SAMPLES` every image.
    let initial = pattern(13, 5 * BS as usize + 100);
    let data = pattern(14, 3 * BS as usize);
    for (i, cfg) in data_common::kinds_only().into_iter().enumerate() {
        let seed = 700 + i as u64;
        let start = || {
            let region = Arc::new(SimRegion::new(data_common::SIM_SIZE).unwrap());
            let vol = Volume::format(region.clone(), &data_common::sim_options(cfg)).unwrap();
            let f = setup_with(&initial)(&vol);
            region.persist_all();
            (region, vol, f)
        };
        let write = |f: &OpenNode| {
            f.write_at(&data, 4 * BS + 50).unwrap();
        };
        // How many fences the write issues, to spread the explored points over it.
        let fences = {
            let (region, _vol, f) = start();
            data_common::explorer(seed, 2, 1)
                .run(&region, |_| write(&f), |_| Ok(()))
                .unwrap()
                .fences
        };
        let stride = if data_common::thorough() {
            1
        } else {
            (fences / 4).max(1)
        };
        let (region, _vol, f) = start();
        let mut nested = 0u64;
        data_common::explorer(seed, 2, 2)
            .run(
                &region,
                |_| write(&f),
                |cp| {
                    if cp.fence % stride != 0 || (cp.index != 0 && !data_common::thorough()) {
                        return Ok(());
                    }
                    let expected = recover_and_image(cp.image)?;
                    let inner =
                        Arc::new(SimRegion::from_image(cp.image).map_err(|e| e.to_string())?);
                    let media: Arc<dyn Media> = inner.clone();
                    let stats = data_common::explorer(seed ^ cp.fence, 2, 2)
                        .run(
                            &inner,
                            |_| {
                                let v = Volume::mount(media.clone()).expect("recovery");
                                v.close().expect("close after recovery");
                            },
                            |inner_cp| {
                                let got = recover_and_image(inner_cp.image)?;
                                if got == expected {
                                    Ok(())
                                } else {
                                    Err(format!(
                                        "{cfg:?}: second recovery differs from a single one: \
                                         {got:?} vs {expected:?}"
                                    ))
                                }
                            },
                        )
                        .map_err(|f| f.to_string())?;
                    nested += stats.images;
                    Ok(())
                },
            )
            .unwrap_or_else(|f| panic!("{f}"));
        assert!(nested > 0);
        drop(f);
    }
}

/// The first write to a file that never had a log, left open: the open creates the log, and
/// the write is durable on return without a digest or a close.
#[test]
fn first_write_to_a_file_without_a_log_is_atomic() {
    let data = pattern(3, 2 * BS as usize + 100);
    let before = Model(Vec::new());
    let mut after = before.clone();
    after.write(&data, 0);
    for (i, cfg) in configs().into_iter().enumerate() {
        check_op(
            cfg,
            Sampling::new(900 + i as u64),
            &|vol: &Volume| {
                vol.mknod(vol.root(), b"f", NodeKind::File, 0o644, Owner::default(), 0)
                    .unwrap();
                None
            },
            &|vol, open_f: &mut Option<OpenNode>| {
                let f = open(vol, "f")?;
                f.write_at(&data, 0)?;
                *open_f = Some(f);
                Ok(())
            },
            "f",
            &before,
            &after,
        );
    }
}
