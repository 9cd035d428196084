//! The cuckoo mapping structure.
