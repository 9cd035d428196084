//! Markdown pages: one per criterion group, one per JSON table, and the index.

use std::fmt::Write;

use super::criterion::Group;
use super::format;
use super::table::{Cell, Table};

fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn row(cells: impl IntoIterator<Item = String>) -> String {
    let cells: Vec<String> = cells.into_iter().map(|c| esc(&c)).collect();
    format!("| {} |\n", cells.join(" | "))
}

fn rule(n: usize) -> String {
    format!("|{}\n", "---|".repeat(n))
}

/// The page of a criterion group: a table of medians (rows = parameters, columns =
/// functions, throughput where declared) and the plot `svg_file`.
pub fn group_page(group: &Group, svg_file: &str) -> String {
    let mut s = format!("# {}\n\n", esc(&group.id));
    s.push_str("Median time per iteration");
    if group.cells.values().any(|m| m.id.throughput.is_some()) {
        s.push_str(", with the throughput it implies");
    }
    s.push_str(". Empty cells did not run.\n\n");
    s.push_str(&row(
        std::iter::once("parameter".to_string()).chain(group.columns.clone())
    ));
    s.push_str(&rule(group.columns.len() + 1));
    for (r, name) in group.rows.iter().enumerate() {
        let cells = (0..group.columns.len()).map(|c| match group.cell(r, c) {
            None => String::new(),
            Some(m) => {
                let t = format::time(m.estimate.median_ns);
                match m.id.throughput {
                    Some(tp) => format!("{t} ({})", format::throughput(tp, m.estimate.median_ns)),
                    None => t,
                }
            }
        });
        s.push_str(&row(std::iter::once(name.clone()).chain(cells)));
    }
    let _ = write!(s, "\n![{}]({})\n", esc(&group.id), svg_file);
    s
}

/// The page of a JSON table.
pub fn table_page(table: &Table) -> String {
    let mut s = format!("# {}\n\n", esc(&table.title));
    s.push_str(&table_body(table));
    if !table.notes.is_empty() {
        let _ = write!(s, "\n{}\n", table.notes);
    }
    s
}

fn table_body(table: &Table) -> String {
    let width = table
        .rows
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .max(table.columns.len())
        .max(1);
    let mut header = table.columns.clone();
    header.resize(width, String::new());
    let mut s = row(header);
    s.push_str(&rule(width));
    for r in &table.rows {
        let mut cells: Vec<String> = r
            .iter()
            .map(|c| match c {
                Cell::Text(t) => t.clone(),
                Cell::Number(n) => format::number(*n),
            })
            .collect();
        cells.resize(width, String::new());
        s.push_str(&row(cells));
    }
    s
}

/// An index entry: title and the file it links to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Text of the link.
    pub title: String,
    /// Relative path of the page.
    pub page: String,
    /// Relative path of the plot, if any.
    pub plot: Option<String>,
}

/// The index page linking every group page (with its plot) and every table page.
pub fn index_page(groups: &[Link], tables: &[Link], warnings: &[String]) -> String {
    let mut s = String::from("# pmfs benchmark report\n\n");
    s.push_str("## Criterion groups\n\n");
    if groups.is_empty() {
        s.push_str("No criterion results found.\n");
    }
    for g in groups {
        let _ = write!(s, "- [{}]({})", esc(&g.title), g.page);
        if let Some(p) = &g.plot {
            let _ = write!(s, " ([plot]({p}))");
        }
        s.push('\n');
    }
    s.push_str("\n## Tables\n\n");
    if tables.is_empty() {
        s.push_str("No tables found.\n");
    }
    for t in tables {
        let _ = writeln!(s, "- [{}]({})", esc(&t.title), t.page);
    }
    if !warnings.is_empty() {
        s.push_str("\n## Skipped inputs\n\n");
        for w in warnings {
            let _ = writeln!(s, "- {}", esc(w));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::criterion::{BenchId, Estimate, Measurement, Throughput};
    use std::collections::BTreeMap;

    #[test]
    fn group_page_is_a_median_table_with_units_and_throughput() {
        let m = |ns: f64, tp| Measurement {
            id: BenchId {
                group: "fig8".into(),
                function: None,
                value: None,
                throughput: tp,
            },
            estimate: Estimate {
                median_ns: ns,
                lower_ns: ns,
                upper_ns: ns,
            },
        };
        let mut cells = BTreeMap::new();
        cells.insert((0, 0), m(250.0, None));
        cells.insert((1, 1), m(16_000.0, Some(Throughput::Elements(16))));
        let g = Group {
            id: "fig8".into(),
            rows: vec!["1".into(), "16".into()],
            columns: vec!["extent".into(), "hashfs|x".into()],
            cells,
        };
        let page = group_page(&g, "fig8.svg");
        let lines: Vec<&str> = page.lines().collect();
        assert!(lines.contains(&"| parameter | extent | hashfs\\|x |"));
        assert!(lines.contains(&"|---|---|---|"));
        assert!(lines.contains(&"| 1 | 250 ns |  |"));
        assert!(lines.contains(&"| 16 |  | 16.0 µs (1.00 Melem/s) |"));
        assert!(page.contains("![fig8](fig8.svg)"));
    }

    #[test]
    fn table_page_pads_short_rows_and_shows_notes() {
        let t = Table {
            title: "Aging".into(),
            columns: vec!["structure".into(), "score".into(), "nodes".into()],
            rows: vec![vec!["extent".into(), 0.8512.into()], vec![]],
            notes: "measured after aging".into(),
        };
        let page = table_page(&t);
        assert!(page.contains("| extent | 0.8512 |  |\n"));
        assert!(page.contains("|  |  |  |\n"));
        assert!(page.ends_with("measured after aging\n"));
    }

    #[test]
    fn index_links_everything_and_lists_warnings() {
        let g = Link {
            title: "fig5".into(),
            page: "fig5.md".into(),
            plot: Some("fig5.svg".into()),
        };
        let t = Link {
            title: "Layout".into(),
            page: "table-layout.md".into(),
            plot: None,
        };
        let page = index_page(&[g], &[t], &["skipped x".into()]);
        assert!(page.contains("- [fig5](fig5.md) ([plot](fig5.svg))"));
        assert!(page.contains("- [Layout](table-layout.md)"));
        assert!(page.contains("- skipped x"));
        let empty = index_page(&[], &[], &[]);
        assert!(empty.contains("No criterion results found."));
        assert!(empty.contains("No tables found."));
        assert!(!empty.contains("Skipped"));
    }
}
