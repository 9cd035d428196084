//! # pmfs-alloc
//!
//! Block allocators for pmfs, all behind pmfs-core's
//! [`BlockAllocator`](pmfs_core::traits::BlockAllocator) contract:
//!
//! - [`baseline`]: the classic free-extent allocator (an ordered map of free extents) over a
//!   persistent bitmap, the allocator the HashFS paper compared against.
//! - [`cffs`]: CFFS contiguity-first allocation — greedy buddy lists over groups of 2 MiB
//!   pages, growing- and fixed-size allocators, implicit preallocation by fragment extension,
//!   the extension LRU and NMRU placement; volatile, rebuilt from the used extents.
//! - [`cache`]: per-thread free-block caches (MadFS) in front of any of them.
//! - [`aging`]: layouts with a chosen layout score (HashFS §4) or a chosen free-space
//!   fragmentation (CFFS Fig. 13), for benchmarks.
//!
//! This crate owns free-space management only. It knows nothing about files, inodes or
//! mappings: callers describe what an allocation is for with an
//! [`AllocHint`](pmfs_core::traits::AllocHint), and after a crash they hand the allocators the
//! extents that are in use.
#![forbid(unsafe_code)]

pub mod aging;
pub mod baseline;
pub mod cache;
pub mod cffs;
mod runs;

pub use baseline::FreeExtentAllocator;
pub use cache::{CacheConfig, ThreadCached};
pub use cffs::{CffsAllocator, CffsConfig};
