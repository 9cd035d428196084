//! A file in mapped mode (`Client::map`) keeps its blocks where they are: the pool pieces the
//! mapper got stay the file's bytes through writes, unaligned and extending ones, hole punches,
//! zeroed ranges and shrinking `set_len`s of any process, and bytes stored into those pieces
//! are what reads return. Once the last pin is gone (or after a remount) writes copy on write
//! again. The pool file is read and written with `pread`/`pwrite`, which see the same page
//! cache pages that an `mmap` of it maps.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use pmfs::{Client, FileMap, Ino, MappingKind, OpenMode, OpenNode, Options, Volume};

const BS: u64 = 4096;

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

struct Pool {
    path: PathBuf,
}

impl Pool {
    fn new(tag: &str) -> Pool {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("pmfs-mapped-{tag}-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Pool { path }
    }

    /// The pool file, open for reading and writing.
    fn file(&self) -> File {
        File::options()
            .read(true)
            .write(true)
            .open(&self.path)
            .unwrap()
    }

    fn options() -> Options {
        Options {
            size: 32 << 20,
            inodes: Some(256),
            ..Options::with_mapping(MappingKind::HashFs)
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The bytes the pieces of `m` hold for file range `[off, off + len)`, read from the pool file.
fn through_pieces(pool: &File, m: &FileMap, off: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for p in m.pieces() {
        let (a, b) = (
            off.max(p.file_off),
            (off + len as u64).min(p.file_off + p.len),
        );
        if a < b {
            pool.read_exact_at(
                &mut out[(a - off) as usize..(b - off) as usize],
                p.pool_off + (a - p.file_off),
            )
            .unwrap();
        }
    }
    out
}

/// Stores `data` at file offset `off` through the pieces of `m`.
fn store_through_pieces(pool: &File, m: &FileMap, off: u64, data: &[u8]) {
    let mut done = 0;
    for p in m.pieces() {
        let (a, b) = (
            off.max(p.file_off),
            (off + data.len() as u64).min(p.file_off + p.len),
        );
        if a < b {
            pool.write_all_at(
                &data[(a - off) as usize..(b - off) as usize],
                p.pool_off + (a - p.file_off),
            )
            .unwrap();
            done += b - a;
        }
    }
    assert_eq!(done, data.len() as u64, "the store is inside the pieces");
}

fn read_all(f: &OpenNode) -> Vec<u8> {
    let mut buf = vec![0u8; f.size().unwrap() as usize];
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(n, buf.len());
    buf
}

fn setup(pool: &Pool) -> (Volume, Ino, Client) {
    let owner = Volume::create(&pool.path, &Pool::options()).unwrap();
    owner.write("/f", b"").unwrap();
    let ino = owner.lookup(owner.root(), b"f").unwrap().ino;
    let client = Volume::attach(&pool.path).unwrap();
    (owner, ino, client)
}

fn finish(owner: Volume, client: Client, pool: &Pool) {
    drop(client);
    owner.close().unwrap();
    let region = Arc::new(pmfs_core::pm::PmRegion::open(&pool.path).unwrap());
    let report = pmfs::fsck::check(region).unwrap();
    assert!(report.is_clean(), "fsck: {report:?}");
}

#[test]
fn writes_of_any_process_land_in_the_mapped_blocks() {
    let pool = Pool::new("writes");
    let (owner, ino, client) = setup(&pool);
    let writer = client.open_ino(ino, RW).unwrap();
    // A sparse file: data, a hole, a partial last block.
    writer.write_at(&[1u8; 5000], 0).unwrap();
    writer.write_at(&[2u8; 100], 4 * BS).unwrap();
    let size = 4 * BS + 100;

    let m = client.map(ino, 0, 1 << 20).unwrap();
    let covered: u64 = m.pieces().iter().map(|p| p.len).sum();
    assert_eq!(covered, 5 * BS, "the range up to the end of the last block");
    assert_eq!(m.pieces()[0].file_off, 0);
    let pf = pool.file();
    let mut want = read_all(&writer);
    assert_eq!(want.len() as u64, size);
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);
    assert!(want[5000..4 * BS as usize].iter().all(|&b| b == 0), "hole");

    // The owner's and the client's writes, unaligned and across blocks, land in place.
    let owner_f = owner.open_ino(ino, RW).unwrap();
    owner_f.write_at(&[3u8; 3000], 3000).unwrap();
    writer.write_at(&[4u8; 10], 4095).unwrap();
    want[3000..6000].fill(3);
    want[4095..4105].fill(4);
    assert_eq!(read_all(&owner_f), want);
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);

    // A write that extends the file inside its last mapped block zeroes nothing it keeps.
    writer.write_at(&[5u8; 50], size + 200).unwrap();
    want.resize((size + 250) as usize, 0);
    want[(size + 200) as usize..].fill(5);
    assert_eq!(read_all(&writer), want);
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);

    // Stores into the pieces are what reads return, in either process.
    store_through_pieces(&pf, &m, 100, b"stored through the mapping");
    want[100..126].copy_from_slice(b"stored through the mapping");
    assert_eq!(read_all(&owner_f), want);
    assert_eq!(read_all(&writer), want);

    drop((owner_f, writer, m));
    finish(owner, client, &pool);
}

#[test]
fn punching_zeroing_and_shrinking_a_mapped_file_keep_its_blocks() {
    let pool = Pool::new("shrink");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(&[7u8; 4 * BS as usize], 0).unwrap();
    let m = client.map(ino, 0, 4 * BS).unwrap();
    let pf = pool.file();

    f.punch_hole(1000, 2 * BS).unwrap();
    let mut want = vec![7u8; 4 * BS as usize];
    want[1000..1000 + 2 * BS as usize].fill(0);
    assert_eq!(read_all(&f), want);
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);

