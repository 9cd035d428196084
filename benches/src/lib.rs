//! Shared helpers for the pmfs benchmarks.
