//! Computes **Tables 4 and 5** of the CFFS paper (IEEE Access, §VI-E): fragments per file, and
//! how well the fragments are aligned to 2 MiB, for files grown 4 KiB at a time in
//! round-robin, with the baseline free-extent allocator standing in for ext4-DAX and the CFFS
//! allocator with and without hints.
//!
//! ```sh
//! cargo run -p pmfs-benches --release --bin cffs-tables [-- --volume-mib N]
//! ```
//!
//! The workloads are counts, not timings. Each run starts from an empty managed range and
//! allocates through the [`BlockAllocator`] trait exactly as a file system would: one block
//! per call, the goal being the block after the file's last fragment. By default the tables are
//! computed for a 2048 MiB range (the 1 GiB of files fill half of it; tables `cffs-table4`,
//! `cffs-table5`) and for a 1152 MiB range (89 % full at the end; `cffs-table4-full`,
//! `cffs-table5-full`); `--volume-mib N` computes them for N MiB only (`…-<N>mib`).
//!
//! - **Table 4** (single-size workloads): `n` files of `1 GiB / n`; four allocations for one
//!   file, then the next file, round-robin.
//! - **Table 5** (huge files and small dummy files): `n` huge files of `512 MiB / n`; two
//!   allocations for one huge file, then two new one-block dummy files, then the next huge
//!   file, round-robin (512 MiB of dummies in all). *No hint*: dummies are allocated as growing
//!   files (the default hint); *hint*: as fixed-size files. Only the huge files are measured.
//!
//! Prints the tables as markdown and writes them as JSON to `<target>/pmfs-report/tables/` for
//! the report tool.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant;

use pmfs_alloc::aging::blocks_and_fragments;
use pmfs_alloc::baseline::bitmap_area_size;
use pmfs_alloc::cffs::PAGE_BLOCKS;
use pmfs_alloc::{CffsAllocator, FreeExtentAllocator};
use pmfs_benches::report::markdown::table_page;
use pmfs_benches::report::table::{Cell, Table};
use pmfs_benches::report::tables_dir;
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};

/// Blocks per MiB.
const MIB: u64 = 256;

/// What a run measured on the files of interest (averages per file).
#[derive(Clone, Copy, Debug)]
struct Measured {
    /// Fragments per file.
    fragments: f64,
    /// Fragments per file that start on a 2 MiB boundary.
    aligned: f64,
    /// Share of the files' 2 MiB logical chunks that one huge page can map: the chunk lies in
    /// one fragment whose physical start is congruent to its logical start modulo 2 MiB. `None`
    /// when the files are smaller than 2 MiB.
    mappable: Option<f64>,
}

/// Measures files given as extent lists in logical order.
fn measure(files: &[Vec<Extent>]) -> Measured {
    let (mut frags, mut aligned, mut chunks, mut mappable) = (0u64, 0u64, 0u64, 0u64);
    for f in files {
        frags += blocks_and_fragments(f).1;
        // Merge physically contiguous extents into fragments with their logical offsets.
        let mut merged: Vec<(u64, Extent)> = Vec::new();
        let mut lblk = 0;
        for e in f {
            match merged.last_mut() {
                Some((_, last)) if last.end() == e.start => last.len += e.len,
                _ => merged.push((lblk, *e)),
            }
            lblk += e.len;
        }
        aligned += merged
            .iter()
            .filter(|(_, e)| e.start.0 % PAGE_BLOCKS == 0)
            .count() as u64;
        chunks += lblk / PAGE_BLOCKS;
        for (l, e) in &merged {
            if (e.start.0 % PAGE_BLOCKS) != (l % PAGE_BLOCKS) {
                continue;
            }
            let first = l.div_ceil(PAGE_BLOCKS);
            let end = (l + e.len) / PAGE_BLOCKS;
            mappable += end.saturating_sub(first);
        }
    }
    let n = files.len().max(1) as f64;
    Measured {
        fragments: frags as f64 / n,
        aligned: aligned as f64 / n,
        mappable: (chunks > 0).then(|| mappable as f64 / chunks as f64),
    }
}

/// The allocators under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Baseline,
    Cffs,
}

fn with_allocator<R>(which: Which, blocks: u64, f: impl FnOnce(&dyn BlockAllocator) -> R) -> R {
    match which {
        Which::Baseline => {
            let region = HeapRegion::new(bitmap_area_size(blocks)).expect("bitmap region");
            let a = FreeExtentAllocator::format(region, PmOff(0), Extent::new(BlockNo(0), blocks))
                .expect("format the baseline bitmap");
            f(&a)
        }
        Which::Cffs => f(&CffsAllocator::new(BlockNo(0), blocks)),
    }
}

