//! Helpers shared by the scenario tests: volumes on heap regions for every mapping kind and a
//! comparable snapshot of a whole namespace.
#![allow(dead_code)]

pub mod counting;
pub mod crash;
pub mod crash_image;

use std::collections::BTreeMap;
use std::sync::Arc;

use pmfs::{File, MappingKind, OpenMode, OpenOptions, Options, Volume};
use pmfs_core::pm::{HeapRegion, Media};

/// The mapping kinds every scenario runs on.
pub const KINDS: [MappingKind; 4] = [
    MappingKind::Extent,
    MappingKind::Radix,
    MappingKind::Cuckoo,
    MappingKind::HashFs,
];

/// Reading and writing, no truncation.
pub const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

/// Size of the test volumes.
pub const SIZE: u64 = 32 << 20;

/// Options for a small test volume.
pub fn options(kind: MappingKind) -> Options {
    Options {
        inodes: Some(2048),
        journal_slots: 4,
        ..Options::with_mapping(kind)
    }
}

/// A freshly formatted volume on a heap region, and the region.
pub fn fresh(kind: MappingKind) -> (Volume, Arc<dyn Media>) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIZE).unwrap());
    let vol = Volume::format(media.clone(), &options(kind)).unwrap();
    (vol, media)
}

/// The file at `path` of `vol`, open for reading and writing, created if absent.
pub fn open_rw(vol: &Volume, path: &str) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(vol, path)
        .unwrap()
}

/// A small HashFS volume in a new pool file under the temporary directory (named after `tag`
/// and this process), for data-only clients to attach to; the caller removes the file.
pub fn client_pool(tag: &str) -> (std::path::PathBuf, Volume) {
    client_pool_of(tag, 16 << 20)
}

/// [`client_pool`] of `size` bytes.
pub fn client_pool_of(tag: &str, size: u64) -> (std::path::PathBuf, Volume) {
    let path = std::env::temp_dir().join(format!("pmfs-{tag}-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let opts = Options {
        size,
        inodes: Some(256),
        ..Options::with_mapping(MappingKind::HashFs)
    };
    let vol = Volume::create(&path, &opts).unwrap();
    (path, vol)
}

/// Mounts the volume on `media` again.
pub fn remount(media: &Arc<dyn Media>) -> Volume {
    Volume::mount(media.clone()).unwrap()
}

/// A copy of everything the program sees on `media` now, as a new region: what a crash
/// right now would leave if every store had reached the media.
pub fn crash_copy(media: &Arc<dyn Media>) -> Arc<dyn Media> {
    let mut img = vec![0u8; media.size() as usize];
    media.read(pmfs_core::layout::PmOff(0), &mut img).unwrap();
    Arc::new(HeapRegion::from_image(&img).unwrap())
}

/// One object of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Obj {
    /// A regular file: content and link count.
    File(Vec<u8>, u64),
    /// A directory.
    Dir,
    /// A symbolic link and its target.
    Symlink(String),
}

/// Path -> object for every object of the volume, plus the groups of paths that are hard
/// links of one inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub objects: BTreeMap<String, Obj>,
    pub links: Vec<Vec<String>>,
}

/// Walks the whole namespace.
pub fn snapshot(vol: &Volume) -> Snapshot {
    let mut objects = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut stack = vec!["/".to_owned()];
    while let Some(dir) = stack.pop() {
        for e in vol.read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let path = if dir == "/" {
                format!("/{name}")
            } else {
                format!("{dir}/{name}")
            };
            let md = vol.symlink_metadata(&path).unwrap();
            let obj = if md.is_dir() {
                stack.push(path.clone());
                Obj::Dir
            } else if md.is_symlink() {
                Obj::Symlink(vol.read_link(&path).unwrap().to_str().unwrap().to_owned())
            } else {
                by_ino.entry(md.ino()).or_default().push(path.clone());
                Obj::File(vol.read(&path).unwrap(), md.nlink())
            };
            objects.insert(path, obj);
        }
    }
    let mut links: Vec<Vec<String>> = by_ino
        .into_values()
        .filter(|v| v.len() > 1)
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    links.sort();
    Snapshot { objects, links }
}

/// Points the first entry of the one-node tree of inode `ino` (extent tree or radix tree) at a
/// block past the data region of the volume `info` describes (damage for fsck's tests).
pub fn point_tree_outside(
    media: &Arc<dyn Media>,
    info: &pmfs::VolumeInfo,
    kind: MappingKind,
    ino: u64,
) {
    use pmfs_core::layout::PmOff;
    const LOW: u64 = (1 << 48) - 1;
    let root = media
        .load_u64(PmOff(info.inode_table_offset + ino * info.inode_size + 72))
        .unwrap();
    let node = (root & LOW) * 4096;
    let outside = (info.data_offset + info.data_size) / 4096 + 5;
    let (at, keep) = match kind {
        // Leaf entry 0: its second word holds the block below bit 48.
        MappingKind::Extent => (node + 72, !LOW),
        // Entry 0: the block below bit 48, the present bit.
        MappingKind::Radix => (node, 1 << 63),
        _ => panic!("{kind:?} has no per-file tree"),
    };
    let word = media.load_u64(PmOff(at)).unwrap();
    media.store_u64(PmOff(at), (word & keep) | outside).unwrap();
}
