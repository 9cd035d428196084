//! Renders the benchmark report.
//!
//! ```sh
//! cargo run -p pmfs-benches --release --bin report [TARGET_DIR]
//! ```
//!
//! Reads criterion's results and the JSON tables under the target directory (the argument,
//! else `$CARGO_TARGET_DIR`, else the workspace's `target/`) and writes markdown pages, SVG
//! plots and `index.md` to `<target>/pmfs-report/`.

use std::path::PathBuf;
use std::process::ExitCode;

use pmfs_benches::report::{Paths, generate, target_dir};

fn main() -> ExitCode {
    let target = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(target_dir);
    let paths = Paths::for_target(&target);
    match generate(&paths) {
        Ok(summary) => {
            for w in &summary.warnings {
                eprintln!("warning: {w}");
            }
            eprintln!(
                "wrote {} files; open {}",
                summary.written.len(),
                paths.out.join("index.md").display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("report failed: {e}");
            ExitCode::FAILURE
        }
    }
}
