//! Several processes write one file of a HashFS pool at once, each attached to the pool
//! (`Volume::attach`) while the owner keeps it mounted and reads it, and the result is
//! linearizable (see `data_common::lin`): no torn block, no write undone by an older one,
//! multi-block writes seen whole, and the final state a serial order of the writes — at
//! block granularity for block-aligned writes, and per 8-byte word for writes of any
//! 8-byte-aligned range, which share partial blocks across processes. Writers are also
//! SIGKILLed in the middle of their stream: the other writers finish, the owner sees a
//! consistent file (the killed writer's last write whole or absent), and after a remount the
//! file is unchanged and fsck is clean.
//!
//! The writers are this test binary run again (`std::process::Command` on the current
//! executable, selecting the same test) with a role in `PMFS_DATA_MP_CHILD`; each logs its
//! writes and reads, with `CLOCK_MONOTONIC` times, to a file the owner checks afterwards.

mod data_common;

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use pmfs::{Ino, OpenNode, Volume};

use data_common::lin::{
    Rec, check_final, check_read, check_words, check_words_final, tag, tags_of, words_of,
};
use data_common::procs::{self, OWNERS, fsck_pool_clean, hashfs_pool, scratch, spawn_role};
use data_common::rng::Rng;
use data_common::{BS, RW, create};

/// Blocks of the shared file.
const BLOCKS: u64 = 16;
/// The environment variable that makes this binary a writer.
const CHILD_ENV: &str = "PMFS_DATA_MP_CHILD";

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process of the machine.
fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What a writer process does: `pool;unit;ino;id;writes;log`.
struct Role {
    pool: PathBuf,
    /// Bytes per unit of the writes: a block, or an 8-byte word.
    unit: u64,
    ino: u64,
    id: u64,
    writes: u64,
    log: PathBuf,
}

impl Role {
    fn encode(&self) -> String {
        format!(
            "{};{};{};{};{};{}",
            self.pool.display(),
            self.unit,
            self.ino,
            self.id,
            self.writes,
            self.log.display()
        )
    }

    fn decode(s: &str) -> Role {
        let p: Vec<&str> = s.split(';').collect();
        assert_eq!(p.len(), 6, "bad {CHILD_ENV}={s:?}");
        Role {
            pool: p[0].into(),
            unit: p[1].parse().unwrap(),
            ino: p[2].parse().unwrap(),
            id: p[3].parse().unwrap(),
            writes: p[4].parse().unwrap(),
            log: p[5].into(),
        }
    }
}

/// A read: blocks from `first`, when it ran, and what each block held.
struct Read {
    first: u64,
    start: u64,
    end: u64,
    tags: Vec<u64>,
}

/// Units of the file.
fn units(unit: u64) -> u64 {
    BLOCKS * BS / unit
}

/// Reads `len` units from unit `first`.
fn read_units(node: &OpenNode, unit: u64, first: u64, len: u64) -> Read {
    let mut buf = vec![0u8; (len * unit) as usize];
    let start = now();
    let n = node.read_at(&mut buf, first * unit).unwrap();
    let end = now();
    assert_eq!(n, buf.len(), "short read");
    let tags = if unit == BS {
        tags_of(&buf, first).unwrap()
    } else {
        words_of(&buf)
    };
    Read {
        first,
        start,
        end,
        tags,
    }
}

