//! How the explorer visits crash images: deterministically for a seed, exhaustively up to
//! the limit and by distinct samples beyond it (extremes included), synchronously inside the
//! workload's fences, and not at all after the first failure.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use pmfs_core::layout::PmOff;
use pmfs_core::pm::Media;
use pmfs_core::sim::{CrashPoint, Explorer, ImageRegion, SimRegion};

/// Writes `n` distinct lines without flushing them, then fences.
fn dirty_lines(pm: &SimRegion, n: u64) {
    for i in 0..n {
        pm.write(PmOff(i * 64), &[i as u8 + 1; 64]).unwrap();
    }
    pm.fence();
}

/// The images of the first crash point of `dirty_lines(n)`.
fn images_at_first_fence(explorer: &Explorer, n: u64) -> Vec<(Vec<u8>, u64, bool)> {
    let region = SimRegion::new(64 * 16).unwrap();
    let seen = RefCell::new(Vec::new());
    explorer
        .run(
            &region,
            |pm| dirty_lines(pm, n),
            |cp| {
                if cp.fence == 0 && !cp.end {
                    seen.borrow_mut()
                        .push((cp.image.to_vec(), cp.index, cp.sampled));
                }
                Ok(())
            },
        )
        .unwrap();
    seen.into_inner()
}

#[test]
fn exhaustive_up_to_the_limit_covers_every_subset_once() {
    let images = images_at_first_fence(&Explorer::new(1).exhaustive_limit(256), 8);
    assert_eq!(images.len(), 256);
    assert!(images.iter().all(|(_, _, sampled)| !sampled));
    let distinct: HashSet<_> = images.iter().map(|(img, _, _)| img.clone()).collect();
    assert_eq!(distinct.len(), 256);
    // Every image is a subset: each line either durable (zero) or latest.
    for (img, _, _) in &images {
        for (i, line) in img.chunks(64).take(8).enumerate() {
            assert!(line == [0; 64] || line == [i as u8 + 1; 64]);
        }
    }
    assert_eq!(images[0].0, vec![0; 1024], "index 0 is the durable image");
    assert_eq!(
        images.iter().map(|i| i.1).collect::<Vec<_>>(),
        (0..256).collect::<Vec<_>>()
    );
}

#[test]
fn beyond_the_limit_distinct_samples_include_both_extremes() {
    let images = images_at_first_fence(&Explorer::new(1).exhaustive_limit(256).samples(50), 9);
    assert_eq!(images.len(), 50);
    assert!(images.iter().all(|(_, _, sampled)| *sampled));
    let distinct: HashSet<_> = images.iter().map(|(img, _, _)| img.clone()).collect();
    assert_eq!(distinct.len(), 50);
    assert_eq!(images[0].0, vec![0; 1024], "first the durable image");
    let mut latest = vec![0u8; 1024];
    for i in 0..9 {
        latest[i * 64..(i + 1) * 64].fill(i as u8 + 1);
    }
    assert_eq!(images[1].0, latest, "then the program's view");
}

#[test]
fn same_seed_same_images_other_seed_other_images() {
    let e = |seed| Explorer::new(seed).exhaustive_limit(16).samples(20);
    let a = images_at_first_fence(&e(42), 12);
    let b = images_at_first_fence(&e(42), 12);
    let c = images_at_first_fence(&e(43), 12);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a[..2], c[..2], "the extremes do not depend on the seed");
}

