//! A read-write mount records its process in the pool (`Volume::recorded_owner`): a data
//! client finds the owner it attaches next to with one read of the pool file, where
//! `/proc/locks` can take the kernel milliseconds to list. A clean close clears the record, and
//! a read-only mount writes none.

mod common;

use std::fs::File;
use std::sync::Arc;

use pmfs::Volume;
use pmfs_core::pm::PmRegion;
use pmfs_core::pm::procs::start_time;

#[test]
fn a_read_write_mount_records_its_process_until_it_closes() {
    let (path, owner) = common::client_pool("owner-record");
    let me = std::process::id();
    let started = start_time(me).expect("this process runs");
    let record = || Volume::recorded_owner(&File::open(&path).unwrap());
    assert_eq!(record(), Some((me, started)));
    owner.close().unwrap();
    assert_eq!(record(), None);

    let owner = Volume::open(&path).unwrap();
    assert_eq!(record(), Some((me, started)));
    owner.close().unwrap();

    let ro = Volume::mount_read_only(Arc::new(PmRegion::open(&path).unwrap())).unwrap();
    assert_eq!(record(), None);
    ro.close().unwrap();
    let _ = std::fs::remove_file(&path);
}
