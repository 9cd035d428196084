//! Persistent-memory regions and persistence primitives.
//!
//! - [`Media`] is the contract every backend implements: bounds-checked reads and writes,
//!   explicit flush/fence/persist, 8-byte atomics.
//! - [`PmRegion`] maps a pool file (2 MiB aligned, `MAP_SYNC` when the file system is DAX on
//!   persistent memory), with an `mmap` backend and, behind the `libpmem` feature, a libpmem
//!   backend; see [`region`](PmRegion) for what "real PM" means and how the fallback works.
//! - [`ReadOnlyRegion`] maps a pool file that may only be read; its writes fail.
//! - [`HeapRegion`] is a volatile heap buffer for tests and tools.
//! - [`ShadowRegion`] is a copy-on-write view of another region that keeps its changes in
//!   memory (the checker recovers a crashed volume in one).
//! - [`Tapped`] shows each access to another region to a [`Tap`] first, which may count it,
//!   run something before it or refuse it: how tests inject failures and bound work.
//! - [`persist`] holds the raw primitives: `clwb` > `clflushopt` > `clflush` and AVX-512 >
//!   AVX2 > SSE2 streaming stores chosen at run time, `sfence`, and the eADR switch.

mod heap;
mod media;
pub mod persist;
pub mod procs;
mod raw;
mod read_only;
mod region;
mod shadow;
mod tap;

pub use heap::HeapRegion;
pub use media::{Media, MediaExt};
pub use read_only::ReadOnlyRegion;
pub use region::{Backend, MIN_POOL_SIZE, PmRegion, preallocate};
pub use shadow::ShadowRegion;
pub use tap::{Tap, Tapped};