    // Zeroing a range is in place too.
    f.write_at(&[9u8; 300], 3 * BS - 100).unwrap();
    f.zero_range(3 * BS - 50, 100, true).unwrap();
    want[(3 * BS - 100) as usize..(3 * BS + 200) as usize].fill(9);
    want[(3 * BS - 50) as usize..(3 * BS + 50) as usize].fill(0);
    assert_eq!(read_all(&f), want);
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);

    // Shrinking zeroes the cut bytes in place; growing again reads zeros there.
    f.set_len(BS + 10).unwrap();
    assert_eq!(f.size().unwrap(), BS + 10);
    assert!(
        through_pieces(&pf, &m, BS + 10, (3 * BS - 10) as usize)
            .iter()
            .all(|&b| b == 0)
    );
    f.set_len(3 * BS).unwrap();
    want.truncate((BS + 10) as usize);
    want.resize(3 * BS as usize, 0);
    assert_eq!(read_all(&f), want);
    // The blocks are still the mapped ones: a write shows through the pieces.
    f.write_at(b"again", 2 * BS).unwrap();
    want[2 * BS as usize..2 * BS as usize + 5].copy_from_slice(b"again");
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);

    drop((f, m));
    finish(owner, client, &pool);
}

#[test]
fn a_mapping_shows_zeros_past_the_end_of_file() {
    let pool = Pool::new("eof");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    // A truncation keeps the new last block, and the bytes past the new end in it.
    f.write_at(&[0x41u8; 2 * BS as usize], 0).unwrap();
    f.set_len(BS + 100).unwrap();
    let m = client.map(ino, 0, 2 * BS).unwrap();
    let covered: u64 = m.pieces().iter().map(|p| p.len).sum();
    assert_eq!(covered, 2 * BS, "the range up to the end of the last block");
    let pf = pool.file();
    let mut want = vec![0x41u8; (BS + 100) as usize];
    want.resize(2 * BS as usize, 0);
    // As in the kernel's partial last page of a file: zeros, not the truncated bytes.
    assert_eq!(through_pieces(&pf, &m, 0, want.len()), want);
    assert_eq!(read_all(&f), want[..(BS + 100) as usize]);
    drop((f, m));
    finish(owner, client, &pool);
}

#[test]
fn mapping_a_sparse_range_allocates_zeroed_blocks() {
    let pool = Pool::new("sparse");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.set_len(8 * BS).unwrap();
    let m = client.map(ino, 2 * BS, 4 * BS).unwrap();
    let covered: u64 = m.pieces().iter().map(|p| p.len).sum();
    assert_eq!(covered, 4 * BS);
    assert_eq!(m.pieces()[0].file_off, 2 * BS);
    let pf = File::open(&pool.path).unwrap();
    assert!(
        through_pieces(&pf, &m, 2 * BS, 4 * BS as usize)
            .iter()
            .all(|&b| b == 0)
    );
    assert!(client.map(ino, 100, BS).is_err(), "unaligned offset");
    drop((f, m));
    finish(owner, client, &pool);
}

