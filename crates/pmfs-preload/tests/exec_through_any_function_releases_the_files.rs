//! A process under the library that ends by `execl`, `execlp`, `execle` or `fexecve` (glibc
//! implements them without calling the interposed `execve`) while it has a pmfs file open in
//! userspace releases that file before the new image starts: a file it had unlinked is freed
//! once the kernel closes the descriptor, so the mount's free space comes back, and the new
//! image gets exactly the arguments and environment it was given (`programs/exec.c`, with
//! more arguments than the C calling convention passes in registers). An image that execs
//! reports no counters; the same program ending with `exit` shows its writes are served in
//! userspace (which is what pins the file: through the kernel, the test passes trivially).
//! Another client of the library stays attached throughout: with none, the daemon would take
//! pins left behind for dead and free the file anyway.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Mounted, TempDir, With, compile, counters, sh_ok, stepped};

fn free_bytes(dir: &Path) -> u64 {
    let out = sh_ok(dir, "stat -f -c '%f %S' .", With::Kernel);
    let text = String::from_utf8(out).unwrap();
    let mut f = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    f.next().unwrap() * f.next().unwrap()
}

/// The free space of the mount once it is back to `want`, or what it is after 5 s (the kernel
/// tells the daemon it forgot a closed unlinked file asynchronously).
fn free_bytes_settled(dir: &Path, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let free = free_bytes(dir);
        if free == want || Instant::now() > deadline {
            return free;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exec_through_every_function_releases_the_files_and_passes_the_arguments() {
    let work = TempDir::new("exec");
    let exe = compile("exec", work.path());
    let m = Mounted::new("exec", "256M", "hashfs");
    let stats = work.path().join("stats");
    // An empty file first: the directory keeps the block its first entry needed.
    sh_ok(m.path(), "touch keep", With::Kernel);
    let mut other = stepped(
        &compile("writer", work.path()),
        &work.path().join("other-stats"),
    )
    .arg(m.path().join("keep"))
    .spawn()
    .unwrap();
    let mut out = other.stdout.take().unwrap();
    writeln!(other.stdin.as_mut().unwrap(), "0 attached").unwrap();
    let mut answer = [0u8; 9];
    out.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"ready\nok\n", "the other client");
    let before = free_bytes(m.path());
    for (how, env) in [
        ("execl", "unset"),
        ("execlp", "unset"),
        ("execle", "from-execle"),
        ("fexecve", "from-execle"),
        ("exit", "exit"),
    ] {
        let out = sh_ok(
            m.path(),
            &format!("{} {how}", exe.display()),
            With::Library(&stats),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("a0 a1 a2 a3 a4 a5 {env}\n"),
            "{how}"
        );
        assert_eq!(
            free_bytes_settled(m.path(), before),
            before,
            "{how}: the unlinked file was not freed"
        );
    }
    drop(other.stdin.take());
    assert!(other.wait().unwrap().success());
    let c = counters(&stats);
    assert_eq!(c.processes, 1, "{c:?}");
    assert!(c.served >= 4, "{c:?}");
    assert!(counters(&work.path().join("other-stats")).served >= 1);
    m.unmount_and_fsck();
}
