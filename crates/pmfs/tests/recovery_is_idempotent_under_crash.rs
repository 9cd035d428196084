//! Recovery survives its own crashes: for crash images taken in the middle of metadata
//! operations (enumerated when a crash point has at most 8, else sampled), a crash at any fence of the recovery itself, followed by another recovery,
//! ends in exactly the namespace a single uninterrupted recovery produces, with fsck clean.

mod common;

use std::sync::Arc;

use pmfs::Volume;
use pmfs_core::pm::Media;
use pmfs_core::sim::{Explorer, SimRegion};

use common::KINDS;
use common::crash::{SIM_SIZE, recover_and_check, recover_and_check_with, sim_options};

/// Runs `op` after `setup` on the simulator; for the crash images at every fence of `op`,
/// explores crashes during their recovery. Returns how many of those images had a directory
/// page to publish.
fn check<T>(
    kind: pmfs::MappingKind,
    seed: u64,
    setup: impl Fn(&Volume) -> T,
    op: impl Fn(&Volume, &mut T) -> pmfs::Result<()>,
) -> u64 {
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(region.clone(), &sim_options(kind)).unwrap();
    let mut state = setup(&vol);
    region.persist_all();
    let mut nested = 0u64;
    let mut publishing = 0u64;
    Explorer::new(seed)
        .samples(4)
        .exhaustive_limit(8)
        .run(
            &region,
            |_| op(&vol, &mut state).unwrap(),
            |cp| {
                let expected = recover_and_check(cp.image)?;
                if recover_and_check_with(cp.image, |v| v.mount_report().dir_pages_published)? > 0 {
                    publishing += 1;
                }
                let inner = Arc::new(SimRegion::from_image(cp.image).map_err(|e| e.to_string())?);
                let media: Arc<dyn Media> = inner.clone();
                let stats = Explorer::new(seed ^ cp.fence)
                    .samples(4)
                    .exhaustive_limit(8)
                    .run(
                        &inner,
                        |_| {
                            let v = Volume::mount(media.clone()).expect("recovery");
                            v.close().expect("close after recovery");
                        },
                        |inner_cp| {
                            let got = recover_and_check(inner_cp.image)?;
                            if got == expected {
                                Ok(())
                            } else {
                                Err(format!(
                                    "second recovery differs from a single one:\n{got:#?}\n\
                                     expected {expected:#?}"
                                ))
                            }
                        },
                    )
                    .map_err(|f| f.to_string())?;
                nested += stats.images;
                Ok(())
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(nested > 0);
    publishing
}

fn tree(vol: &Volume) {
    vol.create_dir("/d").unwrap();
    vol.write("/d/a", b"aaaa").unwrap();
    vol.write("/d/b", &[7u8; 9000]).unwrap();
}

#[test]
fn recovery_of_a_create_or_unlink_survives_crashes() {
    for kind in KINDS {
        check(kind, 31, tree, |v, _| v.write("/d/new", b""));
        check(
            kind,
            32,
            |v| {
                tree(v);
                v.open_file("/d/b").unwrap()
            },
            |v, _| v.remove_file("/d/b"),
        );
    }
}

#[test]
fn recovery_that_frees_several_orphans_survives_crashes() {
    // Two files unlinked while open: the recovery frees both orphans (on the cuckoo table
    // from one pass over it for both).
    for kind in KINDS {
        check(
            kind,
            35,
            |v| {
                tree(v);
                (v.open_file("/d/a").unwrap(), v.open_file("/d/b").unwrap())
            },
            |v, _| {
                v.remove_file("/d/a")?;
                v.remove_file("/d/b")
            },
        );
    }
}

#[test]
fn recovery_of_a_journaled_rename_or_truncate_survives_crashes() {
    for kind in KINDS {
        check(kind, 33, tree, |v, _| v.rename("/d/a", "/d/b"));
        check(kind, 34, tree, |v, _| {
            pmfs::OpenOptions::new()
                .write(true)
                .open(v, "/d/b")?
                .set_len(10)
        });
    }
}

/// A name long enough that a few fill a directory page.
fn long_name(i: usize) -> String {
    format!("/g/{i:03}-{}", "n".repeat(200))
}

/// How many long names fit the first page of a directory: the create after them appends a
/// page.
fn names_per_page(kind: pmfs::MappingKind) -> usize {
    let media: Arc<dyn Media> = Arc::new(pmfs_core::pm::HeapRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(media, &sim_options(kind)).unwrap();
    vol.create_dir("/g").unwrap();
    let page = vol.metadata("/g").unwrap().len();
    (0..)
        .find(|&i| {
            vol.write(&long_name(i), b"").unwrap();
            vol.metadata("/g").unwrap().len() > page
        })
        .unwrap()
}

#[test]
fn recovery_of_a_create_that_appends_a_directory_page_survives_crashes() {
    // A crash after the new page is mapped and before the size that publishes it is durable
    // leaves recovery to initialise and publish the page.
    for kind in KINDS {
        let n = names_per_page(kind);
        let publishing = check(
            kind,
            36,
            |v| {
                v.create_dir("/g").unwrap();
                for i in 0..n {
                    v.write(&long_name(i), b"").unwrap();
                }
            },
            |v, _| v.write(&long_name(n), b""),
        );
        assert!(
            publishing > 0,
            "{kind:?}: no crash image had a page to publish"
        );
    }
}
