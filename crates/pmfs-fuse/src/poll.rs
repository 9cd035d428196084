//! Polling the FUSE device for a while after each request (`-o poll=MICROS`).
//!
//! A request travels from the caller, who queues it in the kernel and sleeps, to a daemon
//! thread blocked in a read of `/dev/fuse`, and its reply back. When the daemon's CPU is idle,
//! the wake-up of that thread is most of the round trip: on a virtual machine whose idle vCPUs
//! halt to the host at once, 20–45 µs, where the daemon's work for a GETATTR is a few µs.
//!
//! With a poll window, the daemon keeps one event-loop thread awake while requests keep
//! coming: each request puts one of the session's `/dev/fuse` descriptors in non-blocking
//! mode, so the thread that reads it retries at once instead of sleeping (fuser's loop reads
//! again on `EAGAIN`), and the next request finds it running. A monitor thread puts the
//! descriptor back in blocking mode once no request has come for the window: an idle daemon
//! sleeps as before, and a busy one spends one CPU on polling. The other event-loop threads
//! block as always and take the requests that arrive while the polling one is busy.
//!
//! Polling changes only when a request is picked up, never what is done with it: a read of
//! either mode hands the thread the same requests, and the end of the connection (`ENODEV`)
//! ends the loop in both.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};

/// The poll window of a mount and the descriptor it switches.
#[derive(Debug)]
pub struct Poller {
    window: Duration,
    epoch: Instant,
    /// When the last request came, in nanoseconds since `epoch`.
    last: AtomicU64,
    /// Whether the descriptor is in non-blocking mode. Changed only under `state`'s lock;
    /// requests read it without.
    polling: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// A duplicate of one of the session's descriptors: it shares the open file description,
    /// whose mode it switches, and keeps it valid after fuser closes its own.
    fd: Option<OwnedFd>,
    /// Whether `fd` was looked for (at the first request, when the session has all of them).
    looked: bool,
    stop: bool,
}

impl Poller {
    /// A poller with a window of `window`, and its monitor thread, which runs until
    /// [`stop`](Poller::stop).
    pub fn start(window: Duration) -> std::io::Result<(Arc<Poller>, JoinHandle<()>)> {
        let p = Arc::new(Poller {
            window,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let monitor = p.clone();
        let thread = std::thread::Builder::new()
            .name("pmfs-poll".into())
            .spawn(move || monitor.monitor())?;
        Ok((p, thread))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Notes a request: the descriptor polls until the window has passed without another.
    pub fn request(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
        if self.polling.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.state();
        if s.stop || self.polling.load(Ordering::Relaxed) {
            return;
        }
        if !s.looked {
            s.looked = true;
            s.fd = fuse_descriptor();
            if s.fd.is_none() {
                let _ = writeln!(
                    std::io::stderr(),
                    "pmfs: -o poll: cannot find the session's /dev/fuse descriptor in /proc/self/fd; not polling"
                );
            }
        }
        if let Some(fd) = &s.fd
            && set_nonblocking(fd.as_fd(), true).is_ok()
        {
            self.polling.store(true, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    /// Whether the descriptor is in non-blocking mode now.
    pub fn is_polling(&self) -> bool {
        self.polling.load(Ordering::Relaxed)
    }

    /// Puts the descriptor back in blocking mode once a window has passed without a request.
    fn monitor(&self) {
        let mut s = self.state();
        while !s.stop {
            if !self.polling.load(Ordering::Relaxed) {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let idle =
                Duration::from_nanos(self.now().saturating_sub(self.last.load(Ordering::Relaxed)));
            if idle >= self.window {
                self.block(&mut s);
                continue;
            }
            s = self
                .changed
                .wait_timeout(s, self.window - idle)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        self.block(&mut s);
    }

    fn block(&self, s: &mut State) {
        if let Some(fd) = &s.fd
            && self.polling.load(Ordering::Relaxed)
        {
            // A descriptor that cannot be switched back keeps polling until the mount ends;
            // fcntl(F_SETFL) on a valid descriptor does not fail.
            let _ = set_nonblocking(fd.as_fd(), false);
        }
        self.polling.store(false, Ordering::Relaxed);
    }

    /// Ends polling (the descriptor blocks again) and the monitor thread.
    pub fn stop(&self) {
        self.state().stop = true;
        self.changed.notify_one();
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> nix::Result<()> {
    let mut flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    flags.set(OFlag::O_NONBLOCK, on);
    fcntl(fd, FcntlArg::F_SETFL(flags)).map(drop)
}

/// A duplicate of one of this process's descriptors of `/dev/fuse`: fuser keeps the session's
/// to itself. The session's descriptors are open while it serves requests, which is when this
/// runs; the duplicate is checked to be of the device, in case another thread closed the
/// number and opened something else under it meanwhile. The crate's one `unsafe` block: no
/// safe interface turns a descriptor number into a descriptor.
#[allow(unsafe_code)]
fn fuse_descriptor() -> Option<OwnedFd> {
    let dev = fs::metadata("/dev/fuse").ok()?.rdev();
    let is_fuse = |m: &fs::Metadata| m.file_type().is_char_device() && m.rdev() == dev;
    for entry in fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<RawFd>().ok())
        else {
            continue;
        };
        if !fs::metadata(entry.path()).is_ok_and(|m| is_fuse(&m)) {
            continue;
        }
        // SAFETY: descriptor `n` is open (just listed, and the session keeps its own open
        // while it serves requests), and the borrow ends with the `dup`. Should another thread
        // have replaced it meanwhile, the duplicate is of some other file, which the check
        // below turns away.
        let borrowed = unsafe { BorrowedFd::borrow_raw(n) };
        let Ok(own) = nix::unistd::dup(borrowed) else {
            continue;
        };
        let same = fs::File::from(own.try_clone().ok()?)
            .metadata()
            .is_ok_and(|m| is_fuse(&m));
        if same {
            return Some(own);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_without_requests_switches_the_descriptor_back() {
        // A pipe stands in for the device: the switching is the same fcntl.
        let (r, _w) = nix::unistd::pipe().unwrap();
        let (p, thread) = Poller::start(Duration::from_millis(50)).unwrap();
        {
            let mut s = p.state();
            s.looked = true;
            s.fd = Some(r.try_clone().unwrap());
        }
        let nonblocking = || {
            OFlag::from_bits_retain(fcntl(r.as_fd(), FcntlArg::F_GETFL).unwrap())
                .contains(OFlag::O_NONBLOCK)
        };
        assert!(!nonblocking());
        p.request();
        assert!(p.is_polling() && nonblocking());
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.is_polling() {
            assert!(Instant::now() < deadline, "still polling");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!nonblocking());
        p.request();
        assert!(nonblocking());
        p.stop();
        thread.join().unwrap();
        assert!(!nonblocking() && !p.is_polling());
    }
}
