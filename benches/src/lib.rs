//! # pmfs-benches
//!
//! Shared helpers for the criterion suites in `benches/benches/` and the report tool
//! (`src/bin/report.rs`).
//!
//! - [`data`]: the subjects (pmfs volumes of every mapping structure, tmpfs) and offset
//!   patterns of the data-path benches that reproduce Figures 6 and 8 of the MadFS paper.
//! - [`mapping`]: the harness of the file-mapping benches that reproduce §4 of the HashFS
//!   paper (FAST'21): volumes sized for each structure, files aged to a layout score, cold-cache
//!   eviction and per-operation timing, generic over
//!   [`FileMapping`](pmfs_core::traits::FileMapping).
//! - [`report`]: reading criterion's output and the JSON tables other tools write, and rendering
//!   them as markdown and SVG.
//!
//! The crate measures; it asserts nothing about performance.

#![forbid(unsafe_code)]

use std::time::Duration;

pub mod data;
pub mod mapping;
pub mod report;

/// Criterion warm-up time every pmfs suite uses.
pub const WARM_UP: Duration = Duration::from_millis(500);
/// Criterion measurement time every pmfs suite uses.
pub const MEASUREMENT: Duration = Duration::from_secs(2);
/// Criterion sample size every pmfs suite uses.
pub const SAMPLE_SIZE: usize = 20;
