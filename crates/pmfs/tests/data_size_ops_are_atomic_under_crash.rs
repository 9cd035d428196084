//! Size and allocation changes are atomic and durable under a crash at any fence, on every
//! mapping kind and on several allocators: truncating down to an unaligned size and up,
//! `fallocate` (mode 0, `KEEP_SIZE` inside and past end of file), punching a hole with partial
//! edges and zeroing a range (`ZERO_RANGE`, inside the file and growing it). Each post-crash
//! image recovers with fsck clean and shows the file either entirely before or entirely after
//! the operation (only after once it returned); holes read as zeros and SEEK_DATA/SEEK_HOLE
//! agree with the contents in every image. A punch whose crash cleanup ran is not done again
//! by the mount after a later crash, over what was written since. Crash points with at most
//! 8 images are enumerated, others sampled (4; with `PMFS_CRASH_SAMPLES` that many, and
//! points of up to 256 images enumerated).

mod data_common;

use pmfs::{OpenNode, SeekTarget, Volume};

use data_common::model::Model;
use data_common::{
    BS, Config, Sampling, check_op, check_steps, configs, create, image_of, pattern,
};

/// `/f` holds 6 blocks of data with a hole at block 3 and a partial last block.
const SIZE: u64 = 6 * BS + 1234;

fn initial() -> Model {
    let mut m = Model(pattern(1, SIZE as usize));
    m.punch(3 * BS, BS);
    m
}

fn setup(vol: &Volume) -> OpenNode {
    let g = create(vol, "g");
    g.write_at(&pattern(200, 3000), 0).unwrap();
    let f = create(vol, "f");
    let m = initial();
    f.write_at(&m.0[..3 * BS as usize], 0).unwrap();
    f.write_at(&m.0[4 * BS as usize..], 4 * BS).unwrap();
    f
}

fn check(
    cfg: Config,
    seed: u64,
    op: &dyn Fn(&Volume, &mut OpenNode) -> pmfs::Result<()>,
    model: impl Fn(&mut Model),
) {
    let before = initial();
    let mut after = before.clone();
    model(&mut after);
    check_op(cfg, Sampling::new(seed), &setup, op, "f", &before, &after);
}

#[test]
fn truncate_down_to_an_unaligned_size_is_atomic() {
    for (i, cfg) in configs().into_iter().enumerate() {
        check(cfg, 100 + i as u64, &|_, f| f.set_len(BS + 77), |m| {
            m.set_len(BS + 77)
        });
    }
}

#[test]
fn truncate_up_is_atomic_and_reads_zeros() {
    for (i, cfg) in configs().into_iter().enumerate() {
        check(cfg, 200 + i as u64, &|_, f| f.set_len(11 * BS + 5), |m| {
            m.set_len(11 * BS + 5)
        });
    }
}

#[test]
fn truncate_down_then_up_exposes_no_stale_bytes() {
    // Down inside a block, then up past it: the bytes that were cut must read as zeros in
    // every image of either step.
    for (i, cfg) in configs().into_iter().enumerate() {
        let mut mid = initial();
        mid.set_len(2 * BS + 10);
        let mut end = mid.clone();
        end.set_len(5 * BS);
        check_steps(
            cfg,
            Sampling::new(300 + i as u64),
            &setup,
            &[&|_, f: &mut OpenNode| f.set_len(2 * BS + 10), &|_, f| {
                f.set_len(5 * BS)
            }],
            &|s| {
                assert_eq!(s[1]["f"].data, mid.0, "{cfg:?}: after the truncate down");
                assert_eq!(s[2]["f"].data, end.0, "{cfg:?}: after the truncate up");
            },
        );
    }
}

#[test]
fn fallocate_that_grows_the_file_is_atomic() {
    // Fills the hole at block 3 and extends past the end.
    for (i, cfg) in configs().into_iter().enumerate() {
        check(
            cfg,
            400 + i as u64,
            &|_, f| f.allocate(2 * BS + 100, 7 * BS, false),
            |m| m.allocate(2 * BS + 100, 7 * BS, false),
        );
    }
}

#[test]
fn fallocate_keep_size_is_atomic_and_maps_the_hole() {
    for (i, cfg) in configs().into_iter().enumerate() {
        let before = initial();
        check_steps(
            cfg,
            Sampling::new(500 + i as u64),
            &setup,
            &[&|_, f: &mut OpenNode| f.allocate(3 * BS + 10, 100, true)],
            &|s| {
                assert_eq!(s[1]["f"].data, before.0, "{cfg:?}: contents unchanged");
                assert_eq!(
                    s[1]["f"].map,
                    vec![(0, SIZE)],
                    "{cfg:?}: the hole is allocated"
                );
            },
        );
    }
}

