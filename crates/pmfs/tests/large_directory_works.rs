//! A directory of 10^5 entries works like a small one: every name is found, listing sees each
//! once, it survives a clean and a crash reopen (lazy load and repair load of ~1200 dentry
//! pages), fragments left by removals are reused instead of growing the directory, and
//! emptying it leaves fsck clean. (Its speed is measured by the `engine_meta` bench, not
//! asserted here.)

mod common;

use std::sync::Arc;

use pmfs::{MappingKind, Options, Volume};
use pmfs_core::pm::{HeapRegion, Media};

use common::{crash_copy, remount};

const N: usize = 100_000;

fn name(i: usize) -> String {
    format!("/big/entry-{i:06}")
}

#[test]
fn hundred_thousand_entries() {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(96 << 20).unwrap());
    let opts = Options {
        inodes: Some(N as u64 + 1000),
        ..Options::with_mapping(MappingKind::Extent)
    };
    let vol = Volume::format(media.clone(), &opts).unwrap();
    vol.create_dir("/big").unwrap();
    for i in 0..N {
        drop(vol.create_file(&name(i)).unwrap());
    }
    let size = vol.metadata("/big").unwrap().len();
    assert_eq!(vol.read_dir("/big").unwrap().count(), N);
    for i in (0..N).step_by(997) {
        assert!(vol.metadata(&name(i)).unwrap().is_file());
    }
    assert!(!vol.exists("/big/entry-100000").unwrap());

    // Remove every other entry, then create as many again: the fragments are reused.
    for i in (0..N).step_by(2) {
        vol.remove_file(&name(i)).unwrap();
    }
    for i in (0..N).step_by(2) {
        drop(vol.create_file(&format!("/big/again-{i:06}")).unwrap());
    }
    assert_eq!(vol.metadata("/big").unwrap().len(), size, "no page added");
    vol.close().unwrap();

    let vol = remount(&media);
    assert_eq!(vol.read_dir("/big").unwrap().count(), N);
    assert!(vol.exists(&name(N - 1)).unwrap());
    let crashed = crash_copy(&media);
    drop(vol);
    let vol = remount(&crashed);
    assert!(!vol.mount_report().clean);
    assert_eq!(vol.read_dir("/big").unwrap().count(), N);
    let mut names: Vec<String> = vol
        .read_dir("/big")
        .unwrap()
        .map(|e| e.unwrap().path().to_str().unwrap().to_owned())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), N);
    for p in &names {
        vol.remove_file(p).unwrap();
    }
    vol.remove_dir("/big").unwrap();
    vol.close().unwrap();
    let report = pmfs::fsck::check(crashed).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert_eq!(report.live_inodes, 1);
}
