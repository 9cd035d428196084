//! The report: criterion's results and the tools' JSON tables rendered as markdown and SVG in
//! `<target>/pmfs-report/`.
//!
//! Inputs are `<target>/criterion/**/new/{benchmark,estimates}.json` (or `$CRITERION_HOME`)
//! and `<target>/pmfs-report/tables/*.json` (see [`table`]). Outputs are one markdown page
//! and one SVG plot per criterion group, one page per table (those read and those
//! [`derived`] from the groups: pmfs against tmpfs, the data-path goals), and `index.md`.
//! Missing or broken inputs are skipped and listed in the index; they never stop the report.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub mod criterion;
pub mod derived;
pub mod format;
pub mod markdown;
pub mod svg;
pub mod table;

/// The cargo target directory: `$CARGO_TARGET_DIR`, else the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Where tools put the JSON tables the report includes.
pub fn tables_dir() -> PathBuf {
    Paths::for_target(&target_dir()).tables
}

/// Input and output locations of a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// Criterion's output directory.
    pub criterion: PathBuf,
    /// Directory of the JSON tables.
    pub tables: PathBuf,
    /// Where the report is written.
    pub out: PathBuf,
}

impl Paths {
    /// The locations under target directory `target` (criterion's honours `$CRITERION_HOME`,
    /// as criterion does).
    pub fn for_target(target: &Path) -> Self {
        let out = target.join("pmfs-report");
        Self {
            criterion: std::env::var_os("CRITERION_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| target.join("criterion")),
            tables: out.join("tables"),
            out,
        }
    }
}

/// What a report run produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Files written.
    pub written: Vec<PathBuf>,
    /// Inputs that were skipped, and why.
    pub warnings: Vec<String>,
}

/// A file name for `id`: letters, digits, `-`, `_` and `.` kept, anything else `_`; made
/// unique among `taken`.
fn slug(id: &str, taken: &mut HashSet<String>) -> String {
    let base: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let base = if base.is_empty() {
        "_".to_string()
    } else {
        base
    };
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

/// Reads every input and writes the report.
pub fn generate(paths: &Paths) -> io::Result<Summary> {
    let mut summary = Summary::default();
    let groups = criterion::group(criterion::scan(&paths.criterion, &mut summary.warnings));
    let mut tables = table::read_tables(&paths.tables, &mut summary.warnings);
    tables.extend(derived::tables(&groups));
    fs::create_dir_all(&paths.out)?;

    let mut taken = HashSet::from(["index".to_string()]);
    let mut write = |name: String, text: String| -> io::Result<()> {
        let p = paths.out.join(name);
        fs::write(&p, text)?;
        summary.written.push(p);
        Ok(())
    };
    let mut group_links = Vec::new();
    for g in &groups {
        let name = slug(&g.id, &mut taken);
        let (page, plot) = (format!("{name}.md"), format!("{name}.svg"));
        write(plot.clone(), svg::bar_chart(g))?;
        write(page.clone(), markdown::group_page(g, &plot))?;
        group_links.push(markdown::Link {
            title: g.id.clone(),
            page,
            plot: Some(plot),
        });
    }
    let mut table_links = Vec::new();
    for t in &tables {
        let page = format!("{}.md", slug(&format!("table-{}", t.name), &mut taken));
        write(page.clone(), markdown::table_page(&t.table))?;
        table_links.push(markdown::Link {
            title: t.table.title.clone(),
            page,
            plot: None,
        });
    }
    let index = markdown::index_page(&group_links, &table_links, &summary.warnings);
    write("index.md".to_string(), index)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_file_safe_and_unique() {
        let mut taken = HashSet::from(["index".to_string()]);
        assert_eq!(slug("fig5 locality/cold", &mut taken), "fig5_locality_cold");
        assert_eq!(
            slug("fig5 locality/cold", &mut taken),
            "fig5_locality_cold-2"
        );
        assert_eq!(slug("index", &mut taken), "index-2");
        assert_eq!(slug("", &mut taken), "_");
    }

    #[test]
    fn generate_writes_pages_plots_and_index_from_fixtures() {
        let root = std::env::temp_dir().join(format!("pmfs-report-gen-{}", std::process::id()));
        let paths = Paths {
            criterion: root.join("criterion"),
            tables: root.join("pmfs-report/tables"),
            out: root.join("pmfs-report"),
        };
        let new = paths.criterion.join("fig9/hashfs/95/new");
        fs::create_dir_all(&new).unwrap();
        fs::write(
            new.join("benchmark.json"),
            r#"{"group_id":"fig9 utilization","function_id":"hashfs","value_str":"95%","throughput":null}"#,
        )
        .unwrap();
        fs::write(
            new.join("estimates.json"),
            r#"{"median":{"point_estimate":123.0,"confidence_interval":{"lower_bound":120.0,"upper_bound":130.0}}}"#,
        )
        .unwrap();
        let broken = paths.criterion.join("fig9/extent/95/new");
        fs::create_dir_all(&broken).unwrap();
        table::Table {
            title: "Aging".into(),
            columns: vec!["structure".into()],
            rows: vec![vec!["hashfs".into()]],
            notes: String::new(),
        }
        .write(&paths.tables, "aging")
        .unwrap();

        let summary = generate(&paths).unwrap();
        assert_eq!(summary.written.len(), 4);
        assert_eq!(summary.warnings.len(), 1);
        let page = fs::read_to_string(paths.out.join("fig9_utilization.md")).unwrap();
        assert!(page.contains("| 95% | 123 ns |"));
        assert!(paths.out.join("fig9_utilization.svg").exists());
        let index = fs::read_to_string(paths.out.join("index.md")).unwrap();
        assert!(index.contains("[fig9 utilization](fig9_utilization.md)"));
        assert!(index.contains("[Aging](table-aging.md)"));
        assert!(index.contains("Skipped inputs"));
        fs::remove_dir_all(&root).unwrap();
    }
}
