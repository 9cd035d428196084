//! `pmfs umount`: unmounts a pmfs file system, also one whose daemon hangs or was killed, and
//! returns once the daemon has closed the volume.
//!
//! # The mount point is never looked up
//! A call on a mount whose daemon does not answer waits for the answer, and a lookup of the
//! mount point is such a call. So the mount is found in the mount table under the canonical
//! path of the mount point's parent joined with the mount point's name, and what follows works
//! from the table's entry.
//!
//! # Aborting the connection
//! `--force` first aborts the mount's FUSE connection by writing to its `abort` file in the
//! `fusectl` file system (`/sys/fs/fuse/connections`, mounted for the moment when it is not
//! mounted there). Calls waiting on the mount then fail with `ECONNABORTED`, later ones with
//! `ENOTCONN`, and the daemon's request loop ends as after an unmount. This frees a mount whose
//! daemon is stopped, or was killed while the kernel held it (a killed daemon whose thread
//! waits in the kernel for a page that a kernel read holds locked cannot finish exiting, since
//! the read's answer would have come from the threads that died).
//!
//! # Waiting for the daemon
//! The daemon holds the pool's owner lock until it has closed the volume ([`crate::pool`]).
//! After the unmount, this command waits up to [`RELEASE_WAIT`] for the lock to be free, so
//! that `pmfs umount DIR && pmfs fsck POOL` works. `--lazy` alone does not wait: the daemon
//! serves the files that are still open until they are closed.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::MsFlags;

use crate::error::{Error, Result};
use crate::mount::{self, MountEntry};

/// How long `pmfs umount` waits for the daemon to release the pool after the unmount.
pub const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// Where the `fusectl` file system lists the FUSE connections.
const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// How to unmount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct How {
    /// Detach the mount even while files on it are open, and do not wait for the daemon.
    pub lazy: bool,
    /// Abort the FUSE connection first, then detach the mount.
    pub force: bool,
}

/// Unmounts the pmfs file system on `dir` as `how` says; returns once its daemon has released
/// the pool (unless `how` is lazy and not forced).
pub fn umount(dir: &Path, how: How) -> Result<()> {
    let at = table_path(dir)?;
    let Some(m) = find(&at) else {
        return Err(Error::new(format!(
            "{}: not a pmfs mount point",
            dir.display()
        )));
    };
    if how.force {
        abort(&m)?;
    }
    if let Err(e) = mount::unmount(&m.dir, how.lazy || how.force) {
        // After an abort the daemon may have unmounted it first.
        if find(&at).is_some_and(|now| now.dev == m.dev) {
            let hint = if e.contains("busy") {
                " (files on it are open: --lazy detaches it now, --force also cuts them off)"
            } else {
                ""
            };
            return Err(Error::new(format!("{e}{hint}")));
        }
    }
    if how.lazy && !how.force {
        return Ok(());
    }
    wait_released(&m)
}

/// The path under which the mount table lists `dir`, found without looking `dir` itself up:
/// the canonical path of its parent joined with its name.
fn table_path(dir: &Path) -> Result<PathBuf> {
    let err = |e: std::io::Error| Error::new(format!("{}: {e}", dir.display()));
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok(parent.canonicalize().map_err(err)?.join(name))
        }
        _ => dir.canonicalize().map_err(err),
    }
}

/// The pmfs mount on `at` (the topmost one, when several are stacked there).
fn find(at: &Path) -> Option<MountEntry> {
    mount::pmfs_mounts().into_iter().rev().find(|m| m.dir == at)
}

/// Aborts the FUSE connection of `m`.
fn abort(m: &MountEntry) -> Result<()> {
    let conns = Path::new(CONNECTIONS);
    let mount_fusectl = !fusectl_mounted();
    if mount_fusectl {
        nix::mount::mount(
            Some("fusectl"),
            conns,
            Some("fusectl"),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| {
            Error::new(format!(
                "{}: cannot mount fusectl on {CONNECTIONS} to abort the connection: {e}",
                m.dir.display()
            ))
        })?;
    }
    let file = conns.join(m.dev.to_string()).join("abort");
    let wrote = std::fs::write(&file, "1");
    if mount_fusectl {
        let _ = nix::mount::umount(conns);
    }
    wrote.map_err(|e| {
        Error::new(format!(
            "{}: cannot abort the connection ({}): {e}",
            m.dir.display(),
            file.display()
        ))
    })
}

/// Whether `fusectl` is mounted on [`CONNECTIONS`].
fn fusectl_mounted() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .filter_map(mount::line)
            .any(|l| l.dir == CONNECTIONS && l.fstype == "fusectl")
    })
}

/// Waits up to [`RELEASE_WAIT`] until nobody holds the owner lock of `m`'s pool.
fn wait_released(m: &MountEntry) -> Result<()> {
    // A pool this user cannot open shows no lock to wait for.
    let Ok(pool) = File::open(&m.pool) else {
        return Ok(());
    };
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        match pool.try_lock_shared() {
            Ok(()) | Err(TryLockError::Error(_)) => return Ok(()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(Error::new(format!(
                    "{}: unmounted, but its daemon still holds {} after {} s",
                    m.dir.display(),
                    m.pool.display(),
                    RELEASE_WAIT.as_secs()
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_is_found_through_its_parent_only() {
        let tmp = std::env::temp_dir().canonicalize().unwrap();
        let inside = tmp.join(format!("pmfs-umount-{}", std::process::id()));
        assert_eq!(table_path(&inside).unwrap(), inside);
        assert_eq!(table_path(&inside.join(".")).unwrap(), inside);
        assert_eq!(
            table_path(&tmp.join("..").join(tmp.file_name().unwrap()).join("m")).unwrap(),
            tmp.join("m")
        );
        assert_eq!(table_path(Path::new("/")).unwrap(), Path::new("/"));
        let e = table_path(&inside.join("no").join("m")).unwrap_err();
        assert!(e.to_string().contains("No such file"), "{e}");
    }
}
