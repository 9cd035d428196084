//! Having the daemon make the kernel drop its pages of a file this process updated
//! ([`pmfs::kernel_pages`]): a process that maps the file through the kernel (one without
//! the library, or a mapping the library leaves to the kernel) would keep seeing the old bytes.
//!
//! The engine calls [`drop_pages`] after a served update of a file the kernel may cache,
//! at most once until the kernel reads the file again. Each call makes a socket of its own
//! (so no state is shared with `fork` children or other threads), asks, waits at most
//! [`PATIENCE`] and closes it again with the raw system call, keeping `errno`. A daemon it
//! cannot reach (an older build, another network namespace) leaves the raised mtime to make
//! `read(2)` through the kernel right.

use std::os::fd::IntoRawFd;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// How long an update waits for the daemon to answer.
const PATIENCE: Duration = Duration::from_secs(1);

/// Hooks [`drop_pages`] into `client`, the client of a pool file with device `dev` and inode
/// number `ino`.
pub(crate) fn install(client: &pmfs::Client, (dev, ino): (u64, u64)) {
    let Ok(owner) = pmfs::kernel_pages::owner_address(dev, ino, client.rendezvous()) else {
        return;
    };
    client.on_kernel_pages(move |file| drop_pages(&owner, file));
}

/// Asks the daemon listening at `owner` to have the kernel drop its pages of `file`, and
/// waits for the answer.
fn drop_pages(owner: &SocketAddr, file: pmfs::Ino) {
    let saved = crate::errno();
    if let Ok(sock) = UnixDatagram::unbound() {
        if pmfs::kernel_pages::bind_asker(&sock).is_ok() {
            let _ = pmfs::kernel_pages::ask(&sock, owner, file, 1, PATIENCE);
        }
        let fd = sock.into_raw_fd();
        // SAFETY: closes the socket made above, which nobody else has; the raw call, so that
        // the library's own `close` does not look the number up.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
    crate::set_errno(saved);
}
