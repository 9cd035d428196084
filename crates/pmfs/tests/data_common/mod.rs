//! Helpers shared by the data-path scenario tests: small volumes over the crash simulator for
//! every mapping and allocator, the observable state of a file (size, contents, the data/hole
//! map SEEK_DATA/SEEK_HOLE report, checked against the contents), and a crash harness that
//! runs a sequence of data operations and accepts, at every crash image, only the state
//! between the last returned operation and the one in progress.
#![allow(dead_code)]

#[path = "../common/crash_image.rs"]
mod crash_image;
pub mod lin;
pub mod model;
pub mod procs;
pub mod rng;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use pmfs::{AllocatorKind, MappingKind, OpenMode, OpenNode, Options, Owner, SeekTarget, Volume};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{DEFAULT_EXHAUSTIVE_LIMIT, Explorer, SAMPLES_ENV, SimRegion};

use self::crash_image::check_crashed;

/// Block size of every volume.
pub const BS: u64 = 4096;

/// Size of the simulated volumes: one 2 MiB data group after the metadata.
pub const SIM_SIZE: u64 = 4 << 20;

/// The mapping kinds every scenario runs on.
pub const KINDS: [MappingKind; 4] = [
    MappingKind::Extent,
    MappingKind::Radix,
    MappingKind::Cuckoo,
    MappingKind::HashFs,
];

/// Read and write access.
pub const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

/// One volume configuration of a scenario.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// The mapping structure.
    pub kind: MappingKind,
    /// The block allocator.
    pub alloc: AllocatorKind,
}

/// Every mapping kind with the default (CFFS) allocator, plus the other two allocators on
/// the tree mappings, which take their blocks from the allocator.
pub fn configs() -> Vec<Config> {
    let mut v: Vec<Config> = KINDS
        .iter()
        .map(|&kind| Config {
            kind,
            alloc: AllocatorKind::Cffs,
        })
        .collect();
    v.push(Config {
        kind: MappingKind::Extent,
        alloc: AllocatorKind::Baseline,
    });
    v.push(Config {
        kind: MappingKind::Radix,
        alloc: AllocatorKind::Simple,
    });
    v
}

/// Every mapping kind with the default allocator.
pub fn kinds_only() -> Vec<Config> {
    KINDS
        .iter()
        .map(|&kind| Config {
            kind,
            alloc: AllocatorKind::Cffs,
        })
        .collect()
}

/// Options of the simulated volumes.
pub fn sim_options(cfg: Config) -> Options {
    Options {
        inodes: Some(64),
        journal_slots: 2,
        allocator: cfg.alloc,
        ..Options::with_mapping(cfg.kind)
    }
}

/// Creates `/name` and opens it for reading and writing.
pub fn create(vol: &Volume, name: &str) -> OpenNode {
    let (_, node, _) = vol
        .create_open(
            vol.root(),
            name.as_bytes(),
            0o644,
            Owner::default(),
            true,
            RW,
        )
        .unwrap();
    node
}

/// Opens the existing `/name` for reading and writing.
pub fn open(vol: &Volume, name: &str) -> pmfs::Result<OpenNode> {
    let attr = vol.lookup(vol.root(), name.as_bytes())?;
    vol.open_ino(attr.ino, RW)
}

/// A deterministic pattern: byte `i` of the result depends on `tag` and `i`.
pub fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| tag.wrapping_mul(31).wrapping_add((i % 251) as u8) | 1)
        .collect()
}

/// What a reader can observe of one regular file.
#[derive(Clone, PartialEq, Eq)]
pub struct FileImage {
    /// Size in bytes.
    pub size: u64,
    /// The whole content.
    pub data: Vec<u8>,
    /// The data segments `[start, end)` SEEK_DATA/SEEK_HOLE report, in order.
    pub map: Vec<(u64, u64)>,
}

impl fmt::Debug for FileImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sum = self.data.iter().fold(0u64, |h, &b| {
            h.wrapping_mul(1_099_511_628_211) ^ u64::from(b)
        });
        write!(
            f,
            "size {} data-hash {sum:016x} map {:?}",
            self.size, self.map
        )
    }
}

impl FileImage {
    /// Where `self` and `other` differ first, in words.
    pub fn diff(&self, other: &FileImage) -> String {
        if self.size != other.size {
            return format!("size {} vs {}", self.size, other.size);
        }
        if let Some(i) = self.data.iter().zip(&other.data).position(|(a, b)| a != b) {
            return format!(
                "byte {i} (block {}) is {} vs {}",
                i as u64 / BS,
                self.data[i],
                other.data[i]
            );
        }
        if self.map != other.map {
            return format!("data map {:?} vs {:?}", self.map, other.map);
        }
        "equal".to_owned()
    }
}

