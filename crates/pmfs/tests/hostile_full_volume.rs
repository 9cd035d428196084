//! A full volume: writes and creates fail with ENOSPC, nothing already stored is damaged,
//! the volume checks clean, and the space comes back after deletes — for data blocks and
//! for inodes, on every mapping kind; copy-on-write overwrites at the edge of full land whole
//! or not at all, and a write out of space first gets the blocks other files' pending
//! overwrites replaced.

mod common;

use std::sync::Arc;

use pmfs::{Error, OpenOptions, Options, Volume, fsck};
use pmfs_core::pm::{HeapRegion, Media};

use common::{KINDS, crash_copy, open_rw, snapshot};

/// A small volume: one 2 MiB data group, 64 inodes.
fn small(kind: pmfs::MappingKind) -> (Volume, Arc<dyn Media>) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(4 << 20).unwrap());
    let opts = Options {
        inodes: Some(64),
        journal_slots: 2,
        ..Options::with_mapping(kind)
    };
    (Volume::format(media.clone(), &opts).unwrap(), media)
}

fn assert_clean(media: &Arc<dyn Media>) {
    let report = fsck::check(crash_copy(media)).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

#[test]
fn filling_the_data_region_is_enospc_and_deletes_give_the_space_back() {
    for kind in KINDS {
        let (vol, media) = small(kind);
        vol.write("/keep", b"kept across the full volume").unwrap();
        let start = vol.statfs().unwrap().free_blocks;
        // Fill with 64 KiB appends to a few files until the volume says no.
        let chunk = vec![0xabu8; 64 << 10];
        let mut full = None;
        'fill: for i in 0..8 {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .open(&vol, &format!("/fill{i}"))
                .unwrap();
            for j in 0..64u64 {
                if let Err(e) = f.write_all_at(&chunk, j * chunk.len() as u64) {
                    full = Some(e);
                    break 'fill;
                }
            }
        }
        let err = full.expect("a 4 MiB volume fills up");
        assert!(matches!(err, Error::NoSpace), "{kind:?}: {err}");
        assert_eq!(std::io::Error::from(err).raw_os_error(), Some(libc::ENOSPC));
        // Further writes fail the same way, small ones included; metadata operations that
        // need no block still work.
        assert!(matches!(vol.write("/another", &chunk), Err(Error::NoSpace)));
        assert!(vol.statfs().unwrap().free_blocks < start / 16);
        vol.rename("/keep", "/kept").unwrap();
        assert_eq!(vol.read("/kept").unwrap(), b"kept across the full volume");

        // Nothing is damaged: a remount sees the same tree, fsck is clean.
        let before = snapshot(&vol);
        vol.close().unwrap();
        assert_clean(&media);
        let vol = Volume::mount(media.clone()).unwrap();
        assert_eq!(snapshot(&vol), before);

        // Deleting the fill gives the space back, and it can be used again.
        for e in vol.read_dir("/").unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.starts_with("fill") || name == "another" {
                vol.remove_file(&format!("/{name}")).unwrap();
            }
        }
        let after = vol.statfs().unwrap().free_blocks;
        assert!(
            after + 2 >= start,
            "{kind:?}: {start} free blocks before filling, {after} after deleting"
        );
        vol.write("/again", &vec![1u8; 1 << 20]).unwrap();
        assert_eq!(vol.read("/again").unwrap().len(), 1 << 20);
        vol.close().unwrap();
        assert_clean(&media);
    }
}

