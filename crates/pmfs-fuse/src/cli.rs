//! The `pmfs` command line: `mkfs`, `mount`, `umount`, `fsck`, `info`, and the `mount.pmfs`
//! helper.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use pmfs::{AllocatorKind, MappingKind, Options, fsck};

use crate::error::{Error, Result};
use crate::pool::{Pool, volume_error};
use crate::{mount, umount};

/// pmfs: a persistent-memory file system. Create, mount, check and inspect pmfs volumes
/// stored in pool files.
#[derive(Debug, Parser)]
#[command(name = "pmfs", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Create a pool file and format a new volume in it.
    Mkfs(MkfsArgs),
    /// Mount the volume of a pool through FUSE (in the background unless --foreground).
    Mount(MountArgs),
    /// Unmount a volume and wait until its daemon has closed it.
    #[command(alias = "unmount")]
    Umount(UmountArgs),
    /// Check a volume for damage, and optionally repair it.
    Fsck(FsckArgs),
    /// Show the geometry, mapping, utilisation, fragmentation and journal state of a volume.
    Info(InfoArgs),
}

/// The file-mapping structure of a new volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MappingArg {
    /// Global linear-probing hash table whose slot index is the data block (HashFS).
    Hashfs,
    /// Per-file B-tree of extents.
    Extent,
    /// Per-file 512-way radix tree.
    Radix,
    /// Global cuckoo hash table with ranged entries.
    Cuckoo,
}

/// The block allocator of a new volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AllocArg {
    /// CFFS contiguity-first greedy buddy allocator.
    Buddy,
    /// Free-extent allocator over a persistent bitmap.
    Baseline,
    /// Volatile first-fit allocator rebuilt at every mount.
    Simple,
}

#[derive(Debug, clap::Args)]
struct MkfsArgs {
    /// The pool file to create.
    pool: PathBuf,
    /// Pool size: bytes, or with a suffix K, M, G, T (powers of 1024); a multiple of 2 MiB.
    #[arg(long, short, default_value = "256M", value_parser = parse_size)]
    size: u64,
    /// File-mapping structure.
    #[arg(long, short, value_enum, default_value = "hashfs")]
    mapping: MappingArg,
    /// Block allocator (HashFS allocates through its own table and ignores it).
    #[arg(long, short, value_enum, default_value = "buddy")]
    alloc: AllocArg,
    /// Number of inodes (default: one per 16 KiB).
    #[arg(long)]
    inodes: Option<u64>,
    /// Replace an existing pool file (unless it is in use).
    #[arg(long, short)]
    force: bool,
}

#[derive(Debug, clap::Args)]
struct MountArgs {
    /// The pool file.
    pool: PathBuf,
    /// The directory to mount the volume on.
    mountpoint: PathBuf,
    /// Mount options, comma separated: ro, rw, suid, dev, noexec, noatime, sync, dirsync,
    /// allow_other, allow_root, attr_timeout=SECS, entry_timeout=SECS, threads=N,
    /// poll=MICROS (keep a thread polling for requests that long after each one; costs a CPU
    /// while requests keep coming) (fstab-only options such as noauto, nofail, x-* are
    /// accepted and ignored).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground (logs to stderr; Ctrl-C unmounts).
    #[arg(long, short)]
    foreground: bool,
    /// Internal: print "ready" on stdout once mounted (used by the background start).
    #[arg(long, hide = true)]
    notify_ready: bool,
}

#[derive(Debug, clap::Args)]
struct UmountArgs {
    /// The mount point.
    mountpoint: PathBuf,
    /// Detach the mount even while files on it are open, and do not wait for the daemon: it
    /// serves those files until they are closed.
    #[arg(long, short)]
    lazy: bool,
    /// Abort the FUSE connection first, then detach the mount: every call on it fails with
    /// ENOTCONN, on open files too. For a daemon that hangs, is stopped or was killed.
    #[arg(long, short)]
    force: bool,
}

#[derive(Debug, clap::Args)]
struct FsckArgs {
    /// The pool file.
    pool: PathBuf,
    /// Repair what can be repaired (runs crash recovery first).
    #[arg(long, short)]
    repair: bool,
}

#[derive(Debug, clap::Args)]
struct InfoArgs {
    /// The pool file.
    pool: PathBuf,
}

/// Parses a size such as `1G`, `512M`, `64MiB` or `4096`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{s:?}: unknown size unit {unit:?}")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent:>3}% {elapsed_precise}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_owned());
    pb
}

fn spinner(what: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_message(what.to_owned());
    pb.tick();
    pb
}

/// Prints a line of the command's regular output.
fn out(line: impl std::fmt::Display) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
}

