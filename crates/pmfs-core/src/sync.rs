//! The synchronisation facade: `std` primitives in ordinary builds, [loom]'s model-checked
//! versions when built with `--cfg loom`.
//!
//! In-DRAM coordination of pmfs-core (the [`log`](crate::log)'s tail hint, grace periods and
//! retire queue) imports its atomics, locks and cells from here and nowhere else, so that a
//! loom model explores every interleaving and weak-memory outcome of that code:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p pmfs-core --release --test loom_log
//! ```
//!
//! Other crates may use the facade for their own loom models. Persistent-memory words are
//! *not* covered: they go through [`Media`](crate::pm::Media), and a loom model supplies a
//! media whose words are loom atomics (see `tests/loom_log.rs`).
//!
//! [`UnsafeCell`] follows loom's closure API (`with`, `with_mut`) in both builds, so code
//! written against it compiles either way.
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(loom))]
pub use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Atomic types, orderings and fences.
pub mod atomic {
    #[cfg(not(loom))]
    pub use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
    };

    #[cfg(loom)]
    pub use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
    };

    /// A sequentially consistent fence for a thread whose stores since its previous fence
    /// were all atomic read-modify-writes (a pin's count, a compare-and-swap of a slot word),
    /// placed between such a write and the loads of a Dekker handshake. On x86-64 each of
    /// those writes is a locked instruction: no later load passes it, and its store is seen
    /// by every other core at once, so only the compiler needs holding back, and an `mfence`
    /// would only add to the cost. On other targets, and under loom and miri, which check the
    /// language's memory model rather than the CPU's, a `SeqCst` fence.
    #[inline]
    pub fn fence_after_rmw() {
        #[cfg(not(loom))]
        super::native::fence_after_rmw();
        #[cfg(loom)]
        fence(Ordering::SeqCst);
    }
}

/// Fences that are `std`'s in every build, loom's included: for code that a loom build
/// compiles but that runs outside loom's models, such as setting up the state a model
/// starts from, where loom's own primitives cannot run.
pub mod native {
    use std::sync::atomic::Ordering;

    /// [`atomic::fence_after_rmw`](super::atomic::fence_after_rmw) on `std`'s fences.
    #[inline]
    pub fn fence_after_rmw() {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// Thread spawning and yielding.
pub mod thread {
    #[cfg(not(loom))]
    pub use std::thread::{JoinHandle, spawn, yield_now};

    #[cfg(loom)]
    pub use loom::thread::{JoinHandle, spawn, yield_now};
}

#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` behind loom's closure API.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a shared raw pointer to the value.
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a mutable raw pointer to the value.
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }

    /// Unwraps the value.
    pub fn into_inner(self) -> T {
        self.0.into_inner()
    }
}
