//! A file's digest cursor left naming a holder that no longer uses the pool is taken over by
//! the next digest: also when the holder's pid now belongs to a running program that never
//! opened the pool (the kernel reuses the pids of killed processes), which a "does the pid
//! run" test would take for the holder and wait for until the next mount.

mod data_common;

use pmfs::{MappingKind, Options, Volume};
use pmfs_core::layout::PmOff;
use pmfs_core::log::CURSOR_LSN_BITS;
use pmfs_core::pm::{Media, PmRegion};

use data_common::procs::{OWNERS, Stranger, fsck_pool_clean, scratch};
use data_common::{BS, RW, create};

/// Byte of the digest cursor word in a 128-byte inode record.
const DIGEST_WORD: u64 = 112;
/// Overwrites after the cursor is planted: several digest batches' worth.
const WRITES: u64 = 400;

fn stale_cursor_is_taken_over(kind: MappingKind) {
    // One test at a time: the other's stranger could hold this one's pool lock (see OWNERS).
    let _serial = OWNERS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("stale-digest", &format!("{kind:?}"));
    let pool = dir.join("pool");
    let opts = Options {
        inodes: Some(64),
        size: 64 << 20,
        ..Options::with_mapping(kind)
    };
    let vol = Volume::create(&pool, &opts).unwrap();
    let info = vol.info();
    let f = create(&vol, "f");
    f.write_at(&vec![1u8; 8 * BS as usize], 0).unwrap();
    let word = PmOff(
        info.inode_table_offset + u64::from(f.ino().number()) * info.inode_size + DIGEST_WORD,
    );
    let media = PmRegion::open(&pool).unwrap();
    let before = media.load_u64(word).unwrap();
    assert_eq!(before >> CURSOR_LSN_BITS, 0, "nobody digests at rest");
    let stranger = Stranger::start();
    media
        .store_u64(word, before | u64::from(stranger.pid()) << CURSOR_LSN_BITS)
        .unwrap();
    for i in 0..WRITES {
        f.write_at(&[i as u8; 100], (i % 8) * BS + 7).unwrap();
    }
    let after = media.load_u64(word).unwrap();
    assert_eq!(
        after >> CURSOR_LSN_BITS,
        0,
        "the cursor still names the stranger (pid {}): never taken over",
        stranger.pid()
    );
    let lsn_mask = (1u64 << CURSOR_LSN_BITS) - 1;
    assert!(
        after & lsn_mask > before & lsn_mask,
        "the digest did not move on: cursor LSN {} then {}",
        before & lsn_mask,
        after & lsn_mask
    );
    let mut expect = vec![1u8; 8 * BS as usize];
    for i in WRITES - 8..WRITES {
        let at = ((i % 8) * BS + 7) as usize;
        expect[at..at + 100].fill(i as u8);
    }
    let mut got = vec![0u8; expect.len()];
    assert_eq!(f.read_at(&mut got, 0).unwrap(), got.len());
    assert!(got == expect, "the file lost writes");
    let ino = f.ino();
    drop(f);
    vol.close().unwrap();
    let vol = Volume::open(&pool).unwrap();
    let f = vol.open_ino(ino, RW).unwrap();
    assert_eq!(f.read_at(&mut got, 0).unwrap(), got.len());
    assert!(got == expect, "the file changed across the remount");
    drop(f);
    vol.close().unwrap();
    drop(media);
    fsck_pool_clean(&pool);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_digest_cursor_naming_a_stranger_is_taken_over_on_hashfs() {
    stale_cursor_is_taken_over(MappingKind::HashFs);
}

#[test]
fn a_digest_cursor_naming_a_stranger_is_taken_over_on_the_extent_tree() {
    stale_cursor_is_taken_over(MappingKind::Extent);
}
