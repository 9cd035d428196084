//! Damaged media: a populated volume (cleanly closed, or crashed in the middle of
//! multi-object operations) gets fuzzer-chosen byte patches in its metadata — superblocks,
//! mount-state word, journal, inode table, allocator and mapping regions, directory pages and
//! the other metadata blocks of the data region. Then the checker, a read-only mount, a
//! read-write mount (recovery) with a few operations and the repair run on it. Each of them
//! returns `Ok` or an error; none may panic, hang or read out of bounds (the target runs
//! under AddressSanitizer). A volume that repair reports clean must mount, take the same
//! operations, and check clean after them.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmfs::{Volume, fsck};
use pmfs_core::layout::BLOCK_SIZE;
use pmfs_fuzz::common::{
    self, Allocator, Base, Bases, MOUNT_STATE_AT, Mapping, STATE_CLEAN, STATE_DIRTY, walk,
};

/// Where a patch lands.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Area {
    /// Block 0: the primary superblock and the mount-state word.
    Superblock,
    /// Block 1: the backup superblock.
    BackupSuperblock,
    /// The undo-journal slots.
    Journal,
    /// The inode table.
    InodeTable,
    /// The persistent allocator state (empty for volatile allocators and HashFS).
    AllocatorRegion,
    /// The global state of the mapping structure (tables of cuckoo and HashFS, roots).
    MappingRegion,
    /// One of the directory pages.
    DentryPage,
    /// One of the other metadata blocks of the data region (tree nodes, symbolic link
    /// targets, extended attributes).
    MetadataBlock,
    /// Anywhere in the volume.
    Anywhere,
}

/// What a patch does at its offset.
#[derive(Arbitrary, Clone, Debug)]
enum Edit {
    /// Flip bits of one byte.
    Xor { mask: u8 },
    /// Store an aligned little-endian word.
    Word { value: u64 },
    /// Add to an aligned little-endian word (counts, sizes, distances, block numbers).
    Add { delta: i16 },
    /// Overwrite a few bytes.
    Bytes { bytes: Vec<u8> },
    /// Zero a 64-byte line.
    ZeroLine,
}

#[derive(Arbitrary, Clone, Debug)]
struct Patch {
    area: Area,
    /// Picks the block among the candidates of `DentryPage` and `MetadataBlock`.
    which: u8,
    /// Offset inside the area (taken modulo its length).
    at: u32,
    edit: Edit,
}

/// What the mount-state word becomes.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum State {
    Keep,
    Clean,
    Dirty,
}

/// An operation tried after a read-write mount.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Op {
    Write { path: u8, off: u16, len: u16 },
    Truncate { path: u8, size: u16 },
    CreateDir { path: u8 },
    RemoveFile { path: u8 },
    RemoveDir { path: u8 },
    Rename { from: u8, to: u8 },
    HardLink { from: u8, to: u8 },
    Symlink { path: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    mapping: Mapping,
    allocator: Allocator,
    /// 0: the cleanly closed image; else one of the crash images.
    image: u8,
    patches: Vec<Patch>,
    /// Recompute both superblock checksums after patching, so that damage to the geometry
    /// gets past the checksum.
    reseal_superblocks: bool,
    /// Recompute the header checksums of the directory pages after patching.
    reseal_pages: bool,
    state: State,
    ops: Vec<Op>,
}

/// Patches and operations beyond these counts are ignored.
const MAX_PATCHES: usize = 24;
const MAX_OPS: usize = 12;

/// Paths of the base tree and a few new ones.
const PATHS: [&str; 16] = [
    "/", "/a", "/a/f", "/a/f2", "/a/b", "/a/b/g", "/l", "/big", "/many", "/c", "/c/f3", "/new",
    "/a/new", "/many/x", "/l/x", "/a/b/new",
];

fn path(i: u8) -> &'static str {
    PATHS[usize::from(i) % PATHS.len()]
}

/// The byte range of `area` in the image, or `None` when the area is empty.
fn area_range(bases: &Bases, base: &Base, area: Area, which: u8) -> Option<(usize, usize)> {
    let info = &bases.info;
    let bs = BLOCK_SIZE as usize;
    let inode_end = (info.inode_table_offset + info.inode_count * info.inode_size) as usize;
    let pick = |v: &[u64]| (!v.is_empty()).then(|| (v[usize::from(which) % v.len()] as usize, bs));
    let (start, len) = match area {
        Area::Superblock => (0, bs),
        Area::BackupSuperblock => (bs, bs),
        Area::Journal => (
            info.journal_offset as usize,
            info.journal_slots as usize * bs,
        ),
        Area::InodeTable => (
            info.inode_table_offset as usize,
            inode_end - info.inode_table_offset as usize,
        ),
        Area::AllocatorRegion => {
            let start = inode_end.div_ceil(bs) * bs;
            (start, (info.mapping_offset as usize).saturating_sub(start))
        }
        Area::MappingRegion => (
            info.mapping_offset as usize,
            (info.data_offset - info.mapping_offset) as usize,
        ),
        Area::DentryPage => pick(&base.dentry_pages)?,
        Area::MetadataBlock => pick(&base.meta_blocks)?,
        Area::Anywhere => (0, base.image.len()),
    };
    (len > 0).then_some((start, len))
}

