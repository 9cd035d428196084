//! The `FileMapping` conformance suite.
