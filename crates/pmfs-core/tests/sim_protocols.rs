//! The crash simulator judges hand-written persistence protocols correctly: the correct
//! "write data, persist, then publish a valid flag" protocol passes for every crash image,
//! and each classic mistake (missing flush, missing fence, flag published first, missing
//! fence after non-temporal stores, CAS before the data is durable, in-line store order) is
//! caught.

use std::cell::Cell;

use pmfs_core::layout::PmOff;
use pmfs_core::pm::Media;
use pmfs_core::sim::{CrashFailure, CrashPoint, Explorer, SimRegion, Stats};

/// The valid flag: 0 = nothing published, 1 = payload valid.
const FLAG: PmOff = PmOff(0);
/// The payload: two cache lines.
const DATA: PmOff = PmOff(256);
const LEN: usize = 128;

fn payload() -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(1))
        .collect()
}

fn word(image: &[u8], off: PmOff) -> u64 {
    let a = off.0 as usize;
    u64::from_le_bytes(image[a..a + 8].try_into().unwrap())
}

/// The publication invariant: a set flag implies the whole payload; once the operation has
/// returned, the flag must be set.
fn check_published(cp: &CrashPoint<'_>, returned: bool) -> Result<(), String> {
    match word(cp.image, FLAG) {
        0 if returned => Err("operation returned but the flag is not durable".into()),
        0 => Ok(()),
        1 if cp.image[DATA.0 as usize..][..LEN] == payload()[..] => Ok(()),
        1 => Err("flag set but payload missing".into()),
        f => Err(format!("flag holds garbage {f}")),
    }
}

/// Runs a publication workload with the publication checker.
fn explore(
    explorer: &Explorer,
    publish: impl FnOnce(&SimRegion),
) -> (Result<Stats, CrashFailure>, u64) {
    let region = SimRegion::new(4096).unwrap();
    let returned = Cell::new(false);
    let calls = Cell::new(0u64);
    let r = explorer.run(
        &region,
        |pm| {
            publish(pm);
            returned.set(true);
        },
        |cp| {
            calls.set(calls.get() + 1);
            check_published(cp, returned.get())
        },
    );
    (r, calls.get())
}

fn correct(pm: &SimRegion) {
    pm.write(DATA, &payload()).unwrap();
    pm.persist(DATA, LEN as u64).unwrap();
    pm.store_u64(FLAG, 1).unwrap();
    pm.persist(FLAG, 8).unwrap();
}

#[test]
fn data_persisted_before_flag_passes_for_every_image() {
    let (r, calls) = explore(&Explorer::new(1), correct);
    let stats = r.unwrap();
    // Fence 0: the two payload lines are uncertain (4 images); fence 1: the flag line
    // (2 images); end: everything durable (1 image).
    assert_eq!(stats.fences, 2);
    assert_eq!(stats.points, 3);
    assert_eq!(stats.images, 7);
    assert_eq!(calls, 7);
    assert_eq!(stats.sampled_points, 0);
    assert_eq!(stats.max_pending_lines, 2);
}

#[test]
fn correct_protocol_passes_with_store_prefixes_and_sampling() {
    let e = Explorer::new(2)
        .store_prefixes(true)
        .exhaustive_limit(4)
        .samples(10);
    let (r, _) = explore(&e, correct);
    let stats = r.unwrap();
    // Each payload line has 9 states (8 word stores), 81 images > 4: sampled.
    assert_eq!(stats.sampled_points, 1);
    assert_eq!(stats.images, 10 + 2 + 1);
}

#[test]
fn missing_flush_of_the_data_is_caught() {
    let (r, _) = explore(&Explorer::new(3), |pm| {
        pm.write(DATA, &payload()).unwrap();
        pm.fence();
        pm.store_u64(FLAG, 1).unwrap();
        pm.persist(FLAG, 8).unwrap();
    });
    let f = r.unwrap_err();
    assert_eq!(f.message, "flag set but payload missing");
    assert_eq!(f.fence, 1, "caught before the fence that persists the flag");
    assert_eq!(word(&f.image, FLAG), 1);
}