/// The writer process: attaches, then writes, logging (one `write` call per line)
/// `S tag first len start` before and `E tag end` after each write; every third write it
/// reads a range (`R first start end tags...`).
fn run_child(role: &Role) {
    let client = Volume::attach(&role.pool).unwrap();
    let node = client.open_ino(Ino::from_raw(role.ino), RW).unwrap();
    let mut log = fs::File::create(&role.log).unwrap();
    let mut rng = Rng::new(role.id * 7919);
    for seq in 1..=role.writes {
        let len = rng.range(1, 3 * BS / role.unit);
        let first = rng.range(0, units(role.unit) - len);
        let t = tag(role.id, seq);
        let mut buf = vec![0u8; (len * role.unit) as usize];
        for w in buf.chunks_exact_mut(8) {
            w.copy_from_slice(&t.to_le_bytes());
        }
        log.write_all(format!("S {t} {first} {len} {}\n", now()).as_bytes())
            .unwrap();
        node.write_at(&buf, first * role.unit).unwrap();
        log.write_all(format!("E {t} {}\n", now()).as_bytes())
            .unwrap();
        if seq % 3 == 0 {
            let len = rng.range(1, units(role.unit) / 2);
            let r = read_units(&node, role.unit, rng.range(0, units(role.unit) - len), len);
            let tags: Vec<String> = r.tags.iter().map(u64::to_string).collect();
            let line = format!("R {} {} {} {}\n", r.first, r.start, r.end, tags.join(" "));
            log.write_all(line.as_bytes()).unwrap();
        }
    }
    drop(node);
    drop(client);
}

/// Parses a writer's log into `writes` and `reads`.
fn parse_log(path: &Path, writes: &mut HashMap<u64, Rec>, reads: &mut Vec<Read>) {
    let text = fs::read_to_string(path).unwrap();
    // A killed writer may leave a partial last line (a read's cut last tag would parse as a
    // tag nobody wrote): only whole lines count.
    for line in text
        .split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
    {
        let w: Vec<u64> = line[2..]
            .split(' ')
            .map(|x| x.parse().unwrap_or(u64::MAX))
            .collect();
        match &line[..1] {
            "S" if w.len() == 4 => {
                writes.insert(
                    w[0],
                    Rec {
                        first: w[1],
                        len: w[2],
                        start: w[3],
                        end: u64::MAX,
                    },
                );
            }
            "E" if w.len() == 2 => writes.get_mut(&w[0]).unwrap().end = w[1],
            "R" if w.len() >= 4 => reads.push(Read {
                first: w[0],
                start: w[1],
                end: w[2],
                tags: w[3..].to_vec(),
            }),
            _ => {}
        }
    }
}