fn apply(image: &mut [u8], start: usize, len: usize, at: u32, edit: &Edit) {
    let off = start + at as usize % len;
    let word_at = |image: &[u8]| {
        let w = (start + (at as usize % len) / 8 * 8).min(image.len() - 8);
        (w, u64::from_le_bytes(image[w..w + 8].try_into().unwrap()))
    };
    match edit {
        Edit::Xor { mask } => image[off] ^= mask,
        Edit::Word { value } => {
            let (w, _) = word_at(image);
            image[w..w + 8].copy_from_slice(&value.to_le_bytes());
        }
        Edit::Add { delta } => {
            let (w, old) = word_at(image);
            let new = old.wrapping_add_signed(i64::from(*delta));
            image[w..w + 8].copy_from_slice(&new.to_le_bytes());
        }
        Edit::Bytes { bytes } => {
            let end = (off + bytes.len().min(64)).min(image.len());
            image[off..end].copy_from_slice(&bytes[..end - off]);
        }
        Edit::ZeroLine => {
            let l = off / 64 * 64;
            image[l..l + 64].fill(0);
        }
    }
}

fn run_op(vol: &Volume, op: Op) {
    let fill = [common::FILL; 9000];
    let _ = match op {
        Op::Write { path: p, off, len } => pmfs::OpenOptions::new()
            .write(true)
            .create(true)
            .open(vol, path(p))
            .and_then(|f| {
                f.write_all_at(&fill[..usize::from(len) % fill.len()], u64::from(off) * 7)
            }),
        Op::Truncate { path: p, size } => pmfs::OpenOptions::new()
            .write(true)
            .open(vol, path(p))
            .and_then(|f| f.set_len(u64::from(size) * 3)),
        Op::CreateDir { path: p } => vol.create_dir(path(p)),
        Op::RemoveFile { path: p } => vol.remove_file(path(p)),
        Op::RemoveDir { path: p } => vol.remove_dir(path(p)),
        Op::Rename { from, to } => vol.rename(path(from), path(to)),
        Op::HardLink { from, to } => vol.hard_link(path(from), path(to)),
        Op::Symlink { path: p } => vol.symlink("/a/f", path(p)),
    };
}

fuzz_target!(|input: Input| {
    let bases = common::bases(input.mapping, input.allocator);
    let base = match usize::from(input.image) % (bases.crashed.len() + 1) {
        0 => &bases.clean,
        i => &bases.crashed[i - 1],
    };
    let mut image = base.image.clone();
    for p in input.patches.iter().take(MAX_PATCHES) {
        if let Some((start, len)) = area_range(bases, base, p.area, p.which) {
            apply(&mut image, start, len, p.at, &p.edit);
        }
    }
    match input.state {
        State::Keep => {}
        State::Clean => {
            image[MOUNT_STATE_AT..MOUNT_STATE_AT + 8].copy_from_slice(&STATE_CLEAN.to_le_bytes())
        }
        State::Dirty => {
            image[MOUNT_STATE_AT..MOUNT_STATE_AT + 8].copy_from_slice(&STATE_DIRTY.to_le_bytes())
        }
    }
    if input.reseal_superblocks {
        common::reseal_superblock(&mut image, 0);
        common::reseal_superblock(&mut image, BLOCK_SIZE as usize);
    }
    if input.reseal_pages {
        for &p in &base.dentry_pages {
            let p = p as usize;
            common::reseal_page_header(&mut image[p..p + BLOCK_SIZE as usize]);
        }
    }

    let media = common::region(&image);
    let _ = fsck::check(media.clone());
    if let Ok(vol) = Volume::mount_read_only(media.clone()) {
        walk(&vol);
    }
    if let Ok(vol) = Volume::mount(media.clone()) {
        walk(&vol);
        for &op in input.ops.iter().take(MAX_OPS) {
            run_op(&vol, op);
        }
        walk(&vol);
        let _ = vol.close();
    }
    if let Ok(repair) = fsck::repair(media.clone())
        && repair.after.is_clean()
    {
        let vol = Volume::mount(media.clone())
            .unwrap_or_else(|e| panic!("repair reported a clean volume that does not mount: {e}"));
        walk(&vol);
        for &op in input.ops.iter().take(MAX_OPS) {
            run_op(&vol, op);
        }
        walk(&vol);
        vol.close().expect("closing a repaired volume");
        let report = fsck::check(media).expect("checking a repaired volume");
        assert!(
            report.is_clean(),
            "repair reported a clean volume, which after the operations checks as {:#?}",
            report.problems
        );
    }
});
