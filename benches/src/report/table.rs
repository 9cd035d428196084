//! The JSON tables tools write to `<target>/pmfs-report/tables/*.json`:
//! `{"title": str, "columns": [str], "rows": [[str | number]], "notes": str}`.

use std::fs;
use std::io;
use std::path::Path;

use serde_json::{Map, Value, json};

/// One cell of a [`Table`].
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Text, shown as is.
    Text(String),
    /// A number, shown with up to 4 significant digits.
    Number(f64),
}

impl From<&str> for Cell {
    fn from(s: &str) -> Self {
        Cell::Text(s.to_string())
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Self {
        Cell::Text(s)
    }
}

impl From<f64> for Cell {
    fn from(n: f64) -> Self {
        Cell::Number(n)
    }
}

impl From<u64> for Cell {
    fn from(n: u64) -> Self {
        Cell::Number(n as f64)
    }
}

/// A titled table of results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// Title.
    pub title: String,
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows; a row may be shorter than the header (missing cells stay empty).
    pub rows: Vec<Vec<Cell>>,
    /// Free text shown under the table.
    pub notes: String,
}

impl Table {
    /// Parses the JSON form. `title` and `columns` are required; `rows` and `notes` may be
    /// missing; `null` cells become empty text.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let title = v
            .get("title")
            .and_then(Value::as_str)
            .ok_or("no title")?
            .to_string();
        let columns = v
            .get("columns")
            .and_then(Value::as_array)
            .ok_or("no columns")?
            .iter()
            .map(|c| {
                c.as_str()
                    .map(str::to_string)
                    .ok_or("column is not a string")
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rows = match v.get("rows") {
            None | Some(Value::Null) => Vec::new(),
            Some(r) => r
                .as_array()
                .ok_or("rows is not an array")?
                .iter()
                .map(parse_row)
                .collect::<Result<Vec<_>, _>>()?,
        };
        let notes = v
            .get("notes")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Ok(Self {
            title,
            columns,
            rows,
            notes,
        })
    }

    /// The JSON form.
    pub fn to_json(&self) -> String {
        let rows: Vec<Value> =
            self.rows
                .iter()
                .map(|r| {
                    Value::Array(
                        r.iter()
                            .map(|c| match c {
                                Cell::Text(s) => Value::String(s.clone()),
                                Cell::Number(n) => serde_json::Number::from_f64(*n)
                                    .map_or(Value::Null, Value::Number),
                            })
                            .collect(),
                    )
                })
                .collect();
        let mut obj = Map::new();
        obj.insert("title".into(), json!(self.title));
        obj.insert("columns".into(), json!(self.columns));
        obj.insert("rows".into(), Value::Array(rows));
        obj.insert("notes".into(), json!(self.notes));
        serde_json::to_string_pretty(&Value::Object(obj)).unwrap_or_default()
    }

    /// Writes the table as `<dir>/<name>.json`, creating `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<()> {
        fs::create_dir_all(dir)?;
        fs::write(dir.join(format!("{name}.json")), self.to_json())
    }
}

fn parse_row(r: &Value) -> Result<Vec<Cell>, String> {
    r.as_array()
        .ok_or("row is not an array")?
        .iter()
        .map(|c| match c {
            Value::String(s) => Ok(Cell::Text(s.clone())),
            Value::Number(n) => n.as_f64().map(Cell::Number).ok_or("bad number".into()),
            Value::Null => Ok(Cell::Text(String::new())),
            other => Err(format!("cell {other} is neither text nor number")),
        })
        .collect()
}

/// A table read from a file, with the file's stem as its name.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTable {
    /// File stem (`cffs-layout` for `cffs-layout.json`).
    pub name: String,
    /// The table.
    pub table: Table,
}

/// Reads every `*.json` table in `dir`, sorted by name. Unreadable tables are skipped with a
/// line in `warnings`; a missing directory holds no tables.
pub fn read_tables(dir: &Path, warnings: &mut Vec<String>) -> Vec<NamedTable> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| {
            let name = p.file_stem()?.to_string_lossy().into_owned();
            let parsed = fs::read_to_string(&p)
                .map_err(|e| e.to_string())
                .and_then(|j| Table::from_json(&j));
            match parsed {
                Ok(table) => Some(NamedTable { name, table }),
                Err(e) => {
                    warnings.push(format!("skipped table {}: {e}", p.display()));
                    None
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_and_tolerate_missing_parts() {
        let t = Table {
            title: "Layout".into(),
            columns: vec!["structure".into(), "score".into()],
            rows: vec![vec!["extent".into(), 0.85.into()], vec!["radix".into()]],
            notes: "aged".into(),
        };
        assert_eq!(Table::from_json(&t.to_json()).unwrap(), t);
        let min = Table::from_json(r#"{"title":"t","columns":["a"],"rows":[[null, 3]]}"#).unwrap();
        assert_eq!(
            min.rows,
            vec![vec![Cell::Text(String::new()), Cell::Number(3.0)]]
        );
        assert_eq!(min.notes, "");
        assert!(Table::from_json(r#"{"columns":["a"]}"#).is_err());
        assert!(Table::from_json(r#"{"title":"t","columns":["a"],"rows":[[[1]]]}"#).is_err());
        assert!(Table::from_json(r#"{"title":"t","columns":[1]}"#).is_err());
    }

    #[test]
    fn read_tables_skips_broken_files() {
        let dir = std::env::temp_dir().join(format!("pmfs-report-tables-{}", std::process::id()));
        let t = Table {
            title: "T".into(),
            columns: vec!["x".into()],
            ..Table::default()
        };
        t.write(&dir, "good").unwrap();
        fs::write(dir.join("bad.json"), "{").unwrap();
        fs::write(dir.join("other.txt"), "ignored").unwrap();
        let mut warnings = Vec::new();
        let tables = read_tables(&dir, &mut warnings);
        assert_eq!(tables.len(), 1);
        assert_eq!(tables[0].name, "good");
        assert_eq!(tables[0].table, t);
        assert_eq!(warnings.len(), 1);
        fs::remove_dir_all(&dir).unwrap();
        assert!(read_tables(&dir, &mut warnings).is_empty());
    }
}
