//! A read-only mount of a pool whose daemon was killed recovers the volume in memory and
//! leaves the pool as the crash left it, so the library must not read the pool for it: a
//! program under the library reads the files through the kernel (nothing served), sees what
//! was written, and the pool does not change. Once the pool is recovered and closed cleanly,
//! a read-only mount of it is served in userspace again, and still nothing writes to the pool.

mod common;

use common::{Mounted, TempDir, With, bytes, counters, sh_ok};

#[test]
fn a_read_only_mount_of_a_crashed_pool_is_not_served() {
    let work = TempDir::new("ro-crashed-stats");
    let mut m = Mounted::new("ro-crashed", "64M", "hashfs");
    let data = bytes(7, 3 * 4096 + 100);
    std::fs::write(m.path().join("f"), &data).unwrap();
    m.kill_daemon();
    let left = std::fs::read(m.pool()).unwrap();

    let m = m.remount_with(&["ro"]);
    let crashed = work.path().join("crashed");
    assert_eq!(sh_ok(m.path(), "cat f", With::Library(&crashed)), data);
    let c = counters(&crashed);
    assert!(c.pmfs_calls > 0 && c.served == 0, "{c:?}");
    assert!(
        std::fs::read(m.pool()).unwrap() == left,
        "the pool changed under the read-only mount"
    );

    // Recovered by a read-write mount and closed: read-only mounts are served again.
    let m = m.remount_with(&[]).remount_with(&["ro"]);
    let left = std::fs::read(m.pool()).unwrap();
    let clean = work.path().join("clean");
    assert_eq!(sh_ok(m.path(), "cat f", With::Library(&clean)), data);
    let c = counters(&clean);
    assert!(c.served > 0, "{c:?}");
    assert!(
        std::fs::read(m.pool()).unwrap() == left,
        "the pool changed under the read-only mount and its served reads"
    );
    m.remount_with(&[]).unmount_and_fsck();
}