#[test]
fn checker_runs_inside_the_fence_and_sees_progress() {
    let region = SimRegion::new(4096).unwrap();
    let progress = Cell::new(0u32);
    let seen = RefCell::new(Vec::new());
    let stats = Explorer::new(3)
        .run(
            &region,
            |pm| {
                for i in 0..3u64 {
                    pm.store_u64_persist(PmOff(i * 64), i + 1).unwrap();
                    progress.set(progress.get() + 1);
                }
            },
            |cp| {
                seen.borrow_mut()
                    .push((cp.fence, cp.end, cp.index, progress.get()));
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(
        seen.into_inner(),
        vec![
            (0, false, 0, 0),
            (0, false, 1, 0),
            (1, false, 0, 1),
            (1, false, 1, 1),
            (2, false, 0, 2),
            (2, false, 1, 2),
            (3, true, 0, 3),
        ]
    );
    assert_eq!(stats.fences, 3);
    assert_eq!(stats.points, 4);
    assert_eq!(stats.images, 7);
}

#[test]
fn after_the_first_failure_the_checker_is_not_called_and_the_workload_finishes() {
    let region = SimRegion::new(4096).unwrap();
    let calls = Cell::new(0u32);
    let finished = Cell::new(false);
    let f = Explorer::new(4)
        .run(
            &region,
            |pm| {
                for i in 0..5u64 {
                    pm.store_u64_persist(PmOff(i * 8), 1).unwrap();
                }
                finished.set(true);
            },
            |cp| {
                calls.set(calls.get() + 1);
                if cp.fence == 1 && cp.index == 1 {
                    Err("second fence, second image".into())
                } else {
                    Ok(())
                }
            },
        )
        .unwrap_err();
    assert_eq!(calls.get(), 4);
    assert!(finished.get());
    assert_eq!((f.fence, f.index, f.end), (1, 1, false));
    assert_eq!(f.seed, 4);
    assert_eq!(
        region.load_u64(PmOff(32)).unwrap(),
        1,
        "the region keeps the workload's effects"
    );
    assert_eq!(region.durable_image(), region.image());
}

#[test]
fn images_reflect_the_state_before_the_fence_takes_effect() {
    // A line flushed before fence 0 is uncertain at fence 0 and durable at the end.
    let region = SimRegion::new(128).unwrap();
    let seen = RefCell::new(Vec::new());
    Explorer::new(0)
        .run(
            &region,
            |pm| {
                pm.write(PmOff(0), &[9; 8]).unwrap();
                pm.persist(PmOff(0), 8).unwrap();
            },
            |cp| {
                seen.borrow_mut().push((cp.fence, cp.image[0]));
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(seen.into_inner(), vec![(0, 0), (0, 9), (1, 9)]);
}

#[test]
fn setup_before_the_run_is_part_of_the_crash_state() {
    let region = SimRegion::new(256).unwrap();
    region.write(PmOff(64), &[1; 64]).unwrap();
    region.write(PmOff(128), &[2; 64]).unwrap();
    region.persist(PmOff(128), 64).unwrap();
    let seen = RefCell::new(Vec::new());
    Explorer::new(0)
        .run(
            &region,
            |_| {},
            |cp| {
                seen.borrow_mut().push((cp.image[64], cp.image[128]));
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(seen.into_inner(), vec![(0, 2), (1, 2)]);
}

#[test]
fn a_fence_from_another_thread_during_a_run_panics() {
    let region = SimRegion::new(64).unwrap();
    let outcome = Cell::new(None);
    Explorer::new(0)
        .run(
            &region,
            |pm| {
                let joined = std::thread::scope(|s| s.spawn(|| pm.fence()).join());
                outcome.set(Some(joined.is_err()));
            },
            |_| Ok(()),
        )
        .unwrap();
    assert_eq!(outcome.get(), Some(true));
    // Outside a run, any thread may fence.
    std::thread::scope(|s| s.spawn(|| region.fence()).join()).unwrap();
}

#[test]
fn regions_are_explored_independently() {
    let a = SimRegion::new(64).unwrap();
    let b = SimRegion::new(64).unwrap();
    let calls = Cell::new(0u32);
    Explorer::new(0)
        .run(
            &a,
            |_| {
                b.store_u64_persist(PmOff(0), 1).unwrap();
            },
            |_: &CrashPoint<'_>| {
                calls.set(calls.get() + 1);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(
        calls.get(),
        1,
        "fences on another region are not crash points"
    );
}

#[test]
fn sample_count_has_a_floor_of_two() {
    let images = images_at_first_fence(&Explorer::new(0).exhaustive_limit(1).samples(0), 3);
    assert_eq!(images.len(), 2);
}

/// A tiny redo protocol: a record at 64, a "pending" word at 0 that names it, and a target
/// word at 128 that recovery sets from the record and then clears the pending word.
fn recover(pm: &dyn Media) {
    if pm.load_u64(PmOff(0)).unwrap() == 1 {
        let v = pm.load_u64(PmOff(64)).unwrap();
        pm.store_u64_persist(PmOff(128), v).unwrap();
        pm.store_u64_persist(PmOff(0), 0).unwrap();
    }
}

#[test]
fn crashes_during_recovery_are_explored_by_a_nested_run() {
    let region = SimRegion::new(256).unwrap();
    let inner_points = Cell::new(0u64);
    let stats = Explorer::new(8)
        .run(
            &region,
            |pm| {
                pm.store_u64_persist(PmOff(64), 42).unwrap();
                pm.store_u64_persist(PmOff(0), 1).unwrap();
            },
            |cp| {
                // Recovery on a private overlay: no copy of the image.
                let view = ImageRegion::new(cp.image).map_err(|e| e.to_string())?;
                recover(&view);
                if view.load_u64(PmOff(0)).unwrap() != 0 {
                    return Err("recovery left the record pending".into());
                }
                // Crashes inside recovery, then recovery again, must reach the same state.
                let expect = view.load_u64(PmOff(128)).unwrap();
                let sim = SimRegion::from_image(cp.image).map_err(|e| e.to_string())?;
                let inner = Explorer::new(cp.index).run(
                    &sim,
                    |pm| recover(pm),
                    |inner_cp| {
                        let again = ImageRegion::new(inner_cp.image).map_err(|e| e.to_string())?;
                        recover(&again);
                        match again.load_u64(PmOff(128)).unwrap() {
                            v if v == expect => Ok(()),
                            v => Err(format!("recovery after a crash in recovery gave {v}")),
                        }
                    },
                );
                let inner = inner.map_err(|f| f.to_string())?;
                inner_points.set(inner_points.get() + inner.points);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(stats.fences, 2);
    // The images with the pending word set ran recovery's two fences plus its end.
    assert!(inner_points.get() > stats.images, "{}", inner_points.get());
}