/// Appends one block to `file`.
fn append(a: &dyn BlockAllocator, file: &mut Vec<Extent>) {
    let hint = AllocHint {
        kind: AllocKind::Growing,
        goal: file.last().map(Extent::end),
    };
    let e = a.alloc(1, hint).expect("the volume holds the workload");
    file.push(e);
}

/// Table 4: `files` files of `file_blocks`, four allocations per turn.
fn table4_run(a: &dyn BlockAllocator, files: usize, file_blocks: u64) -> Measured {
    let mut out: Vec<Vec<Extent>> = vec![Vec::new(); files];
    for _round in 0..file_blocks / 4 {
        for f in out.iter_mut() {
            for _ in 0..4 {
                append(a, f);
            }
        }
    }
    measure(&out)
}

/// Table 5: `files` huge files of `file_blocks`; two allocations per turn, each turn followed
/// by two one-block dummy files allocated with `dummy`.
fn table5_run(
    a: &dyn BlockAllocator,
    files: usize,
    file_blocks: u64,
    dummy: AllocHint,
) -> Measured {
    let mut out: Vec<Vec<Extent>> = vec![Vec::new(); files];
    for _round in 0..file_blocks / 2 {
        for f in out.iter_mut() {
            for _ in 0..2 {
                append(a, f);
            }
            for _ in 0..2 {
                a.alloc(1, dummy).expect("the volume holds the workload");
            }
        }
    }
    measure(&out)
}

fn label(files: usize, file_blocks: u64) -> String {
    format!("{files}×{} MiB", file_blocks / MIB)
}

fn number_row(
    allocator: &str,
    metric: &str,
    values: impl IntoIterator<Item = Option<f64>>,
) -> Vec<Cell> {
    let mut row: Vec<Cell> = vec![allocator.into(), metric.into()];
    row.extend(values.into_iter().map(|v| match v {
        Some(v) => Cell::Number((v * 100.0).round() / 100.0),
        None => "n/a".into(),
    }));
    row
}

fn paper_row(allocator: &str, values: [f64; 5]) -> Vec<Cell> {
    number_row(allocator, "fragments per file", values.map(Some))
}

fn measured_rows(allocator: &str, m: &[Measured]) -> Vec<Vec<Cell>> {
    vec![
        number_row(
            allocator,
            "fragments per file",
            m.iter().map(|x| Some(x.fragments)),
        ),
        number_row(
            allocator,
            "2 MiB-aligned fragments per file",
            m.iter().map(|x| Some(x.aligned)),
        ),
        number_row(
            allocator,
            "huge-page mappable (%)",
            m.iter().map(|x| x.mappable.map(|v| v * 100.0)),
        ),
    ]
}

fn ratio_row(label: &str, base: &[Measured], cffs: &[Measured]) -> Vec<Cell> {
    number_row(
        label,
        "baseline ÷ CFFS fragments",
        base.iter()
            .zip(cffs)
            .map(|(b, c)| Some(b.fragments / c.fragments.max(f64::MIN_POSITIVE))),
    )
}

fn table4(blocks: u64) -> Table {
    let shapes: [(usize, u64); 5] = [
        (4, 256 * MIB),
        (16, 64 * MIB),
        (64, 16 * MIB),
        (512, 2 * MIB),
        (1024, MIB),
    ];
    let run = |which| -> Vec<Measured> {
        shapes
            .iter()
            .map(|&(n, size)| with_allocator(which, blocks, |a| table4_run(a, n, size)))
            .collect()
    };
    let base = run(Which::Baseline);
    let cffs = run(Which::Cffs);
    let mut rows = vec![paper_row(
        "paper: EXT4-DAX",
        [16434.0, 4108.0, 1027.0, 128.0, 64.0],
    )];
    rows.extend(measured_rows("baseline (free-extent)", &base));
    rows.push(paper_row("paper: CFFS", [128.0, 32.0, 8.0, 1.0, 7.0]));
    rows.extend(measured_rows("CFFS", &cffs));
    rows.push(ratio_row("CFFS vs baseline", &base, &cffs));
    let mut columns = vec!["allocator".to_string(), "metric".to_string()];
    columns.extend(shapes.iter().map(|&(n, s)| label(n, s)));
    Table {
        title: format!(
            "CFFS Table 4: single-size workloads (1 GiB of files in a {} MiB range)",
            blocks / MIB
        ),
        columns,
        rows,
        notes: format!(
            "Counts, not timings: each column grows the given files 4 KiB at a time, four \
             allocations per file per turn, round-robin, on an empty {} MiB managed range. The \
             baseline free-extent allocator stands in for EXT4-DAX; rows marked 'paper' are the \
             paper's Table 4. A fragment is a physically contiguous run of a file; 'huge-page \
             mappable' is the share of a file's 2 MiB logical chunks that lie in one fragment \
             with matching 2 MiB alignment.",
            blocks / MIB
        ),
    }
}

