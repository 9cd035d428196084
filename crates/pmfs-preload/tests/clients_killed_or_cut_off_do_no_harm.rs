//! Robustness of programs running under the library: writers killed with SIGKILL at arbitrary
//! points (in the middle of userspace writes) leave a volume that checks clean once its owner
//! mounted it again, while a writer that was not killed finishes with the right bytes; and a
//! program whose mount vanished (the daemon killed) gets errors from its calls, not a crash.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Mounted, TempDir, With, bytes, counters, library, sh_ok};

#[test]
fn killed_writers_leave_a_clean_volume_and_the_others_finish() {
    let work = TempDir::new("killed");
    let src = work.path().join("src");
    std::fs::write(&src, bytes(3, 3 << 20)).unwrap();
    let m = Mounted::new("killed", "256M", "hashfs");
    let stats = work.path().join("stats");
    let src = src.display();
    for round in 0..3u64 {
        let mut victims = Vec::new();
        for i in 0..4 {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "while :; do dd if={src} of=victim-{i} bs=$((4096 * ({i} + 1))) \
                     conv=notrunc,fsync status=none; cat victim-{i} > /dev/null; \
                     truncate -s $(({i} * 1000)) victim-{i}; done"
                ))
                .current_dir(m.path())
                .env("LD_PRELOAD", library())
                .env("PMFS_PRELOAD_STATS", &stats)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0);
            victims.push(c.spawn().unwrap());
        }
        let survivor = sh_ok(
            m.path(),
            &format!(
                "dd if={src} of=survivor-{round} bs=65536 status=none && cmp {src} survivor-{round} && echo same"
            ),
            With::Library(&stats),
        );
        assert_eq!(survivor, b"same\n");
        // Different points of their loops in each round.
        std::thread::sleep(Duration::from_millis(100 + 150 * round));
        for mut v in victims {
            // The shell and whatever it runs at the moment: their own process group.
            let pgid = libc::pid_t::try_from(v.id()).unwrap();
            // SAFETY: kill takes plain integers; the group is the victim's own.
            assert_eq!(unsafe { libc::kill(-pgid, libc::SIGKILL) }, 0);
            v.wait().unwrap();
        }
    }
    let want = std::fs::read(work.path().join("src")).unwrap();
    for round in 0..3 {
        let got = std::fs::read(m.path().join(format!("survivor-{round}"))).unwrap();
        assert!(got == want, "survivor-{round} changed after the kills");
    }
    let c = counters(&stats);
    assert!(c.served > 0, "{c:?}");
    // A killed client leaves staged blocks and pins that the owner's next mount sweeps (see
    // `Volume::attach`): the data must survive that mount too.
    let m = m.remount();
    for round in 0..3 {
        let got = std::fs::read(m.path().join(format!("survivor-{round}"))).unwrap();
        assert!(got == want, "survivor-{round} changed after the remount");
    }
    m.unmount_and_fsck();
}

#[test]
fn a_program_whose_mount_vanished_gets_errors_not_a_crash() {
    let mut m = Mounted::new("vanish", "64M", "hashfs");
    std::fs::write(m.path().join("f"), b"0123456789").unwrap();
    let mut prog = Command::new("sh")
        .arg("-c")
        .arg(
            "exec 3<f; dd bs=4 count=1 <&3 2>/dev/null; echo; echo ready; read line; \
             dd bs=4 count=1 <&3 2>/dev/null; echo \"read status $?\"; \
             echo x > g 2>/dev/null; echo \"create status $?\"",
        )
        .current_dir(m.path())
        .env("LD_PRELOAD", library())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(prog.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "0123\n");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    m.kill_daemon();
    prog.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let rest: Vec<String> = out.lines().map(|l| l.unwrap()).collect();
    let status = prog.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(rest, ["read status 1", "create status 2"]);
}
