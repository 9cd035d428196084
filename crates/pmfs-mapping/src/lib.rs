//! # pmfs-mapping
