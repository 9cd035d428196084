//! Tables computed from criterion's results rather than written by a tool:
//!
//! - for every group with a `tmpfs` column (the engine benches, which run pmfs next to tmpfs
//!   in the same run), each subject's median and its speed relative to tmpfs
//!   ([`versus`]);
//! - the data-path goals of issue 6 ([`data_path_goals`]): 4 KiB random reads and
//!   overwrites and 4 KiB appends against tmpfs, 1 MiB sequential reads and writes (and
//!   appends) against memcpy, from the groups of the `data_fig6` bench, each with the floor
//!   measured beside it where the bench has one (the bare cost of the operation).
//!
//! A ratio is the subject's rate over the baseline's (operations or bytes per second, from the
//! declared throughput when both declare one), so above 1 means faster than the baseline.

use super::criterion::{Group, Measurement, Throughput};
use super::format;
use super::table::{Cell, NamedTable, Table};

/// The column the engine benches use for tmpfs.
pub const TMPFS: &str = "tmpfs";
/// The column of the memcpy reference in `data_fig6`'s sequential and append groups.
pub const MEMCPY: &str = "memcpy";

/// Work per iteration, in the throughput's unit (1 when none is declared).
fn work(m: &Measurement) -> f64 {
    match m.id.throughput {
        Some(Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Elements(n)) => {
            n as f64
        }
        None => 1.0,
    }
}

/// How many times faster `m` is than `base` (rate over rate).
pub fn speedup(m: &Measurement, base: &Measurement) -> f64 {
    let rate = |x: &Measurement| work(x) / x.estimate.median_ns;
    rate(m) / rate(base)
}

/// The median of `m` with its throughput, as the group pages show it.
fn shown(m: &Measurement) -> String {
    let t = format::time(m.estimate.median_ns);
    match m.id.throughput {
        Some(tp) => format!("{t} ({})", format::throughput(tp, m.estimate.median_ns)),
        None => t,
    }
}

fn ratio(x: f64) -> String {
    format!("{}×", format::sig(x, 3))
}

/// `group` against its column `baseline`: per parameter, the baseline's median and each other
/// column's median and ratio. `None` if the group has no such column.
pub fn versus(group: &Group, baseline: &str) -> Option<Table> {
    let b = group.columns.iter().position(|c| c == baseline)?;
    let others: Vec<usize> = (0..group.columns.len()).filter(|&c| c != b).collect();
    let mut columns = vec!["parameter".to_string(), baseline.to_string()];
    for &c in &others {
        columns.push(group.columns[c].clone());
        columns.push(format!("{} / {baseline}", group.columns[c]));
    }
    let rows = group
        .rows
        .iter()
        .enumerate()
        .map(|(r, label)| {
            let base = group.cell(r, b);
            let mut row: Vec<Cell> = vec![label.as_str().into()];
            row.push(base.map_or_else(String::new, shown).into());
            for &c in &others {
                let m = group.cell(r, c);
                row.push(m.map_or_else(String::new, shown).into());
                row.push(match (m, base) {
                    (Some(m), Some(base)) => ratio(speedup(m, base)).into(),
                    _ => "".into(),
                });
            }
            row
        })
        .collect();
    Some(Table {
        title: format!("{} vs {baseline}", group.id),
        columns,
        rows,
        notes: format!(
            "Medians per iteration (throughput in brackets). `X / {baseline}` is X's rate over \
             {baseline}'s in the same run: above 1 is faster."
        ),
    })
}

/// One goal: a benchmark cell and the baseline cell it is compared with.
struct Goal {
    what: &'static str,
    goal: f64,
    group: &'static str,
    param: &'static str,
    baseline_group: &'static str,
    baseline_column: &'static str,
    /// The column of `group` that measures the operation's floor, if the bench has one.
    floor: Option<&'static str>,
}

