//! Deterministic interleavings of a reclaim (a removal emptying tombstones) with an insert
//! whose walk passed the reclaimed slot while it was live and claims the slot after it. Two
//! handles on one table play two processes; the media of each can pause an operation just
//! before a chosen CAS, so every order the seal and the reclaim handshake must handle is run
//! exactly, not hoped for.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pmfs_core::Result;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media, Tap, Tapped};
use pmfs_core::traits::{Extent, FileId, FileMapping};

use super::slot::{EMPTY, PURGING, TOMBSTONE};
use super::{HashFs, HashFsFile, file_seed};

const SLOTS: u64 = 16;
const META: Extent = Extent {
    start: BlockNo(1),
    len: 3,
};
const DATA: Extent = Extent {
    start: BlockNo(8),
    len: SLOTS,
};
const WAIT: Duration = Duration::from_secs(20);

type Hook = (PmOff, u64, Box<dyn FnOnce() + Send>);

/// Runs a hook once, just before the first CAS of `(offset, expected word)`.
#[derive(Default)]
struct BeforeCas(Mutex<Option<Hook>>);

impl BeforeCas {
    fn set(&self, off: PmOff, current: u64, f: impl FnOnce() + Send + 'static) {
        *self.0.lock().unwrap() = Some((off, current, Box::new(f)));
    }
}

impl Tap for BeforeCas {
    fn cas(&self, off: PmOff, current: u64) -> Result<()> {
        let due = {
            let mut hook = self.0.lock().unwrap();
            match hook.take() {
                Some((o, c, f)) if o == off && c == current => Some(f),
                other => {
                    *hook = other;
                    None
                }
            }
        };
        if let Some(f) = due {
            f();
        }
        Ok(())
    }
}

/// A media on `region` whose operations can be paused before a chosen CAS.
fn hooked(region: &Arc<HeapRegion>) -> Tapped<Arc<HeapRegion>, BeforeCas> {
    Tapped::new(Arc::clone(region), BeforeCas::default())
}

fn file<M: Media>(t: &HashFs<M>, ino: u64) -> HashFsFile {
    t.open_file(FileId {
        ino,
        root: PmOff(0),
    })
    .unwrap()
}

/// A logical block of `ino` whose home slot is `home`.
fn lblk_at<M: Media>(t: &HashFs<M>, ino: u64, home: u64) -> u64 {
    let seed = file_seed(ino, t.salt);
    (0..).find(|&l| t.home(seed, l) == home).unwrap()
}

fn signal(tx: &Sender<()>) {
    tx.send(()).unwrap();
}

