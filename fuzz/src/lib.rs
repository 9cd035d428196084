//! Shared code of the pmfs fuzz targets (`fuzz_targets/`): the volumes and base images they
//! start from ([`common`]) and the in-memory model of a file tree that operation sequences
//! are checked against ([`model`]).
//!
//! Run a target with `cargo +nightly fuzz run <target>` from the repository root;
//! `scripts/fuzz.sh` runs every target for a short time.

pub mod common;
pub mod model;
