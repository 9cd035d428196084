//! # pmfs-mapping
//!
//! The four PM-resident file-mapping structures of the HashFS paper (FAST'21, §3), each behind
//! pmfs-core's [`FileMapping`](pmfs_core::traits::FileMapping) contract.
//!
//! This crate owns the on-media format and the algorithms of the mapping structures. It does
//! not know about inodes, directories or the data path; it reaches PM only through
//! [`Media`](pmfs_core::pm::Media).

pub mod cuckoo;
pub mod extent;
pub mod hashfs;
pub mod radix;
pub mod undo;