fn mkfs(a: MkfsArgs) -> Result<()> {
    let mapping = match a.mapping {
        MappingArg::Hashfs => MappingKind::HashFs,
        MappingArg::Extent => MappingKind::Extent,
        MappingArg::Radix => MappingKind::Radix,
        MappingArg::Cuckoo => MappingKind::Cuckoo,
    };
    let allocator = match a.alloc {
        AllocArg::Baseline => AllocatorKind::Baseline,
        AllocArg::Simple => AllocatorKind::Simple,
        AllocArg::Buddy => AllocatorKind::Cffs,
    };
    let opts = Options {
        mapping,
        allocator,
        inodes: a.inodes.or(Some((a.size / 16384).max(64))),
        size: a.size,
        ..Options::default()
    };
    let pb = bar(a.size, "allocating");
    let pool = Pool::create(&a.pool, a.size, a.force, &mut |done, _| {
        pb.set_position(done)
    })?;
    pb.finish_and_clear();
    let sp = spinner("formatting");
    let made = pool.format(&opts).and_then(|vol| {
        let info = vol.info();
        vol.close().map_err(|e| volume_error(pool.path(), e))?;
        Ok(info)
    });
    sp.finish_and_clear();
    let info = match made {
        Ok(i) => i,
        Err(e) => {
            let _ = std::fs::remove_file(pool.path());
            return Err(e);
        }
    };
    out(format_args!(
        "{}: pmfs volume of {} ({:?} mapping, {:?} allocator, {} inodes, {} data)",
        pool.path().display(),
        human(info.size),
        info.mapping,
        info.allocator,
        info.inode_count,
        human(info.data_size)
    ));
    Ok(())
}

/// The problems of a check that are damage: all but the note that the volume was not closed
/// cleanly (the check examines such a volume as the next mount's recovery leaves it).
fn damage(r: &pmfs::fsck::Report) -> usize {
    r.problems
        .iter()
        .filter(|p| p.kind != pmfs::fsck::ProblemKind::NotClean)
        .count()
}

/// The verdict of a check: "clean" or how many problems, with what the next mount recovers
/// and frees either way (a crash's half-done operations, orphans, and blocks staged by writes
/// that never committed).
fn verdict(r: &pmfs::fsck::Report) -> String {
    let mut left = Vec::new();
    match r.orphans.len() {
        0 => {}
        1 => left.push("1 orphan".to_owned()),
        n => left.push(format!("{n} orphans")),
    }
    match r.staged_blocks {
        0 => {}
        1 => left.push("1 block staged by a write that never committed".to_owned()),
        n => left.push(format!("{n} blocks staged by writes that never committed")),
    }
    let crashed = r.has(pmfs::fsck::ProblemKind::NotClean);
    let state = match damage(r) {
        0 if crashed => "not closed cleanly, and clean once the next mount recovers it".to_owned(),
        0 => "clean".to_owned(),
        1 => "1 problem".to_owned(),
        n => format!("{n} problems"),
    };
    if left.is_empty() {
        state
    } else {
        format!(
            "{state}; {}, which the next mount frees",
            left.join(" and ")
        )
    }
}

fn fsck_cmd(a: FsckArgs) -> Result<()> {
    let pool = if a.repair {
        Pool::open(&a.pool)?
    } else {
        Pool::open_read_only(&a.pool)?
    };
    let media = pool.media()?;
    let shown = pool.path().display().to_string();
    let sp = spinner(if a.repair { "repairing" } else { "checking" });
    if !a.repair {
        let r = fsck::check(media).map_err(|e| volume_error(pool.path(), e));
        sp.finish_and_clear();
        let r = r?;
        for p in &r.problems {
            out(p);
        }
        out(format_args!(
            "{shown}: {} inodes, {} directories, {} entries, {} used and {} free blocks: {}",
            r.live_inodes,
            r.directories,
            r.entries,
            r.used_blocks,
            r.free_blocks,
            verdict(&r)
        ));
        return if damage(&r) == 0 {
            Ok(())
        } else {
            Err(
                Error::new(format!("{shown}: damaged; run pmfs fsck --repair {shown}"))
                    .with_status(4),
            )
        };
    }
    let r = fsck::repair(media).map_err(|e| volume_error(pool.path(), e));
    sp.finish_and_clear();
    let r = r?;
    for p in &r.before.problems {
        out(format_args!("found: {p}"));
    }
    for act in &r.actions {
        out(format_args!("fixed: {act}"));
    }
    for p in &r.after.problems {
        out(format_args!("remains: {p}"));
    }
    if !r.after.is_clean() {
        return Err(Error::new(format!(
            "{shown}: {} problems could not be repaired",
            r.after.problems.len()
        ))
        .with_status(4));
    }
    if r.before.is_clean() {
        out(format_args!("{shown}: clean"));
        Ok(())
    } else {
        out(format_args!("{shown}: repaired, now clean"));
        Err(Error::silent(1))
    }
}

