//! Signals that arrive while a thread is inside the library.
//!
//! The kernel runs a signal handler between system calls, never inside one. A handler that
//! interrupted the library in the middle of a served call (holding the file's locks) and then
//! called the library itself, say a `write` to the same log file, would wait for its own thread
//! forever. So the library stands in for `sigaction` and `signal`: the kernel is given
//! [`trampoline`], which runs the program's handler at once when its thread is outside the
//! library, and otherwise records the signal; the program's handler then runs when the
//! outermost library call on that thread is done ([`Inside`]), with the signal's mask as the
//! kernel would set it and `errno` kept, as at the return of a system call.
//!
//! A deferred handler gets the `siginfo` of the signal and a context made where it runs, not
//! the interrupted one. The signals of faults (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`,
//! `SIGTRAP`, `SIGSYS`), whose handlers need the faulting context, are never wrapped. A
//! realtime signal sent several times while deferred runs its handler once; a handler that
//! asked for an alternate stack (`SA_ONSTACK`) runs on the thread's stack when deferred.

use core::cell::{Cell, UnsafeCell};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering, compiler_fence};

use libc::{SIG_DFL, SIG_IGN, siginfo_t, sigset_t};

/// Signal numbers are below this.
const NSIG: usize = 65;

/// The program's handler of each wrapped signal (0: none, the action is the default or
/// ignore), its `sa_flags` and its `sa_mask` (bit `n - 1` for signal `n`).
static HANDLER: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
static FLAGS: [AtomicI32; NSIG] = [const { AtomicI32::new(0) }; NSIG];
static MASK: [AtomicU64; NSIG] = [const { AtomicU64::new(0) }; NSIG];

/// What a deferred signal runs: the handler, its flags and the signal's information.
#[derive(Clone, Copy)]
struct Deferred {
    handler: usize,
    flags: c_int,
    info: siginfo_t,
}

std::thread_local! {
    /// Library calls this thread is in.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Signals deferred on this thread (bit `n - 1` for signal `n`).
    static PENDING: Cell<u64> = const { Cell::new(0) };
    /// What each deferred signal runs.
    static DEFERRED: UnsafeCell<[Deferred; NSIG]> = const { UnsafeCell::new(NONE_DEFERRED) };
}

// SAFETY: all-zero bytes are a valid `siginfo_t`, handler and flags.
const NONE_DEFERRED: [Deferred; NSIG] = unsafe { core::mem::MaybeUninit::zeroed().assume_init() };

/// Whether the library wraps handlers of `sig`.
pub(crate) fn wrapped(sig: c_int) -> bool {
    (1..NSIG as c_int).contains(&sig)
        && ![
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
        ]
        .contains(&sig)
}

/// The thread is inside the library while this lives: wrapped handlers wait for the end of
/// the outermost one.
pub(crate) struct Inside(());

impl Inside {
    pub(crate) fn enter() -> Inside {
        DEPTH.with(|d| d.set(d.get() + 1));
        compiler_fence(Ordering::SeqCst);
        Inside(())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        let depth = DEPTH.with(|d| {
            let n = d.get() - 1;
            d.set(n);
            n
        });
        compiler_fence(Ordering::SeqCst);
        if depth == 0 && PENDING.with(Cell::get) != 0 {
            deliver();
        }
    }
}

fn bits_of(set: &sigset_t) -> u64 {
    (1..NSIG as c_int).fold(0, |b, s| {
        // SAFETY: a valid set and a signal number in range.
        if unsafe { libc::sigismember(set, s) } == 1 {
            b | 1 << (s - 1)
        } else {
            b
        }
    })
}

fn set_of(bits: u64) -> sigset_t {
    let mut set = core::mem::MaybeUninit::<sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset takes signal numbers in range.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for s in 1..NSIG as c_int {
            if bits & 1 << (s - 1) != 0 {
                libc::sigaddset(set.as_mut_ptr(), s);
            }
        }
        set.assume_init()
    }
}

/// The handler the kernel runs for every wrapped signal.
extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, context: *mut c_void) {
    let s = sig as usize;
    let handler = HANDLER[s].load(Ordering::Acquire);
    let flags = FLAGS[s].load(Ordering::Acquire);
    if flags & libc::SA_RESETHAND != 0 {
        // The kernel has reset the action: this delivery is the handler's last.
        HANDLER[s].store(0, Ordering::Release);
    }
    compiler_fence(Ordering::SeqCst);
    if DEPTH.with(Cell::get) == 0 {
        run(sig, handler, flags, info, context);
        return;
    }
    DEFERRED.with(|d| {
        // SAFETY: only this thread reaches its own slots, and a handler interrupting this one
        // defers into another slot (its own signal) or runs without touching them.
        let slot = unsafe { &mut (*d.get())[s] };
        slot.handler = handler;
        slot.flags = flags;
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        slot.info = unsafe { *info };
    });
    PENDING.with(|p| p.set(p.get() | 1 << (s - 1)));
}

