//! A table describing the fixtures a suite measured (achieved layout score, utilisation,
//! metadata size), written next to criterion's results for the report.

use std::io;
use std::time::Duration;

use pmfs_core::Result;
use pmfs_core::layout::BLOCK_SIZE;

use super::structures::Structure;
use super::volume::Fixture;
use crate::report::table::{Cell, Table};

/// Rows describing measured fixtures.
#[derive(Debug)]
pub struct FixtureStats {
    table: Table,
}

impl FixtureStats {
    /// An empty table titled `title`.
    pub fn new(title: &str, notes: &str) -> Self {
        let columns = [
            "structure",
            "setup",
            "file blocks",
            "layout score",
            "capacity blocks",
            "utilisation",
            "metadata KiB",
            "setup s",
        ];
        Self {
            table: Table {
                title: title.to_string(),
                columns: columns.iter().map(|c| c.to_string()).collect(),
                rows: Vec::new(),
                notes: format!(
                    "{notes} Layout score: measured on the built file (HashFS places blocks by \
                     hashing, so its files are not contiguous). Metadata KiB: what a cold \
                     operation finds evicted — the structure's static area, the file's node \
                     blocks and, for structures that use it, the allocator's bitmap."
                ),
            },
        }
    }

    /// Adds a row for file `file` of `fx`, built as `setup` in `took`.
    pub fn add<S: Structure>(
        &mut self,
        fx: &Fixture<S>,
        file: usize,
        setup: &str,
        took: Duration,
    ) -> Result<()> {
        let capacity = fx.layout().data.len;
        let used: u64 = (0..fx.file_count()).map(|f| fx.file(f).blocks).sum();
        let meta_blocks: u64 = fx.metadata_areas(file)?.iter().map(|e| e.len).sum();
        let row: Vec<Cell> = vec![
            S::NAME.into(),
            setup.into(),
            fx.file(file).blocks.into(),
            round(fx.layout_score(file)?, 4).into(),
            capacity.into(),
            round(used as f64 / capacity as f64, 4).into(),
            (meta_blocks * BLOCK_SIZE / 1024).into(),
            round(took.as_secs_f64(), 2).into(),
        ];
        self.table.rows.push(row);
        Ok(())
    }

    /// Writes the table as `<target>/pmfs-report/tables/<name>.json`.
    pub fn write(&self, name: &str) -> io::Result<()> {
        self.table.write(&crate::report::tables_dir(), name)
    }

    /// The table.
    pub fn table(&self) -> &Table {
        &self.table
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::structures::Simple;
    use crate::mapping::volume::VolumeSpec;

    #[test]
    fn rows_describe_the_fixture() {
        let spec = VolumeSpec {
            data_blocks: 1000,
            max_files: 2,
        };
        let mut fx = Fixture::<Simple>::new(spec).unwrap();
        let f = fx.create_file().unwrap();
        let mut out = Vec::new();
        fx.append(f, 250, &mut out).unwrap();
        let mut stats = FixtureStats::new("t", "n");
        stats
            .add(&fx, f, "1 MiB", Duration::from_millis(1234))
            .unwrap();
        let row = &stats.table().rows[0];
        assert_eq!(row[0], Cell::Text("simple".into()));
        assert_eq!(row[2], Cell::Number(250.0));
        assert_eq!(row[3], Cell::Number(1.0));
        assert_eq!(row[5], Cell::Number(0.25));
        assert_eq!(row[6], Cell::Number(4.0), "the allocator bitmap block");
        assert_eq!(row[7], Cell::Number(1.23));
    }
}
