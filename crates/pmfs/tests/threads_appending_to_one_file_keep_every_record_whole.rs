//! Threads of one process append records of odd sizes to one file at once, each through its
//! own handle, on every mapping kind, so that most appends write into the partial last block
//! in place under the file's tail while other appends wait for it. Meanwhile one thread
//! rewrites records that have landed with their own bytes (copy-on-write updates of blocks
//! the appends share, the partial last block among them), and one reads the whole file over
//! and over. Every read must show records laid end to end, each whole; at the end the file
//! must hold every append once, at the offset it returned, and so must a remount, and fsck
//! must be clean.
//!
//! On the trees and the cuckoo hash the writers of a file share its lock (only digests take
//! it alone), so this is where their appends and rewrites race; on HashFS they always did.

mod data_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use data_common::rng::Rng;
use data_common::{Config, KINDS, RW, create, fsck_clean, sim_options};
use pmfs::{OpenNode, Volume};
use pmfs_core::pm::{HeapRegion, Media};

const APPENDERS: u8 = 3;
const APPENDS: u32 = 200;
const REWRITES: u32 = 300;
/// Magic, writer, sequence number, payload length.
const HEADER: usize = 4 + 1 + 4 + 2;
const MAGIC: u32 = 0x7265_6331;
const MAX_PAYLOAD: u64 = 6000;

/// One record: where it landed and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Landed {
    off: u64,
    writer: u8,
    seq: u32,
    len: usize,
}

fn record(writer: u8, seq: u32, payload: usize) -> Vec<u8> {
    let mut r = Vec::with_capacity(HEADER + payload);
    r.extend_from_slice(&MAGIC.to_le_bytes());
    r.push(writer);
    r.extend_from_slice(&seq.to_le_bytes());
    r.extend_from_slice(&(payload as u16).to_le_bytes());
    r.extend((0..payload).map(|i| {
        (i as u32 ^ seq)
            .wrapping_mul(7)
            .wrapping_add(u32::from(writer)) as u8
    }));
    r
}

/// The records `data` holds end to end, or what is wrong with it.
fn parse(data: &[u8]) -> Result<Vec<Landed>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let h = data
            .get(at..at + HEADER)
            .ok_or_else(|| format!("a cut header at {at} of {}", data.len()))?;
        if u32::from_le_bytes(h[0..4].try_into().unwrap()) != MAGIC {
            return Err(format!("no record at {at}"));
        }
        let writer = h[4];
        let seq = u32::from_le_bytes(h[5..9].try_into().unwrap());
        let payload = usize::from(u16::from_le_bytes(h[9..11].try_into().unwrap()));
        let len = HEADER + payload;
        let expect = record(writer, seq, payload);
        match data.get(at..at + len) {
            Some(r) if r == expect.as_slice() => {}
            Some(_) => return Err(format!("record {writer}/{seq} at {at} is torn")),
            None => return Err(format!("record {writer}/{seq} at {at} is cut")),
        }
        out.push(Landed {
            off: at as u64,
            writer,
            seq,
            len,
        });
        at += len;
    }
    Ok(out)
}

/// The whole file, read at once: a read that fills its buffer may have been cut by it (the
/// file grew since its size was taken), so it runs again with a larger one.
fn whole_file(node: &OpenNode) -> Vec<u8> {
    loop {
        let mut buf = vec![0u8; node.size().unwrap() as usize + (64 << 10)];
        let n = node.read_at(&mut buf, 0).unwrap();
        if n < buf.len() {
            buf.truncate(n);
            return buf;
        }
    }
}

