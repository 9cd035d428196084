//! How a fence inside a workload reaches the explorer that runs it.
//!
//! [`Explorer::run`](super::Explorer::run) borrows its checker only for the duration of the
//! run, and the region is shared (`Sync`), so the checker cannot live in the region. Instead
//! the run registers its session in a thread-local table keyed by region id, and
//! [`SimRegion::fence`](super::SimRegion) looks it up there. Fences from other threads find
//! nothing, so a session (which need not be `Send`) is only ever called on its own thread.

use std::cell::RefCell;
use std::marker::PhantomData;

use super::region::Snapshot;

/// The explorer side of a crash point.
pub(crate) trait Hook {
    /// Whether lines offer every store prefix as a crash state.
    fn prefixes(&self) -> bool;
    /// Checks the crash images of `snap`; `end` marks the point after the workload.
    fn crash_point(&mut self, snap: Snapshot, end: bool);
}

/// A registered session, its lifetime erased; see [`install`] for why that is sound.
type HookPtr = *mut (dyn Hook + 'static);

thread_local! {
    /// Sessions of this thread by region id; `None` while the session is being called.
    static HOOKS: RefCell<Vec<(u64, Option<HookPtr>)>> = const { RefCell::new(Vec::new()) };
}

/// Keeps a session registered; unregisters it on drop (also when unwinding).
#[derive(Debug)]
pub(crate) struct Installed<'a> {
    id: u64,
    /// Holds the session's mutable borrow for as long as it is registered.
    _session: PhantomData<&'a mut ()>,
}

/// Registers `session` for fences on region `id` on this thread until the guard drops.
///
/// # Panics
/// If a session is already registered for `id` on this thread.
pub(crate) fn install<'a>(id: u64, session: &'a mut (dyn Hook + 'a)) -> Installed<'a> {
    let ptr: *mut (dyn Hook + 'a) = session;
    // SAFETY: only the lifetime bound of the trait object changes; the layout of the fat
    // pointer is the same. The pointer is dereferenced only in `crash_point`, and only while
    // it is in the table. It leaves the table when the returned guard drops, and the guard
    // holds the `'a` mutable borrow of `session`, so the session outlives every use and
    // nothing else accesses it meanwhile.
    let ptr = unsafe { std::mem::transmute::<*mut (dyn Hook + 'a), HookPtr>(ptr) };
    HOOKS.with_borrow_mut(|t| {
        assert!(
            t.iter().all(|(i, _)| *i != id),
            "SimRegion is already being explored on this thread"
        );
        t.push((id, Some(ptr)));
    });
    Installed {
        id,
        _session: PhantomData,
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        HOOKS.with_borrow_mut(|t| t.retain(|(i, _)| *i != self.id));
    }
}

/// Calls `f` with the session registered for region `id` on this thread, if there is one and
/// it is not already being called (a checker that fences the region it checks gets no nested
/// crash point).
pub(crate) fn crash_point(id: u64, f: impl FnOnce(&mut dyn Hook)) {
    let Some(ptr) = HOOKS.with_borrow_mut(|t| {
        t.iter_mut()
            .find(|(i, _)| *i == id)
            .and_then(|(_, p)| p.take())
    }) else {
        return;
    };
    /// Puts the session back into the table, also when the checker panics.
    struct Restore(u64, HookPtr);
    impl Drop for Restore {
        fn drop(&mut self) {
            HOOKS.with_borrow_mut(|t| {
                if let Some((_, p)) = t.iter_mut().find(|(i, _)| *i == self.0) {
                    *p = Some(self.1);
                }
            });
        }
    }
    let restore = Restore(id, ptr);
    // SAFETY: the pointer is in the table, so its `Installed` guard is alive and the session
    // it points to is alive and not otherwise accessed (see `install`). It was taken out of
    // the table for this call, so no nested call creates a second `&mut` to it.
    let session = unsafe { &mut *restore.1 };
    f(session);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(u32);

    impl Hook for Counter {
        fn prefixes(&self) -> bool {
            false
        }
        fn crash_point(&mut self, _: Snapshot, _: bool) {
            self.0 += 1;
            // A nested call for the same region finds the session busy.
            crash_point(7, |h| h.crash_point(empty(), false));
        }
    }

    fn empty() -> Snapshot {
        Snapshot {
            sync: Vec::new(),
            pending: Vec::new(),
        }
    }

    #[test]
    fn registered_only_while_the_guard_lives_and_not_reentrant() {
        let mut c = Counter(0);
        {
            let _g = install(7, &mut c);
            crash_point(7, |h| h.crash_point(empty(), false));
            crash_point(8, |h| h.crash_point(empty(), false));
            crash_point(7, |h| h.crash_point(empty(), false));
        }
        crash_point(7, |h| h.crash_point(empty(), false));
        assert_eq!(c.0, 2);
    }

    #[test]
    fn other_threads_do_not_see_the_session() {
        let mut c = Counter(0);
        let _g = install(9, &mut c);
        std::thread::spawn(|| {
            let mut seen = false;
            crash_point(9, |_| seen = true);
            assert!(!seen);
        })
        .join()
        .unwrap();
    }
}
