//! # pmfs-fuse
//!
//! Will hold the `pmfs` command (mkfs, mount through FUSE, fsck, info) once the engine exists.
//! It owns the FUSE plumbing and the conversion of engine errors to errno; it must not touch PM
//! bytes itself. Nothing is implemented here yet.
