//! The inode-number API on every mapping: a stale `Ino` never reaches the object that reuses
//! its number, an open handle keeps an unlinked file alive, listings resume after any
//! position, and holes are found, made and filled, also across the chunks a seek looks up.

mod common;

use pmfs::{AttrChange, Error, NodeKind, OpenMode, Owner, SeekTarget, SetTime, XattrSet};

use common::{KINDS, fresh, remount};

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

#[test]
fn stale_numbers_fail_instead_of_reaching_a_new_object() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        let root = vol.root();
        let owner = Owner { uid: 5, gid: 6 };
        let (a, node, created) = vol.create_open(root, b"a", 0o640, owner, true, RW).unwrap();
        assert!(created);
        assert_eq!(
            (a.uid, a.gid, a.perm, a.kind),
            (5, 6, 0o640, NodeKind::File)
        );
        node.write_at(b"hello", 0).unwrap();
        vol.unlink_at(root, b"a").unwrap();
        // Unlinked but open: still there through the handle.
        let mut buf = [0u8; 5];
        assert_eq!(node.read_at(&mut buf, 0).unwrap(), 5);
        assert_eq!(&buf, b"hello");
        assert_eq!(vol.getattr(a.ino).unwrap().nlink, 0);
        drop(node);
        assert!(matches!(vol.getattr(a.ino), Err(Error::NotFound)));
        // HashFS frees written files in batches (one scan of its table for many); asking for
        // the free space frees them now.
        vol.statfs().unwrap();
        // The number comes back with a new generation; the old Ino stays dead.
        let b = vol
            .mknod(root, b"b", NodeKind::Fifo, 0o600, owner, 0)
            .unwrap();
        assert_eq!(b.ino.number(), a.ino.number());
        assert_ne!(b.ino.generation(), a.ino.generation());
        assert!(matches!(vol.getattr(a.ino), Err(Error::NotFound)));
        assert!(matches!(
            vol.set_xattr(a.ino, b"user.x", b"1", XattrSet::Any),
            Err(Error::NotFound)
        ));
        assert!(matches!(vol.open_ino(a.ino, RW), Err(Error::NotFound)));
        assert!(matches!(
            vol.open_ino(b.ino, RW),
            Err(Error::Unsupported(_))
        ));
        // Numbers and generations survive a remount.
        vol.close().unwrap();
        let vol = remount(&media);
        assert_eq!(vol.lookup(vol.root(), b"b").unwrap().ino, b.ino);
    }
}

#[test]
fn listings_resume_after_any_position() {
    for kind in KINDS {
        let (vol, _media) = fresh(kind);
        let root = vol.root();
        let d = vol.mkdir(root, b"d", 0o755, Owner::default()).unwrap().ino;
        for i in 0..300 {
            vol.mknod(
                d,
                format!("n{i:03}").as_bytes(),
                NodeKind::File,
                0o644,
                Owner::default(),
                0,
            )
            .unwrap();
        }
        let all = vol.list_dir(d, None, usize::MAX).unwrap();
        assert_eq!(all.len(), 300);
        assert!(all.windows(2).all(|w| w[0].pos < w[1].pos));
        // Page through while removing what was listed: nothing is skipped or repeated.
        let mut after = None;
        let mut seen = Vec::new();
        loop {
            let page = vol.list_dir(d, after, 7).unwrap();
            if page.is_empty() {
                break;
            }
            for e in &page {
                seen.push(e.name.clone());
                vol.unlink_at(d, &e.name).unwrap();
            }
            after = page.last().map(|e| e.pos);
        }
        let mut names: Vec<Vec<u8>> = all.into_iter().map(|e| e.name).collect();
        names.sort();
        seen.sort();
        assert_eq!(seen, names);
        assert!(vol.list_dir(d, None, 10).unwrap().is_empty());
        assert_eq!(vol.parent_of(d).unwrap(), root);
        vol.rmdir_at(root, b"d").unwrap();
        assert!(matches!(vol.list_dir(d, None, 1), Err(Error::NotFound)));
    }
}