fn expect_success(child: Child, who: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{who} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The owner's side of a run: a pool with one file of tag-0 blocks, `writers` writer
/// processes (`writes[i]` writes each); `kill` = (writer, after how many writes, delay in
/// microseconds) SIGKILLs that writer that long after it finished that many writes. The
/// owner reads while they run, then checks every read and the final state, remounts and
/// runs fsck.
fn run_owner(test: &str, unit: u64, writes: &[u64], kill: Option<(usize, usize, u64)>) {
    let _serial = OWNERS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("data-mp", test);
    let pool = dir.join("pool");
    let vol = hashfs_pool(&pool, 16 << 20);
    let ino = {
        let f = create(&vol, "f");
        f.write_at(&vec![0u8; (BLOCKS * BS) as usize], 0).unwrap();
        f.ino()
    };
    let mut history: HashMap<u64, Rec> = HashMap::new();
    history.insert(
        tag(0, 0),
        Rec {
            first: 0,
            len: units(unit),
            start: 0,
            end: 0,
        },
    );
    let roles: Vec<Role> = writes
        .iter()
        .enumerate()
        .map(|(i, &n)| Role {
            pool: pool.clone(),
            unit,
            ino: ino.raw(),
            id: i as u64 + 1,
            writes: n,
            log: dir.join(format!("writer-{}", i + 1)),
        })
        .collect();
    let mut children: Vec<Option<Child>> = roles
        .iter()
        .map(|r| Some(spawn_role(test, CHILD_ENV, &r.encode())))
        .collect();
    let done = AtomicBool::new(false);
    let mut owner_reads = Vec::new();
    let mut killed_at = None;
    thread::scope(|s| {
        let reader = s.spawn(|| {
            let node = vol.open_ino(ino, RW).unwrap();
            let mut reads = Vec::new();
            while !done.load(Ordering::SeqCst) {
                reads.push(read_units(&node, unit, 0, units(unit)));
                thread::sleep(Duration::from_millis(1));
            }
            reads
        });
        if let Some((victim, after, delay)) = kill {
            let log = &roles[victim].log;
            loop {
                let ended = fs::read_to_string(log)
                    .map(|t| t.lines().filter(|l| l.starts_with("E ")).count())
                    .unwrap_or(0);
                if ended >= after {
                    break;
                }
                thread::sleep(Duration::from_millis(2));
            }
            thread::sleep(Duration::from_micros(delay));
            let mut child = children[victim].take().unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            killed_at = Some(now());
        }
        for (i, c) in children.iter_mut().enumerate() {
            if let Some(c) = c.take() {
                expect_success(c, &format!("writer {}", i + 1));
            }
        }
        done.store(true, Ordering::SeqCst);
        owner_reads = reader.join().unwrap();
    });
    let mut reads = Vec::new();
    for r in &roles {
        parse_log(&r.log, &mut history, &mut reads);
    }
    reads.extend(owner_reads);
    assert!(history.len() > 1, "no write was logged");
    let node = vol.open_ino(ino, RW).unwrap();
    let last = read_units(&node, unit, 0, units(unit));
    if let Some(at) = killed_at {
        // The killed writer's last write, if it was running, is whole or absent; it
        // finished (if at all) before the kill.
        let running: Vec<u64> = history
            .iter()
            .filter(|(_, w)| w.end == u64::MAX)
            .map(|(&t, _)| t)
            .collect();
        assert!(
            running.len() <= 1,
            "more than one write unfinished: {running:?}"
        );
        for t in running {
            let seen = last.tags.contains(&t) || reads.iter().any(|r| r.tags.contains(&t));
            if seen {
                history.get_mut(&t).unwrap().end = at;
            } else {
                history.remove(&t);
            }
        }
    }
    for r in &reads {
        let checked = if unit == BS {
            check_read(&r.tags, r.first, r.start, r.end, &history)
        } else {
            check_words(&r.tags, r.first, r.start, r.end, &history)
        };
        checked.unwrap_or_else(|e| panic!("read at {}..{}: {e}", r.start, r.end));
    }
    let checked = if unit == BS {
        check_final(&last.tags, &history, now())
    } else {
        check_words_final(&last.tags, &history, now())
    };
    checked.unwrap_or_else(|e| panic!("{e}"));
    drop(node);
    vol.close().unwrap();
    // Remount (recovering what the killed writer left) and compare; then fsck.
    let vol = Volume::open(&pool).unwrap();
    let node = vol.open_ino(ino, RW).unwrap();
    let again = read_units(&node, unit, 0, units(unit));
    assert_eq!(again.tags, last.tags, "the file changed across the remount");
    drop(node);
    vol.close().unwrap();
    fsck_pool_clean(&pool);
    fs::remove_dir_all(&dir).unwrap();
}

/// Runs the writer role when this process is a writer; true if it was.
fn as_child() -> bool {
    procs::as_child(CHILD_ENV, |role| run_child(&Role::decode(role)))
}

#[test]
fn writers_in_several_processes_are_linearizable() {
    if as_child() {
        return;
    }
    run_owner(
        "writers_in_several_processes_are_linearizable",
        BS,
        &[150, 150, 150],
        None,
    );
}

#[test]
fn a_writer_killed_mid_stream_leaves_the_others_and_the_file_consistent() {
    if as_child() {
        return;
    }
    // Three rounds, the kill landing at different points of the victim's loop.
    for delay in [0, 70, 150] {
        run_owner(
            "a_writer_killed_mid_stream_leaves_the_others_and_the_file_consistent",
            BS,
            &[100_000, 150, 150],
            Some((0, 40, delay)),
        );
    }
}

#[test]
fn unaligned_writers_in_several_processes_are_linearizable_per_word() {
    if as_child() {
        return;
    }
    run_owner(
        "unaligned_writers_in_several_processes_are_linearizable_per_word",
        8,
        &[150, 150, 150],
        None,
    );
    // And with a writer killed in the middle of its unaligned writes.
    run_owner(
        "unaligned_writers_in_several_processes_are_linearizable_per_word",
        8,
        &[100_000, 150, 150],
        Some((0, 40, 60)),
    );
}
