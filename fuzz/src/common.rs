//! What the targets share: small volumes, the populated base images that `mount_damaged`
//! damages (cleanly closed, and crash images taken in the middle of multi-object operations),
//! the areas of an image a patch can aim at, and a bounded walk that touches every object of
//! a mounted volume.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use pmfs::{AllocatorKind, MappingKind, Options, Volume, VolumeInfo, XattrSet};
use pmfs_core::layout::{BLOCK_SIZE, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};

/// Size of every fuzzed volume: the metadata, then one 2 MiB data group.
pub const POOL: u64 = 4 << 20;
/// The byte every file of the base images is filled with, so that data blocks holding file
/// content can be told apart from blocks holding metadata.
pub const FILL: u8 = 0x5a;
/// Bytes of the superblock record covered by its checksum; the crc32c follows at this offset.
pub const SB_CRC_AT: usize = 248;
/// Offset of the mount-state word in block 0.
pub const MOUNT_STATE_AT: usize = 1024;
/// The mount-state word of a cleanly closed volume.
pub const STATE_CLEAN: u64 = u64::from_le_bytes(*b"CLEAN\0\0\0");
/// The mount-state word of a mounted (or crashed) volume.
pub const STATE_DIRTY: u64 = u64::from_le_bytes(*b"DIRTY\0\0\0");
/// The magic at the start of a directory page.
pub const DENTRY_PAGE_MAGIC: &[u8; 4] = b"PMDP";
/// Bytes of a directory page header covered by its checksum; the crc32c follows.
pub const PAGE_HEADER_CRC_AT: usize = 24;

/// The file-mapping structure of a fuzzed volume.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// Per-file extent tree.
    Extent,
    /// Per-file radix tree.
    Radix,
    /// Global cuckoo hash table.
    Cuckoo,
    /// HashFS global linear-probing table.
    HashFs,
}

impl Mapping {
    /// The engine's kind.
    pub fn kind(self) -> MappingKind {
        match self {
            Mapping::Extent => MappingKind::Extent,
            Mapping::Radix => MappingKind::Radix,
            Mapping::Cuckoo => MappingKind::Cuckoo,
            Mapping::HashFs => MappingKind::HashFs,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The block allocator of a fuzzed volume.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// Volatile first-fit map, rebuilt at every mount.
    Simple,
    /// Free extents over a persistent bitmap.
    Baseline,
}

impl Allocator {
    /// The engine's kind.
    pub fn kind(self) -> AllocatorKind {
        match self {
            Allocator::Simple => AllocatorKind::Simple,
            Allocator::Baseline => AllocatorKind::Baseline,
        }
    }
}

/// mkfs options of the fuzzed volumes: [`POOL`] bytes, 64 inodes, 2 journal slots.
pub fn options(mapping: Mapping, allocator: Allocator) -> Options {
    Options {
        mapping: mapping.kind(),
        allocator: allocator.kind(),
        inodes: Some(64),
        journal_slots: 2,
        size: POOL,
    }
}

/// Everything `media` holds, as bytes.
pub fn image_of(media: &dyn Media) -> Vec<u8> {
    let mut img = vec![0u8; media.size() as usize];
    media
        .read(PmOff(0), &mut img)
        .expect("reading a whole region in bounds");
    img
}

/// A heap region holding `image`.
pub fn region(image: &[u8]) -> Arc<dyn Media> {
    Arc::new(HeapRegion::from_image(image).expect("a heap region of a block-multiple size"))
}

/// The inode-API name of the object `md` describes.
pub fn ino_of(md: &pmfs::Metadata) -> pmfs::Ino {
    pmfs::Ino::from_raw(md.ino() | u64::from(md.generation()) << 32)
}

/// The image of a new, empty volume, closed cleanly (formatting once per mapping and
/// allocator instead of once per input).
pub fn formatted(mapping: Mapping, allocator: Allocator) -> &'static [u8] {
    static CACHE: [OnceLock<Vec<u8>>; 8] = [const { OnceLock::new() }; 8];
    CACHE[mapping.index() * 2 + allocator as usize].get_or_init(|| {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(POOL).expect("heap region"));
        let vol = Volume::format(media.clone(), &options(mapping, allocator)).expect("mkfs");
        vol.close().expect("closing a new volume");
        image_of(&*media)
    })
}

