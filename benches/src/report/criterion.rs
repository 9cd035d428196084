//! Reading criterion's output: `<criterion dir>/**/new/{benchmark,estimates}.json`.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde_json::Value;

/// What one benchmark processes per iteration (criterion's `Throughput`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Throughput {
    /// Bytes, shown with binary prefixes.
    Bytes(u64),
    /// Bytes, shown with decimal prefixes.
    BytesDecimal(u64),
    /// Elements (here: blocks).
    Elements(u64),
}

/// The median of one benchmark with its confidence interval, in nanoseconds per iteration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Median time per iteration.
    pub median_ns: f64,
    /// Lower bound of the median's confidence interval.
    pub lower_ns: f64,
    /// Upper bound of the median's confidence interval.
    pub upper_ns: f64,
}

/// Identity of one benchmark (criterion's `benchmark.json`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchId {
    /// The group.
    pub group: String,
    /// The function inside the group, if named.
    pub function: Option<String>,
    /// The parameter, if any.
    pub value: Option<String>,
    /// What an iteration processes, if declared.
    pub throughput: Option<Throughput>,
}

/// One benchmark's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// Which benchmark.
    pub id: BenchId,
    /// Its median.
    pub estimate: Estimate,
}

/// Parses criterion's `benchmark.json`.
pub fn parse_benchmark(json: &str) -> Result<BenchId, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let group = v
        .get("group_id")
        .and_then(Value::as_str)
        .ok_or("no group_id")?
        .to_string();
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let throughput = match v.get("throughput") {
        None | Some(Value::Null) => None,
        Some(t) => Some(parse_throughput(t)?),
    };
    Ok(BenchId {
        group,
        function: text("function_id"),
        value: text("value_str"),
        throughput,
    })
}

fn parse_throughput(t: &Value) -> Result<Throughput, String> {
    let obj = t.as_object().ok_or("throughput is not an object")?;
    let (kind, n) = obj.iter().next().ok_or("empty throughput")?;
    let n = n.as_u64().ok_or("throughput is not a count")?;
    match kind.as_str() {
        "Bytes" => Ok(Throughput::Bytes(n)),
        "BytesDecimal" => Ok(Throughput::BytesDecimal(n)),
        "Elements" => Ok(Throughput::Elements(n)),
        other => Err(format!("unknown throughput {other}")),
    }
}

/// Parses criterion's `estimates.json` (the median and its confidence interval).
pub fn parse_estimates(json: &str) -> Result<Estimate, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let median = v.get("median").ok_or("no median")?;
    let num = |p: &[&str]| {
        p.iter()
            .try_fold(median, |v, k| v.get(*k))
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("no median {}", p.join(".")))
    };
    let median_ns = num(&["point_estimate"])?;
    Ok(Estimate {
        median_ns,
        lower_ns: num(&["confidence_interval", "lower_bound"]).unwrap_or(median_ns),
        upper_ns: num(&["confidence_interval", "upper_bound"]).unwrap_or(median_ns),
    })
}

/// Finds every benchmark under `dir` (criterion's output directory). Unreadable or partial
/// results are skipped with a line in `warnings`.
pub fn scan(dir: &Path, warnings: &mut Vec<String>) -> Vec<Measurement> {
    let mut out = Vec::new();
    scan_dir(dir, warnings, &mut out);
    out
}

fn scan_dir(dir: &Path, warnings: &mut Vec<String>, out: &mut Vec<Measurement>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut subdirs: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    subdirs.sort();
    for sub in subdirs {
        match sub.file_name().and_then(|n| n.to_str()) {
            Some("new") => {
                if let Some(m) = read_result(&sub, warnings) {
                    out.push(m);
                }
            }
            Some("base" | "change" | "report") => {}
            _ => scan_dir(&sub, warnings, out),
        }
    }
}