/// Seeks that pass over long data runs and long holes (a seek looks blocks up in chunks that
/// grow from 16 blocks to 4096) land where a block-by-block scan of the layout says.
#[test]
fn seeks_agree_with_the_layout_across_lookup_chunks() {
    const B: u64 = 4096;
    // Data runs as [start, end) in blocks; everything else below SIZE_BLOCKS is a hole.
    const DATA: [(u64, u64); 4] = [(0, 3), (17, 70), (5000, 5001), (9000, 9050)];
    const SIZE_BLOCKS: u64 = 9100;
    let is_data = |b: u64| DATA.iter().any(|&(s, e)| (s..e).contains(&b));
    let expect = |off: u64, data: bool| -> Option<u64> {
        let size = SIZE_BLOCKS * B;
        if off >= size {
            return None;
        }
        match (off / B..SIZE_BLOCKS).find(|&b| is_data(b) == data) {
            Some(b) => Some((b * B).max(off)),
            None => (!data).then_some(size),
        }
    };
    // Every block of the first runs, and for each edge between data and hole the offsets
    // from which a chunk boundary falls right on it (16, 48, 112, ... blocks before it).
    let edges = DATA.iter().flat_map(|&(s, e)| [s, e]).chain([SIZE_BLOCKS]);
    let mut offsets: Vec<u64> = (0..120).map(|b| b * B).collect();
    for e in edges {
        let mut before = 0;
        for k in 0..10 {
            before += (16u64 << k).min(4096);
            offsets.extend(e.checked_sub(before).map(|b| b * B));
        }
    }
    offsets.extend([
        B + 7,
        17 * B + 1,
        69 * B + 4095,
        5000 * B + 9,
        SIZE_BLOCKS * B - 1,
    ]);
    for kind in KINDS {
        let (vol, _media) = fresh(kind);
        let (_, f, _) = vol
            .create_open(vol.root(), b"s", 0o644, Owner::default(), true, RW)
            .unwrap();
        for (s, e) in DATA {
            f.write_at(&vec![1u8; ((e - s) * B) as usize], s * B)
                .unwrap();
        }
        f.set_len(SIZE_BLOCKS * B).unwrap();
        for &off in &offsets {
            for (target, data) in [(SeekTarget::Data, true), (SeekTarget::Hole, false)] {
                assert_eq!(
                    f.seek(off, target).unwrap(),
                    expect(off, data),
                    "{kind:?}: {target:?} from {off}"
                );
            }
        }
    }
}

/// `copy_range` copies bytes (holes as zeros) in several pieces, stops at the end the source
/// had when it started, works within one file between ranges that do not overlap, and needs
/// a readable source and a writable target.
#[test]
fn ranges_copy_between_and_within_files() {
    const B: u64 = 4096;
    let src_len = 3 * (1 << 20) + 5;
    let data: Vec<u8> = (0..src_len).map(|i| (i * 7 + i / 4096) as u8).collect();
    for kind in KINDS {
        let (vol, _media) = fresh(kind);
        let create = |name: &[u8]| {
            vol.create_open(vol.root(), name, 0o644, Owner::default(), true, RW)
                .unwrap()
                .1
        };
        let (src, dst) = (create(b"src"), create(b"dst"));
        src.write_at(&data, 0).unwrap();
        dst.write_at(&[9u8; 100], 0).unwrap();
        // Asking for more than there is copies to the source's end, over several pieces.
        assert_eq!(
            src.copy_range(0, &dst, 100, u64::MAX).unwrap(),
            src_len as u64
        );
        let mut back = vec![0u8; 100 + src_len];
        assert_eq!(dst.read_at(&mut back, 0).unwrap(), back.len());
        assert!(back[..100].iter().all(|&b| b == 9));
        assert!(back[100..] == data[..], "{kind:?}: copied bytes differ");
        assert_eq!(src.copy_range(src_len as u64, &dst, 0, 10).unwrap(), 0);

        // A hole in the source arrives as zeros over older bytes.
        let sparse = create(b"sparse");
        sparse.set_len(8 * B).unwrap();
        sparse.write_at(b"end", 8 * B).unwrap();
        assert_eq!(sparse.copy_range(B, &dst, 0, 7 * B + 3).unwrap(), 7 * B + 3);
        let mut head = vec![1u8; (7 * B + 3) as usize];
        dst.read_at(&mut head, 0).unwrap();
        assert!(head[..(7 * B) as usize].iter().all(|&b| b == 0));
        assert_eq!(&head[(7 * B) as usize..], b"end");

        // Within one file, between ranges that do not overlap.
        src.copy_range(0, &src, 2 << 20, 4 * B + 1).unwrap();
        let mut moved = vec![0u8; (4 * B + 1) as usize];
        src.read_at(&mut moved, 2 << 20).unwrap();
        assert!(moved[..] == data[..moved.len()]);
        // Past its own end: the size at the start bounds the copy, which does not go on to
        // copy what it wrote.
        let end = src_len as u64 + 10;
        assert_eq!(
            src.copy_range(B, &src, end, u64::MAX).unwrap(),
            src_len as u64 - B
        );
        assert_eq!(src.size().unwrap(), end + src_len as u64 - B);
        let mut tail = vec![0u8; src_len - B as usize];
        src.read_at(&mut tail, end).unwrap();
        assert!(
            tail[..] == data[B as usize..],
            "{kind:?}: copy past the end differs"
        );
        // Overlapping ranges of one file.
        for (from, to) in [(0, B), (B, 0), (B, B)] {
            assert!(matches!(
                src.copy_range(from, &src, to, 2 * B),
                Err(Error::InvalidArgument(_))
            ));
        }

        // Handles without the access a copy needs.
        let ro = OpenMode { write: false, ..RW };
        let wo = OpenMode { read: false, ..RW };
        let src_ino = src.ino();
        let read_only = vol.open_ino(src_ino, ro).unwrap();
        let write_only = vol.open_ino(src_ino, wo).unwrap();
        assert!(matches!(
            dst.copy_range(0, &read_only, 0, 1),
            Err(Error::BadHandle(_))
        ));
        assert!(matches!(
            write_only.copy_range(0, &dst, 0, 1),
            Err(Error::BadHandle(_))
        ));
    }
}

