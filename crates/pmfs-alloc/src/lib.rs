//! # pmfs-alloc