fn read_result(new_dir: &Path, warnings: &mut Vec<String>) -> Option<Measurement> {
    let read = |name: &str| fs::read_to_string(new_dir.join(name));
    let parsed = read("benchmark.json")
        .map_err(|e| format!("benchmark.json: {e}"))
        .and_then(|j| parse_benchmark(&j).map_err(|e| format!("benchmark.json: {e}")))
        .and_then(|id| {
            read("estimates.json")
                .map_err(|e| format!("estimates.json: {e}"))
                .and_then(|j| parse_estimates(&j).map_err(|e| format!("estimates.json: {e}")))
                .map(|estimate| Measurement { id, estimate })
        });
    match parsed {
        Ok(m) => Some(m),
        Err(e) => {
            warnings.push(format!("skipped {}: {e}", new_dir.display()));
            None
        }
    }
}

/// The benchmarks of one criterion group as a table: rows are parameters, columns functions.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The group id.
    pub id: String,
    /// Row labels (parameters), in natural order.
    pub rows: Vec<String>,
    /// Column labels (functions), in natural order.
    pub columns: Vec<String>,
    /// Results by (row, column) index.
    pub cells: BTreeMap<(usize, usize), Measurement>,
}

impl Group {
    /// The result at `row`, `col`, if that benchmark ran.
    pub fn cell(&self, row: usize, col: usize) -> Option<&Measurement> {
        self.cells.get(&(row, col))
    }
}

/// Label of the row a benchmark belongs to.
fn row_label(id: &BenchId) -> String {
    id.value.clone().unwrap_or_else(|| "-".to_string())
}

/// Label of the column a benchmark belongs to.
fn column_label(id: &BenchId) -> String {
    id.function.clone().unwrap_or_else(|| id.group.clone())
}

/// Arranges measurements into one table per group, groups in natural order of their ids.
pub fn group(measurements: Vec<Measurement>) -> Vec<Group> {
    let mut by_group: BTreeMap<String, Vec<Measurement>> = BTreeMap::new();
    for m in measurements {
        by_group.entry(m.id.group.clone()).or_default().push(m);
    }
    let mut groups: Vec<Group> = by_group
        .into_iter()
        .map(|(id, ms)| {
            let rows = sorted_unique(ms.iter().map(|m| row_label(&m.id)));
            let columns = sorted_unique(ms.iter().map(|m| column_label(&m.id)));
            let mut cells = BTreeMap::new();
            for m in ms {
                let r = rows.iter().position(|x| *x == row_label(&m.id));
                let c = columns.iter().position(|x| *x == column_label(&m.id));
                if let (Some(r), Some(c)) = (r, c) {
                    cells.insert((r, c), m);
                }
            }
            Group {
                id,
                rows,
                columns,
                cells,
            }
        })
        .collect();
    groups.sort_by(|a, b| natural_cmp(&a.id, &b.id));
    groups
}

fn sorted_unique(labels: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = labels.collect();
    v.sort_by(|a, b| natural_cmp(a, b));
    v.dedup();
    v
}

