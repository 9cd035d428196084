//! sqlite3 in every rollback-journal mode and in WAL mode, with a few thousand rows, updates,
//! deletes and `PRAGMA integrity_check`, and fio with `--verify=crc32c`, all on a pmfs mount
//! under the library: the same query results as on a local directory without it, databases
//! the kernel path reads back intact, and counters that show the library served the calls (fio
//! runs its job in a forked process, which leaves with `_exit`: the library reports there too).
//! sqlite3 runs on a mount whose daemon polls for requests (`-o poll`) too.

mod common;

use std::fs;

use common::{Mounted, TempDir, With, counters, sh_ok};

const SQL: &str = "
PRAGMA journal_mode=MODE;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
CREATE INDEX tk ON t(k);
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)
INSERT INTO t(k, v) SELECT printf('key-%05d', (i * 7919) % 4000), zeroblob(i % 700) FROM n;
COMMIT;
UPDATE t SET v = randomblob(300) WHERE id % 3 = 0;
UPDATE t SET v = zeroblob(length(v)) WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
BEGIN;
INSERT INTO t(k, v) SELECT k || '-again', v FROM t WHERE id % 7 = 0;
ROLLBACK;
INSERT INTO t(k, v) SELECT k || '-copy', v FROM t WHERE id % 11 = 0;
SELECT count(*), sum(length(v)), min(k), max(k) FROM t;
PRAGMA integrity_check;
";

#[test]
fn sqlite_in_every_journal_mode_gives_the_same_results_under_the_library() {
    sqlite_in_every_journal_mode(&[]);
}

/// The same on a mount whose daemon polls for requests (`-o poll`): what it serves is the same,
/// however the requests are picked up.
#[test]
fn sqlite_gives_the_same_results_on_a_polling_mount() {
    sqlite_in_every_journal_mode(&["poll=1000"]);
}

fn sqlite_in_every_journal_mode(options: &[&str]) {
    let work = TempDir::new("sqlite");
    let m = Mounted::with_options("sqlite", "256M", "hashfs", options);
    let stats = work.path().join("stats");
    for mode in ["delete", "truncate", "persist", "wal"] {
        let sql = SQL.replace("MODE", mode);
        fs::write(work.path().join("script.sql"), &sql).unwrap();
        let cmd = format!(
            "sqlite3 {mode}.db < {}",
            work.path().join("script.sql").display()
        );
        let local = sh_ok(work.path(), &cmd, With::Kernel);
        let lib = sh_ok(m.path(), &cmd, With::Library(&stats));
        let text = String::from_utf8_lossy(&lib);
        assert!(
            text.starts_with(mode) && text.trim_end().ends_with("ok"),
            "{text}"
        );
        assert_eq!(local, lib, "{mode}: results differ");
        // The kernel path reads the database the library's process wrote.
        let check = "SELECT count(*), sum(length(v)) FROM t; PRAGMA integrity_check;";
        let again = sh_ok(
            m.path(),
            &format!("sqlite3 {mode}.db '{check}'"),
            With::Kernel,
        );
        let want = sh_ok(
            work.path(),
            &format!("sqlite3 {mode}.db '{check}'"),
            With::Kernel,
        );
        assert_eq!(again, want, "{mode}: reopened without the library");
    }
    let c = counters(&stats);
    assert_eq!(c.processes, 4);
    assert!(c.pmfs_fds >= 4 && c.pmfs_calls >= 1000, "{c:?}");
    assert!(c.served >= 1000, "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn fio_verifies_its_data_under_the_library() {
    let work = TempDir::new("fio");
    let m = Mounted::new("fio", "256M", "hashfs");
    let stats = work.path().join("stats");
    let out = sh_ok(
        m.path(),
        "fio --name=verify --filename=fio.dat --size=4M --bs=4k --rw=randwrite \
         --ioengine=psync --verify=crc32c --do_verify=1 --output-format=terse",
        With::Library(&stats),
    );
    let terse = String::from_utf8_lossy(&out);
    assert!(terse.starts_with("3;"), "{terse}");
    assert_eq!(
        fs::metadata(m.path().join("fio.dat")).unwrap().len(),
        4 << 20
    );
    let c = counters(&stats);
    assert!(c.pmfs_fds >= 1 && c.pmfs_calls >= 2048, "{c:?}");
    assert!(c.served >= 2048, "{c:?}");
    m.unmount_and_fsck();
}
