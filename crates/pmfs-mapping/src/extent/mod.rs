//! The extent mapping structure.