const GOALS: [Goal; 6] = [
    Goal {
        what: "4 KiB random read vs tmpfs",
        goal: 2.0,
        group: "fig6_read_rand",
        param: "4096",
        baseline_group: "fig6_read_rand",
        baseline_column: TMPFS,
        floor: Some(MEMCPY),
    },
    Goal {
        what: "4 KiB random overwrite vs tmpfs",
        goal: 2.0,
        group: "fig6_overwrite_rand",
        param: "4096",
        baseline_group: "fig6_overwrite_rand",
        baseline_column: TMPFS,
        floor: Some("durable-copy"),
    },
    Goal {
        what: "4 KiB append vs tmpfs",
        goal: 1.0,
        group: "fig6_append",
        param: "4096",
        baseline_group: "fig6_append",
        baseline_column: TMPFS,
        floor: None,
    },
    Goal {
        what: "1 MiB sequential read vs memcpy",
        goal: 0.85,
        group: "fig6_read_seq",
        param: "1048576",
        baseline_group: "fig6_read_seq",
        baseline_column: MEMCPY,
        floor: Some("memcpy-clusters"),
    },
    Goal {
        what: "1 MiB sequential overwrite vs memcpy",
        goal: 0.85,
        group: "fig6_overwrite_seq",
        param: "1048576",
        baseline_group: "fig6_overwrite_seq",
        baseline_column: MEMCPY,
        floor: None,
    },
    Goal {
        what: "1 MiB append vs memcpy",
        goal: 0.85,
        group: "fig6_append",
        param: "1048576",
        baseline_group: "fig6_append",
        baseline_column: MEMCPY,
        floor: None,
    },
];

/// The pmfs subjects of the data-path benches, in column order.
const SUBJECTS: [&str; 4] = ["pmfs-extent", "pmfs-radix", "pmfs-cuckoo", "pmfs-hashfs"];

fn find<'a>(
    groups: &'a [Group],
    group: &str,
    column: &str,
    param: &str,
) -> Option<&'a Measurement> {
    let g = groups.iter().find(|g| g.id == group)?;
    let c = g.columns.iter().position(|x| x == column)?;
    let r = g.rows.iter().position(|x| x == param)?;
    g.cell(r, c)
}

/// The issue-6 goals table from the `data_fig6` groups; `None` if none of them ran.
pub fn data_path_goals(groups: &[Group]) -> Option<Table> {
    let mut columns = vec!["measure".to_string(), "goal".to_string()];
    columns.extend(SUBJECTS.iter().map(|s| s.to_string()));
    columns.push("floor".to_string());
    columns.push("baseline".to_string());
    let mut rows = Vec::new();
    for g in &GOALS {
        let Some(base) = find(groups, g.baseline_group, g.baseline_column, g.param) else {
            continue;
        };
        let mut row: Vec<Cell> = vec![g.what.into(), format!("≥ {}×", g.goal).into()];
        for s in SUBJECTS {
            row.push(match find(groups, g.group, s, g.param) {
                Some(m) => {
                    let x = speedup(m, base);
                    let mark = if x >= g.goal { "" } else { " (below)" };
                    format!("{}{mark}", ratio(x)).into()
                }
                None => "".into(),
            });
        }
        let floor = g
            .floor
            .and_then(|f| Some((f, find(groups, g.group, f, g.param)?)));
        row.push(match floor {
            Some((f, m)) => format!("{} ({f})", ratio(speedup(m, base))).into(),
            None => "".into(),
        });
        row.push(format!("{} {}", g.baseline_column, shown(base)).into());
        rows.push(row);
    }
    if rows.is_empty() {
        return None;
    }
    Some(Table {
        title: "Data-path goals (issue 6, MadFS Fig. 6 shapes)".into(),
        columns,
        rows,
        notes: "Each cell is the pmfs subject's rate over the baseline's in the same run \
                (`data_fig6` bench): tmpfs through pread/pwrite, or memcpy of the same size \
                from or into a DRAM buffer, measured in the same group. \"(below)\" marks a cell under its goal. \
                `floor` is the same ratio for the floor the group measures beside the subjects: \
                a copy of the same bytes (`memcpy`), a durable copy with its 8-byte commit \
                (`durable-copy`), a copy from scattered 32 KiB pieces (`memcpy-clusters`, the \
                floor of HashFS's layout, whose clusters of eight blocks lie apart)."
            .into(),
    })
}

