//! Harness of the file-mapping benches (HashFS paper, FAST'21, §4).
//!
//! A bench builds, for every [`Structure`], a [`Fixture`]: a fresh region laid out as
//! root words, the structure's metadata area and a data area; the structure formatted on it;
//! files grown with [`aging`] to the wanted size and layout score. It then measures
//! [`ops::Workload`]s — single lookups and appends, cold or hot — with criterion's
//! `iter_custom`, so that eviction and housekeeping are not timed.
//!
//! Data blocks are never read or written: only the mapping structures' own metadata is
//! touched, as in the paper, which measures the file-mapping operation alone.

pub mod aging;
pub mod bench;
pub mod cold;
pub mod ops;
pub mod scripted;
pub mod stats;
pub mod structures;
pub mod volume;

pub use ops::{Cache, Harness, Op, OpKind, Workload};
pub use structures::{Structure, Visitor, for_each_structure};
pub use volume::{Fixture, VolumeSpec};

/// Blocks in one GiB.
pub const GIB_BLOCKS: u64 = (1 << 30) / pmfs_core::layout::BLOCK_SIZE;

/// Blocks in one MiB.
pub const MIB_BLOCKS: u64 = (1 << 20) / pmfs_core::layout::BLOCK_SIZE;
