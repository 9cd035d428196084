//! A journaled operation that fails part way leaves the volume as it was before or after it,
//! the same in the session and after a crash at any fence, and a later operation that
//! writes the same words without the journal is not undone by the next mount (or is refused,
//! when the failure left work that only recovery does). The media here refuses the k-th word
//! store of the operation, compare-and-swaps included (as a region refuses one out of its
//! bounds), for every k: before the journal is armed, inside the transaction (the words are
//! rolled back), at its commit (rolled back too) and in the cleanups after it. Without a
//! crash, the volume then closes (cleanly, or unclean with [`pmfs::Error::LeftForRecovery`]
//! when a failed store left work to recovery) and mounts again as the session showed it.
//! When the next stores are refused too, so that the operation cannot be undone in place, the
//! session takes no more changes until recovery has run. Operations outside the journal
//! (log-free directory updates, writes, size changes) are checked the same way without a
//! crash: a failure after their first step reached the media leaves a half-done operation
//! that only recovery resolves, and the session then takes no more changes. A client in the
//! owner's process whose update failed leaves the file's tail to the owner.

mod common;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use pmfs::{OpenMode, OpenOptions, RenameFlags, Volume};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media, Tap, Tapped};
use pmfs_core::sim::{Explorer, SAMPLES_ENV, SimRegion};

use common::crash::{SIM_SIZE, recover_and_check, sim_options};
use common::{KINDS, Obj, Snapshot, snapshot};

/// Makes word stores (plain or compare-and-swap) of a region of `size` bytes fail on
/// request, as the region refuses one out of its bounds.
struct Refuse {
    size: u64,
    /// Word stores to let through before the one refused; `u64::MAX`: none refused.
    left: AtomicU64,
    run: AtomicU64,
    stores: AtomicU64,
}

/// A region whose word stores fail on request.
type Refusing<M> = Tapped<Arc<M>, Refuse>;

fn refusing<M: Media>(inner: Arc<M>) -> Arc<Refusing<M>> {
    let tap = Refuse {
        size: inner.size(),
        left: AtomicU64::new(u64::MAX),
        run: AtomicU64::new(1),
        stores: AtomicU64::new(0),
    };
    Arc::new(Tapped::new(inner, tap))
}

impl Refuse {
    /// Refuses the `k`-th word store from now on (1: the next one).
    fn refuse(&self, k: u64) {
        self.refuse_run(k, 1);
    }

    /// Refuses `n` word stores from the `k`-th on.
    fn refuse_run(&self, k: u64, n: u64) {
        self.run.store(n, Ordering::Relaxed);
        self.left.store(k - 1, Ordering::Relaxed);
    }

