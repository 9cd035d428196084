//! Several processes append records of odd sizes to one file of a HashFS pool at once (each
//! attached with `Volume::attach` while the owner keeps the pool mounted), so that nearly
//! every append writes into the partial last block in place, under the file's tail. One writer is
//! SIGKILLed in the middle of its stream, maybe while it holds the tail: the others must
//! take the tail over and finish. The file must then be the records laid end to end, each
//! whole, each append that returned present once at the offset it reported, the killed
//! writer's last append whole or absent; a remount must show the same bytes and fsck must be
//! clean.
//!
//! The writers are this test binary run again with a role in `PMFS_DATA_APPEND_CHILD`; each
//! but the one to be killed logs `seq offset` for every append that returned.

mod data_common;

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use pmfs::{Ino, Volume};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{Media, PmRegion};

use data_common::procs::{
    self, OWNERS, Stranger, fsck_pool_clean, hashfs_pool, scratch, spawn_role,
};
use data_common::rng::Rng;
use data_common::{RW, create};

const CHILD_ENV: &str = "PMFS_DATA_APPEND_CHILD";
/// Bytes before the first record (the file starts with an unaligned end).
const PROLOGUE: usize = 77;
/// A record: magic, writer, sequence number, payload length, then the payload.
const MAGIC: u32 = 0x5245_4344;
const HEADER: usize = 4 + 2 + 4 + 2;
/// How long the survivors may take once the victim is dead.
const DEADLINE: Duration = Duration::from_secs(60);

/// Who the file's tail word names before the writers start (see [`run`]).
#[derive(Clone, Copy)]
enum Stale {
    /// A process that has exited.
    Exited,
    /// A running process that never opened the pool, as when the kernel has given a dead
    /// holder's pid to another program.
    Reused,
}

fn record(writer: u16, seq: u32, len: u16) -> Vec<u8> {
    let mut r = Vec::with_capacity(HEADER + len as usize);
    r.extend_from_slice(&MAGIC.to_le_bytes());
    r.extend_from_slice(&writer.to_le_bytes());
    r.extend_from_slice(&seq.to_le_bytes());
    r.extend_from_slice(&len.to_le_bytes());
    r.extend((0..len).map(|i| fill(writer, seq, i)));
    r
}

fn fill(writer: u16, seq: u32, i: u16) -> u8 {
    (u32::from(writer) * 31 + seq * 7 + u32::from(i)) as u8
}

/// The writer role: `pool;ino;id;count;log`. It appends `count` records, logging `seq
/// offset` per append that returned, unless `log` is empty (the writer to be killed: it
/// spends its time appending, most of it holding the tail).
fn run_child(role: &str) {
    let p: Vec<&str> = role.split(';').collect();
    assert_eq!(p.len(), 5, "bad {CHILD_ENV}={role:?}");
    let client = Volume::attach(p[0]).unwrap();
    let node = client
        .open_ino(Ino::from_raw(p[1].parse().unwrap()), RW)
        .unwrap();
    let id: u16 = p[2].parse().unwrap();
    let mut log = (!p[4].is_empty()).then(|| fs::File::create(p[4]).unwrap());
    let mut rng = Rng::new(u64::from(id) * 104_729);
    for seq in 1..=p[3].parse().unwrap() {
        let len = rng.range(0, 700) as u16;
        let at = node.append(&record(id, seq, len)).unwrap();
        if let Some(log) = &mut log {
            log.write_all(format!("{seq} {at}\n").as_bytes()).unwrap();
        }
    }
}

/// The `seq → offset` pairs a log holds (a killed writer's cut last line is ignored).
fn parse_log(text: &str) -> HashMap<u32, u64> {
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .map(|l| {
            let (s, o) = l.split_once(' ').unwrap();
            (s.parse().unwrap(), o.parse().unwrap())
        })
        .collect()
}