/// Long names so that `/many` needs two directory pages.
fn many_name(i: usize) -> String {
    format!("/many/{i:02}-{}", "n".repeat(56))
}

/// Builds the base tree: a directory hierarchy, files with several blocks and holes, hard
/// links, a symbolic link, an extended attribute, and a two-page directory with fragments.
/// Every byte of file content is [`FILL`].
pub fn populate(vol: &Volume) -> pmfs::Result<()> {
    vol.create_dir_all("/a/b")?;
    vol.write("/a/f", &[FILL; 3 * BLOCK_SIZE as usize + 100])?;
    vol.hard_link("/a/f", "/a/f2")?;
    vol.write("/a/b/g", &[FILL; 10])?;
    vol.symlink("/a/f", "/l")?;
    let big = vol.create_file("/big")?;
    big.write_all_at(&[FILL; BLOCK_SIZE as usize], 0)?;
    big.write_all_at(&[FILL; BLOCK_SIZE as usize], 40 * BLOCK_SIZE)?;
    drop(big);
    let ino = ino_of(&vol.metadata("/a/f")?);
    vol.set_xattr(ino, b"user.fuzz", &[FILL; 40], XattrSet::Any)?;
    vol.create_dir("/many")?;
    for i in 0..70 {
        vol.hard_link("/a/b/g", &many_name(i))?;
    }
    for i in (0..70).step_by(5) {
        vol.remove_file(&many_name(i))?;
    }
    Ok(())
}

/// The work done while the crash images are taken: an open file loses its last name (an
/// orphan), a directory moves, a hard link is made, a file is overwritten, truncated and
/// renamed over another.
fn crash_workload(vol: &Volume) -> pmfs::Result<()> {
    let open = vol.open_file("/a/b/g")?;
    for i in (1..70).filter(|i| i % 5 != 0) {
        vol.remove_file(&many_name(i))?;
    }
    vol.remove_file("/a/b/g")?;
    vol.rename("/a/b", "/c")?;
    vol.hard_link("/a/f", "/c/f3")?;
    let f = pmfs::OpenOptions::new().write(true).open(vol, "/a/f")?;
    f.write_all_at(&[FILL; 5000], 1000)?;
    f.set_len(100)?;
    drop(f);
    vol.rename("/big", "/a/f2")?;
    drop(open);
    Ok(())
}

/// A base image and where its metadata lies.
#[derive(Debug)]
pub struct Base {
    /// The image.
    pub image: Vec<u8>,
    /// Offsets of the data blocks that hold directory pages.
    pub dentry_pages: Vec<u64>,
    /// Offsets of the other data blocks that hold neither zeros nor file content (mapping
    /// nodes, symbolic link targets, extended attributes, log blocks).
    pub meta_blocks: Vec<u64>,
}

impl Base {
    fn new(image: Vec<u8>, info: &VolumeInfo) -> Base {
        let mut dentry_pages = Vec::new();
        let mut meta_blocks = Vec::new();
        let bs = BLOCK_SIZE as usize;
        for off in (info.data_offset as usize..image.len()).step_by(bs) {
            let b = &image[off..off + bs];
            if b.starts_with(DENTRY_PAGE_MAGIC) {
                dentry_pages.push(off as u64);
            } else if b.iter().any(|&x| x != 0) && !b.iter().all(|&x| x == FILL) {
                meta_blocks.push(off as u64);
            }
        }
        Base {
            image,
            dentry_pages,
            meta_blocks,
        }
    }
}

/// The base images of one mapping and allocator.
#[derive(Debug)]
pub struct Bases {
    /// Where the regions of the volume are.
    pub info: VolumeInfo,
    /// The populated volume, closed cleanly.
    pub clean: Base,
    /// Crash images (durable state only) taken at four fences spread over
    /// the crash workload: recovery has journal transactions, half-done directory operations
    /// and an orphan to deal with.
    pub crashed: Vec<Base>,
}