/// Reads the whole file through `node` and walks it with SEEK_DATA/SEEK_HOLE, checking that
/// the walk agrees with the contents: every byte outside the reported data reads as zero,
/// boundaries are block-aligned (or end of file), and seeking from inside a hole or a data
/// segment stays put.
pub fn image_of(node: &OpenNode) -> Result<FileImage, String> {
    let e = |what: &str, err: pmfs::Error| format!("{what}: {err}");
    let size = node.size().map_err(|x| e("size", x))?;
    let mut data = vec![0u8; size as usize];
    let mut got = 0usize;
    while got < data.len() {
        let n = node
            .read_at(&mut data[got..], got as u64)
            .map_err(|x| e("read", x))?;
        if n == 0 {
            return Err(format!("read returned 0 at {got} of {size}"));
        }
        got += n;
    }
    let mut extra = [0u8; 1];
    if node.read_at(&mut extra, size).map_err(|x| e("read", x))? != 0 {
        return Err(format!("read past the size {size} returned data"));
    }
    let mut map = Vec::new();
    let mut at = 0u64;
    while at < size {
        let d = node
            .seek(at, SeekTarget::Data)
            .map_err(|x| e("seek data", x))?;
        let hole_end = d.unwrap_or(size);
        if hole_end < at || hole_end > size {
            return Err(format!("SEEK_DATA from {at} gave {hole_end} (size {size})"));
        }
        if hole_end > at {
            if node
                .seek(at, SeekTarget::Hole)
                .map_err(|x| e("seek hole", x))?
                != Some(at)
            {
                return Err(format!("SEEK_HOLE from {at} inside a hole moved"));
            }
            if let Some(i) = data[at as usize..hole_end as usize]
                .iter()
                .position(|&b| b != 0)
            {
                return Err(format!(
                    "byte {} lies in a hole [{at}, {hole_end}) but reads {}",
                    at + i as u64,
                    data[at as usize + i]
                ));
            }
        }
        let Some(d) = d else { break };
        if d % BS != 0 && d != at {
            return Err(format!("SEEK_DATA from {at} gave unaligned {d}"));
        }
        if node
            .seek(d, SeekTarget::Data)
            .map_err(|x| e("seek data", x))?
            != Some(d)
        {
            return Err(format!("SEEK_DATA from data at {d} moved"));
        }
        let h = node
            .seek(d, SeekTarget::Hole)
            .map_err(|x| e("seek hole", x))?
            .ok_or_else(|| format!("SEEK_HOLE from data at {d} found no end"))?;
        if h <= d || h > size || (h % BS != 0 && h != size) {
            return Err(format!("SEEK_HOLE from {d} gave {h} (size {size})"));
        }
        map.push((d, h));
        at = h;
    }
    Ok(FileImage { size, data, map })
}

/// Name -> image of every regular file in the root directory.
pub type VolImage = BTreeMap<String, FileImage>;

/// Images of every regular file in the root directory.
pub fn volume_image(vol: &Volume) -> Result<VolImage, String> {
    let mut out = BTreeMap::new();
    let entries = vol
        .list_dir(vol.root(), None, usize::MAX)
        .map_err(|e| format!("list: {e}"))?;
    for ent in entries {
        if ent.kind != pmfs::NodeKind::File {
            continue;
        }
        let name = String::from_utf8(ent.name.clone()).map_err(|e| e.to_string())?;
        let node = vol
            .open_ino(
                ent.ino,
                OpenMode {
                    read: true,
                    ..OpenMode::default()
                },
            )
            .map_err(|e| format!("open {name}: {e}"))?;
        let img = image_of(&node).map_err(|e| format!("{name}: {e}"))?;
        out.insert(name, img);
    }
    Ok(out)
}

/// Mounts `image` (recovering it), images its files, closes it and runs fsck.
pub fn recover_and_image(image: &[u8]) -> Result<VolImage, String> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::from_image(image).map_err(|e| e.to_string())?);
    let vol = Volume::mount(media.clone()).map_err(|e| format!("mount failed: {e}"))?;
    let img = volume_image(&vol)?;
    vol.close().map_err(|e| format!("close failed: {e}"))?;
    fsck_clean(media)?;
    Ok(img)
}

/// Runs fsck on a closed volume and fails unless it is clean.
pub fn fsck_clean(media: Arc<dyn Media>) -> Result<(), String> {
    let report = pmfs::fsck::check(media).map_err(|e| format!("fsck failed: {e}"))?;
    if report.is_clean() {
        Ok(())
    } else {
        Err(format!("fsck: {:#?}", report.problems))
    }
}

/// An explorer drawing `default_samples` images per sampled crash point and enumerating
/// points of at most `exhaustive` images; with `PMFS_CRASH_SAMPLES` set, that many samples
/// and points of up to [`DEFAULT_EXHAUSTIVE_LIMIT`] images enumerated.
pub fn explorer(seed: u64, default_samples: usize, exhaustive: usize) -> Explorer {
    let e = Explorer::new(seed);
    if thorough() {
        e.exhaustive_limit(exhaustive.max(DEFAULT_EXHAUSTIVE_LIMIT))
    } else {
        e.samples(default_samples).exhaustive_limit(exhaustive)
    }
}