/// Compares strings so that embedded numbers sort by value (`4 KiB` < `16 KiB` < `4 MiB` is
/// not attempted; `t2` < `t10` and `0.7` < `0.85` are).
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (ta, tb) = (tokens(a), tokens(b));
    for (x, y) in ta.iter().zip(&tb) {
        let o = match (x, y) {
            (Token::Num(p), Token::Num(q)) => p.partial_cmp(q).unwrap_or(Ordering::Equal),
            (Token::Num(_), Token::Text(_)) => Ordering::Less,
            (Token::Text(_), Token::Num(_)) => Ordering::Greater,
            (Token::Text(p), Token::Text(q)) => p.cmp(q),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ta.len().cmp(&tb.len()).then_with(|| a.cmp(b))
}

#[derive(Debug)]
enum Token<'a> {
    Num(f64),
    Text(&'a str),
}

fn tokens(s: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let digit = b[i].is_ascii_digit();
        while i < b.len() && (b[i].is_ascii_digit() || (digit && b[i] == b'.')) == digit {
            i += 1;
        }
        let t = &s[start..i];
        match t.parse::<f64>() {
            Ok(n) if digit => out.push(Token::Num(n)),
            _ => out.push(Token::Text(t)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BENCH: &str = r#"{"group_id":"fig5_locality","function_id":"hashfs",
        "value_str":"cold-rand-lookup","throughput":{"Elements":16},
        "full_id":"fig5_locality/hashfs/cold-rand-lookup","directory_name":"x"}"#;
    const EST: &str = r#"{"mean":{"confidence_interval":{"confidence_level":0.95,
        "lower_bound":1.0,"upper_bound":3.0},"point_estimate":2.0,"standard_error":0.1},
        "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":95.5,
        "upper_bound":110.0},"point_estimate":100.25,"standard_error":2.0},
        "median_abs_dev":null,"slope":null,"std_dev":null}"#;

    fn m(group: &str, function: Option<&str>, value: Option<&str>, ns: f64) -> Measurement {
        Measurement {
            id: BenchId {
                group: group.into(),
                function: function.map(Into::into),
                value: value.map(Into::into),
                throughput: None,
            },
            estimate: Estimate {
                median_ns: ns,
                lower_ns: ns,
                upper_ns: ns,
            },
        }
    }

    #[test]
    fn parses_criterion_json() {
        let id = parse_benchmark(BENCH).unwrap();
        assert_eq!(id.group, "fig5_locality");
        assert_eq!(id.function.as_deref(), Some("hashfs"));
        assert_eq!(id.value.as_deref(), Some("cold-rand-lookup"));
        assert_eq!(id.throughput, Some(Throughput::Elements(16)));
        let e = parse_estimates(EST).unwrap();
        assert_eq!((e.median_ns, e.lower_ns, e.upper_ns), (100.25, 95.5, 110.0));
        let bare = parse_benchmark(
            r#"{"group_id":"g","function_id":null,"value_str":null,"throughput":null}"#,
        )
        .unwrap();
        assert_eq!(
            (bare.function, bare.value, bare.throughput),
            (None, None, None)
        );
        assert!(parse_benchmark(r#"{"function_id":"f"}"#).is_err());
        assert!(parse_benchmark(r#"{"group_id":"g","throughput":{"Lines":3}}"#).is_err());
        assert!(parse_estimates(r#"{"mean":{}}"#).is_err());
        assert!(parse_estimates("not json").is_err());
    }

    #[test]
    fn scan_finds_results_and_reports_partial_ones() {
        let dir = std::env::temp_dir().join(format!("pmfs-report-scan-{}", std::process::id()));
        let ok = dir.join("fig5_locality/hashfs/cold-rand-lookup/new");
        let partial = dir.join("fig5_locality/extent/cold-rand-lookup/new");
        let ignored = dir.join("fig5_locality/hashfs/cold-rand-lookup/base");
        for d in [&ok, &partial, &ignored] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(ok.join("benchmark.json"), BENCH).unwrap();
        fs::write(ok.join("estimates.json"), EST).unwrap();
        fs::write(partial.join("benchmark.json"), BENCH).unwrap();
        fs::write(ignored.join("benchmark.json"), "garbage").unwrap();
        let mut warnings = Vec::new();
        let found = scan(&dir, &mut warnings);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].estimate.median_ns, 100.25);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("estimates.json"), "{warnings:?}");
        assert!(scan(&dir.join("missing"), &mut warnings).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn groups_become_tables_in_natural_order() {
        let groups = group(vec![
            m("fig8", Some("radix"), Some("256"), 3.0),
            m("fig8", Some("hashfs"), Some("16"), 2.0),
            m("fig8", Some("radix"), Some("1"), 1.0),
            m("fig10", None, None, 5.0),
        ]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].id, "fig8");
        assert_eq!(groups[0].rows, vec!["1", "16", "256"]);
        assert_eq!(groups[0].columns, vec!["hashfs", "radix"]);
        assert_eq!(groups[0].cell(2, 1).unwrap().estimate.median_ns, 3.0);
        assert!(groups[0].cell(0, 0).is_none());
        assert_eq!(groups[1].rows, vec!["-"]);
        assert_eq!(groups[1].columns, vec!["fig10"]);
    }

    #[test]
    fn natural_order_compares_numbers_by_value() {
        let mut v = vec!["t10", "t2", "ls=0.85", "ls=0.7", "ls=1", "a"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, vec!["a", "ls=0.7", "ls=0.85", "ls=1", "t2", "t10"]);
    }
}
