//! The contracts between the engine and its pluggable parts: [`BlockAllocator`] and
//! [`FileMapping`], each with the simplest correct implementation (for tests) and, behind the
//! `testing` feature, a conformance suite every implementation runs.

mod alloc;
#[cfg(feature = "testing")]
pub mod conformance;
mod mapping;
mod simple_alloc;
mod simple_mapping;

pub use alloc::{AllocHint, AllocKind, BlockAllocator, Extent};
pub use mapping::{
    FileId, FileMapping, MappingKind, Run, Runs, first_mapped_by_lookups, maps_exactly, merge_runs,
};
pub use simple_alloc::SimpleAllocator;
pub use simple_mapping::SimpleMapping;