#[test]
fn writes_copy_on_write_again_once_the_last_pin_is_gone() {
    let pool = Pool::new("unpin");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(&[1u8; BS as usize], 0).unwrap();
    let pf = File::open(&pool.path).unwrap();

    let first = client.map(ino, 0, BS).unwrap();
    let second = client.map(ino, 0, BS).unwrap();
    assert_eq!(first.pieces(), second.pieces());
    drop(first);
    f.write_at(b"pinned", 0).unwrap();
    assert_eq!(&through_pieces(&pf, &second, 0, 6), b"pinned");
    drop(second);
    // Copy on write: the old block keeps its bytes, the file moves.
    let old = client.map(ino, 0, BS).unwrap();
    let old_piece = old.pieces()[0];
    drop(old);
    f.write_at(b"moved!", 0).unwrap();
    let mut b = [0u8; 6];
    pf.read_exact_at(&mut b, old_piece.pool_off).unwrap();
    assert_eq!(&b, b"pinned");
    let mut r = [0u8; 6];
    f.read_at(&mut r, 0).unwrap();
    assert_eq!(&r, b"moved!");
    drop(f);
    finish(owner, client, &pool);
}

#[test]
fn a_pin_left_by_a_dead_mapper_is_reset_at_mount() {
    let pool = Pool::new("leak");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(&[1u8; BS as usize], 0).unwrap();
    let m = client.map(ino, 0, BS).unwrap();
    let piece = m.pieces()[0];
    // As if the mapper were killed: its pin is never given back.
    std::mem::forget(m.into_pin());
    drop(f);
    drop(client);
    owner.close().unwrap();

    let owner = Volume::open(&pool.path).unwrap();
    let client = Volume::attach(&pool.path).unwrap();
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(b"after", 0).unwrap();
    let pf = File::open(&pool.path).unwrap();
    let mut b = [0u8; 5];
    pf.read_exact_at(&mut b, piece.pool_off).unwrap();
    assert_eq!(
        b, [1u8; 5],
        "the write copied on write, the old block is untouched"
    );
    drop(f);
    finish(owner, client, &pool);
}

#[test]
fn mapping_races_writers_without_losing_or_relocating_bytes() {
    let pool = Pool::new("race");
    let (owner, ino, client) = setup(&pool);
    let client = Arc::new(client);
    const BLOCKS: u64 = 16;
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(&vec![0u8; (BLOCKS * BS) as usize], 0).unwrap();
    drop(f);
    let pf = Arc::new(File::open(&pool.path).unwrap());
    // Each writer owns some blocks and writes a counter into them over and over, unaligned;
    // the mapper maps and unmaps, checking while pinned that a fresh write of its own shows
    // through the pieces (in place) and that reads and pieces agree.
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let client = client.clone();
            std::thread::spawn(move || {
                let f = client.open_ino(ino, RW).unwrap();
                for i in 0..400u64 {
                    let blk = w + 2 * (i % (BLOCKS / 2 - 1));
                    f.write_at(&i.to_le_bytes(), blk * BS + 1000).unwrap();
                }
            })
        })
        .collect();
    let f = client.open_ino(ino, RW).unwrap();
    for round in 0..60u64 {
        let m = client.map(ino, 0, BLOCKS * BS).unwrap();
        let mark = format!("round {round:04}");
        // The last block is the mapper's own.
        let at = (BLOCKS - 1) * BS + 7;
        f.write_at(mark.as_bytes(), at).unwrap();
        assert_eq!(through_pieces(&pf, &m, at, mark.len()), mark.as_bytes());
        drop(m);
    }
    for w in writers {
        w.join().unwrap();
    }
    let m = client.map(ino, 0, BLOCKS * BS).unwrap();
    assert_eq!(
        through_pieces(&pf, &m, 0, (BLOCKS * BS) as usize),
        read_all(&f)
    );
    for w in 0..2u64 {
        let blk = w + 2 * (399 % (BLOCKS / 2 - 1));
        let mut b = [0u8; 8];
        f.read_at(&mut b, blk * BS + 1000).unwrap();
        assert_eq!(u64::from_le_bytes(b), 399, "writer {w}'s last write");
    }
    drop((f, m));
    let client = Arc::into_inner(client).unwrap();
    finish(owner, client, &pool);
}

