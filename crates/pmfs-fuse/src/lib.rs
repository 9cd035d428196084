//! # pmfs-fuse
//!
//! The `pmfs` command and the FUSE frontend of the engine: `pmfs mkfs`, `pmfs mount` (a FUSE
//! daemon serving a volume through [fuser]), `pmfs umount`, `pmfs fsck` and `pmfs info`, plus
//! the `mount.pmfs` helper that `mount -t fuse.pmfs` and fstab entries run.
//!
//! This crate owns the FUSE plumbing and the conversion of engine errors to errno, at the
//! edge only ([`fs`]); it never touches PM bytes itself: every file-system decision is the
//! engine's (`pmfs`, through its inode-number API), except permission policy, which the
//! kernel enforces (`default_permissions`) and the daemon completes where FUSE leaves it to
//! the file system (ownership of new objects, set-group-ID directories, `access`).
//!
//! ## The daemon owns the pool
//! A mounted pool is locked (`flock`, exclusive) by its daemon for as long as it serves it;
//! `mkfs`, `fsck`, `info` and a second `mount` of the same pool fail with a one-line error
//! while the lock is held. Data clients that attach to a mounted pool (the preload library)
//! map the same pool file; they are trusted exactly as far as the pool file's permissions
//! allow: whoever can open the pool file read-write can change any byte of the volume, so
//! mkfs creates pools with mode 0600 (owner only). See [`pool`].
//!
//! ## Binaries
//! One binary, `pmfs`. Called through a link named `mount.pmfs` or `mount.fuse.pmfs` it is
//! the mount helper ([`cli::mount_helper_main`]): `ln -s $(which pmfs)
//! /sbin/mount.fuse.pmfs` makes `mount -t fuse.pmfs POOL DIR` and fstab lines such as
//! `/dev/shm/my.pool /mnt/pm fuse.pmfs defaults,nofail 0 0` work.
#![deny(unsafe_code)]

pub mod cli;
pub mod error;
pub mod fs;
pub mod mount;
pub mod poll;
pub mod pool;
pub mod umount;

pub use error::{Error, Result};
