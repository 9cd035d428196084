//! The crash simulator: a [`Media`](crate::pm::Media) backend that knows what a power failure
//! would leave on media, and an [`Explorer`] that checks every such post-crash image.
//!
//! # Using it
//!
//! Set up a [`SimRegion`] (format a structure, [`persist_all`](SimRegion::persist_all) or
//! persist what the format persists), then [`Explorer::run`] a workload on it with a checker.
//! The checker is called synchronously from inside each fence the workload issues, so it can
//! read progress counters the workload updates between operations.
//!
//! ```
//! use std::cell::Cell;
//! use pmfs_core::layout::PmOff;
//! use pmfs_core::pm::Media;
//! use pmfs_core::sim::{Explorer, SimRegion};
//!
//! // Protocol: write the data, persist it, then publish a valid flag and persist that.
//! let region = SimRegion::new(4096).unwrap();
//! let published = Cell::new(false);
//! let stats = Explorer::new(7)
//!     .run(
//!         &region,
//!         |pm| {
//!             pm.write(PmOff(128), b"payload!").unwrap();
//!             pm.persist(PmOff(128), 8).unwrap();
//!             pm.store_u64_persist(PmOff(0), 1).unwrap();
//!             published.set(true);
//!         },
//!         |cp| {
//!             let flag = u64::from_le_bytes(cp.image[0..8].try_into().unwrap());
//!             if flag == 1 && &cp.image[128..136] != b"payload!" {
//!                 return Err("flag set but payload missing".into());
//!             }
//!             if cp.end && published.get() && flag != 1 {
//!                 return Err("published but the flag is not durable".into());
//!             }
//!             Ok(())
//!         },
//!     )
//!     .unwrap();
//! assert_eq!(stats.fences, 2);
//! ```
//!
//! A checker that opens a structure on the image can wrap it in an [`ImageRegion`] (a
//! [`Media`](crate::pm::Media) that reads the image and keeps recovery's writes in a private
//! overlay, without copying the region), or copy it into a
//! [`HeapRegion`](crate::pm::HeapRegion). To explore crashes *during recovery*, load the image
//! into a [`SimRegion::from_image`] and run a nested [`Explorer`] on it from the checker.
//!
//! A rejected image comes back as a [`CrashFailure`]; [`CrashFailure::save`] writes it to a
//! small text file and a regression test replays the checker on
//! [`CrashFailure::load`]'s result with [`CrashFailure::replay`].
//!
//! # The model
//!
//! The region is cut into 64-byte cache lines. For each line the simulator keeps the content
//! the program sees and, while the two may differ, a *log*: a base content surely on media
//! and the stores since, in program order, each split into 8-byte-aligned word pieces (a
//! store never tears inside an aligned word; a wider or unaligned store is a sequence of word
//! stores, lowest address first). Following x86 with ADR:
//!
//! - An ordinary store ([`write`](crate::pm::Media::write), `store_u64`, a successful
//!   `cas_u64`) changes the cache only. The line may be written back at any moment on its own
//!   (eviction), with its content at that moment.
//! - A flush (clwb/clflushopt) takes the line's content at flush time; that snapshot (or a
//!   later one) is surely on media after the next fence. Stores after the flush need another
//!   flush. A flush of a line without pending stores does nothing.
//! - A non-temporal store ([`write_nt`](crate::pm::Media::write_nt), `fill_nt`) is surely on
//!   media after the next fence, flushed or not; it does not make the earlier ordinary stores
//!   of its line durable.
//! - A fence makes the above guarantees take effect. It orders nothing else: lines never
//!   flushed stay uncertain across any number of fences.
//!
//! Hence, with `c(p)` the line's content after the first `p` stores of its log, a crash
//! leaves the line in state `c(p)` plus every store already guaranteed durable that comes
//! after `p` (fenced non-temporal stores), for some `p` from 0 (the durable content) to the
//! log's length (the content the program sees). Lines are independent of each other.
//!
//! **Crash points.** A crash is simulated just before each fence takes effect, and once
//! after the workload returns. Every state right after a fence is also a state right before
//! it (a fence only removes possibilities), and under ADR a crash at any moment between two
//! fences leaves each line in one of the states the next crash point offers (the guarantees
//! are the same, the line has only gained stores). So with store prefixes and exhaustive
//! enumeration the points cover every moment of the workload; without prefixes they cover
//! the two extreme states of each line, and sampling covers a subset.
//!
//! **Images.** A crash image is the durable content of the region with each uncertain line
//! in one of its states. By default a line has two states, durable and latest (the issue's
//! "any subset of the lines not yet durable"); with
//! [`Explorer::store_prefixes`] it has every distinct `c(p)` (as in Vinter), which also catches
//! protocols that rely on the order of stores inside one line. Lines whose states all agree
//! do not count. A point with at most [`Explorer::exhaustive_limit`] images (the product of
//! the lines' state counts) is enumerated exhaustively, the first line varying fastest,
//! starting from the durable image; beyond, [`Explorer::samples`] distinct images are drawn:
//! the durable image, the program's view, then random ones from a SplitMix64 generator
//! seeded by the explorer's seed and the point's fence index. Same seed and workload, same
//! images in the same order, on every platform.
//!
//! **eADR.** [`SimRegion::new_eadr`] models caches inside the persistence domain: ordinary
//! stores are durable as soon as they are done, [`needs_flush`](crate::pm::Media::needs_flush)
//! is `false`, and only non-temporal stores wait for a fence. Crash points are still the
//! fences, where every ordinary store done so far is durable: a crash *between* two ordinary
//! stores (the first durable, the second not yet done) is not simulated under eADR.
//!
//! # Limits
//!
//! - Single-threaded workloads: the order of stores is the program order of one thread; a
//!   fence on the region from another thread during a run panics. Concurrency belongs to
//!   loom tests.
//! - No torn 8-byte words: an aligned word store is all-or-nothing, as x86 guarantees; wider
//!   stores (a `write` of a whole line included) may be cut at word boundaries only with store
//!   prefixes, and only in ascending address order within a line (a `memcpy` that writes
//!   backwards is not modelled).
//! - Without store prefixes the states between the durable and the latest content of a line
//!   are not explored, so reordering of stores to different words of one line is only caught
//!   with prefixes.
//! - A non-temporal store is assumed to land as a whole on the words it covers; the
//!   write-back of the line's older cached content that a real CPU performs when a
//!   non-temporal store hits a cached line is not taken as a guarantee.
//! - Every flush is treated like clwb/clflushopt (durable at the next fence), including a
//!   plain clflush, which real CPUs order more strictly: the model is the weaker one.
//! - A line stored to more than 256 times without becoming durable has its log compacted:
//!   a store immediately overwritten by the next store to the same word (and no flush in
//!   between) is forgotten, so with store prefixes the state between the two is no longer
//!   offered. Every state that remains is one the line really had.
//! - Media errors, poisoned lines and partial line writes below word granularity are not
//!   simulated; neither are other processes mapping the region.
//! - Crash points are at fences only (and the end): each image is a legal state at that
//!   point, and under ADR with store prefixes every legal state of every earlier moment since
//!   the previous fence is among them. Under eADR the moments between two ordinary stores
//!   are not covered (see above).

mod explorer;
mod failure;
mod hook;
mod image;
mod line;
mod region;

pub use explorer::{
    CrashPoint, DEFAULT_EXHAUSTIVE_LIMIT, DEFAULT_SAMPLES, Explorer, SAMPLES_ENV, Stats,
};
pub use failure::{CrashFailure, LineChoice};
pub use image::ImageRegion;
pub use region::SimRegion;