#[test]
fn fallocate_keep_size_past_the_end_is_atomic_and_invisible() {
    // Preallocating past end of file changes neither size nor contents; a later extension
    // reads zeros over the preallocated blocks. Both steps are checked under crashes.
    for (i, cfg) in configs().into_iter().enumerate() {
        let before = initial();
        let mut grown = before.clone();
        grown.set_len(10 * BS);
        check_steps(
            cfg,
            Sampling::new(600 + i as u64),
            &setup,
            &[
                &|_, f: &mut OpenNode| f.allocate(SIZE - 100, 3 * BS, true),
                &|_, f| f.set_len(10 * BS),
            ],
            &|s| {
                assert_eq!(s[1]["f"].size, SIZE, "{cfg:?}: KEEP_SIZE kept the size");
                assert_eq!(s[1]["f"].data, before.0, "{cfg:?}: contents unchanged");
                assert_eq!(s[2]["f"].data, grown.0, "{cfg:?}: extension reads zeros");
            },
        );
    }
}

#[test]
fn punch_hole_with_partial_edges_is_atomic() {
    for (i, cfg) in configs().into_iter().enumerate() {
        // Edges inside blocks 0 and 5; blocks 1..5 become (or stay) holes.
        check(
            cfg,
            700 + i as u64,
            &|_, f| f.punch_hole(BS - 300, 4 * BS + 600),
            |m| m.punch(BS - 300, 4 * BS + 600),
        );
        // A hole that reaches past end of file, starting inside the last block.
        check(
            cfg,
            710 + i as u64,
            &|_, f| f.punch_hole(6 * BS + 1000, 10 * BS),
            |m| m.punch(6 * BS + 1000, 10 * BS),
        );
    }
}

#[test]
fn a_finished_punch_is_not_done_again_over_later_writes() {
    // The punch's journal slot must go idle durably once its cleanup ran: a slot still in
    // the cleanup state after the next crash would make the mount punch the range again,
    // over what was written there since. The write keeps off the edge blocks, whose copies
    // the cleanup checks for.
    for (i, cfg) in configs().into_iter().enumerate() {
        let mut punched = initial();
        punched.punch(BS - 300, 4 * BS + 600);
        let mut written = punched.clone();
        written.write(&pattern(77, BS as usize), 2 * BS);
        check_steps(
            cfg,
            Sampling::new(750 + i as u64),
            &setup,
            &[
                &|_, f: &mut OpenNode| f.punch_hole(BS - 300, 4 * BS + 600),
                &|_, f| f.write_at(&pattern(77, BS as usize), 2 * BS).map(drop),
            ],
            &|s| {
                assert_eq!(s[1]["f"].data, punched.0, "{cfg:?}: after the punch");
                assert_eq!(s[2]["f"].data, written.0, "{cfg:?}: after the write");
            },
        );
    }
}

#[test]
fn zero_range_is_atomic() {
    for (i, cfg) in configs().into_iter().enumerate() {
        // Edges inside blocks 1 and 5, over the hole at block 3; the size stays.
        check(
            cfg,
            800 + i as u64,
            &|_, f| f.zero_range(BS + 50, 4 * BS, true),
            |m| {
                m.allocate(BS + 50, 4 * BS, true);
                m.punch(BS + 50, 4 * BS);
            },
        );
        // From inside the last block to past end of file: the file grows, all of it zeros.
        check(
            cfg,
            810 + i as u64,
            &|_, f| f.zero_range(6 * BS + 1000, 2 * BS, false),
            |m| {
                m.allocate(6 * BS + 1000, 2 * BS, false);
                m.punch(6 * BS + 1000, 2 * BS);
            },
        );
    }
}

#[test]
fn punched_blocks_are_holes_to_seek() {
    // Outside the crash sweep: the exact map after a punch and an allocate on every config.
    for cfg in configs() {
        let media: std::sync::Arc<dyn pmfs_core::pm::Media> =
            std::sync::Arc::new(pmfs_core::pm::HeapRegion::new(data_common::SIM_SIZE).unwrap());
        let vol = Volume::format(media, &data_common::sim_options(cfg)).unwrap();
        let f = setup(&vol);
        f.punch_hole(BS - 300, 4 * BS + 600).unwrap();
        let img = image_of(&f).unwrap();
        assert_eq!(img.map, vec![(0, BS), (5 * BS, SIZE)], "{cfg:?}");
        assert_eq!(f.seek(BS - 300, SeekTarget::Hole).unwrap(), Some(BS));
        assert_eq!(f.seek(BS, SeekTarget::Data).unwrap(), Some(5 * BS));
        f.allocate(2 * BS, BS, true).unwrap();
        let img = image_of(&f).unwrap();
        assert_eq!(
            img.map,
            vec![(0, BS), (2 * BS, 3 * BS), (5 * BS, SIZE)],
            "{cfg:?}"
        );
        let mut m = initial();
        m.punch(BS - 300, 4 * BS + 600);
        assert_eq!(img.data, m.0, "{cfg:?}");
    }
}