#[test]
fn running_out_of_inodes_is_enospc_and_deletes_give_them_back() {
    for kind in KINDS {
        let (vol, media) = small(kind);
        let mut made = 0;
        let err = loop {
            let r = if made % 2 == 0 {
                vol.write(&format!("/n{made}"), b"x")
            } else {
                vol.create_dir(&format!("/n{made}"))
            };
            match r {
                Ok(()) => made += 1,
                Err(e) => break e,
            }
            assert!(made <= 64, "{kind:?}: more objects than inodes");
        };
        assert!(matches!(err, Error::NoSpace), "{kind:?}: {err}");
        assert_eq!(vol.statfs().unwrap().free_inodes, 0);
        // Every create-like call fails cleanly; hard links need no inode and work.
        assert!(matches!(vol.create_dir("/x"), Err(Error::NoSpace)));
        assert!(matches!(vol.symlink("/n0", "/x"), Err(Error::NoSpace)));
        vol.hard_link("/n0", "/n0-link").unwrap();
        let before = snapshot(&vol);
        vol.close().unwrap();
        assert_clean(&media);

        let vol = Volume::mount(media.clone()).unwrap();
        assert_eq!(snapshot(&vol), before);
        vol.remove_dir("/n1").unwrap();
        vol.remove_file("/n2").unwrap();
        assert_eq!(vol.statfs().unwrap().free_inodes, 2);
        vol.create_dir("/y").unwrap();
        vol.write("/z", b"z").unwrap();
        assert!(matches!(vol.write("/w", b"w"), Err(Error::NoSpace)));
        vol.close().unwrap();
        assert_clean(&media);
    }
}

/// Overwrites copy on write, so each needs fresh blocks before it gives the old ones back,
/// and on the trees a fragmenting file needs new nodes from the same space. At random offsets
/// and lengths on a volume at the edge of full (in turns, a second file takes every block that
/// comes free, then gives half of its own back), every write either lands whole or fails
/// with ENOSPC having changed nothing, and the volume checks clean after it.
#[test]
fn overwrites_at_random_on_a_full_volume_land_whole_or_fail_cleanly() {
    for kind in KINDS {
        let (vol, media) = small(kind);
        vol.write("/pad", &vec![0u8; 256 << 10]).unwrap();
        let (f, g) = (open_rw(&vol, "/f"), open_rw(&vol, "/g"));
        let mut model = Vec::new();
        let chunk = vec![0x11u8; 64 << 10];
        loop {
            match f.write_at(&chunk, model.len() as u64) {
                Ok(n) => {
                    assert_eq!(n, chunk.len(), "{kind:?}: a short write");
                    model.extend_from_slice(&chunk);
                }
                Err(Error::NoSpace) => break,
                Err(e) => panic!("{kind:?}: filling: {e}"),
            }
        }
        vol.remove_file("/pad").unwrap();

        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |below: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % below
        };
        let (mut landed, mut refused, mut g_len) = (0, 0, 0u64);
        let mut buf = Vec::new();
        for i in 0..3000u64 {
            if i % 400 == 0 {
                g_len /= 2;
                g.set_len(g_len)
                    .unwrap_or_else(|e| panic!("{kind:?} i={i} g_len={g_len}: {e:?}"));
            }
            if i % 400 >= 200 {
                while g.write_at(&[0x22; 4096], g_len).is_ok() {
                    g_len += 4096;
                }
            }
            let len = 1 + next(3 * 4096) as usize;
            let off = next(model.len() as u64 - len as u64) as usize;
            let data = vec![(i % 251) as u8 + 1; len];
            match f.write_at(&data, off as u64) {
                Ok(n) => {
                    assert_eq!(n, len, "{kind:?}: a short write");
                    model[off..off + len].copy_from_slice(&data);
                    landed += 1;
                }
                Err(Error::NoSpace) => refused += 1,
                Err(e) => panic!("{kind:?}: overwrite {i}: {e}"),
            }
            if i % 250 == 249 {
                buf.resize(model.len(), 0);
                assert_eq!(f.read_at(&mut buf, 0).unwrap(), model.len());
                assert!(
                    buf == model,
                    "{kind:?}: contents differ after overwrite {i}"
                );
            }
        }
        assert!(
            landed > 500 && refused > 10,
            "{kind:?}: {landed} overwrites landed, {refused} refused"
        );
        assert_eq!(vol.metadata("/g").unwrap().len(), g_len);
        drop((f, g));
        vol.close().unwrap();
        assert_clean(&media);
        let vol = Volume::mount(media.clone()).unwrap();
        assert!(
            vol.read("/f").unwrap() == model,
            "{kind:?}: contents differ after remount"
        );
        assert_eq!(vol.read("/g").unwrap(), vec![0x22; g_len as usize]);
        vol.close().unwrap();
        assert_clean(&media);
    }
}