/// Splits the file into its records: `(writer, seq) → offset`. Panics on a torn or
/// interleaved record, and on a record seen twice.
fn parse_file(data: &[u8]) -> HashMap<(u16, u32), u64> {
    let mut at = PROLOGUE;
    let mut out = HashMap::new();
    while at < data.len() {
        let h = &data[at..];
        assert!(h.len() >= HEADER, "a torn record header at {at}");
        let magic = u32::from_le_bytes(h[0..4].try_into().unwrap());
        assert_eq!(magic, MAGIC, "no record starts at {at}");
        let writer = u16::from_le_bytes(h[4..6].try_into().unwrap());
        let seq = u32::from_le_bytes(h[6..10].try_into().unwrap());
        let len = u16::from_le_bytes(h[10..12].try_into().unwrap());
        let end = at + HEADER + len as usize;
        assert!(
            end <= data.len(),
            "record {writer}/{seq} at {at} runs past the end"
        );
        for (i, &b) in data[at + HEADER..end].iter().enumerate() {
            assert_eq!(
                b,
                fill(writer, seq, i as u16),
                "record {writer}/{seq} at {at}: byte {i} is wrong"
            );
        }
        assert!(
            out.insert((writer, seq), at as u64).is_none(),
            "record {writer}/{seq} appears twice"
        );
        at = end;
    }
    out
}

