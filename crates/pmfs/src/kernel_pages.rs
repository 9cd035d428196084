//! Asking a pool's owner to make the kernel drop the pages it caches of a file.
//!
//! A FUSE kernel keeps pages of the files it reads. A data-only client ([`Client`]) writes the
//! pool behind the kernel's back, so a process that reads through the kernel could see the old
//! bytes. Reads through `read(2)` are kept right by the mtime: the kernel fetches the
//! attributes before it reads (`attr_timeout` 0) and drops its pages when the mtime moved, and
//! a client raises the mtime after updating a file the kernel may cache (one the owner marked
//! when it read or wrote it for the kernel, [`OpenNode::kernel_caches`]). A kernel *mapping* never
//! fetches attributes: its pages stay until the owner tells the kernel to drop them
//! (`FUSE_NOTIFY_INVAL_INODE`). The owner (the FUSE daemon) listens on a datagram socket named
//! after the pool file ([`owner_address`]); a client that updated a file the kernel may cache
//! sends the file's [`Ino`] there and waits for the answer ([`ask`]), so that when its update
//! returns no kernel mapping shows the old bytes either. The owner clears the mark before it
//! has the kernel drop the pages ([`Volume::forget_kernel_pages`]): a kernel read after that
//! sets it again, so the next update asks again, and the updates between cost nothing.
//!
//! The address is an abstract socket: nothing in the file system, and visible in the network
//! namespace it was bound in only. A client that cannot reach the owner (another namespace, an
//! owner without a listener) goes on without: the raised mtime still keeps `read(2)` right.
//! Abstract names have no permissions, so the name holds a random word the owner stores in the
//! pool at each read-write mount (the *rendezvous* word): only processes that may read the pool
//! can know it, and so bind the name before the owner, or send it requests (the worst a request
//! does is make the kernel drop pages it would have kept).
//!
//! [`Client`]: crate::Client
//! [`OpenNode::kernel_caches`]: crate::OpenNode::kernel_caches
//! [`Volume::forget_kernel_pages`]: crate::Volume::forget_kernel_pages

use std::io;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Ino;

/// A request: a sequence number and the file's [`Ino`]. An answer: the same sequence number
/// and 0, or the errno the owner failed with.
const MESSAGE: usize = 16;

/// The address the owner of the pool file with device `dev` and inode number `ino` listens
/// on while its mount's rendezvous word is `key` ([`Volume::rendezvous`],
/// [`Client::rendezvous`]).
///
/// # Errors
/// None in practice: the name is shorter than the limit of an abstract address.
///
/// [`Volume::rendezvous`]: crate::Volume::rendezvous
/// [`Client::rendezvous`]: crate::Client::rendezvous
pub fn owner_address(dev: u64, ino: u64, key: u64) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("pmfs/kernel-pages/{dev:x}/{ino:x}/{key:016x}"))
}

/// The owner's end: a socket bound to [`owner_address`].
#[derive(Debug)]
pub struct Listener {
    sock: UnixDatagram,
    stopped: Arc<AtomicBool>,
}

/// Ends a [`Listener::serve`] loop from another thread ([`Listener::stopper`]).
#[derive(Debug)]
pub struct Stopper {
    sock: UnixDatagram,
    stopped: Arc<AtomicBool>,
}

impl Stopper {
    /// Makes the loop return after the request it is serving, if any.
    ///
    /// # Errors
    /// The socket's error.
    pub fn stop(self) -> io::Result<()> {
        self.stopped.store(true, Ordering::Release);
        self.sock.shutdown(Shutdown::Both)
    }
}

