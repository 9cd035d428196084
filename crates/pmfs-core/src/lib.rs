//! # pmfs-core
//!
//! The media layer of pmfs. This crate owns every access to persistent-memory bytes:
//!
//! - [`pm`]: the [`Media`](pm::Media) contract, regions over pool files and heap memory, and the
//!   persistence primitives (flush, fence, non-temporal copy).
//! - [`layout`]: little-endian on-media types, typed offsets and block numbers, checksums.
//! - [`traits`]: the contracts of the pluggable parts, [`BlockAllocator`](traits::BlockAllocator)
//!   and [`FileMapping`](traits::FileMapping).
//!
//! It knows nothing about files, directories or inodes, and depends on no other pmfs crate.

pub mod cpu;
pub mod error;
pub mod layout;
pub mod log;
pub mod pm;
pub mod sim;
pub mod sync;
pub mod traits;

pub use error::{Error, Result};
