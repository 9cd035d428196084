//! Sparse files through the pmfs embedding API, next to tmpfs through the system calls in the
//! same run. A file of 1 TiB holds one 4 KiB block at offset 0 (in `sparse_seek_data_far`
//! also one at 512 GiB); what costs it its size rather than its blocks shows here:
//!
//! - `sparse_seek_data`: `SEEK_DATA` from 4096, which finds no data;
//! - `sparse_seek_data_far`: `SEEK_DATA` from 4096 to the block at 512 GiB: the trees look up
//!   the hole in a few pieces, the hashed structures make one pass over their table;
//! - `sparse_truncate`: the file grown to 1 TiB and truncated back to 4096 bytes;
//! - `sparse_truncate_stat`: a truncation to just below 1 TiB (alternately 4 KiB lower), then
//!   the file's block count (`st_blocks`), which the truncation made pmfs count again.
//!
//! Subjects: `pmfs-extent`, `pmfs-radix`, `pmfs-cuckoo`, `pmfs-hashfs` (a 1 GiB volume on a
//! pool file in `PMFS_BENCH_DIR`, default `/dev/shm`) and `tmpfs`. Criterion settings come from
//! the environment (see `pmfs_benches::data`).

use std::fs;
use std::hint::black_box;
use std::os::fd::AsRawFd;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pmfs::{Ino, OpenMode, OpenNode, Owner, SeekTarget};
use pmfs_benches::data::{BLOCK, DataFile, Subject, Timing};

/// The sparse size.
const HUGE: u64 = 1 << 40;
/// Where `sparse_seek_data_far` puts its second block.
const FAR: u64 = HUGE / 2;

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

/// A sparse file of a [`Subject`].
enum Sparse {
    Pmfs { node: OpenNode, ino: Ino },
    Tmpfs(fs::File),
}

impl Sparse {
    /// Creates `name` in `s` with one block of data at 0, and more at each of `more`, sized
    /// [`HUGE`].
    fn new(s: &Subject, name: &str, more: &[u64]) -> Sparse {
        let block = vec![7u8; BLOCK as usize];
        let f = match s {
            Subject::Pmfs { vol, .. } => {
                let who = Owner { uid: 0, gid: 0 };
                let (attr, node, _) = vol
                    .create_open(vol.root(), name.as_bytes(), 0o644, who, true, RW)
                    .expect("create a pmfs sparse file");
                Sparse::Pmfs {
                    node,
                    ino: attr.ino,
                }
            }
            Subject::Tmpfs { .. } => match s.file(name) {
                DataFile::Tmpfs(f) => Sparse::Tmpfs(f),
                DataFile::Pmfs(_) => unreachable!("a pmfs file of a tmpfs subject"),
            },
        };
        for &off in [0].iter().chain(more) {
            f.write_at(&block, off);
        }
        f.set_len(HUGE);
        f
    }

    fn write_at(&self, buf: &[u8], off: u64) {
        match self {
            Sparse::Pmfs { node, .. } => {
                assert_eq!(node.write_at(buf, off).expect("pmfs write"), buf.len());
            }
            Sparse::Tmpfs(f) => std::os::unix::fs::FileExt::write_all_at(f, buf, off).unwrap(),
        }
    }

    fn set_len(&self, len: u64) {
        match self {
            Sparse::Pmfs { node, .. } => node.set_len(len).expect("pmfs set_len"),
            Sparse::Tmpfs(f) => f.set_len(len).expect("ftruncate"),
        }
    }

    /// `SEEK_DATA` from `off`: the offset of the next data, `None` if none follows.
    fn seek_data(&self, off: u64) -> Option<u64> {
        match self {
            Sparse::Pmfs { node, .. } => node.seek(off, SeekTarget::Data).expect("pmfs seek"),
            Sparse::Tmpfs(f) => {
                // SAFETY: lseek on a descriptor this file owns; it moves only the offset.
                let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
                (r >= 0).then_some(r as u64)
            }
        }
    }

    /// The file's block count, in 512-byte units (`st_blocks`).
    fn blocks(&self, s: &Subject) -> u64 {
        match (self, s) {
            (Sparse::Pmfs { ino, .. }, Subject::Pmfs { vol, .. }) => {
                vol.getattr(*ino).expect("pmfs getattr").blocks
            }
            (Sparse::Tmpfs(f), _) => std::os::unix::fs::MetadataExt::blocks(&f.metadata().unwrap()),
            _ => unreachable!("a file of another subject"),
        }
    }
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let t = Timing::from_env();
    let mut g = c.benchmark_group(name);
    g.warm_up_time(t.warm_up)
        .measurement_time(t.measurement)
        .sample_size(t.samples);
    g
}

fn sparse(c: &mut Criterion) {
    let subjects = Subject::all(1 << 30, "sparse");
    let files: Vec<(Sparse, Sparse)> = subjects
        .iter()
        .map(|s| (Sparse::new(s, "near", &[]), Sparse::new(s, "far", &[FAR])))
        .collect();

    let mut g = group(c, "sparse_seek_data");
    for (s, (near, _)) in subjects.iter().zip(&files) {
        assert_eq!(near.seek_data(BLOCK), None);
        g.bench_function(BenchmarkId::new(s.name(), "1TiB"), |b| {
            b.iter(|| black_box(near.seek_data(BLOCK)))
        });
    }
    g.finish();

    let mut g = group(c, "sparse_seek_data_far");
    for (s, (_, far)) in subjects.iter().zip(&files) {
        assert_eq!(far.seek_data(BLOCK), Some(FAR));
        g.bench_function(BenchmarkId::new(s.name(), "1TiB"), |b| {
            b.iter(|| black_box(far.seek_data(BLOCK)))
        });
    }
    g.finish();

    let mut g = group(c, "sparse_truncate");
    for (s, (near, _)) in subjects.iter().zip(&files) {
        g.bench_function(BenchmarkId::new(s.name(), "1TiB"), |b| {
            b.iter(|| {
                near.set_len(HUGE);
                near.set_len(BLOCK);
            })
        });
    }
    g.finish();

    let mut g = group(c, "sparse_truncate_stat");
    for (s, (near, _)) in subjects.iter().zip(&files) {
        let mut i = 0u64;
        g.bench_function(BenchmarkId::new(s.name(), "1TiB"), |b| {
            b.iter(|| {
                i += 1;
                near.set_len(HUGE - (i & 1) * BLOCK);
                black_box(near.blocks(s))
            })
        });
        assert_eq!(near.blocks(s), BLOCK / 512);
    }
    g.finish();
}

criterion_group!(data_sparse, sparse);
criterion_main!(data_sparse);