#[test]
fn holes_are_found_made_and_filled() {
    const B: u64 = 4096;
    for kind in KINDS {
        let (vol, _media) = fresh(kind);
        let root = vol.root();
        let (_, f, _) = vol
            .create_open(root, b"s", 0o644, Owner::default(), true, RW)
            .unwrap();
        f.write_at(&[1u8; 4096], 4 * B).unwrap();
        f.set_len(32 * B).unwrap();
        assert_eq!(f.seek(0, SeekTarget::Data).unwrap(), Some(4 * B));
        assert_eq!(f.seek(0, SeekTarget::Hole).unwrap(), Some(0));
        assert_eq!(f.seek(4 * B, SeekTarget::Hole).unwrap(), Some(5 * B));
        assert_eq!(f.seek(5 * B, SeekTarget::Data).unwrap(), None);
        assert_eq!(f.seek(32 * B, SeekTarget::Hole).unwrap(), None);
        f.allocate(0, 8 * B, false).unwrap();
        assert_eq!(f.seek(0, SeekTarget::Data).unwrap(), Some(0));
        assert_eq!(f.seek(0, SeekTarget::Hole).unwrap(), Some(8 * B));
        f.allocate(30 * B, 4 * B, false).unwrap();
        assert_eq!(f.size().unwrap(), 34 * B);
        // Preallocation past end of file keeps the size and shows as data past it only to
        // the allocation, never to reads or seeks.
        f.allocate(40 * B, B, true).unwrap();
        assert_eq!(f.size().unwrap(), 34 * B);
        assert_eq!(f.seek(33 * B, SeekTarget::Hole).unwrap(), Some(34 * B));
        f.punch_hole(4 * B + 10, 100).unwrap();
        f.punch_hole(B, 2 * B).unwrap();
        assert_eq!(f.seek(0, SeekTarget::Hole).unwrap(), Some(B));
        assert_eq!(f.seek(B, SeekTarget::Data).unwrap(), Some(3 * B));
        let mut buf = vec![7u8; 4096];
        f.read_at(&mut buf, 4 * B).unwrap();
        assert!(buf[..10].iter().all(|&b| b == 1));
        assert!(buf[10..110].iter().all(|&b| b == 0));
        assert!(buf[110..].iter().all(|&b| b == 1));
        assert_eq!(f.size().unwrap(), 34 * B);
        // Times: UTIME_OMIT leaves one alone, an explicit time is kept exactly.
        let ino = f.ino();
        let before = vol.getattr(ino).unwrap();
        let a = vol
            .set_attr(
                ino,
                AttrChange {
                    mtime: Some(SetTime::At(1_000_000_000_123)),
                    ..AttrChange::default()
                },
                None,
            )
            .unwrap();
        assert_eq!(a.mtime, 1_000_000_000_123);
        assert_eq!(a.atime, before.atime);
        assert!(a.ctime >= before.ctime);
    }
}