/// `pmfs info` of a pool a daemon serves: what the mount's statfs tells.
fn info_mounted(pool: &Path, dir: &Path) -> Result<()> {
    let st = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| Error::new(format!("{}: statfs: {e}", dir.display())))?;
    let bs = st.fragment_size();
    let (blocks, free) = (st.blocks(), st.blocks_free());
    let (files, ffree) = (st.files(), st.files_free());
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            a as f64 * 100.0 / b as f64
        }
    };
    out(format_args!("pool:         {}", pool.display()));
    out(format_args!(
        "state:        mounted on {} (unmount it for geometry, fragmentation and journal state)",
        dir.display()
    ));
    out("utilisation:");
    out(format_args!(
        "  data blocks  {} used of {blocks} ({:.1}%), {} free",
        blocks - free,
        pct(blocks - free, blocks),
        human(free * bs)
    ));
    out(format_args!(
        "  inodes       {} used of {files} ({:.1}%)",
        files - ffree,
        pct(files - ffree, files)
    ));
    Ok(())
}

fn info_cmd(a: InfoArgs) -> Result<()> {
    if let Ok(abs) = a.pool.canonicalize()
        && let Some(dir) = mount::mount_point_of(&abs)
    {
        return info_mounted(&abs, &dir);
    }
    let pool = Pool::open_read_only(&a.pool)?;
    let media = pool.media()?;
    let vol =
        pmfs::Volume::mount_read_only(media.clone()).map_err(|e| volume_error(pool.path(), e))?;
    let i = vol.info();
    let st = vol.statfs().map_err(|e| volume_error(pool.path(), e))?;
    let pb = bar(1, "scanning");
    let usage = vol.usage(&mut |done, total| {
        pb.set_length(total.max(1));
        pb.set_position(done);
    });
    pb.finish_and_clear();
    let u = usage.map_err(|e| volume_error(pool.path(), e))?;
    let report = vol.mount_report();
    let bs = st.block_size;
    let used = st.total_blocks - st.free_blocks;
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            a as f64 * 100.0 / b as f64
        }
    };
    out(format_args!("pool:         {}", pool.path().display()));
    out(format_args!("volume id:    {:016x}", i.volume_id));
    out(format_args!("format:       version {}", i.format_version));
    out(format_args!(
        "size:         {} ({} blocks of {bs} bytes)",
        human(i.size),
        i.size / bs
    ));
    out(format_args!("mapping:      {:?}", i.mapping));
    out(format_args!("allocator:    {:?}", i.allocator));
    out("geometry:");
    out(format_args!(
        "  journal      @ {:#x}: {} slots of {bs} bytes",
        i.journal_offset, i.journal_slots
    ));
    out(format_args!(
        "  inode table  @ {:#x}: {} inodes of {} bytes",
        i.inode_table_offset, i.inode_count, i.inode_size
    ));
    out(format_args!("  mapping      @ {:#x}", i.mapping_offset));
    out(format_args!(
        "  data         @ {:#x}: {}",
        i.data_offset,
        human(i.data_size)
    ));
    out("utilisation:");
    out(format_args!(
        "  data blocks  {used} used of {} ({:.1}%), {} free",
        st.total_blocks,
        pct(used, st.total_blocks),
        human(st.free_blocks * bs)
    ));
    out(format_args!(
        "  inodes       {} used of {} ({:.1}%)",
        st.total_inodes - st.free_inodes,
        st.total_inodes,
        pct(st.total_inodes - st.free_inodes, st.total_inodes)
    ));
    out(format_args!(
        "  objects      {} files ({}), {} directories, {} symlinks, {} special, {} with xattrs",
        u.files,
        human(u.file_bytes),
        u.dirs,
        u.symlinks,
        u.special,
        u.with_xattrs
    ));
    if let Some(h) = u.hash_slots {
        out(format_args!(
            "  hash slots   {} empty, {} tombstones, {} in use",
            h.empty, h.tombstones, h.in_use
        ));
    }
    out("fragmentation:");
    out(format_args!(
        "  layout score {:.4} ({} file blocks in {} extents)",
        u.layout_score, u.file_blocks, u.file_extents
    ));
    out("journal:");
    out(format_args!(
        "  state        {}",
        if report.clean {
            "closed cleanly"
        } else {
            "not closed cleanly: shown as recovered in memory (the next read-write mount recovers it)"
        }
    ));
    if !report.clean || report.did_anything() {
        out(format_args!("  recovery     {report}"));
    }
    vol.close().map_err(|e| volume_error(pool.path(), e))?;
    Ok(())
}

