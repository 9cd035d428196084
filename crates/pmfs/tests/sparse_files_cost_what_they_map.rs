//! A sparse file costs what it maps, not what its size spans: `SEEK_DATA`, `SEEK_HOLE`,
//! `st_blocks` and truncations of a file of 64 GiB holding one or two blocks read a few
//! hundred words of the volume on every mapping structure (a few thousand where a truncation
//! walks a radix tree's nodes), where a walk of the size would read millions; a `SEEK_DATA`
//! over a 32 GiB hole to a block past it reads about a thousand words at most on the trees
//! and one pass over the table on the hashed structures. The work is counted in words loaded
//! from the media, not timed. Writes past the mapped blocks are found before and after their
//! digest, and the truncations free them. Removing a small file reads what it maps too (on
//! the cuckoo hash it was a pass over the table: 257 000 words).

mod common;

use std::sync::Arc;

use pmfs::{Ino, MappingKind, OpenMode, OpenNode, Owner, SeekTarget, Volume, fsck};

use common::counting::{self, Counting};
use common::{KINDS, options};

const BS: u64 = 4096;
/// The sparse size: 16 Mi blocks.
const HUGE: u64 = 64 << 30;
/// The test volume: large enough that a pass over a hashed structure's table loads more than
/// [`LIMIT`] words.
const VOLUME: u64 = 128 << 20;
/// Words an operation may load: a few hundred on every structure, a few thousand where a
/// truncation walks the nodes of a radix tree. A walk of the size in chunks loaded more than
/// 12 000 on the trees and a word or more per block (millions) on the hashed structures; a
/// truncation or a block count over the size, a table pass (32 000 and more).
const LIMIT: u64 = 8_000;
/// Words two passes over a hashed structure's table load, at most (a lookup and a removal;
/// their tables take less than a 64th of the volume); a walk of a 32 GiB hole loaded more
/// than 8 million.
const TABLE_PASS: u64 = VOLUME / 8 / 32;

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

/// [`Loads::costs`](common::counting::Loads::costs) with [`LIMIT`].
fn cheap<T>(media: &Counting, what: &str, op: impl FnOnce() -> T) -> T {
    media.tap().costs(LIMIT, what, op)
}

fn open(vol: &Volume, ino: Ino) -> OpenNode {
    vol.open_ino(ino, RW).unwrap()
}

#[test]
fn seeks_counts_and_truncations_of_a_sparse_file_read_what_it_maps() {
    for kind in KINDS {
        let media = Arc::new(counting::new(VOLUME));
        let vol = Volume::format(media.clone(), &options(kind)).unwrap();
        let who = Owner { uid: 0, gid: 0 };
        let (attr, f, _) = vol
            .create_open(vol.root(), b"sparse", 0o644, who, true, RW)
            .unwrap();
        let ino = attr.ino;
        let free = vol.statfs().unwrap().free_blocks;
        f.write_at(&[7u8; BS as usize], 0).unwrap();
        f.set_len(HUGE).unwrap();
        let what = |op: &str| format!("{kind:?}: {op}");
        let units = |blocks: u64| blocks * (BS / 512);

        cheap(&media, &what("SEEK_DATA past the data"), || {
            assert_eq!(f.seek(BS, SeekTarget::Data).unwrap(), None)
        });
        cheap(&media, &what("SEEK_HOLE"), || {
            assert_eq!(f.seek(0, SeekTarget::Hole).unwrap(), Some(BS))
        });
        cheap(&media, &what("st_blocks"), || {
            assert_eq!(vol.getattr(ino).unwrap().blocks, units(1))
        });

        // A write far past the mapped blocks: found through the log before its digest, and
        // through the mapping after it (the last close digests).
        let far = HUGE / 2 + 5;
        f.write_at(b"far", far).unwrap();
        cheap(&media, &what("SEEK_DATA to an undigested write"), || {
            assert_eq!(f.seek(BS, SeekTarget::Data).unwrap(), Some(far - 5))
        });
        drop(f);
        let f = open(&vol, ino);
        // The hashed structures have no order to skip a hole by: one pass over their table.
        let hashed = matches!(kind, MappingKind::Cuckoo | MappingKind::HashFs);
        let limit = if hashed { LIMIT + TABLE_PASS } else { LIMIT };
        media
            .tap()
            .costs(limit, &what("SEEK_DATA to a digested write"), || {
                assert_eq!(f.seek(BS, SeekTarget::Data).unwrap(), Some(far - 5))
            });
        assert_eq!(
            f.seek(far, SeekTarget::Hole).unwrap(),
            Some((far / BS + 1) * BS)
        );
        assert_eq!(vol.getattr(ino).unwrap().blocks, units(2));
        let mut buf = [0u8; 3];
        f.read_at(&mut buf, far).unwrap();
        assert_eq!(&buf, b"far");

        // A truncation below the far block unmaps it (a lookup of the hole before it); one
        // from the sparse size down to the data again looks at nothing.
        media
            .tap()
            .costs(limit, &what("truncation to below a far block"), || {
                f.set_len(BS).unwrap()
            });
        assert_eq!(f.seek(0, SeekTarget::Data).unwrap(), Some(0));
        assert_eq!(vol.getattr(ino).unwrap().blocks, units(1));
        f.set_len(HUGE).unwrap();
        assert_eq!(f.seek(BS, SeekTarget::Data).unwrap(), None);
        cheap(&media, &what("truncation of a sparse file"), || {
            f.set_len(BS).unwrap()
        });
        f.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7u8; 3]);
        f.set_len(0).unwrap();
        drop(f);
        assert_eq!(vol.getattr(ino).unwrap().blocks, 0);
        // Removing a file frees what it maps (past its end too), without a pass over a hashed
        // table.
        let (_, small, _) = vol
            .create_open(vol.root(), b"small", 0o644, who, true, RW)
            .unwrap();
        small.write_at(&[1; 3 * BS as usize], 0).unwrap();
        small.allocate(0, 8 * BS, true).unwrap();
        drop(small);
        cheap(&media, &what("unlink"), || {
            vol.remove_file("/small").unwrap()
        });
        vol.remove_file("/sparse").unwrap();
        assert_eq!(vol.statfs().unwrap().free_blocks, free, "{kind:?}");
        vol.close().unwrap();
        let report = fsck::check(media.clone()).unwrap();
        assert!(report.is_clean(), "{kind:?}: {:#?}", report.problems);
    }
}
