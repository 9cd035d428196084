//! The `BlockAllocator` conformance suite.