    /// Counts a word store at `off` and refuses it if its turn has come.
    fn pass(&self, off: PmOff) -> pmfs_core::Result<()> {
        self.stores.fetch_add(1, Ordering::Relaxed);
        let left = self.left.load(Ordering::Relaxed);
        if left != u64::MAX {
            if left == 0 {
                let run = self.run.load(Ordering::Relaxed);
                if run > 1 {
                    self.run.store(run - 1, Ordering::Relaxed);
                } else {
                    self.accept_all();
                }
                return Err(pmfs_core::Error::OutOfBounds {
                    off,
                    len: 8,
                    size: self.size,
                });
            }
            self.left.store(left - 1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn accept_all(&self) {
        self.run.store(1, Ordering::Relaxed);
        self.left.store(u64::MAX, Ordering::Relaxed);
    }
}

impl Tap for Refuse {
    fn store(&self, off: PmOff) -> pmfs_core::Result<()> {
        self.pass(off)
    }
    fn cas(&self, off: PmOff, _current: u64) -> pmfs_core::Result<()> {
        self.pass(off)
    }
}

fn tree(vol: &Volume) {
    vol.create_dir_all("/s/sub").unwrap();
    vol.create_dir("/t").unwrap();
    vol.write("/s/a", b"aaaa").unwrap();
    vol.write("/t/b", b"bb").unwrap();
    vol.hard_link("/t/b", "/s/b").unwrap();
    vol.write("/t/c", &[b'c'; 5000]).unwrap();
    vol.create_file("/s/e").unwrap();
}

type Op = fn(&Volume) -> pmfs::Result<()>;

/// Operations that change words under the journal (entries, link counts, parents).
const OPS: [(&str, Op); 6] = [
    ("rename across directories", |v| v.rename("/s/a", "/t/a")),
    ("rename over a file", |v| v.rename("/s/a", "/t/c")),
    ("rename of a directory", |v| v.rename("/s/sub", "/t/sub")),
    ("exchange", |v| {
        v.rename_with(
            "/s/a",
            "/t/b",
            RenameFlags {
                noreplace: false,
                exchange: true,
            },
        )
    }),
    ("hard link", |v| v.hard_link("/s/a", "/t/l")),
    ("unlink of one of two links", |v| v.remove_file("/s/b")),
];

/// Creates after the failure, without the journal: each rewrites link words of the entries
/// of a directory the operation changed.
const LATER: [&str; 2] = ["/s/z", "/t/z"];

/// `s` with the first `n` of [`LATER`] created.
fn with_later(s: &Snapshot, n: usize) -> Snapshot {
    let mut s = s.clone();
    for p in &LATER[..n] {
        s.objects.insert((*p).into(), Obj::File(Vec::new(), 1));
    }
    s
}

/// Word stores `op` makes on a fresh tree.
fn stores_of(kind: pmfs::MappingKind, op: Op) -> u64 {
    let media = refusing(Arc::new(HeapRegion::new(SIM_SIZE).unwrap()));
    let vol = Volume::format(media.clone(), &sim_options(kind)).unwrap();
    tree(&vol);
    let from = media.tap().stores.load(Ordering::Relaxed);
    op(&vol).unwrap();
    media.tap().stores.load(Ordering::Relaxed) - from
}

/// The states the session may show after `op` failed: as before, or as after it.
fn outcomes(kind: pmfs::MappingKind, op: Op) -> (Snapshot, Snapshot) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(media, &sim_options(kind)).unwrap();
    tree(&vol);
    let before = snapshot(&vol);
    op(&vol).unwrap();
    (before, snapshot(&vol))
}

/// Crash points of up to 16 images enumerated, 4 sampled at the others unless
/// `PMFS_CRASH_SAMPLES` says otherwise: the workloads are many (one per refused store).
fn explorer(seed: u64) -> Explorer {
    let e = Explorer::new(seed).exhaustive_limit(16);
    if std::env::var_os(SAMPLES_ENV).is_some() {
        e
    } else {
        e.samples(4)
    }
}

fn check(kind: pmfs::MappingKind, name: &str, op: Op, k: u64, seed: u64) {
    let (before, after) = outcomes(kind, op);
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let media = refusing(region.clone());
    let vol = Volume::format(media.clone(), &sim_options(kind)).unwrap();
    tree(&vol);
    region.persist_all();
    // What the session shows after the failure, and how many of `LATER` returned since.
    let seen: RefCell<Option<Snapshot>> = RefCell::default();
    let created = Cell::new(0);
    // Whether the session refused a create: the failure left work to recovery.
    let refused = Cell::new(false);
    let what = format!("{kind:?}, {name}, store {k} refused");
    explorer(seed)
        .run(
            &region,
            |_| {
                media.tap().refuse(k);
                let r = op(&vol);
                media.tap().accept_all();
                let now = snapshot(&vol);
                assert!(
                    now == before || now == after,
                    "{what}: the session shows neither before nor after ({r:?}): {now:#?}"
                );
                *seen.borrow_mut() = Some(now);
                for (i, p) in LATER.iter().enumerate() {
                    match vol.create_file(p) {
                        Ok(_) => created.set(i + 1),
                        Err(pmfs::Error::LeftForRecovery(_)) => {
                            refused.set(true);
                            break;
                        }
                        Err(e) => panic!("{what}: creating {p} after it: {e}"),
                    }
                }
            },
            |cp| {
                let got = recover_and_check(cp.image)?;
                let n = created.get();
                let ok = match &*seen.borrow() {
                    None => got == before || got == after,
                    Some(s) => {
                        got == with_later(s, n)
                            || (!refused.get() && n < LATER.len() && got == with_later(s, n + 1))
                    }
                };
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "{what}: recovery gives {got:#?}\nthe session showed {:#?}",
                        seen.borrow()
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
}

/// Every refused store of `op` (the `i`-th of [`OPS`]), on every mapping.
fn every_refusal(i: usize) {
    let (name, op) = OPS[i];
    for (j, kind) in KINDS.into_iter().enumerate() {
        for k in 1..=stores_of(kind, op) {
            check(kind, name, op, k, (i * KINDS.len() + j) as u64 * 100 + k);
        }
    }
}

#[test]
fn a_failed_rename_across_directories() {
    every_refusal(0);
}

#[test]
fn a_failed_rename_over_a_file() {
    every_refusal(1);
}

#[test]
fn a_failed_rename_of_a_directory() {
    every_refusal(2);
}

#[test]
fn a_failed_exchange() {
    every_refusal(3);
}

#[test]
fn a_failed_hard_link() {
    every_refusal(4);
}

#[test]
fn a_failed_unlink_of_one_of_two_links() {
    every_refusal(5);
}

/// A fresh tree on a heap region after `op` (named `name`) ran on it with `run` word stores
/// refused from its `k`-th on, and a description of the case with what `op` returned.
fn fail(
    kind: pmfs::MappingKind,
    (name, op): (&str, Op),
    k: u64,
    run: u64,
) -> (Arc<Refusing<HeapRegion>>, Volume, String) {
    let media = refusing(Arc::new(HeapRegion::new(SIM_SIZE).unwrap()));
    let vol = Volume::format(media.clone(), &sim_options(kind)).unwrap();
    tree(&vol);
    media.tap().refuse_run(k, run);
    let r = op(&vol);
    media.tap().accept_all();
    let what = format!(
        "{kind:?}, {name}, stores {k} to {} refused ({r:?})",
        k + run - 1
    );
    (media, vol, what)
}

/// What the next mount of `media` shows (recovering it), after fsck found it clean.
fn remounted(media: &Refusing<HeapRegion>, what: &str) -> Snapshot {
    let mut image = vec![0; SIM_SIZE as usize];
    media.read(PmOff(0), &mut image).unwrap();
    recover_and_check(&image).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Without a crash: after every refused store of every operation the volume closes (cleanly,
/// or leaving for recovery what only recovery can undo) and the next mount shows what the
/// session showed.
#[test]
fn after_a_refused_store_the_next_mount_shows_what_the_session_showed() {
    for (name, op) in OPS {
        for kind in KINDS {
            for k in 1..=stores_of(kind, op) {
                let (media, vol, what) = fail(kind, (name, op), k, 1);
                let seen = snapshot(&vol);
                let closed = vol.close();
                let what = format!("{what}, close: {closed:?}");
                assert!(
                    matches!(closed, Ok(()) | Err(pmfs::Error::LeftForRecovery(_))),
                    "{what}"
                );
                assert_eq!(remounted(&media, &what), seen, "{what}");
            }
        }
    }
}

/// Changes after the failure: a create in each directory the operations change and a rename
/// between them, which takes the journal slot the failed operation used.
const AFTER: [(&str, Op); 3] = [
    ("create", |v| v.write("/s/z", b"z")),
    ("rename", |v| v.rename("/t/c", "/s/c2")),
    ("create", |v| v.write("/t/z", b"zz")),
];

/// What a healthy volume shows after `op` (or not) and the first `n` of [`AFTER`], for
/// every `n`: indexed `[op ran][n]`.
fn healthy(kind: pmfs::MappingKind, op: Op) -> [Vec<Snapshot>; 2] {
    [false, true].map(|ran| {
        (0..=AFTER.len())
            .map(|n| {
                let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
                let vol = Volume::format(media, &sim_options(kind)).unwrap();
                tree(&vol);
                if ran {
                    op(&vol).unwrap();
                }
                for (_, later) in &AFTER[..n] {
                    later(&vol).unwrap();
                }
                snapshot(&vol)
            })
            .collect()
    })
}

/// Without a crash: when the store refused and the next ones (those that would undo the
/// operation) leave work that only recovery does, the session takes no more changes: a
/// change could write over a word that recovery restores, or arm the journal slot that
/// recovery needs. The volume closes unclean and mounts again as before or after the
/// operation, with every change the session accepted.
#[test]
fn after_a_failure_left_to_recovery_the_session_takes_no_more_changes() {
    for (name, op) in OPS {
        // Cases where the refusals reached the rollback: the test is about them.
        let mut frozen = 0;
        for kind in KINDS {
            let healthy = healthy(kind, op);
            for k in 1..=stores_of(kind, op) {
                for run in 2..=3 {
                    let (media, vol, what) = fail(kind, (name, op), k, run);
                    let mut accepted = 0;
                    let mut refused = false;
                    for (later, change) in AFTER {
                        match change(&vol) {
                            Ok(()) if !refused => accepted += 1,
                            Err(pmfs::Error::LeftForRecovery(_)) => refused = true,
                            got => panic!("{what}: a {later} after it gives {got:?}"),
                        }
                    }
                    let seen = (!refused).then(|| snapshot(&vol));
                    let closed = vol.close();
                    let what = format!("{what}: {accepted} changes accepted, close {closed:?}");
                    if refused {
                        frozen += 1;
                        assert!(
                            matches!(closed, Err(pmfs::Error::LeftForRecovery(_))),
                            "{what}"
                        );
                    } else {
                        assert!(closed.is_ok(), "{what}");
                    }
                    let got = remounted(&media, &what);
                    assert!(
                        got == healthy[0][accepted] || got == healthy[1][accepted],
                        "{what}: the next mount shows {got:#?}"
                    );
                    if let Some(seen) = seen {
                        assert_eq!(got, seen, "{what}");
                    }
                }
            }
        }
        assert!(frozen > 0, "{name}: no failure left work to recovery");
    }
}

/// Opens `path` for writing.
fn for_writing(v: &Volume, path: &str) -> pmfs::Result<pmfs::File> {
    OpenOptions::new().write(true).open(v, path)
}

/// Opens `/t/c` for writing by its inode number, as `fallocate` reaches it.
fn node_c(v: &Volume) -> pmfs::Result<pmfs::OpenNode> {
    let t = v.lookup(v.root(), b"t")?.ino;
    let mode = OpenMode {
        write: true,
        ..OpenMode::default()
    };
    v.open_ino(v.lookup(t, b"c")?.ino, mode)
}

/// Operations without the journal: CFFS's log-free directory updates (a create or the
/// removal of a last link in two ordered steps) and the data path (a write committed by the
/// file's log, a size change, the `fallocate` modes).
const LOG_FREE: [(&str, Op); 13] = [
    ("create", |v| v.create_file("/s/n").map(drop)),
    ("mkdir", |v| v.create_dir("/s/d")),
    ("symlink", |v| v.symlink("/t/b", "/s/l")),
    ("unlink of the last link", |v| v.remove_file("/t/c")),
    ("rmdir", |v| v.remove_dir("/s/sub")),
    ("first write", |v| {
        for_writing(v, "/s/e")?.write_all_at(&[5; 3000], 0)
    }),
    ("append", |v| {
        for_writing(v, "/s/a")?.write_all_at(&[7; 5000], 4)
    }),
    ("overwrite", |v| {
        for_writing(v, "/t/c")?.write_all_at(&[9; 100], 4000)
    }),
    ("truncate", |v| for_writing(v, "/t/c")?.set_len(100)),
    ("extend", |v| for_writing(v, "/t/c")?.set_len(70000)),
    ("punch hole", |v| node_c(v)?.punch_hole(100, 4000)),
    ("zero range", |v| node_c(v)?.zero_range(4000, 9000, false)),
    ("allocate", |v| node_c(v)?.allocate(8192, 12000, false)),
];

/// A change after the failure that takes no inode number (a create could take the one the
/// failed operation gave back, and with it whatever the failure left under that number): a
/// byte appended to each file the operations write, where it still exists. An append takes
/// the file's tail, which a failed release could have left held.
const LATER_WRITE: Op = |v| {
    for path in ["/t/b", "/t/c", "/s/a", "/s/e"] {
        match for_writing(v, path) {
            Ok(f) => f.write_all_at(b"z", f.metadata()?.len())?,
            Err(pmfs::Error::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
};

/// [`LATER_WRITE`] on `vol`, in a thread given 60 s: a lock or tail that a failure left held
/// would keep it waiting.
fn later_write(vol: Volume, what: &str) -> (Volume, pmfs::Result<()>) {
    let vol = Arc::new(vol);
    let (tx, rx) = mpsc::channel();
    let v = vol.clone();
    std::thread::spawn(move || {
        let r = LATER_WRITE(&v);
        drop(v);
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what}: a write after it still waits after 60 s"));
    let vol = Arc::into_inner(vol).expect("the writer let the volume go");
    (vol, r)
}

/// Without a crash, the operations outside the journal: after the `k`-th word store (and
/// the next, when `run` is 2) is refused, the session shows the volume as before or after
/// the operation and takes the next change, closes cleanly, and mounts again as it showed
/// it; or, when the failure left a half-done operation that only recovery resolves, it takes
/// no more changes, closes unclean, and the next mount shows the volume as before or after.
#[test]
fn after_a_refused_store_outside_the_journal_the_next_mount_shows_what_the_session_showed() {
    for (name, op) in LOG_FREE {
        for kind in KINDS {
            let (before, after) = outcomes(kind, op);
            let [then_before, then_after] = [false, true].map(|ran| {
                let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
                let vol = Volume::format(media, &sim_options(kind)).unwrap();
                tree(&vol);
                if ran {
                    op(&vol).unwrap();
                }
                LATER_WRITE(&vol).unwrap();
                snapshot(&vol)
            });
            for k in 1..=stores_of(kind, op) {
                for run in 1..=2 {
                    let (media, vol, what) = fail(kind, (name, op), k, run);
                    // A failed release of a lock may leave reads behind it waiting: the
                    // session is looked at only if it takes changes.
                    let (vol, later) = later_write(vol, &what);
                    match later {
                        Ok(()) => {
                            let seen = snapshot(&vol);
                            assert!(
                                seen == then_before || seen == then_after,
                                "{what}: the session shows neither before nor after: {seen:#?}"
                            );
                            let closed = vol.close();
                            assert!(closed.is_ok(), "{what}: close gives {closed:?}");
                            assert_eq!(remounted(&media, &what), seen, "{what}");
                        }
                        Err(pmfs::Error::LeftForRecovery(_)) => {
                            let closed = vol.close();
                            assert!(
                                matches!(closed, Err(pmfs::Error::LeftForRecovery(_))),
                                "{what}: close gives {closed:?}"
                            );
                            let got = remounted(&media, &what);
                            assert!(
                                got == before || got == after,
                                "{what}: the next mount shows {got:#?}"
                            );
                        }
                        Err(e) => panic!("{what}: a write after it gives {e}"),
                    }
                }
            }
        }
    }
}

type ClientOp = fn(&pmfs::OpenNode) -> pmfs::Result<()>;

/// Updates of `/t/c` by a client of the volume's pool in the same process, which take the
/// file's tail.
const CLIENT_OPS: [(&str, ClientOp); 2] = [
    ("truncate", |f| f.set_len(100)),
    ("append", |f| f.write_at(&[3; 10], 5000).map(drop)),
];

/// A client's update of `/t/c` in the owner's process, on a fresh tree, with word store `k`
/// refused (none: `0`): the media, the owner, and the word stores the update made.
fn client_fails(op: ClientOp, k: u64) -> (Arc<Refusing<HeapRegion>>, Volume, u64) {
    let media = refusing(Arc::new(HeapRegion::new(SIM_SIZE).unwrap()));
    let vol = Volume::format(media.clone(), &sim_options(pmfs::MappingKind::HashFs)).unwrap();
    tree(&vol);
    let client = Volume::attach_media(media.clone()).unwrap();
    let mode = OpenMode {
        write: true,
        ..OpenMode::default()
    };
    let c = client.open_ino(node_c(&vol).unwrap().ino(), mode).unwrap();
    let from = media.tap().stores.load(Ordering::Relaxed);
    if k > 0 {
        media.tap().refuse(k);
    }
    let _ = op(&c);
    media.tap().accept_all();
    let stores = media.tap().stores.load(Ordering::Relaxed) - from;
    (media, vol, stores)
}

/// A file's tail that a volume failed to let go names its process until the next mount, so
/// other processes wait for that one to exit; another volume of the same process takes the
/// tail over instead of waiting for itself. Here the owner writes the file after each failed
/// update of a client in its process, closes, and the next mount shows what it showed.
#[test]
fn a_tail_a_client_failed_to_let_go_is_taken_over_by_its_owner() {
    for (name, op) in CLIENT_OPS {
        let (_, _, stores) = client_fails(op, 0);
        for k in 1..=stores {
            let what = format!("client {name}, store {k} refused");
            let (media, vol, _) = client_fails(op, k);
            let (vol, later) = later_write(vol, &what);
            later.unwrap_or_else(|e| panic!("{what}: the owner's write after it gives {e}"));
            let seen = snapshot(&vol);
            let closed = vol.close();
            assert!(closed.is_ok(), "{what}: close gives {closed:?}");
            assert_eq!(remounted(&media, &what), seen, "{what}");
        }
    }
}