/// Stores into a mapping change no time by themselves: the pin of a writable mapping raises
/// the file's mtime and ctime at `stored` (an `msync`) and when it is dropped (the last
/// `munmap`), so programs that look for changes by mtime see them; a read-only pin changes
/// nothing.
#[test]
fn pins_of_writable_mappings_raise_the_mtime() {
    let pool = Pool::new("mtime");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(&[1u8; 2 * BS as usize], 0).unwrap();
    let pf = pool.file();
    let mtime = || owner.getattr(ino).unwrap().mtime;
    let times = || {
        let a = owner.getattr(ino).unwrap();
        (a.mtime, a.ctime)
    };

    let reader = client.map(ino, 0, 2 * BS).unwrap().into_pin();
    let before = times();
    drop(reader);
    assert_eq!(times(), before, "a read-only pin");

    let m = client.map(ino, 0, 2 * BS).unwrap();
    store_through_pieces(&pf, &m, 100, b"stored");
    let pin = m.into_pin().writable();
    let t0 = mtime();
    pin.stored().unwrap();
    let t1 = mtime();
    assert!(t1 > t0, "stored: {t0} -> {t1}");
    drop(pin);
    let (t2, c2) = times();
    assert!(t2 > t1, "dropped: {t1} -> {t2}");
    assert_eq!(c2, t2);

    drop(f);
    finish(owner, client, &pool);
}

/// A mapping may be refused the filling of many holes: `map_filling_at_most` fails with
/// `NoSpace` and allocates nothing when the range's holes need more blocks than allowed, and
/// maps as `map` does within the bound.
#[test]
fn filling_holes_for_a_mapping_can_be_bounded() {
    let pool = Pool::new("bounded");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(b"end", 64 * BS).unwrap();
    let blocks = || owner.getattr(ino).unwrap().blocks;
    let before = blocks();
    assert!(matches!(
        client.map_filling_at_most(ino, 0, 65 * BS, 63),
        Err(pmfs::Error::NoSpace)
    ));
    assert_eq!(blocks(), before, "nothing allocated");
    let m = client.map_filling_at_most(ino, 0, 65 * BS, 64).unwrap();
    assert_eq!(m.pieces().iter().map(|p| p.len).sum::<u64>(), 65 * BS);
    assert_eq!(blocks(), 65 * BS / 512);
    drop((f, m));
    finish(owner, client, &pool);
}

/// Filling a mapping's holes allocates, but changes no time: the bytes read the same.
#[test]
fn filling_the_holes_of_a_mapping_leaves_the_times() {
    let pool = Pool::new("fill-times");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(b"end", 8 * BS).unwrap();
    let times = || {
        let a = owner.getattr(ino).unwrap();
        (a.mtime, a.ctime)
    };
    let before = times();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let m = client.map(ino, 0, 9 * BS).unwrap();
    assert_eq!(
        owner.getattr(ino).unwrap().blocks,
        9 * BS / 512,
        "holes filled"
    );
    assert_eq!(times(), before);
    drop((f, m));
    finish(owner, client, &pool);
}

/// `map_leaving_holes` maps what the file holds and nothing more: no block for a hole, no
/// change of time. A write into a hole while the file is mapped gives the hole a block of its
/// own (the pieces stay the bytes they were), which a later mapping covers.
#[test]
fn a_mapping_that_leaves_holes_allocates_nothing() {
    let pool = Pool::new("leave-holes");
    let (owner, ino, client) = setup(&pool);
    let f = client.open_ino(ino, RW).unwrap();
    f.write_at(&[7u8; BS as usize], 0).unwrap();
    f.write_at(b"end", 8 * BS).unwrap();
    let attr = || {
        let a = owner.getattr(ino).unwrap();
        (a.blocks, a.mtime, a.ctime)
    };
    let before = attr();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let m = client.map_leaving_holes(ino, 0, 16 * BS).unwrap();
    assert_eq!(attr(), before, "nothing allocated, no time changed");
    let pieces: Vec<(u64, u64)> = m.pieces().iter().map(|p| (p.file_off, p.len)).collect();
    assert_eq!(pieces, [(0, BS), (8 * BS, BS)]);
    assert_eq!(m.end(), 9 * BS, "the range ends with the file's last block");
    let pf = File::open(&pool.path).unwrap();
    assert_eq!(through_pieces(&pf, &m, 8 * BS, 3), b"end");

    f.write_at(b"hole", 4 * BS).unwrap();
    assert_eq!(through_pieces(&pf, &m, 0, 1), [7], "a mapped block stays");
    let mut got = [0u8; 4];
    f.read_at(&mut got, 4 * BS).unwrap();
    assert_eq!(&got, b"hole");
    let again = client.map_leaving_holes(ino, 0, 16 * BS).unwrap();
    assert_eq!(through_pieces(&pf, &again, 4 * BS, 4), b"hole");
    assert_eq!(again.pieces().len(), 3);
    drop((f, m, again));
    finish(owner, client, &pool);
}
