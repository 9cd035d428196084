//! The daemon of a HashFS volume frees the blocks of unlinked files in batches, later (the
//! engine's deferred release: a batch goes once it holds 1/32 of the table), and its own
//! updates that find no space make it free them at once. A client of the library that finds
//! no space in the pool therefore hands its call to the kernel: the daemon frees what it
//! deferred and does the update. Without that, a program that deleted a file and wrote
//! another as large into a nearly full volume got `ENOSPC`.

mod common;

use common::{Mounted, TempDir, With, counters, free_blocks, sh_in, sh_ok};

/// Each fill writes `FILL` blocks under the library, right after a file of `GONE` blocks was
/// deleted through the kernel (too small a share of the table for the daemon to free it at
/// once), into a volume with fewer than `FILL` blocks free besides: a write in 16 KiB pieces,
/// an append and an allocation.
const GONE: u64 = 256;
const FILL: u64 = 300;
const FILLS: [&str; 3] = [
    "dd if=/dev/zero of=a bs=16k count=75 status=none",
    "head -c 1228800 /dev/zero >> b",
    "fallocate -l 1228800 c",
];

#[test]
fn clients_write_into_space_the_daemon_has_yet_to_free() {
    let m = Mounted::new("space", "64M", "hashfs");
    let work = TempDir::new("space-stats");
    let stats = work.path().join("stats");
    let keep = (free_blocks(m.path()) - (FILL + GONE / 2)) * 4096;
    sh_ok(m.path(), &format!("fallocate -l {keep} keep"), With::Kernel);
    for (i, fill) in FILLS.iter().enumerate() {
        sh_ok(
            m.path(),
            &format!("fallocate -l {} gone && rm gone", GONE * 4096),
            With::Kernel,
        );
        let out = sh_in(m.path(), fill, With::Library(&stats));
        assert!(
            out.status.success(),
            "`{fill}` found no space: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = ["a", "b", "c"][i];
        let len = std::fs::metadata(m.path().join(name)).unwrap().len();
        assert_eq!(len, FILL * 4096, "{name}");
        sh_ok(m.path(), &format!("rm {name}"), With::Kernel);
    }
    // The writes that found space were served in userspace, the others went to the kernel.
    let c = counters(&stats);
    assert!(c.served > 0 && c.pmfs_calls > c.served, "{c:?}");

    // A pool that is really full still says so, under the library as without it.
    let out = sh_in(
        m.path(),
        "dd if=/dev/zero of=more bs=64k count=32 status=none",
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