fn build_bases(mapping: Mapping, allocator: Allocator) -> Bases {
    let opts = options(mapping, allocator);
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(POOL).expect("heap region"));
    let vol = Volume::format(media.clone(), &opts).expect("mkfs of the base image");
    populate(&vol).expect("populating the base image");
    let info = vol.info();
    vol.close().expect("closing the base image");
    let clean = Base::new(image_of(&*media), &info);

    let run = |capture_at: &[u64]| {
        let sim = Arc::new(SimRegion::new(POOL).expect("simulated region"));
        let vol = Volume::format(sim.clone(), &opts).expect("mkfs of the base image");
        populate(&vol).expect("populating the base image");
        sim.persist_all();
        let mut images = Vec::new();
        let stats = Explorer::new(1)
            .exhaustive_limit(1)
            .samples(2)
            .run(
                &sim,
                |_| crash_workload(&vol).expect("the crash workload"),
                |cp| {
                    if cp.index == 0 && !cp.end && capture_at.contains(&cp.fence) {
                        images.push(Base::new(cp.image.to_vec(), &info));
                    }
                    Ok(())
                },
            )
            .expect("capturing images never fails");
        drop(vol);
        (stats.fences, images)
    };
    let (fences, _) = run(&[]);
    let at: Vec<u64> = (1..=4).map(|k| fences * k / 5).collect();
    let (_, crashed) = run(&at);
    Bases {
        info,
        clean,
        crashed,
    }
}

/// The base images of `mapping` and `allocator`, built on first use.
pub fn bases(mapping: Mapping, allocator: Allocator) -> &'static Bases {
    static CACHE: [OnceLock<Bases>; 8] = [const { OnceLock::new() }; 8];
    let i = mapping.index() * 2 + allocator as usize;
    CACHE[i].get_or_init(|| build_bases(mapping, allocator))
}

/// Recomputes the checksum of the superblock record at `base` in `image`.
pub fn reseal_superblock(image: &mut [u8], base: usize) {
    let crc = crc32c::crc32c(&image[base..base + SB_CRC_AT]);
    image[base + SB_CRC_AT..base + SB_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Recomputes the header checksum of the directory page at `base` in `image`.
pub fn reseal_page_header(page: &mut [u8]) {
    let crc = crc32c::crc32c(&page[..PAGE_HEADER_CRC_AT]);
    page[PAGE_HEADER_CRC_AT..PAGE_HEADER_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Most objects [`walk`] visits.
const WALK_LIMIT: usize = 400;
/// Bytes [`walk`] reads at each end of a file.
const READ_SPAN: usize = 8192;

/// Touches every object reachable from the root (bounded): lists directories through both
/// APIs, stats every entry, reads the start and the end of every file, reads every symbolic
/// link and every extended attribute. Errors are expected on damaged volumes and ignored:
/// the point is that nothing panics, hangs or reads out of bounds.
pub fn walk(vol: &Volume) {
    let mut seen = HashSet::new();
    let mut stack = vec!["/".to_owned()];
    let mut buf = vec![0u8; READ_SPAN];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = vol.read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if seen.len() >= WALK_LIMIT {
                return;
            }
            let path = e.path().to_string_lossy().into_owned();
            let _ = e.metadata();
            let Ok(md) = vol.symlink_metadata(&path) else {
                continue;
            };
            if !seen.insert((md.ino(), md.generation(), path.clone())) {
                continue;
            }
            let ino = ino_of(&md);
            if let Ok(names) = vol.list_xattr(ino) {
                for n in names {
                    let _ = vol.get_xattr(ino, &n);
                }
            }
            if md.is_dir() {
                if seen.iter().filter(|s| s.0 == md.ino()).count() == 1 {
                    stack.push(path);
                }
            } else if md.is_symlink() {
                let _ = vol.read_link(&path);
                let _ = vol.metadata(&path);
            } else if let Ok(f) = vol.open_file(&path) {
                let _ = f.read_at(&mut buf, 0);
                let _ = f.read_at(&mut buf, md.len().saturating_sub(READ_SPAN as u64));
            }
        }
    }
    let root = vol.root();
    if let Ok(list) = vol.list_dir(root, None, 64) {
        for e in list {
            let _ = vol.getattr(e.ino);
            let _ = vol.lookup(root, &e.name);
        }
    }
    let _ = vol.statfs();
}