impl Listener {
    /// Binds the [address](owner_address) of the pool file with device `dev`, inode number
    /// `ino` and rendezvous word `key`.
    ///
    /// # Errors
    /// `AddrInUse` if some process listens there already; other socket errors.
    pub fn bind(dev: u64, ino: u64, key: u64) -> io::Result<Listener> {
        let sock = UnixDatagram::bind_addr(&owner_address(dev, ino, key)?)?;
        Ok(Listener {
            sock,
            stopped: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A handle that ends [`serve`](Self::serve) from another thread.
    ///
    /// # Errors
    /// The socket's error.
    pub fn stopper(&self) -> io::Result<Stopper> {
        Ok(Stopper {
            sock: self.sock.try_clone()?,
            stopped: self.stopped.clone(),
        })
    }

    /// Answers requests, one at a time, with what `drop_pages` returns for the file named in
    /// each, until [stopped](Stopper::stop) or the socket fails. Malformed requests are dropped
    /// unanswered.
    ///
    /// # Errors
    /// The socket's error that ended the loop.
    pub fn serve(&self, mut drop_pages: impl FnMut(Ino) -> io::Result<()>) -> io::Result<()> {
        let mut req = [0u8; MESSAGE];
        loop {
            let got = self.sock.recv_from(&mut req);
            if self.stopped.load(Ordering::Acquire) {
                return Ok(());
            }
            let (n, from) = match got {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n != MESSAGE {
                continue;
            }
            let (seq, ino) = split(&req);
            let errno = match drop_pages(Ino::from_raw(ino)) {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
            };
            // The asker may be gone, or have given up; either way it needs no answer.
            let _ = self.sock.send_to_addr(&join(seq, errno as u64), &from);
        }
    }
}

/// Binds `sock` to an address of its own, chosen by the kernel, so that the owner can answer
/// it. Call once, before the first [`ask`].
///
/// # Errors
/// The socket's error.
pub fn bind_asker(sock: &UnixDatagram) -> io::Result<()> {
    use nix::sys::socket::{UnixAddr, bind};
    // An address of the family alone: the kernel picks an unused abstract name.
    bind(sock.as_raw_fd(), &UnixAddr::new_unnamed()).map_err(io::Error::from)
}

/// Asks the owner at `owner` to have the kernel drop its pages of `ino`, through `sock` (bound
/// with [`bind_asker`], used by one caller at a time), and waits for the answer, at most
/// `patience`. `seq` tells this request's answer from late answers to earlier ones that gave
/// up: pass a new number each time.
///
/// # Errors
/// `ConnectionRefused` or `NotFound` when nobody listens at `owner`, `TimedOut` when no answer
/// came in time, the owner's errno when it failed, other socket errors.
pub fn ask(
    sock: &UnixDatagram,
    owner: &SocketAddr,
    ino: Ino,
    seq: u64,
    patience: Duration,
) -> io::Result<()> {
    sock.send_to_addr(&join(seq, ino.raw()), owner)?;
    let deadline = Instant::now() + patience;
    let mut ans = [0u8; MESSAGE];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        sock.set_read_timeout(Some(left))?;
        match sock.recv(&mut ans) {
            Ok(MESSAGE) => {
                let (got, errno) = split(&ans);
                if got != seq {
                    continue;
                }
                return match errno {
                    0 => Ok(()),
                    e => Err(io::Error::from_raw_os_error(e as i32)),
                };
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Err(e) => return Err(e),
        }
    }
}

fn join(a: u64, b: u64) -> [u8; MESSAGE] {
    let mut m = [0u8; MESSAGE];
    m[..8].copy_from_slice(&a.to_le_bytes());
    m[8..].copy_from_slice(&b.to_le_bytes());
    m
}

fn split(m: &[u8; MESSAGE]) -> (u64, u64) {
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(m[r].try_into().unwrap_or([0; 8]));
    (word(0..8), word(8..16))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique() -> (u64, u64) {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (u64::from(std::process::id()), n | 0xfeed_0000)
    }

    #[test]
    fn an_asker_gets_the_owners_answer_for_its_file() {
        let (dev, ino) = unique();
        let l = Listener::bind(dev, ino, 5).unwrap();
        let (tx, seen) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            l.serve(|i| {
                tx.send(i).unwrap();
                match i.raw() {
                    3 => Err(io::Error::from_raw_os_error(libc::ENOENT)),
                    _ => Ok(()),
                }
            })
        });
        let sock = UnixDatagram::unbound().unwrap();
        bind_asker(&sock).unwrap();
        let owner = owner_address(dev, ino, 5).unwrap();
        let patience = Duration::from_secs(5);
        ask(&sock, &owner, Ino::from_raw(7 << 32 | 9), 1, patience).unwrap();
        let e = ask(&sock, &owner, Ino::from_raw(3), 2, patience).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let seen: Vec<u64> = seen.try_iter().map(Ino::raw).collect();
        assert_eq!(seen, [7 << 32 | 9, 3]);
        assert!(Listener::bind(dev, ino, 5).is_err(), "one owner per pool");
        assert!(Listener::bind(dev, ino, 6).is_ok(), "one per mount");
    }

    #[test]
    fn a_stopped_listener_returns() {
        let (dev, ino) = unique();
        let l = Listener::bind(dev, ino, 5).unwrap();
        let stop = l.stopper().unwrap();
        let serving = std::thread::spawn(move || l.serve(|_| Ok(())));
        std::thread::sleep(Duration::from_millis(20));
        stop.stop().unwrap();
        serving.join().unwrap().unwrap();
    }

    #[test]
    fn asking_nobody_fails_at_once() {
        let (dev, ino) = unique();
        let sock = UnixDatagram::unbound().unwrap();
        bind_asker(&sock).unwrap();
        let owner = owner_address(dev, ino, 5).unwrap();
        let e = ask(&sock, &owner, Ino::from_raw(1), 1, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn late_answers_to_given_up_requests_are_skipped() {
        let (dev, ino) = unique();
        let l = Listener::bind(dev, ino, 5).unwrap();
        let sock = UnixDatagram::unbound().unwrap();
        bind_asker(&sock).unwrap();
        let owner = owner_address(dev, ino, 5).unwrap();
        let e = ask(
            &sock,
            &owner,
            Ino::from_raw(1),
            1,
            Duration::from_millis(20),
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // The owner answers the stale request first, then the new one.
        std::thread::spawn(move || l.serve(|_| Ok(())));
        ask(&sock, &owner, Ino::from_raw(2), 2, Duration::from_secs(5)).unwrap();
    }
}