fn run(cfg: Config, seed: u64) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(16 << 20).unwrap());
    let vol = Volume::format(media.clone(), &sim_options(cfg)).unwrap();
    let ino = create(&vol, "log").ino();
    let landed: Mutex<Vec<Landed>> = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let start = Barrier::new(usize::from(APPENDERS) + 2);
    let open = || vol.open_ino(ino, RW).unwrap();
    let (landed_ref, done_ref, start_ref) = (&landed, &done, &start);
    thread::scope(|s| {
        let mut appenders = Vec::new();
        for w in 0..APPENDERS {
            let (node, landed, start) = (open(), landed_ref, start_ref);
            appenders.push(s.spawn(move || {
                let mut rng = Rng::new(seed ^ u64::from(w));
                start.wait();
                for seq in 0..APPENDS {
                    let r = record(w, seq, rng.range(0, MAX_PAYLOAD) as usize);
                    let off = node.append(&r).unwrap();
                    landed.lock().unwrap().push(Landed {
                        off,
                        writer: w,
                        seq,
                        len: r.len(),
                    });
                }
            }));
        }
        let (node, landed, start, done) = (open(), landed_ref, start_ref, done_ref);
        s.spawn(move || {
            let mut rng = Rng::new(seed ^ 0xbeef);
            start.wait();
            let mut rewrites = 0;
            while rewrites < REWRITES && !done.load(Ordering::SeqCst) {
                let pick = {
                    let l = landed.lock().unwrap();
                    (!l.is_empty()).then(|| l[rng.range(0, l.len() as u64 - 1) as usize])
                };
                let Some(l) = pick else {
                    thread::yield_now();
                    continue;
                };
                let r = record(l.writer, l.seq, l.len - HEADER);
                // All of it, or an unaligned piece of it.
                let a = rng.range(0, l.len as u64 - 1) as usize;
                let b = rng.range(a as u64 + 1, l.len as u64) as usize;
                node.write_at(&r[a..b], l.off + a as u64).unwrap();
                rewrites += 1;
            }
        });
        let (node, start, done) = (open(), start_ref, done_ref);
        s.spawn(move || {
            start.wait();
            let mut reads = 0;
            while reads == 0 || !done.load(Ordering::SeqCst) {
                parse(&whole_file(&node)).unwrap_or_else(|e| panic!("{:?}: a read: {e}", cfg.kind));
                reads += 1;
            }
        });
        for a in appenders {
            a.join().unwrap();
        }
        done_ref.store(true, Ordering::SeqCst);
    });
    let mut want = landed.into_inner().unwrap();
    want.sort_by_key(|l| l.off);
    assert_eq!(want.len(), usize::from(APPENDERS) * APPENDS as usize);
    let check = |node: &OpenNode, when: &str| {
        let got =
            parse(&whole_file(node)).unwrap_or_else(|e| panic!("{:?}: {when}: {e}", cfg.kind));
        assert_eq!(
            got, want,
            "{:?}: {when}: not the records the appends returned",
            cfg.kind
        );
    };
    check(&open(), "after the threads");
    vol.close().unwrap();
    let vol = Volume::mount(media.clone()).unwrap();
    check(&vol.open_ino(ino, RW).unwrap(), "after a remount");
    vol.close().unwrap();
    fsck_clean(media).unwrap_or_else(|e| panic!("{:?}: {e}", cfg.kind));
}

#[test]
fn threads_appending_and_rewriting_one_file_keep_every_record_whole() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        let cfg = Config {
            kind,
            alloc: pmfs::AllocatorKind::Cffs,
        };
        run(cfg, 0x5eed + i as u64);
    }
}

#[test]
fn the_parser_rejects_torn_and_cut_records() {
    let mut data = record(1, 2, 100);
    data.extend(record(2, 0, 5));
    assert_eq!(parse(&data).unwrap().len(), 2);
    let mut torn = data.clone();
    torn[HEADER + 50] ^= 1;
    assert!(parse(&torn).is_err());
    assert!(parse(&data[..data.len() - 1]).is_err());
    assert!(parse(&data[..HEADER - 1]).is_err());
    let mut shifted = vec![0u8];
    shifted.extend(&data);
    assert!(parse(&shifted).is_err());
}
