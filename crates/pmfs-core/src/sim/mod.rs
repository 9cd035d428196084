//! The crash simulator.
