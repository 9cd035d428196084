//! A crash image the explorer rejected can be saved, committed and replayed as a regression
//! test: the committed fixture of the "flag published first" bug is exactly what a fresh run
//! with the same seed finds, and replaying checkers on it tells a broken recovery from a fixed
//! one.
//!
//! Regenerate the fixture (after a deliberate change of the model or the file format) with
//! `PMFS_SIM_BLESS=1 cargo test -p pmfs-core --test sim_failure_replay`.

use pmfs_core::layout::{PmOff, crc32c};
use pmfs_core::pm::Media;
use pmfs_core::sim::{CrashFailure, CrashPoint, Explorer, SimRegion};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sim/flag_published_first.crash"
);
const SEED: u64 = 0x5eed;

/// Record at 64: 8-byte payload, then its crc32c; flag at 0.
const FLAG: PmOff = PmOff(0);
const REC: PmOff = PmOff(64);
const PAYLOAD: &[u8; 8] = b"pmfs-sim";

fn word(image: &[u8], off: PmOff) -> u64 {
    let a = off.0 as usize;
    u64::from_le_bytes(image[a..a + 8].try_into().unwrap())
}

/// Naive recovery: trusts the flag.
fn trusting_recovery(cp: &CrashPoint<'_>) -> Result<(), String> {
    if word(cp.image, FLAG) == 1 && &cp.image[64..72] != PAYLOAD {
        return Err("flag set but payload missing".into());
    }
    Ok(())
}

/// Fixed recovery: a flag is only believed when the record's checksum matches; it then
/// reports the record as absent, which is a legal outcome for an operation in progress.
fn validating_recovery(cp: &CrashPoint<'_>) -> Result<(), String> {
    let rec = &cp.image[64..76];
    let valid = u32::from_le_bytes(rec[8..12].try_into().unwrap()) == crc32c(&rec[..8]);
    if word(cp.image, FLAG) == 1 && valid && &rec[..8] != PAYLOAD {
        return Err("valid record with the wrong payload".into());
    }
    Ok(())
}

fn flag_first(pm: &SimRegion) {
    pm.store_u64_persist(FLAG, 1).unwrap();
    let mut rec = PAYLOAD.to_vec();
    rec.extend_from_slice(&crc32c(PAYLOAD).to_le_bytes());
    pm.write(REC, &rec).unwrap();
    pm.persist(REC, rec.len() as u64).unwrap();
}

fn fresh_failure() -> CrashFailure {
    let region = SimRegion::new(512).unwrap();
    Explorer::new(SEED)
        .run(&region, flag_first, trusting_recovery)
        .unwrap_err()
}

#[test]
fn committed_fixture_is_what_a_fresh_run_finds() {
    let fresh = fresh_failure();
    if std::env::var_os("PMFS_SIM_BLESS").is_some() {
        fresh.save(FIXTURE).unwrap();
    }
    let saved = CrashFailure::load(FIXTURE).unwrap();
    assert_eq!(saved, fresh, "saved:\n{saved}\nfresh:\n{fresh}");
    assert_eq!((saved.fence, saved.seed), (0, SEED));
}

#[test]
fn replaying_the_fixture_tells_broken_from_fixed_recovery() {
    let saved = CrashFailure::load(FIXTURE).unwrap();
    assert_eq!(
        saved.replay(trusting_recovery).unwrap_err(),
        "flag set but payload missing"
    );
    saved.replay(validating_recovery).unwrap();
    // The fixed recovery also survives the whole exploration.
    let region = SimRegion::new(512).unwrap();
    Explorer::new(SEED)
        .store_prefixes(true)
        .run(&region, flag_first, validating_recovery)
        .unwrap();
}

#[test]
fn save_and_load_round_trip_through_a_file() {
    let f = fresh_failure();
    let dir = std::env::temp_dir().join(format!("pmfs-sim-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("round_trip.crash");
    f.save(&path).unwrap();
    let loaded = CrashFailure::load(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    let loaded = loaded.unwrap();
    assert_eq!(loaded, f);
    assert_eq!(loaded.to_string(), f.to_string());
    assert_eq!(loaded.crash_point().image, &f.image[..]);
}

#[test]
fn fixture_is_small() {
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    assert!(text.len() < 1024, "{} bytes", text.len());
}
