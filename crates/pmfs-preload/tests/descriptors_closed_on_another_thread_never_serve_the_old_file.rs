//! A descriptor number closed or replaced by a call on one thread, used on another before that
//! call has returned (`programs/reuse.c`). `programs/hold.c`, loaded after the library, holds
//! each such call (`fclose`, `freopen`, `close_range`, `closefrom`, `dup2`, `dup3`) right after
//! the real one, until the main thread has read the number: by then the kernel has given it to
//! another file, and the read must return that file's byte, never the pmfs file's the number
//! named before (the library used to forget the old file only after the real call).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Mounted, TempDir, compile, compile_shared, counters, library};

const EXPECTED: &str = "\
fclose       read 1 byte 'S'
freopen      read 1 byte '0'
close_range  read 1 byte 'S'
closefrom    read 1 byte 'S'
dup2         read 1 byte 'S'
dup3         read 1 byte 'S'
";

fn run(exe: &Path, dir: &Path, preload: &str, stats: &Path) -> String {
    std::fs::create_dir(dir).unwrap();
    let out = Command::new(exe)
        .current_dir(dir)
        .env("LD_PRELOAD", preload)
        .env("PMFS_PRELOAD_STATS", stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} in {}: {out:?}",
        exe.display(),
        dir.display()
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_number_closed_on_another_thread_names_the_new_file_at_once() {
    let work = TempDir::new("reuse");
    let exe = compile("reuse", work.path());
    let hold = compile_shared("hold", work.path());
    let m = Mounted::new("reuse", "256M", "hashfs");
    let stats = work.path().join("stats");
    let hold = hold.display().to_string();
    let with_library = format!("{} {hold}", library().display());

    assert_eq!(
        run(&exe, &work.path().join("local"), &hold, &stats),
        EXPECTED
    );
    assert_eq!(run(&exe, &m.path().join("kernel"), &hold, &stats), EXPECTED);
    assert_eq!(
        run(&exe, &m.path().join("library"), &with_library, &stats),
        EXPECTED
    );
    // Each round's first pread classified the pmfs file and was served in userspace.
    let c = counters(&stats);
    assert!(c.pmfs_fds >= 6 && c.served >= 6, "{c:?}");
    m.unmount_and_fsck();
}