fn wait(rx: &Receiver<()>, what: &str) {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// File 2 holds a block in slot `h`, the home of file 1's block `x`; slot `h + 1` is empty.
/// An insert of `x` walks past `h` (live) and, just before it claims `h + 1`, a removal of
/// file 2's block runs in another thread; with `pause`, that removal stops just before its
/// reclaim's CAS from the word `pause` on slot `h`, until the insert has returned. With
/// `batch` the removal is that of a batch on a crowded table ([`HashFs::remove_files`] on
/// a table with few empty slots: the slots tombstoned in one pass, then
/// [`HashFs::reclaim_all`], which scans from the slot for crossing walks instead of looking
/// at the next slot only). Checks
/// that the inserted block is found, and returns the word slot `h` is left with.
fn insert_past_a_reclaim(pause: Option<u64>, batch: bool) -> u64 {
    let region = Arc::new(HeapRegion::new((DATA.start.0 + SLOTS) * BLOCK_SIZE).unwrap());
    let plain = HashFs::format_with_salt(Arc::clone(&region), META, DATA, 7).unwrap();
    let h = 5;
    let (holder, inserter) = (file(&plain, 2), file(&plain, 1));
    let p = lblk_at(&plain, 2, h);
    let x = lblk_at(&plain, 1, h);
    let mut out = Vec::new();
    plain.insert(&holder, p, 1, &mut out).unwrap();
    assert_eq!(out[0].pblk.0, DATA.start.0 + h);

    let remover = HashFs::open(hooked(&region), META, DATA).unwrap();
    let writer = HashFs::open(hooked(&region), META, DATA).unwrap();
    let slot_h = plain.slot_off(h);
    let (start_tx, start_rx) = channel();
    let (ready_tx, ready_rx) = channel();
    let (go_tx, go_rx) = channel();
    let (done_tx, done_rx) = channel();
    if let Some(word) = pause {
        remover.media().tap().set(slot_h, word, move || {
            signal(&ready_tx);
            wait(&go_rx, "the insert");
        });
    }
    writer
        .media()
        .tap()
        .set(plain.slot_off(h + 1), EMPTY, move || {
            signal(&start_tx);
            match pause {
                Some(_) => wait(&ready_rx, "the reclaim to pause"),
                None => wait(&done_rx, "the removal"),
            }
        });
    std::thread::scope(|s| {
        let remover = &remover;
        let r = s.spawn(move || {
            wait(&start_rx, "the insert's walk");
            let removed = if batch {
                let (freed, _) = remover.tombstone_files(&[2].into()).unwrap();
                remover.reclaim_all().unwrap();
                freed.len() as u64
            } else {
                remover.remove(&file(remover, 2), p, 1).unwrap()
            };
            assert_eq!(removed, 1);
            if pause.is_none() {
                signal(&done_tx);
            }
        });
        let mut out = Vec::new();
        writer.insert(&file(&writer, 1), x, 1, &mut out).unwrap();
        assert_eq!(out[0].pblk.0, DATA.start.0 + h + 1);
        if pause.is_some() {
            signal(&go_tx);
        }
        r.join().unwrap();
    });
    let mut runs = Vec::new();
    plain.lookup(&inserter, x, 1, &mut runs).unwrap();
    assert_eq!(
        runs.len(),
        1,
        "the inserted block is lost behind an emptied slot"
    );
    assert_eq!(runs[0].pblk.0, DATA.start.0 + h + 1);
    plain.media().load_u64(slot_h).unwrap()
}

/// The reclaim empties the passed slot before the claim: the seal makes it a tombstone.
#[test]
fn a_seal_fills_a_slot_emptied_behind_the_claim() {
    assert_eq!(insert_past_a_reclaim(None, false), TOMBSTONE);
    assert_eq!(insert_past_a_reclaim(None, true), TOMBSTONE);
}

/// The reclaim marked the slot purging and saw the next slot empty, then the claim took the
/// next slot: the seal turns the purging slot into a tombstone, so the reclaim's last CAS
/// fails.
#[test]
fn a_seal_takes_a_purging_slot_from_the_reclaim() {
    assert_eq!(insert_past_a_reclaim(Some(PURGING), false), TOMBSTONE);
    assert_eq!(insert_past_a_reclaim(Some(PURGING), true), TOMBSTONE);
}

/// The claim took the next slot before the reclaim marked the passed slot purging: the
/// reclaim's check sees it and puts the tombstone back.
#[test]
fn a_reclaim_that_sees_the_claim_keeps_the_tombstone() {
    assert_eq!(insert_past_a_reclaim(Some(TOMBSTONE), false), TOMBSTONE);
    assert_eq!(insert_past_a_reclaim(Some(TOMBSTONE), true), TOMBSTONE);
}

/// Without a racing insert the same removals empty the slot: the three races above are the
/// only reason it stays a tombstone.
#[test]
fn an_unraced_removal_empties_the_slot() {
    let region = Arc::new(HeapRegion::new((DATA.start.0 + SLOTS) * BLOCK_SIZE).unwrap());
    let t = HashFs::format_with_salt(region, META, DATA, 7).unwrap();
    let f = file(&t, 2);
    let p = lblk_at(&t, 2, 5);
    t.insert(&f, p, 1, &mut Vec::new()).unwrap();
    assert_eq!(t.remove(&f, p, 1).unwrap(), 1);
    assert_eq!(t.media().load_u64(t.slot_off(5)).unwrap(), EMPTY);
    t.insert(&f, p, 1, &mut Vec::new()).unwrap();
    assert_eq!(t.remove_files(&[2].into()).unwrap(), 1);
    assert_eq!(t.media().load_u64(t.slot_off(5)).unwrap(), EMPTY);
}
