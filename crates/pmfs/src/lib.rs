//! # pmfs
//!
//! Will hold the file-system engine (volume format, inodes, directories, journal, data path,
//! fsck) and the std::fs-like embedding API. Nothing is implemented here yet.
