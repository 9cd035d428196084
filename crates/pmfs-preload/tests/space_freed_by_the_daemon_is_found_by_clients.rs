//! The daemon of a HashFS volume frees the blocks of unlinked files in batches, later (the
//! engine's deferred release), and only its own writes that find no space make it free them
//! at once. A client of the library that finds no space in the pool therefore hands its call
//! to the kernel: the daemon frees what it deferred and does the update. Without that, a
//! program that deleted a file and wrote another as large got `ENOSPC` from a half-empty
//! volume.

mod common;

use common::{Mounted, TempDir, With, counters, sh_in, sh_ok};

/// Each script fills most of a 64 MiB pool under the library, after the file of the script
/// before was deleted (so the daemon still holds its blocks): a write, an append and an
/// allocation.
const FILLS: [&str; 3] = [
    "dd if=/dev/zero of=a bs=1M count=40 status=none",
    "head -c 41943040 /dev/zero >> b",
    "fallocate -l 40M c",
];

#[test]
fn clients_write_into_space_the_daemon_has_yet_to_free() {
    let m = Mounted::new("space", "64M", "hashfs");
    let work = TempDir::new("space-stats");
    let stats = work.path().join("stats");
    sh_ok(
        m.path(),
        "dd if=/dev/zero of=first bs=1M count=40 status=none && rm first",
        With::Kernel,
    );
    for (i, fill) in FILLS.iter().enumerate() {
        let out = sh_in(m.path(), fill, With::Library(&stats));
        assert!(
            out.status.success(),
            "`{fill}` found no space: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = ["a", "b", "c"][i];
        let len = std::fs::metadata(m.path().join(name)).unwrap().len();
        assert_eq!(len, 40 << 20, "{name}");
        sh_ok(m.path(), &format!("rm {name}"), With::Kernel);
    }
    // The writes that found space were served in userspace, the others went to the kernel.
    let c = counters(&stats);
    assert!(c.served > 0 && c.pmfs_calls > c.served, "{c:?}");

    // A pool that is really full still says so, under the library as without it.
    sh_ok(
        m.path(),
        "dd if=/dev/zero of=keep bs=1M count=40 status=none",
        With::Kernel,
    );
    let out = sh_in(
        m.path(),
        "dd if=/dev/zero of=more bs=1M count=40 status=none",
        With::Library(&stats),
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No space left on device"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sh_ok(m.path(), "rm more keep", With::Kernel);
    m.unmount_and_fsck();
}
