//! Conformance suites: property tests against std-collection models that every implementation
//! of a contract runs from its own tests (enabled by the `testing` feature).

pub mod alloc;
pub mod mapping;
