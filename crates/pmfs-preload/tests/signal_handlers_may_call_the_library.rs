//! A signal handler that writes to the file its thread is writing (`programs/signals.c`: an
//! interval timer's handler appends to the log the main thread appends to). The library's
//! call may be interrupted while it holds the file's locks; a handler that called the library
//! then used to wait for its own thread forever. Its handlers now run when the library's call
//! is done, as the kernel runs them between system calls. The program also checks what
//! `sigaction` and `signal` report of the handlers it installed.

mod common;

use std::fs;

use common::{Mounted, TempDir, With, compile, counters, sh_ok};

const EXPECTED: &str = "\
sigaction SIGALRM            = 0
handlers ran                 = 1
siginfo right                = 1
size is every line           = 1
sigaction SIGUSR1            = 0
query                        = 0
handler reported             = 1
SA_SIGINFO not reported      = 1
SA_RESETHAND reported        = 1
mask reported                = 1
raise SIGUSR1                = 0
reset to default             = 1
signal first                 = 1
signal again                 = 1
usr2 runs                    = 2
ignore                       = 1
ignored                      = 2
invalid                      = -1 errno Invalid argument
";

#[test]
fn a_handler_writing_to_the_file_its_thread_writes_neither_hangs_nor_tears_lines() {
    let work = TempDir::new("signals");
    let exe = compile("signals", work.path());
    let m = Mounted::new("signals", "256M", "hashfs");
    let stats = work.path().join("stats");
    // A hang is a failure, not a stuck test.
    let script = format!("timeout 120 {}", exe.display());
    let run = |dir: std::path::PathBuf, with: With<'_>| {
        fs::create_dir(&dir).unwrap();
        let out = String::from_utf8(sh_ok(&dir, &script, with)).unwrap();
        let log = fs::read_to_string(dir.join("log")).unwrap();
        let whole = log.lines().all(|l| {
            l == "handler line"
                || l.strip_prefix("main line ")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
        });
        (out, whole)
    };
    let local = run(work.path().join("local"), With::Kernel);
    let kernel = run(m.path().join("kernel"), With::Kernel);
    let library = run(m.path().join("library"), With::Library(&stats));
    assert_eq!(local, (EXPECTED.to_owned(), true));
    assert_eq!(kernel, local);
    assert_eq!(library, local);
    let c = counters(&stats);
    assert!(c.served >= 1_000, "{c:?}");
    m.unmount_and_fsck();
}
