//! `-o poll=MICROS`: after each request one of the daemon's `/dev/fuse` descriptors is
//! non-blocking (its event-loop thread polls for the next request) until the window passes
//! without one; then every descriptor blocks again and the idle daemon uses no CPU. Requests
//! are served the same either way. Without the option no descriptor is ever non-blocking.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::{Mount, Pool};

const O_NONBLOCK: u32 = 0o4000;

/// The open flags of the daemon's descriptors of `/dev/fuse`.
fn fuse_flags(m: &Mount) -> Vec<u32> {
    let pid = m.daemon.as_ref().unwrap().id();
    let mut flags = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "/dev/fuse") {
            let info =
                fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", e.file_name().display()))
                    .unwrap();
            let f = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .unwrap()
                .trim();
            flags.push(u32::from_str_radix(f, 8).unwrap());
        }
    }
    assert!(!flags.is_empty(), "the daemon has no /dev/fuse descriptor");
    flags
}

fn polling(m: &Mount) -> bool {
    fuse_flags(m).iter().any(|f| f & O_NONBLOCK != 0)
}

/// The daemon's CPU time so far, in clock ticks.
fn cpu_ticks(m: &Mount) -> u64 {
    let pid = m.daemon.as_ref().unwrap().id();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which ends with the last ')'.
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Creates, writes, reads, renames and removes files; returns whether the mount was seen
/// polling right after one of the operations.
fn work(m: &Mount, rounds: usize) -> bool {
    let mut seen = false;
    for i in 0..rounds {
        let a = m.join(&format!("f{i}"));
        let b = m.join(&format!("g{i}"));
        fs::write(&a, format!("round {i}")).unwrap();
        seen |= polling(m);
        fs::rename(&a, &b).unwrap();
        assert_eq!(fs::read_to_string(&b).unwrap(), format!("round {i}"));
        assert!(fs::metadata(&a).is_err());
        seen |= polling(m);
        fs::remove_file(&b).unwrap();
        assert!(fs::metadata(&b).is_err());
    }
    seen
}

#[test]
fn the_daemon_polls_after_requests_and_sleeps_when_idle() {
    let pool = Pool::new("poll", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    // A long window: the checks right after an operation must fall inside it on a busy CI
    // machine too.
    let m = pool.mount(&dir, &["poll=300000"]);
    assert!(
        work(&m, 20),
        "no descriptor was non-blocking after requests"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while polling(&m) {
        assert!(
            Instant::now() < deadline,
            "still polling long after the last request"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = cpu_ticks(&m);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(&m) - before;
    assert!(
        used <= 10,
        "the idle daemon used {used} ticks of CPU in a second"
    );
    assert!(!polling(&m));
    // Polling starts again with the next requests.
    assert!(work(&m, 5));
    m.unmount();
    pool.fsck_clean();
}

#[test]
fn without_the_option_every_descriptor_blocks() {
    let pool = Pool::new("nopoll", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    assert!(!work(&m, 20));
    m.unmount();
}
