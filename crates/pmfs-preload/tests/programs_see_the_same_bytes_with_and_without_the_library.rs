//! cat, cp, dd (several block sizes, seeks, `conv=notrunc`, a sparse write), offsets shared
//! through a shell's duplicated descriptors across fork and exec, several processes writing
//! disjoint pieces of one file at once, and several processes appending to one file: the same
//! script runs on a local directory and on a pmfs mount, each without and with the library,
//! and every result has the same bytes. The library's counters show that it served the pmfs
//! files' calls in userspace, counted nothing on local files, and stayed silent with
//! `PMFS_PRELOAD=off`.

mod common;

use std::fs;
use std::path::Path;

use common::{Mounted, TempDir, With, bytes, counters, sh_ok, tree};

/// The script: reads `src` (on a local directory), writes everything into the current one.
fn script(src: &Path) -> String {
    let src = src.display();
    format!(
        r#"set -e
cp {src} copy
cat copy > cat-of-copy
cat {src} > cat-in
dd if={src} of=dd-4k bs=4096 status=none
dd if={src} of=dd-odd bs=1000 count=7 seek=3 status=none
cp {src} dd-notrunc
dd if=/dev/zero of=dd-notrunc bs=512 count=9 seek=5 conv=notrunc status=none
dd if={src} of=dd-notrunc bs=3 count=11 skip=7 seek=100001 conv=notrunc status=none
dd if={src} of=dd-skip bs=65536 skip=2 seek=1 count=4 status=none
dd if={src} of=dd-sparse bs=1M seek=3 count=1 status=none
dd if=copy of=dd-from-pmfs bs=8192 skip=5 count=9 status=none
exec 3<copy
dd bs=10 count=1 <&3 > offset-a 2>/dev/null
exec 4<&3
dd bs=7 count=1 <&4 > offset-b 2>/dev/null
dd bs=5 count=1 <&3 > offset-c 2>/dev/null
exec 3<&- 4<&-
exec 5>shared-log
echo one >&5
(echo two >&5)
sh -c 'echo three >&5'
exec 5>&-
: > pieces
for i in 0 1 2 3 4 5 6 7; do
  dd if={src} of=pieces bs=16384 skip=$i seek=$i count=1 conv=notrunc status=none &
done
wait
for i in 1 2 3 4; do
  (j=0; while [ $j -lt 40 ]; do echo "writer $i line $j" >> appended; j=$((j+1)); done) &
done
wait
sort appended > appended-sorted
rm appended
"#
    )
}

#[test]
fn programs_on_a_pmfs_mount_see_the_same_bytes_with_the_library_and_local_files_are_untouched() {
    let work = TempDir::new("programs");
    let src = work.path().join("src");
    fs::write(&src, bytes(7, (1 << 20) + 12345)).unwrap();
    let m = Mounted::new("programs", "256M", "hashfs");
    let script = script(&src);

    let run = |dir: &Path, with: With<'_>| {
        fs::create_dir(dir).unwrap();
        sh_ok(dir, &script, with);
        tree(dir)
    };
    let stats = |name: &str| work.path().join(name);

    let reference = run(&work.path().join("local-kernel"), With::Kernel);
    let local_lib = run(
        &work.path().join("local-library"),
        With::Library(&stats("local")),
    );
    let pmfs_kernel = run(&m.path().join("kernel"), With::Kernel);
    let pmfs_lib = run(&m.path().join("library"), With::Library(&stats("pmfs")));
    let pmfs_off = run(&m.path().join("off"), With::LibraryOff(&stats("off")));

    assert_eq!(
        reference.len(),
        15,
        "{:?}",
        reference.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for (name, got) in [
        ("local, library", &local_lib),
        ("pmfs, kernel", &pmfs_kernel),
        ("pmfs, library", &pmfs_lib),
        ("pmfs, library off", &pmfs_off),
    ] {
        for (r, g) in reference.iter().zip(got.iter()) {
            assert_eq!(r.0, g.0, "{name}: file names differ");
            assert!(r.1 == g.1, "{name}: {} differs", r.0);
        }
        assert_eq!(reference.len(), got.len(), "{name}: file count");
    }
    let by_name = |n: &str| &reference.iter().find(|f| f.0 == n).unwrap().1;
    assert_eq!(by_name("offset-a").len() + by_name("offset-b").len(), 17);
    assert_eq!(by_name("shared-log"), b"one\ntwo\nthree\n");
    assert_eq!(
        by_name("appended-sorted").len(),
        4 * 40 * "writer 1 line 10\n".len() - 4 * 10
    );

    let local = counters(&stats("local"));
    assert!(local.processes > 20, "{local:?}");
    assert_eq!((local.pmfs_fds, local.pmfs_calls), (0, 0), "{local:?}");
    let pmfs = counters(&stats("pmfs"));
    assert!(pmfs.processes > 20, "{pmfs:?}");
    assert!(pmfs.pmfs_fds >= 20 && pmfs.pmfs_calls >= 100, "{pmfs:?}");
    // Local files are never served; pmfs files are, through the attached pool.
    assert_eq!(local.served, 0);
    assert!(pmfs.served >= 100, "{pmfs:?}");
    assert!(!stats("off").exists(), "PMFS_PRELOAD=off still reported");
    m.unmount_and_fsck();
}