/// Overwrites give their old blocks back when they are digested, which happens in batches.
/// A write that runs out of space first has every log this process holds digested, so the
/// blocks another file's pending overwrites replaced serve it rather than an ENOSPC.
#[test]
fn a_write_out_of_space_gets_the_blocks_other_files_overwrites_gave_up() {
    for kind in KINDS {
        let (vol, media) = small(kind);
        let (f, g) = (open_rw(&vol, "/f"), open_rw(&vol, "/g"));
        f.write_all_at(&vec![1u8; 300 * 4096], 0).unwrap();
        f.sync_all().unwrap();
        // Fewer overwrites than a digest batch: their old blocks stay taken for now.
        const PENDING: u64 = 64;
        for i in 0..PENDING {
            f.write_all_at(&[2u8; 4096], (i * 4 + 1) * 4096).unwrap();
        }
        let free = vol.statfs().unwrap().free_blocks;
        let mut appended = 0;
        while g.write_at(&[3u8; 4096], appended * 4096).is_ok() {
            appended += 1;
        }
        assert!(
            appended >= free + PENDING / 2,
            "{kind:?}: {appended} blocks appended with {free} free and {PENDING} to come back"
        );
        drop((f, g));
        vol.close().unwrap();
        assert_clean(&media);
    }
}

/// A file grown until the volume has no block left must still shrink: the truncation's log
/// entry finds room, because appends that take no block (a few bytes into the partial last
/// block) stop short of the log's last slots when its next block could not be had.
#[test]
fn a_file_grown_until_nothing_is_left_can_still_be_truncated() {
    for kind in KINDS {
        let (vol, media) = small(kind);
        let f = open_rw(&vol, "/f");
        let mut model = Vec::new();
        // A few bytes (the end is then unaligned), blocks' worth, then a few bytes, until
        // the volume says no to each: the last ones go into the partial last block in place
        // and take nothing but log slots.
        f.write_at(b"odd", 0).unwrap();
        model.extend_from_slice(b"odd");
        for (chunk, byte) in [(4096, 1u8), (3, 2)] {
            loop {
                match f.write_at(&vec![byte; chunk], model.len() as u64) {
                    Ok(_) => model.extend(std::iter::repeat_n(byte, chunk)),
                    Err(Error::NoSpace) => break,
                    Err(e) => panic!("{kind:?}: growing: {e}"),
                }
            }
        }
        for round in 0..3 {
            let len = model.len() / 2 + 1;
            f.set_len(len as u64)
                .unwrap_or_else(|e| panic!("{kind:?}: truncation {round}: {e}"));
            model.truncate(len);
        }
        drop(f);
        assert!(vol.read("/f").unwrap() == model, "{kind:?}: contents");
        vol.close().unwrap();
        assert_clean(&media);
    }
}

/// A symbolic link's target takes a block under a journal cleanup, armed before the block is
/// sought: a create that then finds no space must retire that cleanup itself, or the volume
/// closes "cleanly" with a busy journal slot and no mount accepts it.
#[test]
fn a_symbolic_link_that_finds_no_space_leaves_the_volume_mountable() {
    for kind in KINDS {
        let (vol, media) = small(kind);
        // Big files first, then single blocks, so that blocks run out before inodes do.
        for size in [64 << 10, 4 << 10] {
            for i in 0.. {
                if vol
                    .write(&format!("/fill{size}-{i}"), &vec![7u8; size])
                    .is_err()
                {
                    break;
                }
            }
        }
        let mut links = 0;
        let err = loop {
            match vol.symlink("/some/target", &format!("/link{links}")) {
                Ok(()) => links += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::NoSpace), "{kind:?}: {err}");
        assert!(vol.statfs().unwrap().free_inodes > 0, "{kind:?}");
        for i in 0..4 {
            let r = vol.symlink("/some/target", &format!("/late{i}"));
            assert!(matches!(r, Err(Error::NoSpace)), "{kind:?}: {r:?}");
        }
        let before = snapshot(&vol);
        vol.close().unwrap();
        assert_clean(&media);
        let vol = Volume::mount(media.clone()).unwrap();
        assert!(
            vol.mount_report().clean,
            "{kind:?}: {:?}",
            vol.mount_report()
        );
        assert_eq!(snapshot(&vol), before);
        vol.close().unwrap();
    }
}