fn trampoline_address() -> usize {
    trampoline as extern "C" fn(c_int, *mut siginfo_t, *mut c_void) as usize
}

/// Runs the program's `handler` of `sig` as the kernel would have.
fn run(sig: c_int, handler: usize, flags: c_int, info: *mut siginfo_t, context: *mut c_void) {
    if handler == 0 {
        // The action became the default or ignore after the signal was caught: take it now.
        // SAFETY: raise has no memory preconditions.
        unsafe { libc::raise(sig) };
    } else if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed this address as an SA_SIGINFO handler.
        let f = unsafe {
            core::mem::transmute::<usize, extern "C" fn(c_int, *mut siginfo_t, *mut c_void)>(
                handler,
            )
        };
        f(sig, info, context);
    } else {
        // SAFETY: the program installed this address as a plain handler.
        let f = unsafe { core::mem::transmute::<usize, extern "C" fn(c_int)>(handler) };
        f(sig);
    }
}

/// Runs the handlers deferred on this thread, each with its mask blocked (and its signal,
/// unless `SA_NODEFER`), as the kernel would on the return of a system call.
#[cold]
fn deliver() {
    let saved = crate::errno();
    while let Some(s) = PENDING.with(|p| {
        let bits = p.get();
        (bits != 0).then(|| {
            let s = bits.trailing_zeros() as usize + 1;
            p.set(bits & !(1 << (s - 1)));
            s
        })
    }) {
        // SAFETY: this thread's slot, filled when its bit was set.
        let mut d = DEFERRED.with(|d| unsafe { (*d.get())[s] });
        let mut block = MASK[s].load(Ordering::Acquire);
        if d.flags & libc::SA_NODEFER == 0 {
            block |= 1 << (s - 1);
        }
        let block = set_of(block);
        let mut old = core::mem::MaybeUninit::<sigset_t>::uninit();
        let mut context = core::mem::MaybeUninit::<libc::ucontext_t>::zeroed();
        // SAFETY: valid sets; getcontext fills a ucontext (a context for handlers that look).
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, old.as_mut_ptr());
            libc::getcontext(context.as_mut_ptr());
        }
        run(
            s as c_int,
            d.handler,
            d.flags,
            &mut d.info,
            context.as_mut_ptr().cast(),
        );
        // SAFETY: `old` was filled by the first call.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), core::ptr::null_mut()) };
    }
    crate::set_errno(saved);
}

/// `sigaction` for a wrapped signal: the kernel gets [`trampoline`] for a handler, and
/// `old` reports the program's own.
///
/// # Safety
/// The C function's contract.
pub(crate) unsafe fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let _inside = Inside::enter();
    let s = sig as usize;
    let before = (
        HANDLER[s].load(Ordering::Acquire),
        FLAGS[s].load(Ordering::Acquire),
        MASK[s].load(Ordering::Acquire),
    );
    // SAFETY: the caller passes a valid action or null.
    let mut given = unsafe { act.as_ref() }.copied();
    if let Some(a) = given.as_mut() {
        if a.sa_sigaction == SIG_DFL || a.sa_sigaction == SIG_IGN {
            HANDLER[s].store(0, Ordering::Release);
        } else {
            FLAGS[s].store(a.sa_flags, Ordering::Release);
            MASK[s].store(bits_of(&a.sa_mask), Ordering::Release);
            HANDLER[s].store(a.sa_sigaction, Ordering::Release);
            a.sa_sigaction = trampoline_address();
            a.sa_flags |= libc::SA_SIGINFO;
        }
    }
    let given_ptr = given.as_ref().map_or(core::ptr::null(), |a| a as *const _);
    // SAFETY: forwarded under the same contract.
    let r = unsafe { crate::real::sigaction(sig, given_ptr, old) };
    if r != 0 {
        HANDLER[s].store(before.0, Ordering::Release);
        FLAGS[s].store(before.1, Ordering::Release);
        MASK[s].store(before.2, Ordering::Release);
        return r;
    }
    // SAFETY: the caller passes a valid buffer or null; the real call filled it.
    if let Some(o) = unsafe { old.as_mut() }
        && o.sa_sigaction == trampoline_address()
    {
        o.sa_sigaction = before.0;
        o.sa_flags = before.1;
        o.sa_mask = set_of(before.2);
    }
    r
}