/// Every derived table of `groups`, named for their pages.
pub fn tables(groups: &[Group]) -> Vec<NamedTable> {
    let mut out: Vec<NamedTable> = groups
        .iter()
        .filter_map(|g| {
            versus(g, TMPFS).map(|table| NamedTable {
                name: format!("{}-vs-{TMPFS}", g.id),
                table,
            })
        })
        .collect();
    if let Some(table) = data_path_goals(groups) {
        out.insert(
            0,
            NamedTable {
                name: "data-path-goals".into(),
                table,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::criterion::{BenchId, Estimate, group};
    use super::*;

    fn m(g: &str, f: &str, v: &str, ns: f64, bytes: u64) -> Measurement {
        Measurement {
            id: BenchId {
                group: g.into(),
                function: Some(f.into()),
                value: Some(v.into()),
                throughput: Some(Throughput::Bytes(bytes)),
            },
            estimate: Estimate {
                median_ns: ns,
                lower_ns: ns,
                upper_ns: ns,
            },
        }
    }

    #[test]
    fn versus_tmpfs_gives_rate_ratios_per_parameter() {
        let groups = group(vec![
            m("fig6_read_rand", "tmpfs", "4096", 1000.0, 4096),
            m("fig6_read_rand", "pmfs-extent", "4096", 400.0, 4096),
            m("fig6_read_rand", "pmfs-extent", "16384", 800.0, 16384),
        ]);
        let t = versus(&groups[0], TMPFS).unwrap();
        assert_eq!(
            t.columns,
            ["parameter", "tmpfs", "pmfs-extent", "pmfs-extent / tmpfs"]
        );
        assert_eq!(t.rows[0][0], Cell::from("4096"));
        assert_eq!(t.rows[0][3], Cell::from("2.50×"));
        // No tmpfs result at 16384: the ratio cell stays empty.
        assert_eq!(t.rows[1][3], Cell::from(""));
        assert!(versus(&groups[0], "ext4").is_none());
    }

    #[test]
    fn goals_compare_with_tmpfs_and_memcpy_and_mark_misses() {
        let mib = 1 << 20;
        let groups = group(vec![
            m("fig6_read_rand", "tmpfs", "4096", 1000.0, 4096),
            m("fig6_read_rand", "pmfs-hashfs", "4096", 400.0, 4096),
            m("fig6_read_rand", "pmfs-radix", "4096", 800.0, 4096),
            m("fig6_read_rand", MEMCPY, "4096", 250.0, 4096),
            m("fig6_read_seq", "pmfs-hashfs", "1048576", 125_000.0, mib),
            m("fig6_read_seq", MEMCPY, "1048576", 100_000.0, mib),
        ]);
        let t = data_path_goals(&groups).unwrap();
        assert_eq!(t.rows.len(), 2);
        let col = |name: &str| t.columns.iter().position(|c| c == name).unwrap();
        assert_eq!(t.rows[0][col("pmfs-hashfs")], Cell::from("2.50×"));
        assert_eq!(t.rows[0][col("pmfs-radix")], Cell::from("1.25× (below)"));
        assert_eq!(t.rows[0][col("pmfs-extent")], Cell::from(""));
        assert_eq!(t.rows[1][col("pmfs-hashfs")], Cell::from("0.800× (below)"));
        // The floor beside the subjects, where the group has one.
        assert_eq!(t.rows[0][col("floor")], Cell::from("4.00× (memcpy)"));
        assert_eq!(t.rows[1][col("floor")], Cell::from(""));
        assert!(data_path_goals(&group(Vec::new())).is_none());
        let all = tables(&groups);
        assert_eq!(all[0].name, "data-path-goals");
        assert_eq!(all[1].name, "fig6_read_rand-vs-tmpfs");
        // fig6_read_seq has no tmpfs column, so no page against tmpfs.
        assert_eq!(all.len(), 2);
    }
}
