//! A file in mapped mode (a client maps it: [`pmfs::Client::map`]) is updated in place, so an
//! update is not atomic: a crash during one may leave each byte old or new, and the size old
//! or new. Once it returned it is durable. Checked at every fence of writes, size changes and
//! hole punches of the owner and of the client, with fsck clean after recovery. Clients work
//! on HashFS volumes only.

mod common;

use std::cell::Cell;
use std::sync::Arc;

use pmfs::{Client, FileMap, Ino, MappingKind, OpenNode, Volume};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::SimRegion;

use common::RW;
use common::crash::{SIM_SIZE, light_explorer, recover_and_check_with, sim_options};

/// The file's first content: three whole blocks and part of a fourth.
const FIRST: usize = 3 * 4096 + 1000;

/// An update through the owner's (`.0`) or the client's (`.1`) handle of the mapped file.
type Op = fn(&OpenNode, &OpenNode) -> pmfs::Result<()>;

const OPS: [(&str, Op); 7] = [
    ("overwrite across blocks", |o, _| {
        o.write_at(&[2; 6000], 3000).map(drop)
    }),
    ("extend inside the last block", |o, _| {
        o.write_at(&[3; 50], FIRST as u64 + 100).map(drop)
    }),
    ("extend past the mapped blocks", |o, _| {
        o.write_at(&[4; 5000], 5 * 4096).map(drop)
    }),
    ("shrink", |o, _| o.set_len(5000)),
    ("grow", |o, _| o.set_len(6 * 4096 + 10)),
    ("punch a hole", |o, _| o.punch_hole(2000, 4096 + 3000)),
    ("client overwrite", |_, c| {
        c.write_at(&[5; 3000], 7000).map(drop)
    }),
];

/// A volume on `media` with `/f` written and mapped by a client: the volume, the owner's
/// and the client's handles of `/f`, and the mapping (kept for the file to stay mapped).
fn mapped(media: Arc<dyn Media>) -> (Volume, Client, OpenNode, OpenNode, FileMap) {
    let vol = Volume::format(media.clone(), &sim_options(MappingKind::HashFs)).unwrap();
    let content: Vec<u8> = (0..FIRST).map(|i| (i % 251) as u8 + 1).collect();
    vol.write("/f", &content).unwrap();
    let ino: Ino = vol.lookup(vol.root(), b"f").unwrap().ino;
    let client = Volume::attach_media(media).unwrap();
    let map = client.map(ino, 0, 1 << 20).unwrap();
    let owner = vol.open_ino(ino, RW).unwrap();
    let by_client = client.open_ino(ino, RW).unwrap();
    (vol, client, owner, by_client, map)
}

fn content(vol: &Volume) -> Vec<u8> {
    vol.read("/f").unwrap()
}

/// Whether `got` is what a crash during the change from `old` to `new` may leave: the size of
/// either, and each byte as either has it (zero past an end).
fn torn_between(got: &[u8], old: &[u8], new: &[u8]) -> bool {
    let at = |v: &[u8], i: usize| v.get(i).copied().unwrap_or(0);
    (got.len() == old.len() || got.len() == new.len())
        && got
            .iter()
            .enumerate()
            .all(|(i, &b)| b == at(old, i) || b == at(new, i))
}

fn check(name: &str, op: Op, seed: u64) {
    let (before, after) = {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
        let (vol, _client, owner, by_client, _map) = mapped(media);
        let before = content(&vol);
        op(&owner, &by_client).unwrap();
        (before, content(&vol))
    };
    assert_ne!(before, after, "{name} must change the file");
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let (vol, client, owner, by_client, map) = mapped(region.clone());
    region.persist_all();
    let done = Cell::new(false);
    light_explorer(seed)
        .run(
            &region,
            |_| {
                op(&owner, &by_client).unwrap();
                done.set(true);
            },
            |cp| {
                let got = recover_and_check_with(cp.image, content)?;
                let ok = if done.get() {
                    got == after
                } else {
                    torn_between(&got, &before, &after)
                };
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "{name} (returned: {}): /f after recovery is {} bytes, {} \
                         before and {} after; first bytes that differ from after: {:?}",
                        done.get(),
                        got.len(),
                        before.len(),
                        after.len(),
                        got.iter().zip(&after).position(|(a, b)| a != b)
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    drop((map, by_client, owner, client, vol));
}

#[test]
fn updates_of_a_mapped_file_are_durable_on_return_under_crash() {
    for (i, (name, op)) in OPS.into_iter().enumerate() {
        check(name, op, i as u64);
    }
}