fn mount_cmd(a: MountArgs) -> Result<()> {
    let opts = mount::parse_options(&a.options)?;
    if a.foreground || a.notify_ready {
        return mount::serve(&a.pool, &a.mountpoint, &opts, a.notify_ready);
    }
    // Check what can be checked before going to the background, for a clear error here.
    let mountpoint = mount::check_mount_point(&a.mountpoint)?;
    let pool = a
        .pool
        .canonicalize()
        .map_err(|_| Error::new(format!("{}: no such pool file", a.pool.display())))?;
    mount::spawn_daemon(&pool, &mountpoint, &a.options)
}

/// Runs the command with `args` (program name first); returns the exit status.
pub fn main<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let r = match cli.command {
        Cmd::Mkfs(a) => mkfs(a),
        Cmd::Mount(a) => mount_cmd(a),
        Cmd::Umount(a) => umount::umount(
            &a.mountpoint,
            umount::How {
                lazy: a.lazy,
                force: a.force,
            },
        ),
        Cmd::Fsck(a) => fsck_cmd(a),
        Cmd::Info(a) => info_cmd(a),
    };
    report(r)
}

fn report(r: Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            if !e.is_silent() {
                let _ = writeln!(std::io::stderr(), "pmfs: {e}");
            }
            e.status()
        }
    }
}

/// The `mount.pmfs` helper: `mount.pmfs POOL DIR [-sfnv] [-o OPTIONS] [-t TYPE]`, as mount(8)
/// runs it for `mount -t fuse.pmfs POOL DIR` and for fstab entries of type `fuse.pmfs`
/// (install or link it as `/sbin/mount.fuse.pmfs`). Mounts in the background and returns.
/// When its first argument is a `pmfs` subcommand (`mount`), it behaves as `pmfs`.
pub fn mount_helper_main(args: Vec<OsString>) -> i32 {
    if args.get(1).is_some_and(|a| a == "mount") {
        return main(args);
    }
    let mut positional: Vec<PathBuf> = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut it = args.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => match it.next() {
                Some(o) => options.push(o.to_string_lossy().into_owned()),
                None => return report(Err(Error::new("-o needs an argument").with_status(2))),
            },
            Some("-t") => {
                it.next();
            }
            Some(s) if s.starts_with("-o") => options.push(s[2..].to_owned()),
            Some(s) if s.starts_with('-') && s.len() > 1 => {
                // -s (sloppy), -n (no mtab), -v (verbose) change nothing here; -f fakes.
                fake |= s.contains('f');
            }
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [pool, dir] = positional.as_slice() else {
        return report(Err(Error::new(
            "usage: mount.pmfs POOL DIR [-sfnv] [-o OPTIONS]",
        )
        .with_status(2)));
    };
    let r = (|| {
        mount::parse_options(&options)?;
        let mountpoint = mount::check_mount_point(dir)?;
        let pool = canonical_pool(pool)?;
        if fake {
            return Ok(());
        }
        mount::spawn_daemon(&pool, &mountpoint, &options)
    })();
    report(r)
}

fn canonical_pool(p: &Path) -> Result<PathBuf> {
    p.canonicalize()
        .map_err(|_| Error::new(format!("{}: no such pool file", p.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn a_verdict_names_what_the_next_mount_frees_clean_or_not() {
        use pmfs::fsck::{Problem, ProblemKind};
        let problem = |kind| Problem {
            kind,
            at: 0x400,
            ino: None,
            detail: String::new(),
        };
        let mut r = pmfs::fsck::Report::default();
        assert_eq!(verdict(&r), "clean");
        r.staged_blocks = 2;
        assert_eq!(
            verdict(&r),
            "clean; 2 blocks staged by writes that never committed, which the next mount frees"
        );
        r.problems.push(problem(ProblemKind::NotClean));
        r.orphans = vec![7];
        assert_eq!(damage(&r), 0);
        assert_eq!(
            verdict(&r),
            "not closed cleanly, and clean once the next mount recovers it; 1 orphan and 2 \
             blocks staged by writes that never committed, which the next mount frees"
        );
        r.problems.push(problem(ProblemKind::LinkCount));
        assert_eq!(damage(&r), 1);
        assert_eq!(
            verdict(&r),
            "1 problem; 1 orphan and 2 blocks staged by writes that never committed, which the \
             next mount frees"
        );
        r.problems.push(problem(ProblemKind::DeadEntry));
        r.orphans.clear();
        r.staged_blocks = 0;
        assert_eq!(verdict(&r), "2 problems");
    }

    #[test]
    fn every_command_has_help() {
        for cmd in ["mkfs", "mount", "umount", "unmount", "fsck", "info"] {
            let e = Cli::try_parse_from(["pmfs", cmd, "--help"]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        }
        assert!(Cli::try_parse_from(["pmfs", "mkfs", "p", "--mapping", "btree"]).is_err());
    }
}
