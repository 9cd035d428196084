//! # pmfs-preload
//!
//! Will be `libpmfs_preload.so`: interposed read/write/mmap for files on a pmfs FUSE mount,
//! served from the shared pool mapping. It owns the FFI edge only; the data path is the
//! engine's. Nothing is implemented here yet: loading it changes no behaviour.