#[test]
fn missing_fence_between_data_and_flag_is_caught() {
    let (r, _) = explore(&Explorer::new(4), |pm| {
        pm.write(DATA, &payload()).unwrap();
        pm.flush(DATA, LEN as u64).unwrap();
        pm.store_u64(FLAG, 1).unwrap();
        pm.persist(FLAG, 8).unwrap();
    });
    let f = r.unwrap_err();
    assert_eq!(f.message, "flag set but payload missing");
    assert_eq!(f.fence, 0);
}

#[test]
fn flag_published_before_the_data_is_caught() {
    let (r, _) = explore(&Explorer::new(5), |pm| {
        pm.store_u64(FLAG, 1).unwrap();
        pm.persist(FLAG, 8).unwrap();
        pm.write(DATA, &payload()).unwrap();
        pm.persist(DATA, LEN as u64).unwrap();
    });
    let f = r.unwrap_err();
    assert_eq!(f.message, "flag set but payload missing");
    assert_eq!(f.fence, 0);
    assert_eq!(f.lines.len(), 1);
    assert_eq!(f.lines[0].offset, 0);
    assert_eq!(f.lines[0].choice, f.lines[0].latest);
}

#[test]
fn missing_final_persist_is_caught_at_the_end() {
    let (r, _) = explore(&Explorer::new(6), |pm| {
        pm.write(DATA, &payload()).unwrap();
        pm.persist(DATA, LEN as u64).unwrap();
        pm.store_u64(FLAG, 1).unwrap();
    });
    let f = r.unwrap_err();
    assert!(f.end);
    assert_eq!(f.fence, 1);
    assert_eq!(f.message, "operation returned but the flag is not durable");
}

#[test]
fn non_temporal_data_then_fence_then_flag_passes() {
    let (r, _) = explore(&Explorer::new(7), |pm| {
        pm.write_nt(DATA, &payload()).unwrap();
        pm.fence();
        pm.store_u64_persist(FLAG, 1).unwrap();
    });
    let stats = r.unwrap();
    assert_eq!(stats.fences, 2);
    assert_eq!(stats.images, 4 + 2 + 1);
}

#[test]
fn non_temporal_data_without_fence_before_the_flag_is_caught() {
    let (r, _) = explore(&Explorer::new(8), |pm| {
        pm.write_nt(DATA, &payload()).unwrap();
        pm.store_u64(FLAG, 1).unwrap();
        pm.persist(FLAG, 8).unwrap();
    });
    let f = r.unwrap_err();
    assert_eq!(
        (f.fence, f.message.as_str()),
        (0, "flag set but payload missing")
    );
}

#[test]
fn write_persist_then_flag_passes() {
    let (r, _) = explore(&Explorer::new(9).store_prefixes(true), |pm| {
        pm.write_persist(DATA, &payload()).unwrap();
        pm.store_u64_persist(FLAG, 1).unwrap();
    });
    r.unwrap();
}

/// CAS publication: a slot holds 0 or the offset of a durable record.
fn check_slot(image: &[u8], committed: bool) -> Result<(), String> {
    match word(image, FLAG) {
        0 if committed => Err("CAS returned but the slot is empty".into()),
        0 => Ok(()),
        off if off == DATA.0 => {
            if image[DATA.0 as usize..][..LEN] == payload()[..] {
                Ok(())
            } else {
                Err("slot points to a record that is not durable".into())
            }
        }
        other => Err(format!("slot holds garbage {other:#x}")),
    }
}

fn explore_cas(explorer: &Explorer, persist_first: bool) -> Result<Stats, CrashFailure> {
    let region = SimRegion::new(4096).unwrap();
    let committed = Cell::new(false);
    explorer.run(
        &region,
        |pm| {
            pm.write(DATA, &payload()).unwrap();
            if persist_first {
                pm.persist(DATA, LEN as u64).unwrap();
            }
            assert_eq!(pm.cas_u64(FLAG, 5, DATA.0).unwrap(), Err(0));
            assert_eq!(pm.cas_u64_persist(FLAG, 0, DATA.0).unwrap(), Ok(0));
            if !persist_first {
                pm.persist(DATA, LEN as u64).unwrap();
            }
            committed.set(true);
        },
        |cp| check_slot(cp.image, committed.get()),
    )
}