/// Waits for `child` until the deadline: an error if it failed or is still running then.
fn finish(child: &mut Child, until: Instant) -> Result<(), String> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return if status.success() {
                Ok(())
            } else {
                Err(format!("failed: {status}\n{err}"))
            };
        }
        if Instant::now() > until {
            return Err("stuck (a tail nobody took over?)".to_owned());
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Writer processes, `counts[i]` appends each; `kill` = (writer index, milliseconds after
/// the start): that writer logs nothing and is SIGKILLed then, and the last writer starts
/// only after that (it must take the tail over if the killed one held it). A writer stuck
/// past the deadline fails the test (all are killed first).
///
/// `stale`: before the writers start, the file's tail word names a process that does not
/// use the pool (as a writer killed while it held the tail leaves it); the writers take it
/// over.
fn run(test: &str, counts: &[u32], kill: Option<(usize, u64)>, stale: Option<Stale>) {
    let _serial = OWNERS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("append-mp", test);
    let pool = dir.join("pool");
    let vol = hashfs_pool(&pool, 64 << 20);
    let ino = {
        let f = create(&vol, "f");
        f.write_at(&[b'p'; PROLOGUE], 0).unwrap();
        f.ino()
    };
    // A process that runs but never opened the pool: a killed holder's pid given to another
    // program.
    let mut _stranger = None;
    if let Some(stale) = stale {
        let holder = match stale {
            Stale::Exited => {
                let mut exited = Command::new("true").spawn().unwrap();
                exited.wait().unwrap();
                exited.id()
            }
            Stale::Reused => {
                let running = Stranger::start();
                let pid = running.pid();
                _stranger = Some(running);
                pid
            }
        };
        // The superblock names the inode table's first block (byte 48); the tail word is
        // at byte 80 of the 128-byte inode record.
        let media = PmRegion::open(&pool).unwrap();
        let table = media.load_u64(PmOff(48)).unwrap();
        let word = PmOff(table * 4096 + u64::from(ino.number()) * 128 + 80);
        assert_eq!(media.load_u64(word).unwrap(), 0, "the tail is free at rest");
        media.store_u64(word, u64::from(holder)).unwrap();
    }
    let logs: Vec<PathBuf> = (0..counts.len())
        .map(|i| dir.join(format!("writer-{}", i + 1)))
        .collect();
    let spawn = |i: usize| {
        let log = match kill {
            Some((victim, _)) if victim == i => String::new(),
            _ => logs[i].display().to_string(),
        };
        let role = format!(
            "{};{};{};{};{log}",
            pool.display(),
            ino.raw(),
            i + 1,
            counts[i]
        );
        spawn_role(test, CHILD_ENV, &role)
    };
    let late = kill.map_or(counts.len(), |_| counts.len() - 1);
    let mut children: Vec<Option<Child>> = (0..late).map(|i| Some(spawn(i))).collect();
    let mut killed = None;
    if let Some((victim, after)) = kill {
        thread::sleep(Duration::from_millis(after));
        let mut child = children[victim].take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        killed = Some(victim);
        children.push(Some(spawn(late)));
    }
    let until = Instant::now() + DEADLINE;
    let stuck = children.iter_mut().enumerate().find_map(|(i, c)| {
        let c = c.as_mut()?;
        finish(c, until)
            .err()
            .map(|e| format!("writer {}: {e}", i + 1))
    });
    if let Some(why) = stuck {
        for c in children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        panic!("{why}");
    }
    let node = vol.open_ino(ino, RW).unwrap();
    let size = node.size().unwrap();
    let mut data = vec![0u8; size as usize];
    assert_eq!(node.read_at(&mut data, 0).unwrap(), data.len());
    assert_eq!(&data[..PROLOGUE], &[b'p'; PROLOGUE][..]);
    let mut found = parse_file(&data);
    for (i, log) in logs.iter().enumerate() {
        let writer = i as u16 + 1;
        if killed == Some(i) {
            // One append at a time: its records are appends 1..=k, for the k it finished
            // or had in flight.
            let mut seqs: Vec<u32> = found
                .keys()
                .filter(|&&(w, _)| w == writer)
                .map(|&(_, q)| q)
                .collect();
            seqs.sort_unstable();
            assert!(
                seqs.iter().copied().eq(1..=seqs.len() as u32),
                "the killed writer's appends are not a prefix: {seqs:?}"
            );
            assert!(!seqs.is_empty(), "the killed writer appended nothing");
            found.retain(|&(w, _), _| w != writer);
            continue;
        }
        let returned = parse_log(&fs::read_to_string(log).unwrap());
        assert_eq!(
            returned.len(),
            counts[i] as usize,
            "writer {writer} fell short"
        );
        for (seq, at) in returned {
            assert_eq!(
                found.remove(&(writer, seq)),
                Some(at),
                "writer {writer}'s append {seq}, which returned {at}"
            );
        }
    }
    assert!(found.is_empty(), "records nobody appended: {found:?}");
    drop(node);
    vol.close().unwrap();
    let vol = Volume::open(&pool).unwrap();
    let node = vol.open_ino(ino, RW).unwrap();
    let mut again = vec![0u8; size as usize + 1];
    assert_eq!(node.read_at(&mut again, 0).unwrap(), data.len());
    assert_eq!(
        &again[..data.len()],
        &data[..],
        "the file changed across the remount"
    );
    drop(node);
    vol.close().unwrap();
    fsck_pool_clean(&pool);
    fs::remove_dir_all(&dir).unwrap();
}

fn as_child() -> bool {
    procs::as_child(CHILD_ENV, run_child)
}

#[test]
fn appends_from_several_processes_land_whole_and_once() {
    if as_child() {
        return;
    }
    run(
        "appends_from_several_processes_land_whole_and_once",
        &[300, 300, 300],
        None,
        None,
    );
}

#[test]
fn a_tail_left_by_a_process_that_died_is_taken_over() {
    if as_child() {
        return;
    }
    run(
        "a_tail_left_by_a_process_that_died_is_taken_over",
        &[300, 300],
        None,
        Some(Stale::Exited),
    );
}

#[test]
fn a_tail_naming_a_process_that_does_not_map_the_pool_is_taken_over() {
    if as_child() {
        return;
    }
    run(
        "a_tail_naming_a_process_that_does_not_map_the_pool_is_taken_over",
        &[300, 300],
        None,
        Some(Stale::Reused),
    );
}

#[test]
fn a_writer_killed_while_appending_leaves_the_tail_to_the_others() {
    if as_child() {
        return;
    }
    for after in [40, 150] {
        run(
            "a_writer_killed_while_appending_leaves_the_tail_to_the_others",
            &[1_000_000, 300, 300],
            Some((0, after)),
            None,
        );
    }
}