fn table5(blocks: u64) -> Table {
    let shapes: [(usize, u64); 5] = [
        (1, 512 * MIB),
        (4, 128 * MIB),
        (16, 32 * MIB),
        (64, 8 * MIB),
        (256, 2 * MIB),
    ];
    let growing = AllocHint {
        kind: AllocKind::Growing,
        goal: None,
    };
    let fixed = AllocHint {
        kind: AllocKind::Fixed,
        goal: None,
    };
    let run = |which, dummy| -> Vec<Measured> {
        shapes
            .iter()
            .map(|&(n, size)| with_allocator(which, blocks, |a| table5_run(a, n, size, dummy)))
            .collect()
    };
    let base = run(Which::Baseline, growing);
    let cffs = run(Which::Cffs, growing);
    let cffs_hint = run(Which::Cffs, fixed);
    let mut rows = vec![paper_row(
        "paper: EXT4-DAX",
        [54126.0, 16433.0, 4109.0, 1028.0, 257.0],
    )];
    rows.extend(measured_rows("baseline (free-extent)", &base));
    rows.push(paper_row(
        "paper: CFFS",
        [69334.0, 17333.0, 4323.0, 1034.0, 1.0],
    ));
    rows.extend(measured_rows("CFFS (no hint)", &cffs));
    rows.push(paper_row(
        "paper: CFFS(hint)",
        [256.0, 64.0, 16.0, 4.0, 1.0],
    ));
    rows.extend(measured_rows("CFFS (hint)", &cffs_hint));
    rows.push(ratio_row("CFFS (no hint) vs baseline", &base, &cffs));
    rows.push(ratio_row("CFFS (hint) vs baseline", &base, &cffs_hint));
    let mut columns = vec!["allocator".to_string(), "metric".to_string()];
    columns.extend(shapes.iter().map(|&(n, s)| label(n, s)));
    Table {
        title: format!(
            "CFFS Table 5: huge files with small dummy files (512 MiB each, {} MiB range)",
            blocks / MIB
        ),
        columns,
        rows,
        notes: format!(
            "Counts, not timings: two 4 KiB allocations for one huge file, then two new 4 KiB \
             dummy files, then the next huge file, round-robin, on an empty {} MiB managed range; \
             only the huge files are measured. 'No hint': dummy files are allocated with the \
             default (growing) hint; 'hint': with the fixed-size hint. Rows marked 'paper' are \
             the paper's Table 5 (EXT4-DAX is stood in for by the baseline free-extent \
             allocator).",
            blocks / MIB
        ),
    }
}

/// The managed-range sizes to run, in MiB, with the name suffix of their tables.
fn parse_args() -> Result<Vec<(u64, String)>, String> {
    let mut args = std::env::args().skip(1);
    let mut runs = vec![(2048, String::new()), (1152, "-full".to_string())];
    while let Some(a) = args.next() {
        match a.as_str() {
            "--volume-mib" => {
                let mib: u64 = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--volume-mib needs a number")?;
                if mib < 1100 {
                    return Err("the workloads need a volume of at least 1100 MiB".into());
                }
                runs = vec![(mib, format!("-{mib}mib"))];
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(runs)
}

fn main() -> ExitCode {
    let runs = match parse_args() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cffs-tables: {e}\nusage: cffs-tables [--volume-mib N]");
            return ExitCode::FAILURE;
        }
    };
    let dir = tables_dir();
    for (mib, suffix) in runs {
        for (name, make) in [
            ("cffs-table4", table4 as fn(u64) -> Table),
            ("cffs-table5", table5),
        ] {
            let t = Instant::now();
            let table = make(mib * MIB);
            let name = format!("{name}{suffix}");
            eprintln!("{name}: computed in {:.1} s", t.elapsed().as_secs_f64());
            // The binary exists to print the tables.
            #[allow(clippy::print_stdout)]
            {
                println!("{}", table_page(&table));
            }
            if let Err(e) = table.write(&dir, &name) {
                eprintln!("cffs-tables: writing {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("wrote the tables to {}", dir.display());
    ExitCode::SUCCESS
}