#[test]
fn cas_publication_after_persisting_the_record_passes() {
    let stats = explore_cas(&Explorer::new(10), true).unwrap();
    assert_eq!(stats.fences, 2);
}

#[test]
fn cas_publication_before_persisting_the_record_is_caught() {
    let f = explore_cas(&Explorer::new(11), false).unwrap_err();
    assert_eq!(f.message, "slot points to a record that is not durable");
    assert_eq!(f.fence, 0);
}

/// Flag and data in one line: the order of the two stores is all that protects the data.
fn same_line(flag_first: bool, explorer: &Explorer) -> Result<Stats, CrashFailure> {
    let region = SimRegion::new(64).unwrap();
    explorer.run(
        &region,
        |pm| {
            if flag_first {
                pm.store_u64(PmOff(0), 1).unwrap();
                pm.store_u64(PmOff(8), 0xda7a).unwrap();
            } else {
                pm.store_u64(PmOff(8), 0xda7a).unwrap();
                pm.store_u64(PmOff(0), 1).unwrap();
            }
            pm.persist(PmOff(0), 64).unwrap();
        },
        |cp| {
            if word(cp.image, PmOff(0)) == 1 && word(cp.image, PmOff(8)) != 0xda7a {
                Err("flag without data in the same line".into())
            } else {
                Ok(())
            }
        },
    )
}

#[test]
fn store_order_inside_a_line_is_caught_only_with_store_prefixes() {
    let prefixes = Explorer::new(12).store_prefixes(true);
    let lines = Explorer::new(12);
    assert!(same_line(false, &prefixes).is_ok());
    assert!(same_line(false, &lines).is_ok());
    assert!(
        same_line(true, &lines).is_ok(),
        "whole-line states do not see the order of stores inside a line"
    );
    let f = same_line(true, &prefixes).unwrap_err();
    assert_eq!(f.lines[0].choice, 1, "the state after the first store");
    assert_eq!(f.lines[0].choices, 3);
}

#[test]
fn store_prefixes_catch_a_torn_multi_word_record() {
    let run = |prefixes: bool| {
        let region = SimRegion::new(128).unwrap();
        Explorer::new(13).store_prefixes(prefixes).run(
            &region,
            |pm| {
                pm.write(PmOff(64), &[0xab; 24]).unwrap();
                pm.persist(PmOff(64), 24).unwrap();
            },
            |cp| {
                let rec = &cp.image[64..88];
                if rec.iter().all(|&b| b == 0) || rec.iter().all(|&b| b == 0xab) {
                    Ok(())
                } else {
                    Err("torn record".into())
                }
            },
        )
    };
    assert!(run(false).is_ok());
    let f = run(true).unwrap_err();
    assert_eq!(f.image[64..72], [0xab; 8]);
    assert_eq!(f.image[72..80], [0; 8]);
}

#[test]
fn eadr_needs_no_flush_but_adr_does() {
    let run = |region: &SimRegion| {
        let returned = Cell::new(false);
        Explorer::new(14).run(
            region,
            |pm| {
                // A protocol written for eADR only: no flushes at all.
                pm.write(DATA, &payload()).unwrap();
                pm.fence();
                pm.store_u64(FLAG, 1).unwrap();
                pm.fence();
                returned.set(true);
            },
            |cp| check_published(cp, returned.get()),
        )
    };
    let stats = run(&SimRegion::new_eadr(4096).unwrap()).unwrap();
    assert_eq!(stats.images, 3, "nothing is ever uncertain under eADR");
    assert!(run(&SimRegion::new(4096).unwrap()).is_err());
}
