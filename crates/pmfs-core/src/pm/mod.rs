//! Persistent-memory regions and persistence primitives.
//!
//! [`Media`] is the contract every backend implements; [`HeapRegion`] is the volatile heap
//! backend. [`persist`] holds the raw flush/fence/non-temporal-copy primitives.

mod heap;
mod media;
pub mod persist;
mod raw;

pub use heap::HeapRegion;
pub use media::{Media, MediaExt};
