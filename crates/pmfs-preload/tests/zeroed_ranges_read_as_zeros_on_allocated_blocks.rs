//! `fallocate -z` (`FALLOC_FL_ZERO_RANGE`, with and without `KEEP_SIZE`) on a pmfs mount,
//! through the daemon and under the library: each range reads as zeros and the bytes around
//! it stay, the size is what the mode says (kept, or grown to the range's end), the file has
//! no hole left, and the library served the calls in userspace.

mod common;

use std::fs;

use common::{Mounted, TempDir, With, bytes, counters, sh_ok};

const SIZE: usize = 20_000;

/// Inside the file across a block edge; inside the file and past its end, keeping the size;
/// from inside the file past its end, growing it.
const SCRIPT: &str = "set -e
cp ../src f
fallocate -z -o 1000 -l 5000 f
fallocate -z -n -o 15000 -l 10000 f
fallocate -z -o 18000 -l 6000 f
stat -c '%s %b %B' f
";

#[test]
fn zeroed_ranges_read_as_zeros_on_allocated_blocks_with_and_without_the_library() {
    let work = TempDir::new("zero-range");
    let m = Mounted::new("zero-range", "256M", "hashfs");
    let src = bytes(3, SIZE);
    fs::write(m.path().join("src"), &src).unwrap();
    let mut want = src;
    want[1000..6000].fill(0);
    want[15000..].fill(0);
    want.resize(24_000, 0);
    let stats = work.path().join("stats");

    for (name, with) in [("kernel", With::Kernel), ("library", With::Library(&stats))] {
        let dir = m.path().join(name);
        fs::create_dir(&dir).unwrap();
        let out = String::from_utf8(sh_ok(&dir, SCRIPT, with)).unwrap();
        let got = fs::read(dir.join("f")).unwrap();
        assert_eq!(got.len(), want.len(), "{name}: size");
        assert!(got == want, "{name}: contents");
        let st: Vec<u64> = out.split_whitespace().map(|w| w.parse().unwrap()).collect();
        assert_eq!(st[0], 24_000, "{name}: {out}");
        // Every block of the file is allocated (six), and the one `-n` allocated past the
        // end of file counts too.
        assert!(st[1] * st[2] >= 7 * 4096, "{name}: {out}");
    }
    let c = counters(&stats);
    assert!(c.served >= 3, "{c:?}");
    m.unmount_and_fsck();
}