/// Whether the sample count was raised through `PMFS_CRASH_SAMPLES`.
pub fn thorough() -> bool {
    std::env::var_os(SAMPLES_ENV).is_some()
}

/// One step of a crash scenario.
pub type Step<'a, T> = &'a dyn Fn(&Volume, &mut T) -> pmfs::Result<()>;

/// Crash sampling of a scenario.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Seed of the explorer.
    pub seed: u64,
    /// Images drawn at a sampled crash point (unless `PMFS_CRASH_SAMPLES` is set).
    pub samples: usize,
    /// Crash points with at most this many images are enumerated.
    pub exhaustive: usize,
}

impl Sampling {
    /// Seed `seed`, 4 samples, exhaustive up to 8 images.
    pub fn new(seed: u64) -> Sampling {
        Sampling {
            seed,
            samples: 4,
            exhaustive: 8,
        }
    }
}

/// Runs `setup`, then `steps` one after the other under the crash simulator, on a volume
/// configured by `cfg`. Every crash image must recover with fsck clean and show the files
/// exactly as they were after the last step that returned, or (while a step runs) as they
/// are after that step: each step is atomic and durable on return. The expected states come
/// from running the same steps on a plain heap region; `check_states` may check them too
/// (for instance against a model). Returns the number of crash images checked.
pub fn check_steps<T>(
    cfg: Config,
    sampling: Sampling,
    setup: &dyn Fn(&Volume) -> T,
    steps: &[Step<'_, T>],
    check_states: &dyn Fn(&[VolImage]),
) -> u64 {
    let ctx = format!("{:?}/{:?} seed {}", cfg.kind, cfg.alloc, sampling.seed);
    let states = {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
        let vol = Volume::format(media, &sim_options(cfg)).unwrap();
        let mut state = setup(&vol);
        let mut states = vec![volume_image(&vol).unwrap()];
        for (i, step) in steps.iter().enumerate() {
            step(&vol, &mut state).unwrap_or_else(|e| panic!("{ctx}: step {i} failed: {e}"));
            states.push(volume_image(&vol).unwrap_or_else(|e| panic!("{ctx}: {e}")));
        }
        states
    };
    check_states(&states);
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(region.clone(), &sim_options(cfg)).unwrap();
    let mut state = setup(&vol);
    region.persist_all();
    let done = Cell::new(0usize);
    let stats = explorer(sampling.seed, sampling.samples, sampling.exhaustive)
        .run(
            &region,
            |_| {
                for (i, step) in steps.iter().enumerate() {
                    step(&vol, &mut state)
                        .unwrap_or_else(|e| panic!("{ctx}: step {i} failed on the simulator: {e}"));
                    done.set(i + 1);
                }
            },
            |cp| {
                check_crashed(cp.image)?;
                let got = recover_and_image(cp.image)?;
                let d = done.get();
                if got == states[d] || (d < steps.len() && got == states[d + 1]) {
                    return Ok(());
                }
                let mut why = String::new();
                for (name, img) in &got {
                    let describe = |s: &VolImage| match s.get(name) {
                        Some(e) => img.diff(e),
                        None => "missing there".to_owned(),
                    };
                    why.push_str(&format!(
                        "\n  {name}: vs returned state: {}; vs next: {}",
                        describe(&states[d]),
                        states.get(d + 1).map_or("-".to_owned(), describe)
                    ));
                }
                Err(format!(
                    "{ctx}: after {d} of {} steps returned, the recovered files are neither \
                     that state nor the next:{why}\n  got {got:?}",
                    steps.len()
                ))
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(stats.fences > 0, "{ctx}: the steps issued no fence");
    drop(state);
    drop(vol);
    stats.images
}

/// [`check_steps`] for one operation that changes `/{file}` from `before` to `after`
/// (the heap run must agree with the models).
pub fn check_op<T>(
    cfg: Config,
    sampling: Sampling,
    setup: &dyn Fn(&Volume) -> T,
    op: Step<'_, T>,
    file: &str,
    before: &model::Model,
    after: &model::Model,
) -> u64 {
    check_steps(cfg, sampling, setup, &[op], &|s| {
        assert_ne!(s[0], s[1], "{cfg:?}: the operation must change the file");
        for (st, m, when) in [(&s[0], before, "before"), (&s[1], after, "after")] {
            let got = &st[file];
            assert!(
                got.data == m.0,
                "{cfg:?}: {file} {when} the operation, on a heap region: {} (model size {})",
                got.diff(&FileImage {
                    size: m.0.len() as u64,
                    data: m.0.clone(),
                    map: got.map.clone(),
                }),
                m.0.len()
            );
        }
    })
}
